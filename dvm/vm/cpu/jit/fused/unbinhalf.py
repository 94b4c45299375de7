"""FK_UNBIN over 16-bit operands (jit/fused/unbin's run where x's load, z's load or y's store is a
float16 or bfloat16 operand: a bfloat16 model's SiLU(gate) * up, a scaled residual).

The tile form converts every 16-bit operand into an f32 register in a pass of its own, runs the
two instructions as two more passes and converts y out in a fifth. Here the tile's rows are read
and written where they lie, up to CHUNK lanes at a time (whole rows, or a long row's pieces): x's
and z's lanes converted into scratch in L1 (t's tile, never written otherwise), y = B(U(x), z) by
unbin's own loops, y rounded into its store's rows. Every
lane goes through the conversions of jit/bits that the loads and stores use and the same f32
arithmetic, so the results are bitwise the tile form's.

Taken when the tile holds whole rows of at least ROWS_MIN_LANES lanes, no output of the launch
overlaps an input (FR_AOK), a loaded operand is dead after the run, and y is not written over a
register it reads; otherwise the run returns 0 and the instructions run one by one.
"""
from __future__ import annotations

import numpy as np
from numba import carray, njit

from ...abi import DT_F32, FR_AOK, M_BM, M_BN, M_COLS, M_ROWS, M_TL, NO_LOAD, RS_FULL, UNBIN_ZDEAD
from .. import frame as fm
from ..addr import freg, lane_bytes
from ..bits import OPTS, ptr_f32
from ..vtree import CHUNK as VECTOR_LANES
from .rowhalf import row_move
from .unbin import (AT_NEW, NO_ROWS, ROWS_MIN_LANES, _scaled_bin, _un_bin, rows_at, unbin_fields, unbin_ops,
                    unbin_states)

# lanes converted at a time: x's, z's and y's chunks (3 x 4 KB) stay in L1, in whole vectors
CHUNK = 1024

NONE = NO_ROWS   # an operand read from (or y written into) its f32 register, not rows of a buffer


@njit(inline='always', **OPTS)
def is_half(j, optab):
    """Whether operand j (NO_LOAD or a negative peep entry: none) is float16 or bfloat16."""
    return j >= 0 and lane_bytes(optab[j, 2]) == 2


@njit(inline='always', **OPTS)
def _gather(reg, lo, rows, r, q, k0, m, dt, scratch):
    """Lanes k0..k0+m of rows r..r+q as q*m f32 lanes: the register's from lane lo (dt NONE), an
    f32 row where it lies (q = 1), else each row converted (or copied) into scratch."""
    if dt == NONE:
        return reg[lo:lo + q * m]
    if dt == DT_F32 and q == 1:
        return carray(ptr_f32(rows[r] + 4 * k0), m)
    for i in range(q):
        row_move(False, scratch[i * m:(i + 1) * m], rows[r + i] + lane_bytes(dt) * k0, dt)
    return scratch[:q * m]


