"""Fused instruction runs of the CPU VM (the PC_FUSED_TILE piece): a few instructions executed in
one pass over the tile.

A full-tile f32 op costs one pass that stores 16 KB (at BM*BN = 4096 lanes) and is bound by the
core's store rate, so a normalisation's 7-9 passes per tile, not its arithmetic, set its speed.
host/fuse_plan.py finds these runs in a kernel once (statically); fused_tile_piece executes one when
the registers are in the expected states at run time, else the instructions run one by one.
Each run does the same f32 operations in the same order as its instructions (the tree order of
the reduction included), so results are bitwise identical; registers the run would only pass
through are dead after it (checked by the plan), so they are not written.

  FK_SQSUM   mul t, x, x ; rowred.sum r, t                    r = sum of squares (RMSNorm)
  FK_CSQSUM  sub d, x, m ; mul t, d, d ; rowred.sum r, t      d = x - m, r = sum of d^2 (LayerNorm)
  FK_EXPSUM  sub t, x, m ; exp e, t ; rowred.sum r, e        e = exp(x - m), r = sum of e (softmax)
  FK_APPLY   mul y, x, s ; [load w] ; mul y, y, w ; [load b] ; [add y, y, b]
             y = ((x * s) * w) + b for a compact s and row vectors w, b (a norm's scale and affine);
             mul and add are commutative, so their operands may come in either order
  FK_LOADRED load x, o ; rowred.op r, x                       r = sum/prod/max/min of each row of
             operand o, read in place: no tile copy (jit/rowtree: PC_ROWTREE)
  FK_LOADACC load x, o ; acc.op +a, x                         a = a op x, lane-wise, for a
             tile read from operand o's rows (row-major) or columns (column-major: contiguous
             runs at any distance, as in a sum over axis 0 split into row blocks) without the
             load's copy
  FK_CSQACC  sub d, x, m ; mul t, d, d ; acc.sum +a, t        a += (x - m)^2 lane-wise (a LayerNorm's
             variance over the sweeps of long rows; d and t are dead after)
  FK_UNBIN   un t, x ; [load z, o] ; bin y, t, z                y = B(U(x), z) for a math op U (or
             an add, sub or mul of x and a constant c) and an add, sub or mul B, t dead after
             (jit/fused/unbin; 16-bit loads and store: jit/fused/unbinhalf)
  FK_ADDSUM  add h, a, b ; rowred.sum s, h                    h = a + b, s = each row's sum, read
             back while the row is in L1 (whole rows of 16 to VTREE_MAX lanes, a power of two:
             the rowred's own register tree); h goes where the add's would (peep: PEEP_LATER)
  FK_ROWNORM a LayerNorm or RMSNorm, FK_ROWSOFTMAX a softmax, from the load to the store, one
             row at a time (jit/fused/rows: PC_FUSED_ROWS); the runs inside keep their own plan entries, for the
             tiles the row forms cannot take

x full, m and s compact, row-major tiles of BN >= 128 lanes (a power of two for the sums; FK_LOADRED,
FK_CSQACC take any BN, FK_LOADACC any BN and either layout). Scratch: sf holds SF_ROWS*BN + BM
lanes: two tree rows, a copy of s (BM lanes), then w, b and the two rows of the row forms.
w and b stay there across the tiles of a launch (a norm's weight and bias are the same row at
every row block): st[ST_CACHE] tags them with the run's pc and the tile's c0, set only for
operands loaded from a buffer that no output of the launch overlaps (aok).
"""
from __future__ import annotations

import numpy as np
from numba import carray, njit

from ...abi import (FK_ADDSUM, FK_UNBIN, DT_F32, FK_APPLY, FK_CSQACC, FK_EXPSUM, FK_LOADACC, FK_SQSUM, FR_AOK,
                    FR_ARGS, FR_C0, FR_R0, M_BM, M_BN, M_COLS, M_NC, M_NR, M_ROWS, M_TL, NO_SRC, OPTAB_FIXED,
                    PC_ROWTREE, ROWS_AT, PEEP_LATER, RS_COMPACT, RS_FULL, R_SUM)
from .. import frame as fm
from .. import ops
from ..addr import col_uniform, direct_addr, freg, row_addrs
from ..bits import OPTS, ptr_f32
from ..mathf import exp_into
from ..reduce import combine, is_pow2, level
from ..frame import call_piece
from ..rowtree import tree_p2_sum
from ..vtree import VTREE_MAX, vtree
from .common import apply_row, cached_row, sq_level
from .unbin import run_unbin
from .unbinhalf import run_unbin_half, takes_half


