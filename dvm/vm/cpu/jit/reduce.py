"""Reductions of the CPU VM (the PC_REDUCE piece): accumulate, the pairwise-halving tree, single-
tile row reductions, argmax/argmin, in both register layouts. The row trees of row-major tiles
run in vector registers in the PC_ROWTREE piece (jit/rowtree) once it is loaded; until then, and
for the forms it does not take, the staged loops here compute the same tree.

The tree order is part of the spec (docs/DECISIONS.md): every VM reduces a row's BN lanes with
the same pairwise-halving tree over the next power of two, so results do not depend on the
thread count or on how a VM lays a tile out in memory.

Two register layouts (the VM picks one per kernel, host/desc._transposed):
  row-major     lane (r, k) at r*BN + k (functions without suffix)
  column-major  lane (r, k) at k*BM + r (suffix _t): a tree level is one contiguous loop over
                the rows, and column-major operands load whole cache lines per column.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from ..abi import (BK_F32, BK_F64, BK_I64, DEC_BANK, DEC_GROUP, DEC_OP, FR_C0, FR_FIN, G_ACC, G_ACCINIT, G_ROWRED, M_BM,
                   M_BN, M_COLS, M_TL, PC_ROWTREE, R_ARGMAX, R_ARGMIN, R_MAX, R_MIN, R_PROD, R_SUM)
from . import frame as fm
from . import ops
from .addr import freg
from .bits import NUMBA_INLINE, OPTS


# --- reductions --------------------------------------------------------------------------------
@njit(**OPTS)
def combine(op, a, b):
    """The reductions' combine: sum, prod, max, min (jit/ops' add, mul, maximum, minimum)."""
    if op == R_SUM:
        return ops.add(a, b)
    if op == R_PROD:
        return ops.mul(a, b)
    if op == R_MAX:
        return ops.maximum(a, b)
    return ops.minimum(a, b)


@njit(inline='always', **OPTS)   # called per row: a call costs more than a short row's work
def fill(o, v):
    for i in range(o.shape[0]):
        o[i] = v


@njit(inline='always', **OPTS)   # called per row
def copy(o, a):
    for i in range(o.shape[0]):
        o[i] = a[i]


@njit(inline='always', **OPTS)   # called per row
def accinit(op, o, is_float):
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
        level(op, acc[:n], x[:n])
        return
    for r in range(bm):
        level(op, acc[r * bn:r * bn + ncv], x[r * bn:r * bn + ncv])


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
def tree(op, s, bn):
    """Pairwise-halving tree over s[:bn] (next power of two, identity padding); result in s[0]."""
    width = bn
    p = 1
    while p < width:
        p *= 2
    while p > 1:
        h = p // 2
        m = width - h
        if m > 0:
            level(op, s[:m], s[h:h + m])
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


@njit(**OPTS)
def is_pow2(n):
    return n > 0 and (n & (n - 1)) == 0


@njit(**OPTS)
def _rfin_arg(op, o, v, ix, bm, bn, sv, si):
    for r in range(bm):
        copy(sv[:bn], v[r * bn:(r + 1) * bn])
        copy(si[:bn], ix[r * bn:(r + 1) * bn])
        _tree_arg(op, sv, si, bn)
        fill(o[r * bn:(r + 1) * bn], si[0])


@njit(**OPTS)
def _rowred_arg(op, o, x, bm, bn, ncv, c0, sv, si, is_float):
    for r in range(bm):
        copy(sv[:ncv], x[r * bn:r * bn + ncv])
        accinit(op, sv[ncv:bn], is_float)
        for j in range(bn):
            si[j] = c0 + j if j < ncv else 9223372036854775807
        _tree_arg(op, sv, si, bn)
        fill(o[r * bn:(r + 1) * bn], si[0])


# --- column-major tiles: lane (r, k) at k*bm + r ----------------------------------------------
@njit(**OPTS)
def _acc_t(op, acc, x, bm, ncv):
    """The valid columns of a column-major tile are the prefix [0, ncv*bm): one flat combine."""
    n = ncv * bm
    _acc(op, acc[:n], x[:n], 1, n, n)


@njit(inline=NUMBA_INLINE, **OPTS)   # per row and per tree level: the row sums' loops slower inlined by LLVM
def level(op, lo, hi):
    """lo[j] = lo[j] . hi[j] lane-wise (lo and hi do not overlap): one tree level over whole
    columns, and _acc's combine."""
    n = lo.shape[0]
    if op == R_SUM:
        for j in range(n):
            lo[j] = ops.add(lo[j], hi[j])
    elif op == R_PROD:
        for j in range(n):
            lo[j] = ops.mul(lo[j], hi[j])
    elif op == R_MAX:
        for j in range(n):
            lo[j] = ops.maximum(lo[j], hi[j])
    else:
        for j in range(n):
            lo[j] = ops.minimum(lo[j], hi[j])


