"""The norms' row forms (FK_ROWNORM, planned by host/fuse_plan._row_norm): the whole norm one row
at a time, as jit/fused/rows describes; run_rownorm takes a tile or returns 0.
"""
from __future__ import annotations

import numpy as np
from numba import carray, njit

from ...abi import (DEC_GROUP, DT_BF16, DT_F32, G_LOAD, M_BM, M_BN, M_COLS, M_ROWS, NO_CAST, NO_SRC, R_SUM, RS_COMPACT,
                    RS_FULL)
from .. import ops
from ..addr import row_addrs_sized
from ..bits import OPTS, ptr_f32
from ..rowtree import tree_p2
from ..vtree import vtree, vtree_pad
from .common import add_row, add_terms, cached_row
from .rowchain import (NARROW_BLOCK_LANES, ROW_FORM_MIN_BN, apply_row_c, chain_ok, chain_rows, in_place_row,
                       rows_fit)
from .rowhalf import (add_half_terms, apply_rounded, round_row, row_f32, row_move, scale_rounded_bf16,
                      sum_rounded_bf16)
from .rowpart import levels_csqsum, levels_sum, rows_from_memory, touch_row
from .states import bracket


# cv, the 16-bit rows and roundings of a tile's norm (run_rownorm, _norm_rows): the dtypes (abi DT_*)
# of x's or a's rows (CV_A), of b's (CV_B), of the output (CV_Y); the stored sum's when it is
# written from x's f32 row (CV_Z, else -1), before x's rounding (CV_Z_RAW: the store is of the sum,
# not of its rounding); x's and the scale's rounding casts (CV_XROUND, CV_YROUND: T or -1); x's
# row copied into the scratch row from its operand (CV_COPY: 16-bit or rounded, not a residual);
# the later terms' of a residual sum (CV_T: one dtype for all, -1 without)
CV_A, CV_B, CV_Y, CV_Z, CV_Z_RAW, CV_XROUND, CV_YROUND, CV_COPY, CV_T = range(9)