@njit(**OPTS)
def _sqsum_rows(o, x, m, dout, bm, bn, ncv, s, centered):
    """All f32 (a float64 constant here would promote the squares to float64 and change results).
    o[r] = the tree sum over row r's valid lanes of (x - m[r])^2 (centered) or x^2, the first
    tree level (eight lanes per output) fused with the squares; dout = x - m[r] on every lane
    when centered. bn: a power of two >= 128; s: 2*bn lanes of scratch (3*bn/8 for the tree, the
    second bn-lane row for a partial row's padded copy). The level reads one row by
    index: eight row slices instead make LLVM give up vectorizing."""
    q = bn // 8
    lvl = s[:q]
    ta = s[q:2 * q]
    tb = s[2 * q:3 * q]
    pad = s[bn:2 * bn]
    for r in range(bm):
        xr = x[r * bn:(r + 1) * bn]
        if centered:
            mv = m[r]
            dr = dout[r * bn:(r + 1) * bn]
            for k in range(bn):
                dr[k] = ops.sub(xr[k], mv)
            sq_level(lvl, dr, q, ncv, bn, pad)
        else:
            sq_level(lvl, xr, q, ncv, bn, pad)
        o[r] = tree_p2_sum(lvl, ta, tb, q)


@njit(**OPTS)
def _expsum_rows(x, m, e, bm, bn, s):
    """e = exp(x - m[r]) on every lane of row r (one pass for the sub and the exp). x - m goes
    through scratch row s[:bn]: e is often x's register, and a loop whose output may alias its
    input does not vectorize."""
    a = s[:bn]
    for r in range(bm):
        mv = m[r]
        xr = x[r * bn:(r + 1) * bn]
        er = e[r * bn:(r + 1) * bn]
        for k in range(bn):
            a[k] = ops.sub(xr[k], mv)
        exp_into(er, a, bn)


@njit(**OPTS)
def _rows_reduce(fra, fr, rowtree, op, o, ra, nrv, ncv, s):
    """rowtree.rowred_at through the PC_ROWTREE piece (address rowtree): o = the reductions of the
    nrv f32 rows at addresses ra[:nrv] (ncv valid lanes each) of a BN-lane tile."""
    fr[FR_ARGS], fr[FR_ARGS + 1], fr[FR_ARGS + 2] = op, o.ctypes.data, ra.ctypes.data
    fr[FR_ARGS + 3], fr[FR_ARGS + 4], fr[FR_ARGS + 5] = nrv, ncv, s.ctypes.data
    call_piece(rowtree, fra, ROWS_AT, 0, 0)


@njit(**OPTS)
def _apply_rows(o, x, s, w, b, bm, bn, bias):
    """o = ((x * s[r]) * w) + b per row r (without `+ b` unless bias)."""
    for r in range(bm):
        apply_row(o[r * bn:(r + 1) * bn], x[r * bn:(r + 1) * bn], s[r], w, b, bn, bias)


@njit(**OPTS)
def _apply_to_rows(ra, x, s, w, b, nrows, ncv, bn, bias):
    """_apply_rows straight into a buffer: row r's ncv valid lanes at address ra[r] (the store
    it replaces, for tiles _direct_addr cannot alias: partial, or rows not back to back)."""
    for r in range(nrows):
        apply_row(carray(ptr_f32(ra[r]), ncv), x[r * bn:r * bn + ncv], s[r], w, b, ncv, bias)


@njit(inline='always', **OPTS)   # one call site: a call would pass every view's fields per tile
def _run_loadacc(pc, fz, meta, dims, optab, addrs, F, fp, r0, c0, ix, st):
    """FK_LOADACC = (kind, 2, o, x, a, op): the load's tile combined into a from the buffer, for an
    f32 operand with one column dim: row by row (row-major tiles, unit column stride: _row_addrs)
    or column by column (column-major tiles, one row dim of unit stride: column k is the run at
    row r0 of the operand's column c0 + k). The valid columns only, as _acc and _acc_t combine
    them; the load's clamped rows (copies of the last valid row) are combined too, so a ends as
    the two instructions leave it. 0 when it cannot take the tile."""
    j, x, a, op = fz[pc, 2], fz[pc, 3], fz[pc, 4], fz[pc, 5]
    if optab[j, 2] != DT_F32 or col_uniform(j, optab, meta) or st[0, a] != RS_FULL or fp[a] != 0:
        return 0
    bm, bn = meta[M_BM], meta[M_BN]
    nrv = min(bm, meta[M_ROWS] - r0)
    ncv = min(bn, meta[M_COLS] - c0)
    acc = F[a]
    if meta[M_TL] == 0:
        if not row_addrs(ix, j, optab, dims, meta, addrs, r0, c0, nrv):
            return 0
        for r in range(bm):
            level(op, acc[r * bn:r * bn + ncv], carray(ptr_f32(ix[min(r, nrv - 1)]), ncv))
    else:
        if meta[M_NR] != 1 or meta[M_NC] != 1 or optab[j, OPTAB_FIXED] != 1:
            return 0
        base = addrs[optab[j, 1]] + 4 * (optab[j, 3] + r0)
        if optab[j, OPTAB_FIXED + 1] == bm and nrv == bm:   # the columns back to back: one flat combine
            level(op, acc[:ncv * bm], carray(ptr_f32(base + 4 * c0 * bm), ncv * bm))
            ncv = 0
        for k in range(ncv):
            col = carray(ptr_f32(base + 4 * (c0 + k) * optab[j, OPTAB_FIXED + 1]), nrv)
            level(op, acc[k * bm:k * bm + nrv], col)
            v = col[nrv - 1]
            for i in range(k * bm + nrv, (k + 1) * bm):
                acc[i] = combine(op, acc[i], v)
    fp[x] = 0   # x is dead after the run (the plan checked): left as the load's
    st[0, x] = RS_FULL
    return 2


