"""Row-level (compact) registers of the CPU VM.

A reduction result is constant along the row. The VM keeps it compact: row r's value in lane r,
which is also column 0 of a column-major tile (cpu_reduce's _rfin/_rowred leave it so). Row-level
arithmetic then runs on BM lanes only (cpu_interp._row_mode), a full-tile f32 add/sub/mul/div/
maximum/minimum broadcasts a compact operand on the fly (_bin_rowb), and any other full-tile
reader first expands it in place (_expand). Row vectors (below) and uniform registers (constants,
applied as a scalar by _bins) work the same way. Results are identical to broadcast tiles: the
same f32 operations on the same values.
"""
from __future__ import annotations

from numba import njit

from .cpu_kernels import OP_ADD, OP_DIV, OP_MAX, OP_MIN, OP_MUL, OP_SUB, _fmax, _fmin
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


@njit(inline='always', **OPTS)
def _lane(op, x, y):
    """x . y for the f32 add/sub/mul/div/maximum/minimum (cpu_kernels._bin_float's lane op).
    Inlined into the loops below: op is loop-invariant, so LLVM unswitches and vectorizes; a call
    per row (slices + the op chain) costs more than the row's work at BN = 1024."""
    if op == OP_ADD:
        return x + y
    if op == OP_SUB:
        return x - y
    if op == OP_MUL:
        return x * y
    if op == OP_DIV:
        return x / y
    if op == OP_MAX:
        return _fmax(x, y)
    return _fmin(x, y)


@njit(inline='always', **OPTS)
def _vv(op, o, a, b, swap):
    """o = a . b lane-wise, or b . a when swap."""
    if swap:
        for i in range(o.shape[0]):
            o[i] = _lane(op, b[i], a[i])
    else:
        for i in range(o.shape[0]):
            o[i] = _lane(op, a[i], b[i])


@njit(inline='always', **OPTS)
def _vs(op, o, a, v, swap):
    """o = a . v (v . a when swap) for a scalar v."""
    if swap:
        for i in range(o.shape[0]):
            o[i] = _lane(op, v, a[i])
    else:
        for i in range(o.shape[0]):
            o[i] = _lane(op, a[i], v)


@njit(**OPTS)
def _bins(op, o, a, v, swap):
    """A full tile and a uniform register (v: its value)."""
    _vs(op, o, a, v, swap)


ROWB_OPS = (OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_MAX, OP_MIN)


@njit(**OPTS)
def _bin_rowb(op, o, a, b, bm, bn, tl, swap):
    """o = a . b (b . a when swap) for a full tile a and a compact register b."""
    if tl:
        bv = b[:bm]
        for k in range(bn):
            _vv(op, o[k * bm:(k + 1) * bm], a[k * bm:(k + 1) * bm], bv, swap)
    else:
        for r in range(bm):
            _vs(op, o[r * bn:(r + 1) * bn], a[r * bn:(r + 1) * bn], b[r], swap)


# Row vectors: an f32 load whose rows are all the same (a weight or bias broadcast over the rows
# of a row-major tile) fills row 0 only; a binary op applies that row to every row of the other
# operand (_bin_rowv), any other reader expands it first (_expand_rowv).
@njit(**OPTS)
def _expand_rowv(o, bm, bn):
    row = o[:bn]
    for r in range(1, bm):
        o[r * bn:(r + 1) * bn] = row


@njit(**OPTS)
def _bin_rowv(op, o, a, b, bm, bn, swap):
    """o = a . b (b . a when swap) for a full tile a and a row vector b (row-major tiles)."""
    bv = b[:bn]
    for r in range(bm):
        _vv(op, o[r * bn:(r + 1) * bn], a[r * bn:(r + 1) * bn], bv, swap)