@njit(**OPTS)
def _half_rows(uop, uswap, cv, bop, swap, scaled, xv, zv, yv, ix, xdt, zdt, ydt, bm, bn, nout, scratch):
    """y = B(U(x), z) (scaled: B(x U cv, z)) over the tile's rows, up to `ch` lanes at a time (whole
    rows, as many as fit, or a row's chunks). xdt, zdt, ydt: x's, z's and y's row dtypes (NONE: the
    registers xv, zv, yv), their rows' addresses ix[bm:2bm] (x), ix[:bm] (z), ix[2bm:3bm] (y, its
    first nout rows written). scratch: f32 lanes for three chunks."""
    ch = min(CHUNK, (scratch.shape[0] // 3) // VECTOR_LANES * VECTOR_LANES)
    xs, zs, ys = scratch[:ch], scratch[ch:2 * ch], scratch[2 * ch:3 * ch]
    xrows, zrows, yrows = ix[bm:2 * bm], ix[:bm], ix[2 * bm:3 * bm]
    g, w = (ch // bn, bn) if bn <= ch else (1, ch)   # rows a chunk, lanes of a row a chunk
    nr = bm if ydt == NONE else nout
    for r in range(0, nr, g):
        q = min(g, nr - r)
        for k0 in range(0, bn, w):
            m, lo = min(w, bn - k0), r * bn + k0   # (q = 1 or m = bn: the registers' lanes are one run)
            xc = _gather(xv, lo, xrows, r, q, k0, m, xdt, xs)
            zc = _gather(zv, lo, zrows, r, q, k0, m, zdt, zs)
            if ydt == NONE:
                yc = yv[lo:lo + q * m]
            elif ydt == DT_F32 and q == 1:
                yc = carray(ptr_f32(yrows[r] + 4 * k0), m)
            else:
                yc = ys[:q * m]
            if scaled:
                _scaled_bin(uop, uswap, cv, bop, swap, yc, xc, zc, AT_NEW)
            else:
                _un_bin(uop, bop, swap, yc, xc, zc)
            if ydt != NONE and (ydt != DT_F32 or q > 1):
                for i in range(q):
                    row_move(True, yc[i * m:(i + 1) * m], yrows[r + i] + lane_bytes(ydt) * k0, ydt)


@njit(inline='always', **OPTS)
def takes_half(fz, pc, optab):
    """Whether FK_UNBIN at pc loads x or z, or stores y, as float16 or bfloat16 (this form's run)."""
    return is_half(unbin_fields(fz, pc)[9], optab) or is_half(fz[pc, 6], optab) or is_half(fz[pc, 8] - 1, optab)


@njit(**OPTS)
def run_unbin_half(fr, pc, fz, meta, F, fp, st, optab, dims, addrs, r0, c0):
    """unbin.run_unbin's run with x's and z's loads and y's store (field 8: the store right after
    the run, nothing else reading y) at the rows of their buffers, converted chunk by chunk.
    Returns the instructions done, or 0 where this form does not apply."""
    n, x, t, z, y, j, swap, uswap, c, ox = unbin_fields(fz, pc)
    bm, bn, ix, js = meta[M_BM], meta[M_BN], fm.ix(fr), fz[pc, 8] - 1
    nrows = min(bm, meta[M_ROWS] - r0)
    if not unbin_states(st, x, z, j, c, ox) or fr[FR_AOK] != 1 or meta[M_TL] != 0 or bn < ROWS_MIN_LANES or \
            meta[M_COLS] - c0 < bn or nrows <= 0 or ix.shape[0] < 3 * bm or \
            (j != NO_LOAD and (fz[pc, 7] & UNBIN_ZDEAD) == 0):
        return 0
    xdt = zdt = ydt = NONE
    if ox >= 0:
        xdt = rows_at(ix[bm:2 * bm], ox, nrows, optab, dims, meta, addrs, r0, c0)
    if j != NO_LOAD:
        zdt = rows_at(ix[:bm], j, nrows, optab, dims, meta, addrs, r0, c0)
    if js >= 0:
        ydt = rows_at(ix[2 * bm:3 * bm], js, nrows, optab, dims, meta, addrs, r0, c0)
    if (ox >= 0 and xdt == NONE) or (j != NO_LOAD and zdt == NONE) or \
            (ydt == NONE and ((ox < 0 and y == x) or (j == NO_LOAD and y == z))):
        return 0   # (rows not addressable, or y written over a register it reads)
    xv, zv = freg(F, fp, x), freg(F, fp, z)
    cv = freg(F, fp, c)[0] if c >= 0 else np.float32(0)
    if ox >= 0:   # x, t and a loaded z are dead after the run; y a full tile (or already stored)
        fp[x], st[0, x] = 0, RS_FULL
    if j != NO_LOAD:
        fp[z], st[0, z] = 0, RS_FULL
    fp[t], st[0, t], fp[y], st[0, y] = 0, RS_FULL, 0, RS_FULL
    uop, bop = unbin_ops(fr, pc, n, ox)
    scratch = F[t] if ox >= 0 or t != x else fm.sf(fr)[:2 * bn]   # (t's tile: dead, never written; or
    #                                                             sf's tree rows, the rest of sf cached rows)
    _half_rows(uop, uswap, cv, bop, swap, c >= 0, xv, zv, F[y], ix, xdt, zdt, ydt, bm, bn, nrows, scratch)
    return n + 1 if ydt != NONE else n
