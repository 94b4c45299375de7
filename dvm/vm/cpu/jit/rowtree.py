"""The row trees of f32 row-major tiles in vector registers (the PC_ROWTREE piece), and the tree
of a power-of-two row (tree_p2, inlined into row loops; tree_p2_sum, a call, for the fused tile runs).
Bitwise the staged loops of jit/reduce: the same combines in the same order (the spec's pairwise-
halving tree, docs/DECISIONS.md). f64 and i64 rows take the staged loops.
"""
from __future__ import annotations

import numpy as np
from numba import carray, njit

from ..abi import (DEC_OP, FR_ARGS, FR_C0, FR_R0, FUSED_RUN, M_BM, M_BN, M_COLS, M_ROWS, R_MAX, R_PROD, R_SUM,
                   ROWS_AT, RS_COMPACT, RS_FULL)
from . import frame as fm
from . import ops
from .addr import freg, row_addrs
from .bits import OPTS, ptr_f32, ptr_i64
from .fused.rowpart import levels_max, levels_sum, part_fits, rows_from_memory, touch_row
from .reduce import accinit, copy, is_pow2, tree
from .vtree import VTREE_MAX, vtree, vtree_n, vtree_pad


def _lvl3_of(f):
    """A loop d[k] = the first three tree levels over x[k + j*q], j < 8, combined by f in the
    tree's order (made per combine at import time: jit/ops.loop1)."""
    @njit(inline='always', **OPTS)
    def lvl3(d, x, q):
        for k in range(q):
            d[k] = f(f(f(x[k], x[k + 4 * q]), f(x[k + 2 * q], x[k + 6 * q])),
                     f(f(x[k + q], x[k + 5 * q]), f(x[k + 3 * q], x[k + 7 * q])))
    return lvl3


_LVL3_SUM, _LVL3_PROD, _LVL3_MAX, _LVL3_MIN = (_lvl3_of(f) for f in (ops.add, ops.mul, ops.maximum, ops.minimum))


@njit(inline='always', **OPTS)
def _lvl3(op, d, x, q):
    """Three tree levels of width 8q in one pass, in the tree's order."""
    if op == R_SUM:
        _LVL3_SUM(d, x, q)
    elif op == R_PROD:
        _LVL3_PROD(d, x, q)
    elif op == R_MAX:
        _LVL3_MAX(d, x, q)
    else:
        _LVL3_MIN(d, x, q)


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
def tree_p2(op, x, a, b, p):
    """The pairwise-halving tree over x[:p] (p a power of two): rows of up to VTREE_MAX lanes in
    vector registers (jit/vtree); wider ones first fuse up to three levels a pass (same order, so
    bitwise the same result) into scratch rows a, then b, of p lanes (a must not be x; b may be:
    x is read by the first pass only). Returns the reduced value. Inlined into the row loops, as
    straight-line passes between fixed arrays: swapped array variables in a loop and a call per
    level and per row make it several times slower than its loops."""
    if p < 16:
        copy(a[:p], x[:p])
        tree(op, a, p)
        return a[0]
    if p <= VTREE_MAX:
        return vtree(op, x, p)
    p = _stage(op, a, x, p)   # three levels, >= 128 lanes a loop (vectorized)
    if p <= VTREE_MAX:        # every row of up to MAX_BN = 4096 lanes
        return vtree(op, a, p)
    p = _stage(op, b, a, p)   # wider rows (a program may have up to program.MAX_TILE lanes a row)
    while p > VTREE_MAX:
        copy(a[:p], b[:p])
        p = _stage_call(op, b, a, p)
    return vtree(op, b, p)


@njit(**OPTS)
def tree_p2_sum(x, a, b, p):
    """tree_p2 of a sum (only its trees compiled), called per row by the fused tile runs."""
    return tree_p2(R_SUM, x, a, b, p)


@njit(**OPTS)
def _tree_p2_call(op, x, a, b, p):
    """tree_p2 as one compiled function (its trees once), for rows wider than ONE_STAGE_MAX, where
    a call per row costs nothing measurable."""
    return tree_p2(op, x, a, b, p)


