"""Transparent huge pages for large fresh outputs.

A fresh output is mapped page by page on first touch: writing 16 MiB into new memory takes 4096
page faults, ~6 ms on the 2-core machine, twice the time of a fused softmax over it. Where
the kernel maps transparent huge pages on request (Linux, THP "madvise" or "always"), a large
output's aligned interior is advised MADV_HUGEPAGE before anything touches it: 2 MiB pages, 512
times fewer faults, as NumPy does for its own large arrays. Nothing changes in the memory's
contents or ownership; where the advice is refused the pages stay small.
"""
from __future__ import annotations

import ctypes
import sys

HUGE_PAGE = 1 << 21          # x86-64's PMD-sized page
HUGE_OUTPUT_BYTES = 4 << 20  # advise outputs this large (NumPy's own threshold)
_MADV_HUGEPAGE = 14


def _madvise():
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):  # pragma: no cover - no C library by that name
        return None
    fn.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    fn.restype = ctypes.c_int
    return fn


_MADVISE = _madvise()


def advise(address: int, nbytes: int) -> bool:
    """Ask for huge pages on the whole 2 MiB pages inside [address, address + nbytes); True if
    the kernel accepted the advice for a non-empty range."""
    if _MADVISE is None:
        return False
    start = -(-address // HUGE_PAGE) * HUGE_PAGE
    end = (address + nbytes) // HUGE_PAGE * HUGE_PAGE
    return end > start and _MADVISE(start, end - start, _MADV_HUGEPAGE) == 0
