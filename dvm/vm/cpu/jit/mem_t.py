"""Tile loads and stores of column-major registers (lane (r, k) at k*BM + r: a column of a tile is
BM rows apart in memory, contiguous when the kept axis is the operand's innermost one), and of
compact registers at a finalize store, whatever the layout; index tiles: the PC_MEM_T piece.
Edge tiles use clamped indices as in jit/mem.
"""
from __future__ import annotations

from numba import njit

from ..abi import FR_C0, FR_FIN, FR_R0, M_BM, M_BN, M_COLS, M_NC, M_NR, M_ROWS, MEM_INDEX, MEM_LOAD, MEM_STOREROW, OPTAB_FIXED
from . import frame as fm
from .addr import elem_offset, row_bases
from .bits import OPTS
from .mem import load_row, memop_of, store_row
from .moves import move_run, raw_copy

_S = OPTAB_FIXED


@njit(**OPTS)
def mem_tile_t(is_store, reg, buf, cv, j, optab, dims, meta, r0, c0, fin, ix, one_row):
    """mem.mem_tile for column-major tiles (one_row: unused, rows are never repeated there): column k of the tile is reg[k*bm:(k+1)*bm]. ix: 2*(bm+bn) lanes.
    Rows are addressed as start + i*stride when there is one row dim, else through ix[:nrv]."""
    nr, nc, bm, bn = meta[M_NR], meta[M_NC], meta[M_BM], meta[M_BN]
    rows, cols = meta[M_ROWS], meta[M_COLS]
    nrv = min(bm, rows - r0)
    ncv = 1 if fin else min(bn, cols - c0)
    off = optab[j, 3]
    zero = off * 0
    general = nr > 1
    stride = optab[j, _S + nr - 1] if nr == 1 else zero
    # several row dims, the innermost of unit stride: a column is runs of that dim's length, each
    # run addressed once (run q: lanes ix[q] .. ix[q + 1], its base at ix[bm + 1 + q])
    runs = general and raw_copy(reg, buf, cv, optab[j, _S + nr - 1], False)
    dl = max(dims[nr - 1], 1)
    nrun = zero
    if runs:
        i = zero
        while i < nrv:
            ix[bm + 1 + nrun] = elem_offset(j, r0 + i, optab, dims, zero, nr)
            ix[nrun] = i
            nrun += 1
            i += min(dl - (r0 + i) % dl, nrv - i)
        ix[nrun] = nrv
    elif general:
        row_bases(ix, j, optab, dims, r0, nrv, nr)
    rbase = zero if general else r0 * stride
    ixs = ix[bm:bm + nrv]
    raw = raw_copy(reg, buf, cv, stride, general)
    for k in range(ncv):
        col = reg[k * bm:(k + 1) * bm]
        cbase = off + (zero if fin else elem_offset(j, c0 + k, optab, dims, nr, nr + nc))
        if runs:
            for q in range(nrun):
                move_run(is_store, reg, buf, k * bm + ix[q], cbase + ix[bm + 1 + q], ix[q + 1] - ix[q])
        else:
            if general:
                for i in range(nrv):
                    ixs[i] = cbase + ix[i]
            if raw:
                move_run(is_store, reg, buf, k * bm, cbase + rbase, nrv)
            elif is_store:
                store_row(buf, col, cv, cbase + rbase, stride, nrv, ixs, general)
            else:
                load_row(col, buf, cv, cbase + rbase, stride, nrv, ixs, general)
        if not is_store and nrv < bm:   # clamped rows copy the last valid row
            v = col[nrv - 1]
            tail = col[nrv:]
            for i in range(bm - nrv):
                tail[i] = v
    if not is_store:   # clamped columns (and a fin load's broadcast) copy the last valid column
        last = reg[(ncv - 1) * bm:ncv * bm]
        for k in range(ncv, bn):
            dst = reg[k * bm:(k + 1) * bm]
            for i in range(bm):
                dst[i] = last[i]


@njit(**OPTS)
def _index_t(o, j, optab, dims, meta, r0, c0, fin, rb):
    """jit/mem._index for a column-major tile: the row offsets once (an odometer, rb: BM lanes of
    scratch), in column 0's lanes; every other column adds its column's difference."""
    nr, nc, bm, bn = meta[M_NR], meta[M_NC], meta[M_BM], meta[M_BN]
    rows, cols = meta[M_ROWS], meta[M_COLS]
    nrv = max(min(bm, rows - r0), 1)   # rows past the last valid one repeat its offset
    row_bases(rb, j, optab, dims, min(r0, rows - 1), nrv, nr)   # (zeros without row dims)
    cb0 = optab[j, 3] + elem_offset(j, 0 if fin else min(c0, cols - 1), optab, dims, nr, nr + nc)
    for i in range(bm):
        o[i] = cb0 + rb[min(i, nrv - 1)]
    for k in range(1, bn):
        c = 0 if fin else min(c0 + k, cols - 1)
        d = optab[j, 3] + elem_offset(j, c, optab, dims, nr, nr + nc) - cb0
        for i in range(bm):
            o[k * bm + i] = o[i] + d




_memop_t = memop_of(mem_tile_t)


def mem_t_piece(fra, pc, what, flags):
    """PC_MEM_T: instruction pc's load or store (MEM_LOAD, MEM_STORE, MEM_STOREROW) of a column-
    major tile or of a compact register at a finalize store, or its index tile (MEM_INDEX).
    Returns an abi.ERR_* code."""
    fr = fm.frame(fra)
    ins = fm.instrs(fr)
    d, j = ins[pc, 1], ins[pc, 2]
    optab, dims, meta = fm.optab(fr), fm.dims(fr), fm.meta(fr)
    r0, c0, fin = fr[FR_R0], fr[FR_C0], fr[FR_FIN] != 0
    if what == MEM_INDEX:
        _index_t(fm.bank_i(fr)[d], j, optab, dims, meta, r0, c0, fin, fm.ix(fr)[:meta[M_BM]])
        return 0
    return _memop_t(what != MEM_LOAD, d, j, optab, dims, meta, fm.addrs(fr), fm.numels(fr), fm.bank_f(fr),
                    fm.bank_d(fr), fm.bank_i(fr), fm.bank_b(fr), fm.fptr(fr), r0, c0,
                    fin or what == MEM_STOREROW, fm.ix(fr), False)
