"""Reductions of the CPU VM: accumulate, the pairwise-halving tree, single-tile row reductions.

The tree order is part of the spec (docs/DECISIONS.md): every VM reduces a row's BN lanes with
the same pairwise-halving tree over the next power of two, so results do not depend on the
thread count or on how a VM lays a tile out in memory.

Two register layouts (the VM picks one per kernel, cpu.py `_transposed`):
  row-major     lane (r, k) at r*BN + k (functions without suffix)
  column-major  lane (r, k) at k*BM + r (suffix _t): a tree level is one contiguous loop over
                the rows, and column-major operands load whole cache lines per column.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from .cpu_kernels import R_ARGMAX, R_ARGMIN, R_MAX, R_MIN, R_PROD, R_SUM, _fmax, _fmin
from .cpu_bits import OPTS
from .cpu_vtree import VTREE_MAX, vtree, vtree_n, vtree_pad


# --- reductions --------------------------------------------------------------------------------
@njit(**OPTS)
def _combine(op, a, b):
    if op == R_SUM:
        return a + b
    if op == R_PROD:
        return a * b
    if op == R_MAX:
        return _fmax(a, b)
    return _fmin(a, b)


@njit(inline='always', **OPTS)   # (called per row)
def _fill(o, v):
    for i in range(o.shape[0]):
        o[i] = v


@njit(inline='always', **OPTS)   # a call per row costs more than a short row's work
def _copy(o, a):
    for i in range(o.shape[0]):
        o[i] = a[i]


@njit(inline='always', **OPTS)   # a call per row costs more than a short row's work
def _accinit(op, o, is_float):
    if op == R_SUM:
        v = 0.0
    elif op == R_PROD:
        v = 1.0
    elif op == R_MAX or op == R_ARGMAX:
        v = -np.inf
    else:
        v = np.inf
    n = o.shape[0]
    if is_float:
        for i in range(n):
            o[i] = v
    elif op == R_MAX or op == R_ARGMAX:
        for i in range(n):
            o[i] = -9223372036854775807 - 1
    elif op == R_MIN or op == R_ARGMIN:
        for i in range(n):
            o[i] = 9223372036854775807
    else:
        iv = np.int64(v)
        for i in range(n):
            o[i] = iv


@njit(**OPTS)
def _acc(op, acc, x, bm, bn, ncv):
    if ncv == bn:   # whole tile: one flat, vectorized lane-wise combine
        n = bm * bn
        _level_t(op, acc[:n], x[:n])
        return
    for r in range(bm):
        _level_t(op, acc[r * bn:r * bn + ncv], x[r * bn:r * bn + ncv])


@njit(**OPTS)
def _arg_better(op, vn, in_, vo, io, tie):
    nan_new = vn != vn
    nan_old = vo != vo
    strictly = vn > vo if op == R_ARGMAX else vn < vo
    better = (strictly and not nan_old) or (nan_new and not nan_old)
    if tie:
        same = vn == vo or (nan_new and nan_old)
        better = better or (same and in_ < io)
    return better


@njit(**OPTS)
def _acc_arg(op, v, ix, x, bm, bn, ncv, c0):
    for r in range(bm):
        vv = v[r * bn:r * bn + ncv]
        iv = ix[r * bn:r * bn + ncv]
        xv = x[r * bn:r * bn + ncv]
        for j in range(ncv):
            upd = _arg_better(op, xv[j], c0 + j, vv[j], iv[j], False)
            vv[j] = xv[j] if upd else vv[j]
            iv[j] = c0 + j if upd else iv[j]


@njit(**OPTS)
def _tree(op, s, bn):
    """Pairwise-halving tree over s[:bn] (next power of two, identity padding); result in s[0]."""
    width = bn
    p = 1
    while p < width:
        p *= 2
    while p > 1:
        h = p // 2
        m = width - h
        if m > 0:
            lo = s[:m]
            hi = s[h:h + m]
            if op == R_SUM:
                for k in range(m):
                    lo[k] = lo[k] + hi[k]
            elif op == R_PROD:
                for k in range(m):
                    lo[k] = lo[k] * hi[k]
            elif op == R_MAX:
                for k in range(m):
                    lo[k] = _fmax(lo[k], hi[k])
            else:
                for k in range(m):
                    lo[k] = _fmin(lo[k], hi[k])
        width = h
        p = h


@njit(**OPTS)
def _tree_arg(op, sv, si, bn):
    """(value, index) tree; ties and NaNs pick the lower index; result index in si[0]."""
    width = bn
    p = 1
    while p < width:
        p *= 2
    while p > 1:
        h = p // 2
        m = width - h
        for k in range(max(m, 0)):
            if _arg_better(op, sv[h + k], si[h + k], sv[k], si[k], True):
                sv[k] = sv[h + k]
                si[k] = si[h + k]
        width = h
        p = h


@njit(inline='always', **OPTS)
def _lvl3(op, d, x, q):
    """Three tree levels of width 8q in one pass, in the tree's order."""
    if op == R_SUM:
        for k in range(q):
            d[k] = (((x[k] + x[k + 4 * q]) + (x[k + 2 * q] + x[k + 6 * q]))
                    + ((x[k + q] + x[k + 5 * q]) + (x[k + 3 * q] + x[k + 7 * q])))
    elif op == R_PROD:
        for k in range(q):
            d[k] = (((x[k] * x[k + 4 * q]) * (x[k + 2 * q] * x[k + 6 * q]))
                    * ((x[k + q] * x[k + 5 * q]) * (x[k + 3 * q] * x[k + 7 * q])))
    elif op == R_MAX:
        for k in range(q):
            d[k] = _fmax(_fmax(_fmax(x[k], x[k + 4 * q]), _fmax(x[k + 2 * q], x[k + 6 * q])),
                         _fmax(_fmax(x[k + q], x[k + 5 * q]), _fmax(x[k + 3 * q], x[k + 7 * q])))
    else:
        for k in range(q):
            d[k] = _fmin(_fmin(_fmin(x[k], x[k + 4 * q]), _fmin(x[k + 2 * q], x[k + 6 * q])),
                         _fmin(_fmin(x[k + q], x[k + 5 * q]), _fmin(x[k + 3 * q], x[k + 7 * q])))