ONE_STAGE_MAX = 8 * VTREE_MAX   # rows a staged pass brings into vector registers


@njit(inline='always', **OPTS)
def _tree_one_stage(op, x, a, p):
    """tree_p2 over x[:p] for VTREE_MAX < p <= ONE_STAGE_MAX (a power of two): its staged pass into
    scratch a (not x), then the register tree; the same combines in the same order. Inlined into
    rowred_at's row loops: a call per row (tree_p2's arrays passed) costs ~10 ns a 1024-lane row."""
    return vtree(op, a, _stage(op, a, x, p))


ROW_STAGED, ROW_P2, ROW_MASKED, ROW_PADDED = 0, 1, 2, 3   # row_form


@njit(**OPTS)
def row_form(bn, ncv):
    """How the row loops reduce rows of bn lanes, ncv valid. In registers, rows of up to
    VTREE_MAX lanes: ROW_P2 whole rows of a power of two from 16 (vtree), ROW_MASKED whole rows of
    any other width (vtree_n), ROW_PADDED partial rows of more than half a power of two from 16
    (vtree_pad: the lanes past ncv the identity, as the spec pads them, a single-tile row's
    case); else ROW_STAGED (copies, staged passes).
    The loops decide their form once, before the loop, and run one form per loop: the loop with
    every form's branches in it runs about twice as long a row."""
    if bn > VTREE_MAX:
        return ROW_STAGED
    if ncv == bn:
        return ROW_P2 if bn >= 16 and is_pow2(bn) else ROW_MASKED
    return ROW_PADDED if bn >= 16 and is_pow2(bn) and 2 * ncv > bn else ROW_STAGED


@njit(**OPTS)
def rowred_at(op, o, ra, nrv, bm, bn, ncv, s, touch):
    """The single-tile reduction of f32 rows read where they are: row r's ncv valid lanes at
    address ra[r] (r < nrv), padded with the identity to bn lanes as the spec pads them; compact
    result (row r's value in lane r of o). The rows from nrv to bm (a load's copies of the last
    valid row) get its result. s: scratch of 2*bn lanes. The form is decided once, before the
    row loop (row_form). touch: the rows are first touched, in order (fused/rowpart.touch_row:
    rows from memory; a tile's rows then wait in the L2 and the loops stay as they are)."""
    if touch:
        for r in range(nrv):
            touch_row(carray(ptr_f32(ra[r]), ncv), ncv)
    a = s[:bn]
    b = s[bn:2 * bn]
    p2 = is_pow2(bn)
    form = row_form(bn, ncv)
    if form == ROW_P2:
        for r in range(nrv):
            o[r] = vtree(op, carray(ptr_f32(ra[r]), bn), bn)
    elif form == ROW_MASKED:
        for r in range(nrv):
            o[r] = vtree_n(op, carray(ptr_f32(ra[r]), bn), bn)
    elif form == ROW_PADDED:
        for r in range(nrv):
            o[r] = vtree_pad(op, carray(ptr_f32(ra[r]), ncv), ncv, bn)
    elif p2 and ncv == bn and VTREE_MAX < bn <= ONE_STAGE_MAX:
        for r in range(nrv):
            o[r] = _tree_one_stage(op, carray(ptr_f32(ra[r]), bn), a, bn)
    elif p2 and ncv == bn:
        for r in range(nrv):
            o[r] = _tree_p2_call(op, carray(ptr_f32(ra[r]), bn), a, b, bn)
    elif p2 and part_fits(ncv, bn) and (op == R_SUM or op == R_MAX):
        q = bn // 8   # the padded row's first tree levels, from its valid lanes (fused/rowpart)
        lvl, la, lb = a[:q], b[:q], b[q:2 * q]
        z = np.float32(0.0)
        for r in range(nrv):
            if op == R_SUM:
                levels_sum(lvl, carray(ptr_f32(ra[r]), ncv), ncv, bn, z)
            else:
                levels_max(lvl, carray(ptr_f32(ra[r]), ncv), ncv, bn, z)
            o[r] = vtree(op, lvl, q) if q <= VTREE_MAX else _tree_p2_call(op, lvl, la, lb, q)
    elif p2 and VTREE_MAX < bn <= ONE_STAGE_MAX:
        for r in range(nrv):
            copy(a[:ncv], carray(ptr_f32(ra[r]), ncv))
            accinit(op, a[ncv:bn], np.bool_(True))
            o[r] = _tree_one_stage(op, a, b, bn)
    else:
        for r in range(nrv):
            copy(a[:ncv], carray(ptr_f32(ra[r]), ncv))
            accinit(op, a[ncv:bn], np.bool_(True))
            if p2:
                o[r] = _tree_p2_call(op, a, b, a, bn)
            else:
                tree(op, a, bn)
                o[r] = a[0]
    for r in range(nrv, bm):
        o[r] = o[nrv - 1]


