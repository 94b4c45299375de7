"""abi.py's integer constants as `tl.constexpr` globals, for the Triton kernels: a @triton.jit
function may read a module global only when it is a constexpr. Kernel modules star-import this."""
from __future__ import annotations

import triton.language as tl

from . import abi

_NAMES = [n for n, v in vars(abi).items() if n.isupper() and isinstance(v, int) and not isinstance(v, bool)]
for _n in _NAMES:
    globals()[_n] = tl.constexpr(getattr(abi, _n))

__all__ = list(_NAMES)