@njit(**OPTS)
def _norm_rows(instrs, dec, F, st, rx, ry, nrows, bn, ncv, centered, s1, qa0, qa1, m, s2, qb0, qb1, rs,
               w, b, bias, ta, residual, ra, rb, terms, touch, cv, rz, sa, sb):
    """The rows [0, nrows) of the tile: row r's ncv valid lanes at rx[r], its output at ry[r].
    bn: a power of two >= ROW_FORM_MIN_BN (NARROW_MIN_BN for 16-bit rows or roundings) below
    2 * ncv (rows_fit); ta: bn-lane tree scratch. The row is read where it is (its trees' first
    levels by fused/rowpart, which pads as the tile form's trees do) and x - m is recomputed where
    it is used (the same f32 op, so the same bits): no padded copy, no centered copy. An RMSNorm's
    squares are (x - 0)^2, bitwise x * x. Each tree and loop appears once: every inlined copy costs
    compile time. residual: row r is first written to
    rx[r] as the sum of the rows at ra[r] and rb[r] and of the later terms (common.add_terms'
    nt, rt, bm, swaps); else, when touch, the row is first touched (fused/rowpart.touch_row: a row
    from memory). 16-bit rows and roundings (cv, from _rows_of): a 16-bit term is converted
    into the scratch row sa (a) or sb (b); x's row of a 16-bit operand (or one rounded) into rx[r]
    from ra[r]; the stored sum into rz[r] before or after x's rounding; a 16-bit output row is
    computed in sa and converted into ry[r]."""
    q = bn // 8
    lvl = ta[:q]
    la = ta[q:2 * q]
    lb = ta[2 * q:3 * q]
    z = np.float32(0.0)
    # a bfloat16 model's sum (rounded, stored in bfloat16 or not) and its RMSNorm's scale: one pass each
    sum_bf16 = residual and terms[0] == 0 and cv[CV_A] == DT_BF16 and cv[CV_B] == DT_BF16 and \
        cv[CV_XROUND] == DT_BF16 and (cv[CV_Z] == -1 or cv[CV_Z] == DT_BF16)
    scale_bf16 = cv[CV_Y] == DT_BF16 and cv[CV_YROUND] == DT_BF16 and not centered and not bias
    for r in range(nrows):
        xr = carray(ptr_f32(rx[r]), ncv)
        if sum_bf16:
            sum_rounded_bf16(xr, ra[r], rb[r], rz[r] if cv[CV_Z] >= 0 else 0)
        elif residual:
            a, bt = row_f32(ra[r], cv[CV_A], sa, ncv), row_f32(rb[r], cv[CV_B], sb, ncv)
            if terms[0] and cv[CV_T] == DT_F32:
                add_terms(xr, a, bt, r, *terms)
            else:
                add_row(xr, a, bt)
                if terms[0]:   # 16-bit terms: each through scratch row sa (a's row is read)
                    add_half_terms(xr, terms[0], terms[1], terms[2], r, terms[3], cv[CV_T], sa)
        elif cv[CV_COPY]:
            row_move(False, xr, ra[r], cv[CV_A])
        elif touch:
            touch_row(xr, ncv)
        if not sum_bf16:   # (which rounded and stored it)
            if cv[CV_Z] >= 0 and cv[CV_Z_RAW]:
                row_move(True, xr, rz[r], cv[CV_Z])
            if cv[CV_XROUND] >= 0:
                round_row(xr, cv[CV_XROUND])
            if cv[CV_Z] >= 0 and not cv[CV_Z_RAW]:
                row_move(True, xr, rz[r], cv[CV_Z])
        mv = z
        if centered:
            levels_sum(lvl, xr, ncv, bn, z)
            F[s1][r] = tree_p2(R_SUM, lvl, la, lb, q)
            chain_rows(instrs, dec, qa0, qa1, F, st, r, r + 1)
            mv = F[m][r]
        levels_csqsum(lvl, xr, ncv, bn, mv)
        F[s2][r] = tree_p2(R_SUM, lvl, la, lb, q)
        chain_rows(instrs, dec, qb0, qb1, F, st, r, r + 1)
        if scale_bf16:
            scale_rounded_bf16(ry[r], xr, F[rs][r], w)
            continue
        orow = carray(ptr_f32(ry[r] if cv[CV_Y] == DT_F32 else sa), ncv)
        if cv[CV_YROUND] >= 0:
            apply_rounded(orow, xr, mv, centered, F[rs][r], cv[CV_YROUND], w, b, ncv, bias)
        else:
            apply_row_c(orow, xr, mv, centered, F[rs][r], w, b, ncv, bias)
        if cv[CV_Y] != DT_F32:
            row_move(True, orow, ry[r], cv[CV_Y])


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
            chain_rows(instrs, dec, qa0, qa1, F, st, r0, r1)
        for r in range(r0, r1):
            xr = carray(ptr_f32(rx[r]), ncv)
            mv = F[m][r] if centered else z
            mb[r - r0] = mv
            for k in range(ncv):
                c = ops.sub(xr[k], mv)
                d[k] = ops.mul(c, c)
            F[s2][r] = vtree(R_SUM, d, bn)
        chain_rows(instrs, dec, qb0, qb1, F, st, r0, r1)
        for r in range(r0, r1):
            y = carray(ptr_f32(ry[r]), ncv)
            if rx[r] == ry[r]:   # (one array for both: the loop vectorizes, as it does not for two that overlap)
                apply_row_c(y, y, mb[r - r0], centered, F[rs][r], w, b, ncv, bias)
            else:
                apply_row_c(y, carray(ptr_f32(rx[r]), ncv), mb[r - r0], centered, F[rs][r], w, b, ncv, bias)


