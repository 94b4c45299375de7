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
the run does not write (checked by the plan; its state at run time by _chain_ok).

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
"""
from __future__ import annotations

import numpy as np
from numba import carray, njit

from ...abi import (CHAIN_OPS, DEC_GROUP, DEC_KIND, DEC_OP, DT_F32, FK_ROWNORM, FR_AOK, FR_C0, FR_R0, G_LOAD, K_BIN,
                    M_BM, M_BN, M_COLS, M_ROWS, NO_SRC, OP_DIV, OP_RECIP, OP_RSQRT, OP_SQRT, R_MAX, R_SUM,
                    RS_COMPACT, RS_FULL, RS_UNIFORM, RS_UNIFORM_ALL)
from .. import frame as fm
from .. import ops
from ..addr import row_addrs, row_uniform
from ..bits import NUMBA_INLINE, OPTS, ptr_f32
from ..mathf import exp_into
from ..reduce import is_pow2
from ..rowtree import tree_p2
from ..vtree import vtree, vtree_pad
from .common import add_row, add_terms, apply_row, cached_row
from .rowpart import levels_csqsum, levels_max, levels_sum, rows_from_memory, touch_row
from .states import bracket


@njit(inline=NUMBA_INLINE, **OPTS)   # as apply_row: the narrow-row LayerNorm's loop
def _apply_row_c(orow, xr, mv, centered, sv, w, b, n, bias):
    """apply_row of xr - mv when centered (the centering sub recomputed: the same bits)."""
    if not centered:
        apply_row(orow, xr, sv, w, b, n, bias)
    elif bias:
        for k in range(n):
            orow[k] = ops.add(ops.mul(ops.mul(ops.sub(xr[k], mv), sv), w[k]), b[k])
    else:
        for k in range(n):
            orow[k] = ops.mul(ops.mul(ops.sub(xr[k], mv), sv), w[k])


@njit(inline='always', **OPTS)
def _center(drow, xr, mv, n):
    """drow[:n] = xr[:n] - mv (drow does not overlap xr: the loop vectorizes)."""
    for k in range(n):
        drow[k] = ops.sub(xr[k], mv)


@njit(inline='always', **OPTS)
def _scalar_op(op, a, b):
    """One lane of a chain op (abi.CHAIN_OPS), as jit/ops defines it."""
    if op == OP_SQRT:
        return ops.sqrt(a)
    if op == OP_RSQRT:
        return ops.rsqrt(a)
    if op == OP_RECIP:
        return ops.reciprocal(a)
    return ops.binary(op, a, b)


@njit(inline='always', **OPTS)
def _internal(reg, instrs, r1, r2, q0, q1):
    """reg is written by the run before it is read: r1, r2 (its row sums) or a chain's dest."""
    if reg == r1 or reg == r2:
        return True
    for q in range(q0, q1):
        if instrs[q, 1] == reg:
            return True
    return False


@njit(**OPTS)
def _chain_ok(instrs, dec, st, qa0, qa1, qb0, qb1, r1, r2):
    """Every chain op is one _scalar_op does, and every source the run does not write is compact or
    uniform now."""
    for q in range(qa0, qb1):
        if qa1 <= q < qb0:
            continue
        op, kind = dec[instrs[q, 0], DEC_OP], dec[instrs[q, 0], DEC_KIND]
        ok = False
        for c in CHAIN_OPS:
            ok = ok or op == c
        if not ok:
            return False
        for f in range(2 if kind == K_BIN else 1):
            reg = instrs[q, 2 + f]
            if not (_internal(reg, instrs, r1, r2, qa0, qa1) or _internal(reg, instrs, r1, r2, qb0, qb1)):
                s = st[0, reg]
                if s != RS_COMPACT and s != RS_UNIFORM and s != RS_UNIFORM_ALL:
                    return False
    return True