@njit(inline='always', **OPTS)   # one call site
def _loadred(fr, pc, bm, bn, meta):
    """FK_LOADRED = (kind, 2, o, x, r, op) at pc: `load x, o ; rowred.op r, x` on the rows of f32
    operand o read where they are (unit column stride: addr.row_addrs), without the load's copy;
    the instructions done, 0 where the rows cannot be addressed (they then run one by one)."""
    fz, ix, st, fp = fm.fuse(fr), fm.ix(fr), fm.states(fr), fm.fptr(fr)
    j, x, r = fz[pc, 2], fz[pc, 3], fz[pc, 4]
    r0, c0 = fr[FR_R0], fr[FR_C0]
    nrows = min(bm, meta[M_ROWS] - r0)
    if not row_addrs(ix, j, fm.optab(fr), fm.dims(fr), meta, fm.addrs(fr), r0, c0, nrows):
        return 0
    rowred_at(fz[pc, 5], fm.bank_f(fr)[r], ix, nrows, bm, bn, min(bn, meta[M_COLS] - c0), fm.sf(fr),
              rows_from_memory(meta, 1))
    fp[x] = 0   # x is dead after the run (the plan checked): left as the load's
    st[0, x] = RS_FULL
    fp[r] = 0
    st[0, r] = RS_COMPACT
    return fz[pc, 1]


def rowtree_piece(fra, pc, n, unused):
    """PC_ROWTREE, f32 rows in vector registers: the row trees of instruction pc (a non-arg
    rowred over n = the tile's valid lanes, or rfin over n = BN) of a row-major tile; with
    n == FUSED_RUN the FK_LOADRED run at pc (the core calls fused runs with a = FUSED_RUN); with
    pc == ROWS_AT, rowred_at on the frame's FR_ARGS (op, address of o, of the row addresses, nrv,
    ncv, address of 2*BN lanes of scratch), for another fused run. Compact results."""
    fr = fm.frame(fra)
    meta = fm.meta(fr)
    bm, bn = meta[M_BM], meta[M_BN]
    if n == FUSED_RUN:
        return _loadred(fr, pc, bm, bn, meta)
    if pc == ROWS_AT:
        op, o, ra, nrv, ncv, s = (fr[FR_ARGS], fr[FR_ARGS + 1], fr[FR_ARGS + 2], fr[FR_ARGS + 3],
                                  fr[FR_ARGS + 4], fr[FR_ARGS + 5])
        rowred_at(op, carray(ptr_f32(o), bm), carray(ptr_i64(ra), nrv), nrv, bm, bn, ncv,
                  carray(ptr_f32(s), 2 * bn), False)   # (a register's rows: fused/tile's exp sums)
        return 0
    ins, dec = fm.instrs(fr), fm.decode(fr)
    F, fp, ra = fm.bank_f(fr), fm.fptr(fr), fm.ix(fr)
    x = freg(F, fp, ins[pc, 2]).ctypes.data
    for r in range(bm):
        ra[r] = x + 4 * r * bn
    rowred_at(dec[ins[pc, 0], DEC_OP], freg(F, fp, ins[pc, 1]), ra, bm, bm, bn, n, fm.sf(fr), False)   # in cache
    return 0
