"""Row-level (compact) registers of the CPU VM, the PC_ROWLEVEL piece.

A reduction result is constant along the row. The VM keeps it compact: row r's value in lane r,
which is also column 0 of a column-major tile (the reductions leave it so). Row-level arithmetic
then runs on BM lanes only (jit/interp._row_mode), a full-tile f32 add/sub/mul/div/maximum/minimum
broadcasts a compact operand on the fly (_bin_rowb), and any other full-tile reader first expands
it in place (_expand). Row vectors (below) and uniform registers (constants, applied as a scalar
by _bins) work the same way. Results are identical to broadcast tiles: the same f32 operations on
the same values (jit/ops).
"""
from __future__ import annotations

from numba import njit

from ..abi import (BK_F32, BK_F64, BK_I64, DEC_BANK, DEC_OP, FR_C0, FR_FIN, FR_R0, MODE_CMP_OUTER, MODE_EXPAND,
                   MODE_ROWB, MODE_UNIFORM, M_BM, M_BN, M_COLS, M_ROWS, M_TL, OP_GE, OP_GT, OP_LE, OP_LT, RS_COMPACT,
                   RS_FULL, RS_ROWVEC, RS_UNIFORM, RS_UNIFORM_ALL)
from . import frame as fm
from . import loops
from .addr import freg
from .bits import OPTS
from .moves import repeat_row
from .reduce import bcast_t, fill


@njit(**OPTS)
def _expand(o, bm, bn, tl):
    """Compact -> broadcast tile, in place."""
    if tl:
        bcast_t(o, bm, bn)
    else:   # from the last row down: row r's lanes start at r*bn >= r, above every unread lane
        for r in range(bm - 1, -1, -1):
            fill(o[r * bn:(r + 1) * bn], o[r])


@njit(**OPTS)
def _bins(op, o, a, v, swap):
    """A full tile and a uniform register (v: its value)."""
    loops.bin_scalar(op, o, a, v, swap)


@njit(**OPTS)
def _bin_rowb(op, o, a, b, bm, bn, tl, swap):
    """o = a . b (b . a when swap) for a full tile a and a compact register b."""
    if tl:   # column k of the tile: its bm rows against the compact column
        loops.bin_vec(op, o, a, b[:bm], bn, bm, swap)
    else:
        loops.bin_rows(op, o, a, b, bm, bn, bn, swap)


@njit(**OPTS)
def _bin_rowb_to_rows(op, ra, a, b, nrows, ncv, bn, swap):
    """_bin_rowb (row-major tiles) straight into a buffer: row r's ncv valid lanes at address
    ra[r] (the store it replaces, for tiles addr.direct_addr cannot alias)."""
    loops.bin_rows_at(op, ra, a, b, nrows, bn, ncv, swap)


# Row vectors: a load whose rows are all the same (a weight or bias broadcast over the rows of a
# row-major tile) fills row 0 only; an f32 binary op applies that row to every row of the other
# operand (_bin_rowv), a comparison with a compact register pairs them (_cmp_outer), any other
# reader expands it first (moves.repeat_row).
@njit(**OPTS)
def _bin_rowv(op, o, a, b, bm, bn, swap):
    """o = a . b (b . a when swap) for a full tile a and a row vector b (row-major tiles)."""
    loops.bin_vec(op, o, a, b[:bn], bm, bn, swap)


@njit(**OPTS)
def _cmp_outer(op, o, c, v, bm, bn, swap):
    """o[r, k] = c[r] . v[k] (v[k] . c[r] when swap) for a compact c and a row vector v. A swapped
    order comparison is the mirrored one (v < x is x > v, for NaN too: both false)."""
    if swap:
        op = OP_GT if op == OP_LT else OP_GE if op == OP_LE else OP_LT if op == OP_GT else \
            OP_LE if op == OP_GE else op
    loops.cmp_outer(op, o, c, v[:bn], bm, bn)