@njit(**OPTS)
def _norm_rows(instrs, dec, F, st, rx, ry, nrows, bn, ncv, centered, s1, qa0, qa1, m, s2, qb0, qb1, rs,
               w, b, bias, ta, residual, ra, rb, terms, touch):
    """The rows [0, nrows) of the tile: row r's ncv valid lanes at rx[r], its output at ry[r].
    bn: a power of two >= ROW_FORM_MIN_BN below 2 * ncv (_rows_fit); ta: bn-lane tree scratch. The row is
    read where it is (its trees' first levels by fused/rowpart, which pads as the tile form's trees
    do) and x - m is recomputed where it is used (the same f32 op, so the same bits): no padded
    copy, no centered copy. An RMSNorm's squares are (x - 0)^2, bitwise x * x. Each tree and loop
    appears once: every inlined copy costs compile time. residual: row r is first written to
    rx[r] as the sum of the rows at ra[r] and rb[r] and of the later terms (common.add_terms'
    nt, rt, bm, swaps); else, when touch, the row is first touched (fused/rowpart.touch_row: a row
    from memory)."""
    q = bn // 8
    lvl = ta[:q]
    la = ta[q:2 * q]
    lb = ta[2 * q:3 * q]
    z = np.float32(0.0)
    for r in range(nrows):
        xr = carray(ptr_f32(rx[r]), ncv)
        if residual and terms[0]:
            add_terms(xr, carray(ptr_f32(ra[r]), ncv), carray(ptr_f32(rb[r]), ncv), r, *terms)
        elif residual:
            add_row(xr, carray(ptr_f32(ra[r]), ncv), carray(ptr_f32(rb[r]), ncv))
        elif touch:
            touch_row(xr, ncv)
        mv = z
        if centered:
            levels_sum(lvl, xr, ncv, bn, z)
            F[s1][r] = tree_p2(R_SUM, lvl, la, lb, q)
            _chain_rows(instrs, dec, qa0, qa1, F, st, r, r + 1)
            mv = F[m][r]
        levels_csqsum(lvl, xr, ncv, bn, mv)
        F[s2][r] = tree_p2(R_SUM, lvl, la, lb, q)
        _chain_rows(instrs, dec, qb0, qb1, F, st, r, r + 1)
        _apply_row_c(carray(ptr_f32(ry[r]), ncv), xr, mv, centered, F[rs][r], w, b, ncv, bias)


@njit(**OPTS)
def _chain_rows(instrs, dec, q0, q1, F, st, r0, r1):
    """The chain's compact ops on rows r0 to r1 (row r's values in lane r; lane 0 of a uniform
    source), an op at a time (decoded once for the rows). A call, not inlined: inlined into the
    row loops it makes LLVM's code for them worse."""
    for q in range(q0, q1):
        op, kind = dec[instrs[q, 0], DEC_OP], dec[instrs[q, 0], DEC_KIND]
        ra = instrs[q, 2]
        rb = instrs[q, 3] if kind == K_BIN else ra
        a, b, y = F[ra], F[rb], F[instrs[q, 1]]
        ca, cb = st[0, ra] == RS_COMPACT, st[0, rb] == RS_COMPACT
        for r in range(r0, r1):
            y[r] = _scalar_op(op, a[r] if ca else a[0], b[r] if cb else b[0])