@njit(inline='always', **OPTS)
def _stage(op, d, x, p):
    """Three tree levels of x[:p] (p >= 64) in one pass into d (not x); the width left."""
    q = p // 8
    _lvl3(op, d, x, q)
    return q


@njit(**OPTS)
def _stage_call(op, d, x, p):
    return _stage(op, d, x, p)


@njit(inline='always', **OPTS)
def _tree_p2(op, x, a, b, p):
    """The pairwise-halving tree over x[:p] (p a power of two): rows of up to VTREE_MAX lanes in
    vector registers (cpu_vtree); wider ones first fuse up to three levels a pass (same order, so
    bitwise the same result) into scratch rows a, then b, of p lanes (a must not be x; b may be:
    x is read by the first pass only). Returns the reduced value. Inlined into the row loops, as
    straight-line passes between fixed arrays: swapped array variables in a loop and a call per
    level and per row made it ~4x slower than its loops (1024 lanes: 136 -> 37 ns)."""
    if p < 16:
        _copy(a[:p], x[:p])
        _tree(op, a, p)
        return a[0]
    if p <= VTREE_MAX:
        return vtree(op, x, p)
    p = _stage(op, a, x, p)   # three levels, >= 128 lanes a loop (vectorized)
    if p <= VTREE_MAX:        # every row of up to MAX_BN = 4096 lanes
        return vtree(op, a, p)
    p = _stage(op, b, a, p)   # wider rows (a program may have up to program.MAX_TILE lanes a row)
    while p > VTREE_MAX:
        _copy(a[:p], b[:p])
        p = _stage_call(op, b, a, p)
    return vtree(op, b, p)


@njit(**OPTS)
def _is_pow2(n):
    return n > 0 and (n & (n - 1)) == 0


ROW_STAGED, ROW_P2, ROW_MASKED, ROW_PADDED = 0, 1, 2, 3   # _row_form


@njit(**OPTS)
def _row_form(bn, ncv):
    """How the row loops reduce rows of bn lanes, ncv valid. In registers, rows of up to
    VTREE_MAX lanes: ROW_P2 whole rows of a power of two from 16 (vtree), ROW_MASKED whole rows of
    any other width (vtree_n), ROW_PADDED partial rows of more than half a power of two from 16
    (vtree_pad: the lanes past ncv the identity, as the spec pads them, a single-tile row's
    case); else ROW_STAGED (copies, staged passes).
    The loops decide their form once, before the loop, and run one form per loop: the loop with
    every form's branches in it ran 2x slower a row (64 lanes, one thread: ~6.5 against ~3 ns)."""
    if bn > VTREE_MAX:
        return ROW_STAGED
    if ncv == bn:
        return ROW_P2 if bn >= 16 and _is_pow2(bn) else ROW_MASKED
    return ROW_PADDED if bn >= 16 and _is_pow2(bn) and 2 * ncv > bn else ROW_STAGED


