"""Norms and softmax one row at a time: the PC_FUSED_ROWS piece (FK_ROWNORM and FK_ROWSOFTMAX,
planned by host/fuse_plan._row_norm and _row_softmax).

The tile form of a LayerNorm makes 4-5 passes over its BM x BN tile (64 KB at 16x1024 f32: L2,
not L1): the load's copy, the row sum, the centered squares (their tile written), the scale and
affine. The row form takes each row from the operand's buffer (three passes for a LayerNorm: the
sum, the centered squares, the scale and affine; two for an RMSNorm: no copy of the row, which
stays in L1 after the first) and writes the output row straight into the store's buffer.

    load x, o ; rowred.sum s1, x ; chain A -> m ; sub d, x, m ; mul t, d, d ; rowred.sum s2, t
    (LayerNorm; RMSNorm: load x, o ; mul t, x, x ; rowred.sum s2, t) ; chain B -> rs ;
    y = ((d or x) * rs) * w [+ b] (an FK_APPLY run) ; store y

A residual sum may stand for the load: `load a ; load b ; add x, a, b`, optionally with
`store x` right after `store y` (host/fuse_plan._row_norm); each row of x is then first added
into the stored sum's buffer row, or into a scratch row, and read from there.

A chain is a few f32 add/sub/mul/div/sqrt/rsqrt/reciprocal on compact registers (the mean's
division, eps, rsqrt), replayed on each row's scalars: row r's value in lane r of its register,
as a compact register keeps it. Every other source of a chain is a compact or uniform register
the run does not write (checked by the plan; its state at run time by chain_ok).

    load x, o ; rowred.max m, x ; sub t, x, m ; exp e, t ; rowred.sum s, e ; chain -> r ;
    mul y, e, r (or div y, e, r) ; store y                                     (softmax)

The softmax row form reads the row from the buffer once and keeps exp(x - m) in a scratch row.
Each row takes the same f32 operations in the same order as the instructions (the reductions'
trees, the compact ops, ((d * rs) * w) + b), so the results are bitwise those of the tile form.
Both take a tile only when its outputs may be written in place (aok), its rows can be addressed
(f32 operands, unit column stride: addr.row_addrs) and BN is a power of two >= ROW_FORM_MIN_BN holding
the whole row, less than twice its length; otherwise they return 0 and the instructions run
(with their own fused runs). The norms also take rows of NARROW_MIN_BN to ROW_FORM_MIN_BN / 2
lanes (_norm_rows_narrow): their trees in vector registers, the chains replayed on a block of rows
at a time, where the per-row calls and chains of _norm_rows cost more than the tile form's passes.
The norms take float16 and bfloat16 operands too, with the rounding casts of a 16-bit model's
norm (jit/fused/rownorm, rowhalf: through f32 scratch rows, per row at every width).
"""
from __future__ import annotations

import numpy as np
from numba import carray, njit

from ...abi import (DEC_OP, FK_ROWNORM, FR_AOK, FR_C0, FR_R0, M_BM, M_BN, M_COLS, M_ROWS, OP_DIV, R_MAX, R_SUM,
                    RS_COMPACT, RS_FULL)
from .. import frame as fm
from .. import ops
from ..addr import row_addrs
from ..bits import OPTS, ptr_f32
from ..mathf import exp_into
from ..rowtree import tree_p2
from .rowchain import ROW_FORM_MIN_BN, center_row, chain_ok, chain_rows, rows_fit
from .rownorm import run_rownorm
from .rowpart import levels_max, levels_sum, rows_from_memory, touch_row
from .states import bracket