@njit(**OPTS)
def _tree_t(op, o, bm, bn):
    """The pairwise-halving tree over the bn columns of column-major tile o, in place (the same
    pairs and order as tree; columns beyond the width keep the left operand). Row results end in
    o[:bm]."""
    width = bn
    p = 1
    while p < width:
        p *= 2
    while p > 1:
        h = p // 2
        m = width - h
        if m > 0:
            level(op, o[:m * bm], o[h * bm:(h + m) * bm])
        width = h
        p = h


@njit(**OPTS)
def bcast_t(o, bm, bn):
    """Column 0 (o[:bm]) copied to every column: a row-level value is a broadcast tile."""
    c0 = o[:bm]
    for k in range(1, bn):
        copy(o[k * bm:(k + 1) * bm], c0)


@njit(**OPTS)
def _rfin_t(op, o, acc, bm, bn):
    """Compact result (row r at lane r, which is column 0 of a column-major tile)."""
    copy(o, acc)
    _tree_t(op, o, bm, bn)


@njit(**OPTS)
def _rowred_t(op, o, x, bm, bn, ncv, is_float):
    """Single-tile reduction over the valid columns (identity elsewhere); compact result."""
    n = ncv * bm
    copy(o[:n], x[:n])
    accinit(op, o[n:bm * bn], is_float)
    _tree_t(op, o, bm, bn)


@njit(**OPTS)
def rowred_staged(op, o, x, bm, bn, ncv, s, is_float):
    """Single-tile reduction of the row-major tile x over its ncv valid columns (the identity
    elsewhere, as the spec pads): the tree over a padded copy of each row in scratch s (bn lanes);
    compact result (row r's value in lane r). The PC_ROWTREE piece computes the same in vector
    registers."""
    a = s[:bn]
    for r in range(bm):
        copy(a[:ncv], x[r * bn:r * bn + ncv])
        accinit(op, a[ncv:bn], is_float)
        tree(op, a, bn)
        o[r] = a[0]