@njit(**OPTS)
def _rfin_arg(op, o, v, ix, bm, bn, sv, si):
    for r in range(bm):
        _copy(sv[:bn], v[r * bn:(r + 1) * bn])
        _copy(si[:bn], ix[r * bn:(r + 1) * bn])
        _tree_arg(op, sv, si, bn)
        _fill(o[r * bn:(r + 1) * bn], si[0])


@njit(**OPTS)
def _rowred(op, o, x, bm, bn, ncv, s, is_float):
    """Single-tile reduction of x over its valid columns (identity elsewhere); compact result
    (row r's value in lane r). s: scratch of 2*bn lanes."""
    form = _row_form(bn, ncv)
    if form == ROW_P2:
        for r in range(bm):
            o[r] = vtree(op, x[r * bn:(r + 1) * bn], bn)
        return
    if form == ROW_MASKED:
        for r in range(bm):
            o[r] = vtree_n(op, x[r * bn:(r + 1) * bn], bn)
        return
    if form == ROW_PADDED:
        for r in range(bm):
            o[r] = vtree_pad(op, x[r * bn:r * bn + ncv], ncv, bn)
        return
    a = s[:bn]
    b = s[bn:2 * bn]
    p2 = _is_pow2(bn)
    if p2 and ncv == bn:
        for r in range(bm):
            o[r] = _tree_p2(op, x[r * bn:(r + 1) * bn], a, b, bn)
        return
    for r in range(bm):
        _copy(a[:ncv], x[r * bn:r * bn + ncv])
        _accinit(op, a[ncv:bn], is_float)
        if p2:
            o[r] = _tree_p2(op, a, b, a, bn)
        else:
            _tree(op, a, bn)
            o[r] = a[0]


@njit(**OPTS)
def _rowred_arg(op, o, x, bm, bn, ncv, c0, sv, si, is_float):
    for r in range(bm):
        _copy(sv[:ncv], x[r * bn:r * bn + ncv])
        _accinit(op, sv[ncv:bn], is_float)
        for j in range(bn):
            si[j] = c0 + j if j < ncv else 9223372036854775807
        _tree_arg(op, sv, si, bn)
        _fill(o[r * bn:(r + 1) * bn], si[0])


# --- column-major tiles: lane (r, k) at k*bm + r ----------------------------------------------
@njit(**OPTS)
def _acc_t(op, acc, x, bm, ncv):
    """The valid columns of a column-major tile are the prefix [0, ncv*bm): one flat combine."""
    n = ncv * bm
    _acc(op, acc[:n], x[:n], 1, n, n)


@njit(inline='always', **OPTS)
def _level_t(op, lo, hi):
    """lo[j] = lo[j] . hi[j] lane-wise (lo and hi do not overlap): one tree level over whole
    columns, and _acc's combine."""
    n = lo.shape[0]
    if op == R_SUM:
        for j in range(n):
            lo[j] = lo[j] + hi[j]
    elif op == R_PROD:
        for j in range(n):
            lo[j] = lo[j] * hi[j]
    elif op == R_MAX:
        for j in range(n):
            lo[j] = _fmax(lo[j], hi[j])
    else:
        for j in range(n):
            lo[j] = _fmin(lo[j], hi[j])


@njit(**OPTS)
def _tree_t(op, o, bm, bn):
    """The pairwise-halving tree over the bn columns of column-major tile o, in place (the same
    pairs and order as _tree; columns beyond the width keep the left operand). Row results end in
    o[:bm]."""
    width = bn
    p = 1
    while p < width:
        p *= 2
    while p > 1:
        h = p // 2
        m = width - h
        if m > 0:
            _level_t(op, o[:m * bm], o[h * bm:(h + m) * bm])
        width = h
        p = h


@njit(**OPTS)
def _bcast_t(o, bm, bn):
    """Column 0 (o[:bm]) copied to every column: a row-level value is a broadcast tile."""
    c0 = o[:bm]
    for k in range(1, bn):
        _copy(o[k * bm:(k + 1) * bm], c0)


@njit(**OPTS)
def _rfin_t(op, o, acc, bm, bn):
    """Compact result (row r at lane r, which is column 0 of a column-major tile)."""
    _copy(o, acc)
    _tree_t(op, o, bm, bn)


@njit(**OPTS)
def _rowred_t(op, o, x, bm, bn, ncv, is_float):
    """Single-tile reduction over the valid columns (identity elsewhere); compact result."""
    n = ncv * bm
    _copy(o[:n], x[:n])
    _accinit(op, o[n:bm * bn], is_float)
    _tree_t(op, o, bm, bn)