@njit(**OPTS)
def _norm_rows_narrow(instrs, dec, F, st, rx, ry, nrows, bn, ncv, centered, s1, qa0, qa1, m, s2, qb0, qb1, rs,
                      w, b, bias, d, mb, residual, ra, rb, terms):
    """_norm_rows for rows of NARROW_MIN_BN to ROW_FORM_MIN_BN / 2 lanes: the row trees in vector
    registers (jit/vtree: of x's valid lanes, padded as the spec pads; of the centered squares in
    scratch row d, whose lanes past ncv hold +0.0, the sum's identity), and the chains replayed on
    a block of rows at a time: rows of NARROW_BLOCK_LANES in all, which the three passes find in
    L1; mb keeps the block's means (chain B may write m's register). A residual sum without a
    stored sum of its own is written into the output row (rx[r] == ry[r]) and normalized there.
    The same f32 operations in the same order as _norm_rows."""
    z = np.float32(0.0)
    for k in range(ncv, bn):
        d[k] = z
    blk = max(1, NARROW_BLOCK_LANES // bn)
    for r0 in range(0, nrows, blk):
        r1 = min(nrows, r0 + blk)
        if residual:
            for r in range(r0, r1):
                xr, xa, xb = carray(ptr_f32(rx[r]), ncv), carray(ptr_f32(ra[r]), ncv), carray(ptr_f32(rb[r]), ncv)
                if terms[0]:
                    add_terms(xr, xa, xb, r, *terms)
                else:
                    add_row(xr, xa, xb)
        if centered:
            for r in range(r0, r1):
                xr = carray(ptr_f32(rx[r]), ncv)
                F[s1][r] = vtree(R_SUM, xr, bn) if ncv == bn else vtree_pad(R_SUM, xr, ncv, bn)
            _chain_rows(instrs, dec, qa0, qa1, F, st, r0, r1)
        for r in range(r0, r1):
            xr = carray(ptr_f32(rx[r]), ncv)
            mv = F[m][r] if centered else z
            mb[r - r0] = mv
            for k in range(ncv):
                c = ops.sub(xr[k], mv)
                d[k] = ops.mul(c, c)
            F[s2][r] = vtree(R_SUM, d, bn)
        _chain_rows(instrs, dec, qb0, qb1, F, st, r0, r1)
        for r in range(r0, r1):
            y = carray(ptr_f32(ry[r]), ncv)
            if rx[r] == ry[r]:   # (one array for both: the loop vectorizes, as it does not for two that overlap)
                _apply_row_c(y, y, mb[r - r0], centered, F[rs][r], w, b, ncv, bias)
            else:
                _apply_row_c(y, carray(ptr_f32(rx[r]), ncv), mb[r - r0], centered, F[rs][r], w, b, ncv, bias)


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
        _center(arow, xr, mv, ncv)
        F[m][r] = mv
        exp_into(erow, arow, ncv)   # the exp instruction's loop (jit/kernels: exp_into)
        levels_sum(lvl, erow, ncv, bn, z)
        F[s][r] = tree_p2(R_SUM, lvl, la, lb, q)
        _chain_rows(instrs, dec, q0, q1, F, st, r, r + 1)
        rv = F[rr][r]
        orow = carray(ptr_f32(ry[r]), ncv)
        if div:
            for k in range(ncv):
                orow[k] = ops.div(erow[k], rv)
        else:
            for k in range(ncv):
                orow[k] = ops.mul(erow[k], rv)


@njit(inline='always', **OPTS)
def _in_place_row(src, optab, dims, meta, addrs, r0, ix):
    """The address of row vector operand src's row when the row forms may read it where it is
    (an f32 operand, row-uniform, unit column stride: only its first ncv lanes are read), else 0.
    Copying it into the scratch cache instead costs a launch as much as the norm of one such row.
    The caller's tile is aok (no output overlaps it)."""
    if src < 0 or optab[src, 2] != DT_F32 or not row_uniform(src, optab, meta):
        return 0
    if not row_addrs(ix[:1], src, optab, dims, meta, addrs, r0, 0, 1):
        return 0
    return ix[0]


ROW_FORM_MIN_BN = 512   # narrower rows run faster through the tile forms (the row form's per-row calls cost more)
# ... or, for the norms, in the narrow row form (_norm_rows_narrow) down to this many lanes (rows of
# 64 ran slower than in the tile form; rows of 512, as many as a 4096x512 norm's, too)
NARROW_MIN_BN = 128
NARROW_BLOCK_LANES = 2048   # the narrow form's block of rows (8 KiB of f32)


@njit(inline='always', **OPTS)
def _rows_fit(meta, aok):
    """The tile's rows are whole, BN is a power of two >= NARROW_MIN_BN (the softmax: ROW_FORM_MIN_BN)
    and less than twice the row (fused/rowpart and vtree_pad read rows of BN / 2 + 1 to BN lanes;
    the encoder's BN is the row's next power of two)."""
    bn, cols = meta[M_BN], meta[M_COLS]
    return aok and cols <= bn < 2 * cols and bn >= NARROW_MIN_BN and is_pow2(bn)


@njit(inline='always', **OPTS)   # one call site: a call would pass every view's fields per tile
def _run_rownorm(pc, fz, instrs, dec, meta, dims, optab, addrs, numels, F, fp, aok, r0, ix, sf, si, st):
    """FK_ROWNORM = (kind, n, x's operand, pc of the centering sub or -1 (RMSNorm), pc of the
    scale's FK_APPLY run, rs, w's and b's sources as FK_APPLY's): the whole norm row by row, its
    output rows written into the store's buffer. 0 when it cannot take the tile (nothing changed
    then but the scratch). x's operand < 0: x is the residual sum of the loads at pc and pc + 1
    (add at pc + 2) and of each later (load, add) pair (host/fuse_plan._residual; their rows'
    addresses in si), its rows written into the buffer of the store at pc - 1 - that field, or
    into a scratch row when it is -1 (host/fuse_plan._row_norm)."""
    bm, bn = meta[M_BM], meta[M_BN]
    if not _rows_fit(meta, aok):
        return 0
    n, cpc, apc, rs, ox = fz[pc, 1], fz[pc, 3], fz[pc, 4], fz[pc, 5], fz[pc, 2]
    residual = ox < 0
    x0 = pc + 3 if residual else pc + 1   # the first instruction after x's row
    while residual and dec[instrs[x0, 0], DEC_GROUP] == G_LOAD:   # a later term's load and add
        x0 += 2
    nt = (x0 - pc - 3) // 2
    ys = pc + n - 2 if ox < -1 and -1 - ox == n - 1 else pc + n - 1
    if residual and bm > bn:   # (ix: four BM-row address lists in its 2 * (BM + BN) entries)
        return 0
    centered = cpc >= 0
    if centered:   # rowred.sum s1, x ; chain A ; sub d, x, m ; mul t, d, d ; rowred.sum s2, t
        s1, qa0, qa1, m, s2, qb0 = instrs[x0, 1], x0 + 1, cpc, instrs[cpc, 3], instrs[cpc + 2, 1], cpc + 3
    else:          # mul t, x, x ; rowred.sum s2, t
        s1, qa0, qa1, m, s2, qb0 = -1, x0 + 2, x0 + 2, -1, instrs[x0 + 1, 1], x0 + 2
    if not _chain_ok(instrs, dec, st, qa0, qa1, qb0, apc, s1, s2):
        return 0
    w, b = sf[2 * bn + bm:3 * bn + bm], sf[3 * bn + bm:4 * bn + bm]
    bias = fz[pc, 7] != NO_SRC
    pw = _in_place_row(fz[pc, 6], optab, dims, meta, addrs, r0, ix)
    if pw != 0:
        w = carray(ptr_f32(pw), min(bn, meta[M_COLS]))
    elif not cached_row(w, 0, fz[pc, 6], apc, F, st, optab, dims, meta, addrs, numels, r0, 0, ix, aok):
        return 0
    pb = _in_place_row(fz[pc, 7], optab, dims, meta, addrs, r0, ix) if bias else 0
    if pb != 0:
        b = carray(ptr_f32(pb), min(bn, meta[M_COLS]))
    elif bias and not cached_row(b, 1, fz[pc, 7], apc, F, st, optab, dims, meta, addrs, numels, r0, 0, ix, aok):
        return 0
    nrows = min(bm, meta[M_ROWS] - r0)
    rx, ry = ix[:bm], ix[bm:2 * bm]   # after the row vectors: their loads use ix
    ra, rb = ix[2 * bm:3 * bm], ix[3 * bm:4 * bm]
    swaps = 0
    if not row_addrs(ry, instrs[ys, 2], optab, dims, meta, addrs, r0, 0, nrows):
        return 0
    if not residual:
        if not row_addrs(rx, ox, optab, dims, meta, addrs, r0, 0, nrows):
            return 0
    else:   # add x, a, b: a's and b's rows in the add's order
        first = 0 if instrs[pc + 2, 2] == instrs[pc, 1] else 1
        if not (row_addrs(ra, instrs[pc + first, 2], optab, dims, meta, addrs, r0, 0, nrows)
                and row_addrs(rb, instrs[pc + 1 - first, 2], optab, dims, meta, addrs, r0, 0, nrows)):
            return 0
        if ox < -1:   # x's rows into its store's buffer
            if not row_addrs(rx, instrs[pc - 1 - ox, 2], optab, dims, meta, addrs, r0, 0, nrows):
                return 0
        elif bn < ROW_FORM_MIN_BN:   # the narrow form's blocks of rows: into the output rows
            rx[:nrows] = ry[:nrows]
        else:         # one scratch row (the softmax form's e row), reused by every row
            rx[:nrows] = sf[4 * bn + bm:5 * bn + bm].ctypes.data
        # the later terms' rows (si: 2 * BN entries, BM <= BN), none where the partial sums go
        # (aok: no output overlaps an input, as a kernel with reductions is never in place:
        # addr.in_place_pair)
        for j in range(nt):
            q = pc + 3 + 2 * j
            if not row_addrs(si[j * bm:(j + 1) * bm], instrs[q, 2], optab, dims, meta, addrs, r0, 0, nrows):
                return 0
            swaps |= (instrs[q + 1, 2] == instrs[q, 1]) << j
    terms = (nt, si, bm, swaps)
    bracket(fp, st, instrs, pc, n, RS_COMPACT)
    if bn < ROW_FORM_MIN_BN:
        _norm_rows_narrow(instrs, dec, F, st, rx, ry, nrows, bn, min(bn, meta[M_COLS]), centered, s1, qa0, qa1, m,
                          s2, qb0, apc, rs, w, b, bias, sf[:bn], sf[5 * bn + bm:6 * bn + bm], residual, ra, rb, terms)
    else:
        _norm_rows(instrs, dec, F, st, rx, ry, nrows, bn, min(bn, meta[M_COLS]), centered, s1, qa0, qa1, m, s2,
                   qb0, apc, rs, w, b, bias, sf[:bn], residual, ra, rb, terms, rows_from_memory(meta, 2))
    bracket(fp, st, instrs, pc, n, RS_FULL)
    return n


@njit(inline='always', **OPTS)   # one call site: a call would pass every view's fields per tile
def _run_rowsoftmax(pc, fz, instrs, dec, meta, dims, optab, addrs, F, fp, aok, r0, ix, sf, st):
    """FK_ROWSOFTMAX = (kind, n, x's operand, pc of the final mul or div, r): the whole softmax
    row by row, its output rows written into the store's buffer. 0 when it cannot take the tile."""
    bm, bn = meta[M_BM], meta[M_BN]
    if not _rows_fit(meta, aok) or bn < ROW_FORM_MIN_BN:
        return 0
    n, fpc, rr = fz[pc, 1], fz[pc, 3], fz[pc, 4]
    m, s = instrs[pc + 1, 1], instrs[pc + 4, 1]
    if not _chain_ok(instrs, dec, st, pc + 5, pc + 5, pc + 5, fpc, m, s):
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
    if fr[FR_C0] != 0 or not _rows_fit(meta, fr[FR_AOK] != 0):
        return 0
    fz = fm.fuse(fr)
    ins, dec = fm.instrs(fr), fm.decode(fr)
    aok, r0 = fr[FR_AOK] != 0, fr[FR_R0]
    F, fp, ix, sf, st = fm.bank_f(fr), fm.fptr(fr), fm.ix(fr), fm.sf(fr), fm.states(fr)
    if fz[pc, 0] == FK_ROWNORM:
        return _run_rownorm(pc, fz, ins, dec, meta, fm.dims(fr), fm.optab(fr), fm.addrs(fr), fm.numels(fr), F,
                            fp, aok, r0, ix, sf, fm.si(fr), st)
    return _run_rowsoftmax(pc, fz, ins, dec, meta, fm.dims(fr), fm.optab(fr), fm.addrs(fr), F, fp, aok, r0, ix,
                           sf, st)