@njit(inline='always', **OPTS)   # one call site: a call would pass every view's fields per tile
def run_rownorm(pc, fz, instrs, dec, meta, dims, optab, addrs, numels, F, fp, aok, r0, ix, sf, si, si2, st):
    """FK_ROWNORM = (kind, n, x's operand, pc of the centering sub or -1 (RMSNorm), pc of the
    scale's FK_APPLY run, rs, w's and b's sources as FK_APPLY's, pc of x's rounding cast and of
    the scale's or NO_CAST): the whole norm row by row, its output rows written into the store's
    buffer. 0 when it cannot take the tile (nothing changed then but the scratch). x's operand < 0:
    x is the residual sum of the loads at pc and pc + 1 (add at pc + 2) and of each later (load,
    add) pair (host/fuse_plan._residual; their rows' addresses in si), its rows written into the
    buffer of the store at pc - 1 - that field, or into a scratch row when it is -1
    (host/fuse_plan._row_norm). 16-bit operands (x's, a and b, the output, the stored sum) and
    rounding casts: _norm_rows at every width rows_fit takes, converted through scratch rows; the
    later terms of a sum are of one dtype (16-bit ones converted one at a time)."""
    bm, bn = meta[M_BM], meta[M_BN]
    if not rows_fit(meta, aok):
        return 0
    n, cpc, apc, rs, ox, xc, yc = fz[pc, 1], fz[pc, 3], fz[pc, 4], fz[pc, 5], fz[pc, 2], fz[pc, 8], fz[pc, 9]
    residual = ox < 0
    x0 = pc + 3 if residual else pc + 1   # the first instruction after x's row
    while residual and dec[instrs[x0, 0], DEC_GROUP] == G_LOAD:   # a later term's load and add
        x0 += 2
    nt = (x0 - pc - 3) // 2
    if xc != NO_CAST:
        x0 = xc + 1
    ys = pc + n - 2 if ox < -1 and -1 - ox == n - 1 else pc + n - 1
    if residual and bm > bn:   # (ix: four BM-row address lists in its 2 * (BM + BN) entries)
        return 0
    centered = cpc >= 0
    if centered:   # rowred.sum s1, x ; chain A ; sub d, x, m ; mul t, d, d ; rowred.sum s2, t
        s1, qa0, qa1, m, s2, qb0 = instrs[x0, 1], x0 + 1, cpc, instrs[cpc, 3], instrs[cpc + 2, 1], cpc + 3
    else:          # mul t, x, x ; rowred.sum s2, t
        s1, qa0, qa1, m, s2, qb0 = -1, x0 + 2, x0 + 2, -1, instrs[x0 + 1, 1], x0 + 2
    if not chain_ok(instrs, dec, st, qa0, qa1, qb0, apc, s1, s2):
        return 0
    w, b = sf[2 * bn + bm:3 * bn + bm], sf[3 * bn + bm:4 * bn + bm]
    bias = fz[pc, 7] != NO_SRC
    pw = in_place_row(fz[pc, 6], optab, dims, meta, addrs, r0, ix)
    if pw != 0:
        w = carray(ptr_f32(pw), min(bn, meta[M_COLS]))
    elif not cached_row(w, 0, fz[pc, 6], apc, F, st, optab, dims, meta, addrs, numels, r0, 0, ix, aok):
        return 0
    pb = in_place_row(fz[pc, 7], optab, dims, meta, addrs, r0, ix) if bias else 0
    if pb != 0:
        b = carray(ptr_f32(pb), min(bn, meta[M_COLS]))
    elif bias and not cached_row(b, 1, fz[pc, 7], apc, F, st, optab, dims, meta, addrs, numels, r0, 0, ix, aok):
        return 0
    nrows = min(bm, meta[M_ROWS] - r0)
    rx, ry = ix[:bm], ix[bm:2 * bm]   # after the row vectors: their loads use ix
    ra, rb, rz = ix[2 * bm:3 * bm], ix[3 * bm:4 * bm], si2[:bm]
    cv = _rows_of(pc, ox, ys, xc, yc, nt, instrs, optab, dims, meta, addrs, r0, nrows, rx, ry, ra, rb, rz, si,
                  sf[4 * bn + bm:5 * bn + bm].ctypes.data)
    if cv[CV_A] < 0:
        return 0
    # 16-bit rows or roundings take the per-row form at any width (its conversions and roundings
    # are per row); f32 rows under ROW_FORM_MIN_BN lanes the narrow form, its sum into y's rows
    narrow = bn < ROW_FORM_MIN_BN and not (cv[CV_Z] >= 0 or cv[CV_YROUND] >= 0 or cv[CV_COPY] or cv[CV_A] != DT_F32
                                           or cv[CV_B] != DT_F32 or cv[CV_Y] != DT_F32
                                           or (cv[CV_T] >= 0 and cv[CV_T] != DT_F32))
    if narrow and residual and ox == -1:
        rx[:nrows] = ry[:nrows]
    swaps = 0
    for j in range(nt):
        swaps |= (instrs[pc + 4 + 2 * j, 2] == instrs[pc + 3 + 2 * j, 1]) << j
    terms = (nt, si, bm, swaps)
    bracket(fp, st, instrs, pc, n, RS_COMPACT)
    if narrow:
        _norm_rows_narrow(instrs, dec, F, st, rx, ry, nrows, bn, min(bn, meta[M_COLS]), centered, s1, qa0, qa1, m,
                          s2, qb0, apc, rs, w, b, bias, sf[:bn], sf[5 * bn + bm:6 * bn + bm], residual, ra, rb, terms)
    else:
        _norm_rows(instrs, dec, F, st, rx, ry, nrows, bn, min(bn, meta[M_COLS]), centered, s1, qa0, qa1, m, s2,
                   qb0, apc, rs, w, b, bias, sf[:bn], residual, ra, rb, terms, rows_from_memory(meta, 2), cv, rz,
                   np.int64(sf[bn:2 * bn].ctypes.data), np.int64(sf[5 * bn + bm:6 * bn + bm].ctypes.data))
    bracket(fp, st, instrs, pc, n, RS_FULL)
    return n