@njit(inline='always', **OPTS)   # one call site (reduce_piece): a call would pass every view's fields
def _red(g, op, bank, f1, f2, f3, F, D, I, B, fp, bm, bn, ncv, c0, sf, sd, si, si2, tl):
    """Instruction group g (accinit, acc, rowred, rfin) of reduction op on bank `bank`, except the
    row trees of non-arg rowred / rfin of row-major tiles (_row_trees). tl: column-major tiles
    (never for arg reductions, see host/desc._transposed)."""
    is_arg = op == R_ARGMAX or op == R_ARGMIN
    if g == G_ACCINIT:
        if bank == BK_F32:
            accinit(op, freg(F, fp, f1), bank == BK_F32)
        elif bank == BK_F64:
            accinit(op, D[f1], bank == BK_F64)
        else:
            accinit(op, I[f1], bank != BK_I64)
        if is_arg:
            I[f2][:] = 0
    elif g == G_ACC:
        if is_arg:
            if bank == BK_F32:
                _acc_arg(op, freg(F, fp, f1), I[f2], freg(F, fp, f3), bm, bn, ncv, c0)
            elif bank == BK_F64:
                _acc_arg(op, D[f1], I[f2], D[f3], bm, bn, ncv, c0)
            else:
                _acc_arg(op, I[f1], I[f2], I[f3], bm, bn, ncv, c0)
        elif tl:
            if bank == BK_F32:
                _acc_t(op, freg(F, fp, f1), freg(F, fp, f2), bm, ncv)
            elif bank == BK_F64:
                _acc_t(op, D[f1], D[f2], bm, ncv)
            else:
                _acc_t(op, I[f1], I[f2], bm, ncv)
        elif bank == BK_F32:
            _acc(op, freg(F, fp, f1), freg(F, fp, f2), bm, bn, ncv)
        elif bank == BK_F64:
            _acc(op, D[f1], D[f2], bm, bn, ncv)
        else:
            _acc(op, I[f1], I[f2], bm, bn, ncv)
    elif is_arg and g == G_ROWRED:
        if bank == BK_F32:
            _rowred_arg(op, I[f1], freg(F, fp, f2), bm, bn, ncv, c0, sf, si2, bank == BK_F32)
        elif bank == BK_F64:
            _rowred_arg(op, I[f1], D[f2], bm, bn, ncv, c0, sd, si2, bank == BK_F64)
        else:
            _rowred_arg(op, I[f1], I[f2], bm, bn, ncv, c0, si, si2, bank != BK_I64)
    elif is_arg:   # G_RFIN
        if bank == BK_F32:
            _rfin_arg(op, I[f1], freg(F, fp, f2), I[f3], bm, bn, sf, si2)
        elif bank == BK_F64:
            _rfin_arg(op, I[f1], D[f2], I[f3], bm, bn, sd, si2)
        else:
            _rfin_arg(op, I[f1], I[f2], I[f3], bm, bn, si, si2)
    elif tl and g == G_ROWRED:
        if bank == BK_F32:
            _rowred_t(op, freg(F, fp, f1), freg(F, fp, f2), bm, bn, ncv, bank == BK_F32)
        elif bank == BK_F64:
            _rowred_t(op, D[f1], D[f2], bm, bn, ncv, bank == BK_F64)
        else:
            _rowred_t(op, I[f1], I[f2], bm, bn, ncv, bank != BK_I64)
    elif tl:   # G_RFIN
        if bank == BK_F32:
            _rfin_t(op, freg(F, fp, f1), freg(F, fp, f2), bm, bn)
        elif bank == BK_F64:
            _rfin_t(op, D[f1], D[f2], bm, bn)
        else:
            _rfin_t(op, I[f1], I[f2], bm, bn)
    else:   # the row trees: a tile's ncv valid lanes (G_ROWRED), an accumulator's whole rows (G_RFIN)
        n = ncv if g == G_ROWRED else bn
        if bank == BK_F32:
            rowred_staged(op, freg(F, fp, f1), freg(F, fp, f2), bm, bn, n, sf, bank == BK_F32)
        elif bank == BK_F64:
            rowred_staged(op, D[f1], D[f2], bm, bn, n, sd, bank == BK_F64)
        else:
            rowred_staged(op, I[f1], I[f2], bm, bn, n, si, bank != BK_I64)


def reduce_piece(fra, pc, unused_a, unused_b):
    """PC_REDUCE: instruction pc (accinit, acc, rfin, rowred). The row trees of f32 row-major tiles
    go to PC_ROWTREE when it is loaded (it takes every such tree); the staged loops otherwise."""
    fr = fm.frame(fra)
    ins, dec, meta = fm.instrs(fr), fm.decode(fr), fm.meta(fr)
    opc = ins[pc, 0]
    g, op, bank = dec[opc, DEC_GROUP], dec[opc, DEC_OP], dec[opc, DEC_BANK]
    bm, bn, tl = meta[M_BM], meta[M_BN], meta[M_TL] != 0
    c0 = fr[FR_C0]
    ncv = 1 if fr[FR_FIN] != 0 else min(bn, meta[M_COLS] - c0)
    row_tree = (g != G_ACCINIT and g != G_ACC and not tl and op != R_ARGMAX and op != R_ARGMIN
                and bank == BK_F32)
    rowtree = fm.table(fr)[PC_ROWTREE]
    if row_tree and rowtree != 0:
        return fm.call_piece(rowtree, fra, pc, ncv if g == G_ROWRED else bn, 0)
    _red(g, op, bank, ins[pc, 1], ins[pc, 2], ins[pc, 3], fm.bank_f(fr), fm.bank_d(fr), fm.bank_i(fr),
         fm.bank_b(fr), fm.fptr(fr), bm, bn, ncv, c0, fm.sf(fr), fm.sd(fr), fm.si(fr), fm.si2(fr), tl)
    return 0
