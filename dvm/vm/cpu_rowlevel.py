"""Row-level (compact) registers of the CPU VM.

A reduction result is constant along the row. The VM keeps it compact: row r's value in lane r,
which is also column 0 of a column-major tile (cpu_reduce's _rfin/_rowred leave it so). Row-level
arithmetic then runs on BM lanes only (cpu_interp._row_mode), a full-tile f32 add/sub/mul/div/
maximum/minimum broadcasts a compact operand on the fly (_bin_rowb), and any other full-tile
reader first expands it in place (_expand). Results are identical to broadcast tiles: the same
f32 operations on the same values.
"""
from __future__ import annotations

from numba import njit

from .cpu_kernels import OP_ADD, OP_DIV, OP_MAX, OP_MIN, OP_MUL, OP_SUB, _bin_float, _fmax, _fmin
from .cpu_math import OPTS
from .cpu_reduce import _bcast_t, _fill


@njit(**OPTS)
def _expand(o, bm, bn, tl):
    """Compact -> broadcast tile, in place."""
    if tl:
        _bcast_t(o, bm, bn)
    else:   # from the last row down: row r's lanes start at r*bn >= r, above every unread lane
        for r in range(bm - 1, -1, -1):
            _fill(o[r * bn:(r + 1) * bn], o[r])


@njit(**OPTS)
def _binv(op, o, a, b, swap):
    """o = a . b lane-wise (cpu_kernels._bin_float), or b . a when swap, for the f32
    add/sub/mul/div/maximum/minimum of an operand held compact."""
    n = o.shape[0]
    if swap:
        if op == OP_SUB:
            for i in range(n):
                o[i] = b[i] - a[i]
            return
        if op == OP_DIV:
            for i in range(n):
                o[i] = b[i] / a[i]
            return
        if op == OP_MAX:
            for i in range(n):
                o[i] = _fmax(b[i], a[i])
            return
        if op == OP_MIN:
            for i in range(n):
                o[i] = _fmin(b[i], a[i])
            return
    _bin_float(op, o, a, b)


@njit(**OPTS)
def _bins(op, o, a, v, swap):
    """_binv with a scalar second operand."""
    n = o.shape[0]
    if swap:
        if op == OP_SUB:
            for i in range(n):
                o[i] = v - a[i]
            return
        if op == OP_DIV:
            for i in range(n):
                o[i] = v / a[i]
            return
        if op == OP_MAX:
            for i in range(n):
                o[i] = _fmax(v, a[i])
            return
        if op == OP_MIN:
            for i in range(n):
                o[i] = _fmin(v, a[i])
            return
    if op == OP_ADD:
        for i in range(n):
            o[i] = a[i] + v
    elif op == OP_SUB:
        for i in range(n):
            o[i] = a[i] - v
    elif op == OP_MUL:
        for i in range(n):
            o[i] = a[i] * v
    elif op == OP_DIV:
        for i in range(n):
            o[i] = a[i] / v
    elif op == OP_MAX:
        for i in range(n):
            o[i] = _fmax(a[i], v)
    else:
        for i in range(n):
            o[i] = _fmin(a[i], v)


ROWB_OPS = (OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_MAX, OP_MIN)


@njit(**OPTS)
def _bin_rowb(op, o, a, b, bm, bn, tl, swap):
    """o = a . b (b . a when swap) for a full tile a and a compact register b."""
    if tl:
        bv = b[:bm]
        for k in range(bn):
            _binv(op, o[k * bm:(k + 1) * bm], a[k * bm:(k + 1) * bm], bv, swap)
    else:
        for r in range(bm):
            _bins(op, o[r * bn:(r + 1) * bn], a[r * bn:(r + 1) * bn], b[r], swap)