@njit(**OPTS)
def _add_sum_rows(h, a, b, o, bm, bn):
    """h = a + b on every lane; o[r] = the register tree's sum of row r of h, read right after
    the row is written (rowred.sum's own tree over a whole power-of-two row: the same bits)."""
    for r in range(bm):
        hr = h[r * bn:(r + 1) * bn]
        ar = a[r * bn:(r + 1) * bn]
        br = b[r * bn:(r + 1) * bn]
        for k in range(bn):
            hr[k] = ops.add(ar[k], br[k])
        o[r] = vtree(R_SUM, hr, bn)


@njit(inline='always', **OPTS)   # one call site: a call would pass every view's fields per tile
def _run_addsum(pc, fz, fr, meta, F, fp, st, optab, dims, addrs, r0, c0, aok, sf):
    """FK_ADDSUM = (kind, 2, a, b, h, s) on whole rows (BN a power of two from 16 to VTREE_MAX, all
    valid) of full tiles a and b; 0 when it cannot take the tile."""
    a, b, h, s = fz[pc, 2], fz[pc, 3], fz[pc, 4], fz[pc, 5]
    bm, bn = meta[M_BM], meta[M_BN]
    if st[0, a] != RS_FULL or st[0, b] != RS_FULL or bn < 16 or bn > VTREE_MAX or not is_pow2(bn) or \
            meta[M_COLS] - c0 < bn:
        return 0
    av, bv = freg(F, fp, a), freg(F, fp, b)   # before h's and s's pointers change
    pj = fm.peep(fr)[pc]   # as the add's own dispatch (jit/interp): written into a later store's tile
    fp[h] = direct_addr(PEEP_LATER - pj, optab, dims, meta, addrs, r0, c0) if aok and pj <= PEEP_LATER else 0
    sums = sf[2 * bn:2 * bn + bm]   # s may be a's or b's register
    _add_sum_rows(freg(F, fp, h), av, bv, sums, bm, bn)
    st[0, h] = RS_FULL
    fp[s] = 0
    F[s][:bm] = sums
    st[0, s] = RS_COMPACT
    return 2


@njit(inline='always', **OPTS)
def _csq_acc(acc, x, mv):
    """acc += (x - mv)^2, lane-wise (the sub's, the mul's and the acc's f32 roundings)."""
    for k in range(acc.shape[0]):
        d = ops.sub(x[k], mv)
        acc[k] = ops.add(acc[k], ops.mul(d, d))