@njit(**OPTS)
def _rows_of(pc, ox, ys, xc, yc, nt, instrs, optab, dims, meta, addrs, r0, nrows, rx, ry, ra, rb, rz, si, scratch):
    """The rows' addresses for _norm_rows: rx (x's f32 rows: in place, in the stored sum's
    buffer or the scratch row at `scratch`), ry (the output's), ra and rb (a's and b's, or x's
    operand's when copied), rz (the stored sum's, written from the f32 row), si (the later terms');
    -> cv (a tuple, CV_A < 0 when the rows cannot be addressed so)."""
    no = (-1, -1, -1, -1, 0, -1, -1, 0, -1)
    bm, bn = meta[M_BM], meta[M_BN]
    xround = instrs[xc, 3] if xc != NO_CAST else -1
    yround = instrs[yc, 3] if yc != NO_CAST else -1
    if row_addrs_sized(ry, instrs[ys, 2], optab, dims, meta, addrs, r0, 0, nrows) == 0:
        return no
    ydt = optab[instrs[ys, 2], 2]
    if ox >= 0:   # x's load: its rows read in place, or copied into the scratch row (never rounded in its buffer)
        if row_addrs_sized(rx, ox, optab, dims, meta, addrs, r0, 0, nrows) == 0:
            return no
        xdt = optab[ox, 2]
        copy = xdt != DT_F32 or xround >= 0
        if copy and bm > bn:
            return no
        if copy:
            ra[:nrows] = rx[:nrows]
            rx[:nrows] = scratch
        return (xdt, DT_F32, ydt, -1, 0, xround, yround, 1 if copy else 0, -1)
    # add x, a, b: a's and b's rows in the add's order
    first = 0 if instrs[pc + 2, 2] == instrs[pc, 1] else 1
    oa, ob = instrs[pc + first, 2], instrs[pc + 1 - first, 2]
    if (row_addrs_sized(ra, oa, optab, dims, meta, addrs, r0, 0, nrows) == 0
            or row_addrs_sized(rb, ob, optab, dims, meta, addrs, r0, 0, nrows) == 0):
        return no
    zdt, zraw = -1, 0
    rx[:nrows] = scratch   # one scratch row (the softmax form's e row), reused by every row
    if ox < -1:   # the stored sum: x's rows written into its buffer, or from the scratch row
        st = pc - 1 - ox
        if row_addrs_sized(rz, instrs[st, 2], optab, dims, meta, addrs, r0, 0, nrows) == 0:
            return no
        if optab[instrs[st, 2], 2] == DT_F32 and xround < 0:
            rx[:nrows] = rz[:nrows]
        else:
            zdt = optab[instrs[st, 2], 2]
            zraw = 1 if xc == NO_CAST or instrs[st, 1] != instrs[xc, 1] else 0
    # the later terms' rows (si: 2 * BN entries, BM <= BN), of one dtype, none where the partial
    # sums go (aok: no output overlaps an input, as a kernel with reductions is never in place:
    # addr.in_place_pair)
    tdt = -1
    for j in range(nt):
        o = instrs[pc + 3 + 2 * j, 2]
        if (tdt >= 0 and optab[o, 2] != tdt) or \
                row_addrs_sized(si[j * bm:(j + 1) * bm], o, optab, dims, meta, addrs, r0, 0, nrows) == 0:
            return no
        tdt = optab[o, 2]
    return (optab[oa, 2], optab[ob, 2], ydt, zdt, zraw, xround, yround, 0, tdt)
