"""The row trees of row-major tiles in vector registers (the PC_ROWTREE piece), and the tree of a
power-of-two row that the fused runs inline (tree_p2). Bitwise the staged loops of jit/reduce:
the same combines in the same order (the spec's pairwise-halving tree, docs/DECISIONS.md).
"""
from __future__ import annotations

from numba import njit

from ..abi import BK_F32, BK_F64, BK_I64, DEC_BANK, DEC_OP, M_BM, M_BN, R_MAX, R_PROD, R_SUM
from . import frame as fm
from . import ops
from .addr import freg
from .bits import OPTS
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
    level and per row made it ~4x slower than its loops (1024 lanes: 136 -> 37 ns)."""
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


ROW_STAGED, ROW_P2, ROW_MASKED, ROW_PADDED = 0, 1, 2, 3   # row_form


@njit(**OPTS)
def row_form(bn, ncv):
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
        return ROW_P2 if bn >= 16 and is_pow2(bn) else ROW_MASKED
    return ROW_PADDED if bn >= 16 and is_pow2(bn) and 2 * ncv > bn else ROW_STAGED


@njit(**OPTS)
def rowred(op, o, x, bm, bn, ncv, s, is_float):
    """Single-tile reduction of x over its valid columns (identity elsewhere); compact result
    (row r's value in lane r). s: scratch of 2*bn lanes."""
    form = row_form(bn, ncv)
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
    p2 = is_pow2(bn)
    if p2 and ncv == bn:
        for r in range(bm):
            o[r] = tree_p2(op, x[r * bn:(r + 1) * bn], a, b, bn)
        return
    for r in range(bm):
        copy(a[:ncv], x[r * bn:r * bn + ncv])
        accinit(op, a[ncv:bn], is_float)
        if p2:
            o[r] = tree_p2(op, a, b, a, bn)
        else:
            tree(op, a, bn)
            o[r] = a[0]


def rowtree_piece(fra, pc, n, unused):
    """PC_ROWTREE: the row trees of instruction pc (a non-arg rowred over n = the tile's valid
    lanes, or rfin over n = BN) of a row-major tile, any bank; compact result."""
    fr = fm.frame(fra)
    ins, dec, meta = fm.instrs(fr), fm.decode(fr), fm.meta(fr)
    opc = ins[pc, 0]
    op, bank = dec[opc, DEC_OP], dec[opc, DEC_BANK]
    f1, f2 = ins[pc, 1], ins[pc, 2]
    bm, bn = meta[M_BM], meta[M_BN]
    if bank == BK_F32:
        F, fp = fm.bank_f(fr), fm.fptr(fr)
        rowred(op, freg(F, fp, f1), freg(F, fp, f2), bm, bn, n, fm.sf(fr), bank == BK_F32)
    elif bank == BK_F64:
        D = fm.bank_d(fr)
        rowred(op, D[f1], D[f2], bm, bn, n, fm.sd(fr), bank == BK_F64)
    else:
        I = fm.bank_i(fr)
        rowred(op, I[f1], I[f2], bm, bn, n, fm.si(fr), bank != BK_I64)
    return 0