def fused_tile_piece(fra, pc, unused_a, unused_b):
    """PC_FUSED_TILE: the fused run at pc (any kind but FK_LOADRED and the row forms) on the frame's
    tile when its registers are in the expected states; returns how many instructions it did (a
    trailing store written in place included), 0 if it did nothing. st[0, reg]: the f32 register
    states (abi.RS_*)."""
    fr = fm.frame(fra)
    fz, meta = fm.fuse(fr), fm.meta(fr)
    kind = fz[pc, 0]
    r0, c0, aok = fr[FR_R0], fr[FR_C0], fr[FR_AOK] != 0
    F, fp, st, ix = fm.bank_f(fr), fm.fptr(fr), fm.states(fr), fm.ix(fr)
    optab, dims, addrs = fm.optab(fr), fm.dims(fr), fm.addrs(fr)
    if kind == FK_LOADACC:
        return _run_loadacc(pc, fz, meta, dims, optab, addrs, F, fp, r0, c0, ix, st)
    if meta[M_TL] != 0:
        return 0
    if kind == FK_UNBIN:
        done = run_unbin_half(fr, pc, fz, meta, F, fp, st, optab, dims, addrs, r0, c0) \
            if takes_half(fz, pc, optab) else 0
        return done if done else run_unbin(fr, pc, fz, meta, F, fp, st, optab, dims, addrs, r0, c0, aok)
    bm, bn = meta[M_BM], meta[M_BN]
    n = fz[pc, 1]
    sf = fm.sf(fr)
    if kind == FK_ADDSUM:
        return _run_addsum(pc, fz, fr, meta, F, fp, st, optab, dims, addrs, r0, c0, aok, sf)
    if kind == FK_CSQACC:   # the valid columns of every row, as _acc combines them
        x, m, a, d, t = fz[pc, 2], fz[pc, 3], fz[pc, 4], fz[pc, 5], fz[pc, 6]
        if st[0, x] != RS_FULL or st[0, m] != RS_COMPACT or st[0, a] != RS_FULL or fp[a] != 0:
            return 0
        ncv = min(bn, meta[M_COLS] - c0)
        xv, mv, acc = freg(F, fp, x), freg(F, fp, m), F[a]
        for r in range(bm):
            _csq_acc(acc[r * bn:r * bn + ncv], xv[r * bn:r * bn + ncv], mv[r])
        fp[d] = 0   # d and t are dead after the run (the plan checked): left as full tiles
        st[0, d] = RS_FULL
        fp[t] = 0
        st[0, t] = RS_FULL
        return n
    if kind == FK_APPLY:
        x, s, y = fz[pc, 2], fz[pc, 3], fz[pc, 6]
        if st[0, x] == RS_COMPACT and st[0, s] == RS_FULL:   # mul is commutative: x is the full operand
            x, s = s, x
        if st[0, x] != RS_FULL or st[0, s] != RS_COMPACT:
            return 0
        w, b = sf[2 * bn + bm:3 * bn + bm], sf[3 * bn + bm:4 * bn + bm]
        bias = fz[pc, 5] != NO_SRC
        if not cached_row(w, 0, fz[pc, 4], pc, F, st, optab, dims, meta, addrs, fm.numels(fr), r0, c0, ix, aok):
            return 0
        if bias and not cached_row(b, 1, fz[pc, 5], pc, F, st, optab, dims, meta, addrs, fm.numels(fr), r0, c0, ix,
                                    aok):
            return 0
        last = pc + n - 1
        j = fm.peep(fr)[last]   # >= 0: y is read by nothing but the store after the run
        p = direct_addr(j, optab, dims, meta, addrs, r0, c0) if aok and j >= 0 else 0
        nrows = min(bm, meta[M_ROWS] - r0)
        rows = p == 0 and aok and j >= 0 and row_addrs(ix, j, optab, dims, meta, addrs, r0, c0, nrows)
        if y == x and p == 0 and not rows and fp[x] == 0:   # in place: the loop would not vectorize
            return 0
        sv = sf[2 * bn:2 * bn + bm]   # a copy: y may be s's register
        sv[:] = freg(F, fp, s)[:bm]
        xv = freg(F, fp, x)
        fp[y] = p
        st[0, y] = RS_FULL
        if rows:
            _apply_to_rows(ix, xv, sv, w, b, nrows, min(bn, meta[M_COLS] - c0), bn, bias)
        else:
            _apply_rows(freg(F, fp, y), xv, sv, w, b, bm, bn, bias)
        return n + 1 if p != 0 or rows else n
    rowtree = fm.table(fr)[PC_ROWTREE]
    x = fz[pc, 2]
    if st[0, x] != RS_FULL or bn < 128 or not is_pow2(bn):
        return 0
    ncv = min(bn, meta[M_COLS] - c0)
    if kind == FK_EXPSUM:
        m, e, r = fz[pc, 3], fz[pc, 4], fz[pc, 6]
        if st[0, m] != RS_COMPACT or rowtree == 0:
            return 0
        xv = freg(F, fp, x)
        fp[e] = 0
        st[0, e] = RS_FULL
        ev = F[e]
        _expsum_rows(xv, F[m], ev, bm, bn, sf)
        for row in range(bm):
            ix[row] = ev.ctypes.data + 4 * row * bn
        _rows_reduce(fra, fr, rowtree, R_SUM, F[r], ix, bm, ncv, sf)
        fp[r] = 0
    elif kind == FK_SQSUM:
        r = fz[pc, 3]
        xv = freg(F, fp, x)
        fp[r] = 0
        _sqsum_rows(F[r], xv, xv, xv, bm, bn, ncv, sf, np.bool_(False))   # typed: one compiled copy
    else:
        m, d, r = fz[pc, 3], fz[pc, 4], fz[pc, 6]
        if st[0, m] != RS_COMPACT:
            return 0
        xv = freg(F, fp, x)
        mv = freg(F, fp, m)
        fp[d] = 0
        st[0, d] = RS_FULL
        _sqsum_rows(F[r], xv, mv, F[d], bm, bn, ncv, sf, np.bool_(True))
        fp[r] = 0
    st[0, r] = RS_COMPACT
    return n