@njit(**OPTS)
def _expand_sources(pc, instrs, rio, st, F, D, I, B, bm, bn, tl):
    """Broadcast every compact register, row vector and constant instruction pc reads (none is
    ever aliased to a buffer: fp is 0 for them)."""
    for f in range(5):
        b = rio[pc, f] - 1
        if b >= 0:
            r = instrs[pc, 1 + f]
            s = st[b, r]
            if s == RS_COMPACT:
                if b == BK_F32:
                    _expand(F[r], bm, bn, tl)
                elif b == BK_F64:
                    _expand(D[r], bm, bn, tl)
                elif b == BK_I64:
                    _expand(I[r], bm, bn, tl)
                else:
                    _expand(B[r], bm, bn, tl)
                st[b, r] = RS_FULL
            elif s == RS_UNIFORM:   # a constant in lanes [0, BM): into every lane
                if b == BK_F32:
                    F[r][:] = F[r][0]
                elif b == BK_F64:
                    D[r][:] = D[r][0]
                elif b == BK_I64:
                    I[r][:] = I[r][0]
                else:
                    B[r][:] = B[r][0]
                st[b, r] = RS_UNIFORM_ALL
            elif s == RS_ROWVEC:   # row-major tiles
                if b == BK_F32:
                    repeat_row(F[r], 0, bm, bn)
                elif b == BK_F64:
                    repeat_row(D[r], 0, bm, bn)
                elif b == BK_I64:
                    repeat_row(I[r], 0, bm, bn)
                else:
                    repeat_row(B[r], 0, bm, bn)
                st[b, r] = RS_FULL


ROWB_SWAP = 1   # PC_ROWLEVEL's b: bit 0 the compact (uniform, row-vector) source is the first
ROWB_ROWS = 2   # bit 1 (MODE_ROWB): write the rows straight into the buffer (addresses in ix)


def rowlevel_piece(fra, pc, mode, flags):
    """PC_ROWLEVEL: instruction pc in `mode` (abi.MODE_*: an f32 binary op meeting a compact,
    uniform or row-vector source; a comparison of a compact register and a row vector), or with
    mode MODE_EXPAND its row-level sources expanded to full tiles first."""
    fr = fm.frame(fra)
    ins, meta = fm.instrs(fr), fm.meta(fr)
    bm, bn, tl = meta[M_BM], meta[M_BN], meta[M_TL] != 0
    F, fp = fm.bank_f(fr), fm.fptr(fr)
    if mode == MODE_EXPAND:
        _expand_sources(pc, ins, fm.rio(fr), fm.states(fr), F, fm.bank_d(fr), fm.bank_i(fr), fm.bank_b(fr), bm,
                        bn, tl)
        return 0
    dec = fm.decode(fr)
    op, bank = dec[ins[pc, 0], DEC_OP], dec[ins[pc, 0], DEC_BANK]
    swap = (flags & ROWB_SWAP) != 0
    f1 = ins[pc, 1]
    first, second = ins[pc, 2], ins[pc, 3]
    full, row = (second, first) if swap else (first, second)   # row: the row-level source
    if mode == MODE_CMP_OUTER:   # the first source's field is the compact one unless swapped
        comp, rv = (first, second) if swap else (second, first)
        B = fm.bank_b(fr)
        if bank == BK_F32:
            _cmp_outer(op, B[f1], F[comp], F[rv], bm, bn, not swap)
        elif bank == BK_F64:
            D = fm.bank_d(fr)
            _cmp_outer(op, B[f1], D[comp], D[rv], bm, bn, not swap)
        else:
            I = fm.bank_i(fr)
            _cmp_outer(op, B[f1], I[comp], I[rv], bm, bn, not swap)
    elif mode == MODE_ROWB and (flags & ROWB_ROWS) != 0:
        c0 = fr[FR_C0]
        nrows = min(bm, meta[M_ROWS] - fr[FR_R0])
        ncv = 1 if fr[FR_FIN] != 0 else min(bn, meta[M_COLS] - c0)
        _bin_rowb_to_rows(op, fm.ix(fr), freg(F, fp, full), freg(F, fp, row), nrows, ncv, bn, swap)
    elif mode == MODE_ROWB:
        _bin_rowb(op, freg(F, fp, f1), freg(F, fp, full), freg(F, fp, row), bm, bn, tl, swap)
    elif mode == MODE_UNIFORM:
        n = bm * bn
        _bins(op, freg(F, fp, f1)[:n], freg(F, fp, full)[:n], F[row][0], swap)
    else:   # MODE_ROWV
        _bin_rowv(op, freg(F, fp, f1), freg(F, fp, full), F[row], bm, bn, swap)
    return 0