@njit(**OPTS)
def _softmax_rows(instrs, dec, F, st, rx, ry, nrows, bn, ncv, m, s, q0, q1, rr, div, ta, arow, erow, touch):
    """The rows [0, nrows) of the tile (rx, ry, bn, ncv as _norm_rows): m = the row's max,
    erow = exp(x - m) (arow: x - m, an operand exp must not overlap), s = its sum, the chain,
    then y = e * r (e / r when div). The trees' first levels read the row and erow where they
    are (fused/rowpart, as _norm_rows: a partial row's padded copy costs more); touch as _norm_rows."""
    q = bn // 8
    lvl, la, lb = ta[:q], ta[q:2 * q], ta[2 * q:3 * q]
    z = np.float32(0.0)
    for r in range(nrows):
        xr = carray(ptr_f32(rx[r]), ncv)
        if touch:
            touch_row(xr, ncv)
        levels_max(lvl, xr, ncv, bn, z)
        mv = tree_p2(R_MAX, lvl, la, lb, q)
        center_row(arow, xr, mv, ncv)
        F[m][r] = mv
        exp_into(erow, arow, ncv)   # the exp instruction's loop (jit/kernels: exp_into)
        levels_sum(lvl, erow, ncv, bn, z)
        F[s][r] = tree_p2(R_SUM, lvl, la, lb, q)
        chain_rows(instrs, dec, q0, q1, F, st, r, r + 1)
        rv = F[rr][r]
        orow = carray(ptr_f32(ry[r]), ncv)
        if div:
            for k in range(ncv):
                orow[k] = ops.div(erow[k], rv)
        else:
            for k in range(ncv):
                orow[k] = ops.mul(erow[k], rv)


@njit(inline='always', **OPTS)   # one call site: a call would pass every view's fields per tile
def _run_rowsoftmax(pc, fz, instrs, dec, meta, dims, optab, addrs, F, fp, aok, r0, ix, sf, st):
    """FK_ROWSOFTMAX = (kind, n, x's operand, pc of the final mul or div, r): the whole softmax
    row by row, its output rows written into the store's buffer. 0 when it cannot take the tile."""
    bm, bn = meta[M_BM], meta[M_BN]
    if not rows_fit(meta, aok) or bn < ROW_FORM_MIN_BN:
        return 0
    n, fpc, rr = fz[pc, 1], fz[pc, 3], fz[pc, 4]
    m, s = instrs[pc + 1, 1], instrs[pc + 4, 1]
    if not chain_ok(instrs, dec, st, pc + 5, pc + 5, pc + 5, fpc, m, s):
        return 0
    nrows = min(bm, meta[M_ROWS] - r0)
    rx, ry = ix[:bm], ix[bm:2 * bm]
    if not (row_addrs(rx, fz[pc, 2], optab, dims, meta, addrs, r0, 0, nrows)
            and row_addrs(ry, instrs[pc + n - 1, 2], optab, dims, meta, addrs, r0, 0, nrows)):
        return 0
    bracket(fp, st, instrs, pc, n, RS_COMPACT)
    _softmax_rows(instrs, dec, F, st, rx, ry, nrows, bn, min(bn, meta[M_COLS]), m, s, pc + 5, fpc, rr,
                  dec[instrs[fpc, 0], DEC_OP] == OP_DIV, sf[:bn], sf[5 * bn + bm:6 * bn + bm],
                  sf[4 * bn + bm:5 * bn + bm], rows_from_memory(meta, 2))
    bracket(fp, st, instrs, pc, n, RS_FULL)
    return n


def fused_rows_piece(fra, pc, unused_a, unused_b):
    """PC_FUSED_ROWS: the FK_ROWNORM or FK_ROWSOFTMAX run at pc over the tile at the frame's r0
    (its first column tile only); returns the instructions it did, 0 when it cannot take the
    tile (the instructions then run one by one)."""
    fr = fm.frame(fra)
    meta = fm.meta(fr)
    if fr[FR_C0] != 0 or not rows_fit(meta, fr[FR_AOK] != 0):
        return 0
    fz = fm.fuse(fr)
    ins, dec = fm.instrs(fr), fm.decode(fr)
    aok, r0 = fr[FR_AOK] != 0, fr[FR_R0]
    F, fp, ix, sf, st = fm.bank_f(fr), fm.fptr(fr), fm.ix(fr), fm.sf(fr), fm.states(fr)
    if fz[pc, 0] == FK_ROWNORM:
        return run_rownorm(pc, fz, ins, dec, meta, fm.dims(fr), fm.optab(fr), fm.addrs(fr), fm.numels(fr), F,
                           fp, aok, r0, ix, sf, fm.si(fr), fm.si2(fr), st)
    return _run_rowsoftmax(pc, fz, ins, dec, meta, fm.dims(fr), fm.optab(fr), fm.addrs(fr), F, fp, aok, r0, ix,
                           sf, st)
