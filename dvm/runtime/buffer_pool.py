"""Recycled memory for large outputs and workspaces (NumPy; the CPU frontends' results).

A fresh large NumPy array costs page faults on first touch: the kernel maps and zeroes every
page, ~3.4 ms for 64 MiB on this machine, about as long as copying the 64 MiB itself. A loop
that calls the same kernel again and again (a training step, a benchmark) pays it on every call.
The pool keeps the memory of large results after the caller drops them and hands it out again.

Invariant: a pooled block is handed out only while nothing but the pool references it. NumPy
views always reference the array that owns the memory (their `base` chain is collapsed to the
owner), so any live result, slice, reshape, or tensor made with `torch.from_numpy` keeps the
block's reference count up and the block busy. Nothing is freed behind anyone's back: the
pool only ever re-uses a block nobody can reach.

Blocks are plain `np.empty` uint8 arrays of a size rounded up to `GRANULE`, plus one cache line:
an array handed out starts on a line (as PyTorch's CPU tensors do; malloc's large arrays start
16 bytes into one). A request takes an idle block of exactly that rounded size. The pool holds
at most `DVM_POOL_MB` MiB (config): beyond it, idle blocks of other sizes are dropped, least
recently used first, and a request that still does not fit gets an ordinary unpooled array.
`DVM_POOL_MB=0` turns the pool off.
"""
from __future__ import annotations

import math
import sys
import threading
from collections import OrderedDict

import numpy as np

from ..config import config
from . import counters

# Past its adaptive threshold glibc's malloc gives freed memory at the heap's top back to the kernel
# (and maps large arrays afresh): such an array is fresh pages again on the next call. Kernels with
# 256 KiB-768 KiB outputs took 70-230 page faults a call and 3-6x longer from malloc than from the
# pool; smaller arrays come from malloc's free lists (no faults measured at 128 KiB), where the
# pool's lock and lookup (1-3 us a call) would be all it changed
MIN_BYTES = 1 << 18
GRANULE = 1 << 16
LINE = 64   # bytes in a cache line

_LOCK = threading.Lock()
# size -> [(block, offset of its first cache line)]; least recently used sizes first
_BLOCKS: "OrderedDict[int, list[tuple[np.ndarray, int]]]" = OrderedDict()
_HELD = [0]   # bytes in _BLOCKS


def _idle(block_list: list[tuple[np.ndarray, int]], i: int) -> bool:
    """Block i is referenced by its entry, this frame's `b` and getrefcount's argument only."""
    b = block_list[i][0]
    return sys.getrefcount(b) == 3


def empty(shape: tuple[int, ...], dtype) -> np.ndarray:
    """Like np.empty(shape, dtype): C-contiguous, uninitialized; large ones from the pool."""
    dt = np.dtype(dtype)
    nbytes = math.prod(shape) * dt.itemsize
    limit = config().pool_mb << 20
    if nbytes < MIN_BYTES or limit == 0:
        return np.empty(shape, dt)
    size = -(-nbytes // GRANULE) * GRANULE
    with _LOCK:
        entry = _take(size)
        if entry is not None:
            counters.bump_pool_reuse()
        elif _make_room(size, limit):
            block = np.empty(size + LINE, np.uint8)
            entry = (block, -block.ctypes.data % LINE)
            _BLOCKS.setdefault(size, []).append(entry)
            _HELD[0] += size
        else:   # no room within the limit: an ordinary array
            return np.empty(shape, dt)
        # made under the lock: until the array references the block (its base), another thread
        # would find the block idle
        return np.ndarray(shape, dt, entry[0], entry[1])


def allocator(shape: tuple[int, ...], dtype):
    """The function to allocate arrays of this shape and dtype with: `empty`, or np.empty when
    they are too small to be pooled (saves the pool's checks on a hot path)."""
    return empty if math.prod(shape) * np.dtype(dtype).itemsize >= MIN_BYTES else np.empty


def _take(size: int) -> tuple[np.ndarray, int] | None:
    blocks = _BLOCKS.get(size)
    if not blocks:
        return None
    _BLOCKS.move_to_end(size)
    for i in range(len(blocks)):
        if _idle(blocks, i):
            return blocks[i]
    return None


def _make_room(size: int, limit: int) -> bool:
    """Drop idle blocks, least recently used sizes first, until `size` more bytes fit."""
    if size > limit:
        return False
    for s in list(_BLOCKS):
        if _HELD[0] + size <= limit:
            break
        blocks = _BLOCKS[s]
        for i in range(len(blocks) - 1, -1, -1):
            if _HELD[0] + size <= limit:
                break
            if _idle(blocks, i):
                del blocks[i]
                _HELD[0] -= s
        if not blocks:
            del _BLOCKS[s]
    return _HELD[0] + size <= limit


def held_bytes() -> int:
    """Bytes the pool holds (busy and idle blocks)."""
    with _LOCK:
        return _HELD[0]


def clear() -> None:
    """Forget every block (busy ones stay valid: their users own them from now on)."""
    with _LOCK:
        _BLOCKS.clear()
        _HELD[0] = 0
