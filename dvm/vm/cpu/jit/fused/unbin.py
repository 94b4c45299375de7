"""FK_UNBIN (run by the PC_FUSED_TILE piece): a float32 math op, or an add, sub or mul with a
constant, and the add, sub or mul that consumes it, in one pass of the CPU VM.

    [load x, ox ;] un t, x ; [load z, o] ; bin y, t, z   (or bin y, z, t)   y = B(U(x), z)
    op t, x, c ; [load z, o] ; bin y, t, z                   y = B(x op c, z)  (or c op x)
                                                             (planned by host/fuse_plan)

U is exp, sigmoid, SiLU, tanh or GELU (erf or tanh form), or add, sub or mul of a full tile and a
register only the prologue writes (a constant: `b * 0.9 + g`, `p + (-lr) * u`, a scaled
residual); t is dead after the run (the plan checked), so it is never written, and z is a full
tile: a register, or the operand the run's load would read in place: a contiguous f32 tile, or,
when z is dead after the run and no output of the launch overlaps an input, the tile's rows
wherever they lie (whole rows
of the tile of at least ROWS_MIN_LANES lanes, at any row stride, as the halves of a gate-and-up
product's rows; rows past the domain read its last row, as the load's clamped lanes do). One
loop reads x and z and writes y. A math op's run may start with x's load (x dead after it): x's
tile is then read where it lies as z's is (one contiguous run, or its rows), and where it cannot
be, the load runs and the run planned after it takes the tile. Where the two instructions made
two passes over a tile (the math one compute-bound, the other memory-bound with the tile of t in
L2), every element now goes through both in registers while the next ones stream in (SiLU(a)*b:
see docs/DECISIONS.md).

Bitwise the same as the two instructions: each lane gets U's value (the same functions as
jit/kernels' f32 math, including exp_into's and sigmoid_into's out-of-range re-runs), rounded to
f32, then jit/ops' f32 add, sub or mul, compiled without FMA contraction (OPTS). A math op's y
that would share its memory with x or z (the register allocator gives a result the register of a
source that dies there, when the result is not written straight into the output) leaves the run
to the two instructions: a loop whose output may alias an input does not vectorize, and copying x
through scratch first measured no faster than the two passes. The constant's form computes over
x's or z's tile where y lands on it (an in-place update's `p + (-lr) * u` into p, y given x's
register): one loop reads and writes that tile, as jit/loops.bin_in_place.
"""
from __future__ import annotations

import numpy as np
from numba import carray, njit

from ...abi import (DEC_OP, DT_F32, FR_AOK, M_BM, M_BN, M_COLS, M_ROWS, NO_LOAD, OP_ADD, OP_EXP, OP_GELU,
                    OP_GELU_TANH, OP_MUL, OP_SIGMOID, OP_SILU, OP_TANH, PEEP_LATER, RS_COMPACT, RS_FULL, RS_UNIFORM,
                    RS_UNIFORM_ALL, UNBIN_C_SHIFT, UNBIN_SWAP, UNBIN_USWAP, UNBIN_X_SHIFT, UNBIN_ZDEAD)
from .. import frame as fm
from .. import ops
from ..addr import direct_addr, freg, row_addrs_sized
from ..bits import OPTS, ptr_f32
from ..mathf import EXP1_LO, exp_lane, exp_lane_exact, exp_one_step, expf, sigmoid_given, sigmoidf, tanhf
from ..mathf_ext import gelu_tanhf, geluf


@njit(inline='always', **OPTS)
def _bin3(bop, swap, v, w):
    """B(v, w), or B(w, v) when swap: selects, so the loop that calls it still vectorizes."""
    a = w if swap else v
    b = v if swap else w
    s = ops.sub(a, b)
    p = ops.mul(a, b)
    q = ops.add(a, b)
    return p if bop == OP_MUL else (q if bop == OP_ADD else s)


@njit(**OPTS)
def _un_bin(uop, bop, swap, o, x, z):
    """o = B(U(x), z) lane by lane; o overlaps neither x nor z."""
    n = o.shape[0]
    if uop == OP_EXP:
        outside = False
        for k in range(n):
            v = x[k]
            o[k] = _bin3(bop, swap, exp_lane(v), z[k])
            outside |= not exp_lane_exact(v)
        if outside:
            for k in range(n):
                o[k] = _bin3(bop, swap, expf(x[k]), z[k])
    elif uop == OP_SILU:
        outside = False
        for k in range(n):
            v = x[k]
            o[k] = _bin3(bop, swap, v * sigmoid_given(v, exp_one_step(-abs(v))), z[k])
            outside |= not (abs(v) <= -EXP1_LO)
        if outside:
            for k in range(n):
                o[k] = _bin3(bop, swap, x[k] * sigmoidf(x[k]), z[k])
    elif uop == OP_SIGMOID:
        outside = False
        for k in range(n):
            v = x[k]
            o[k] = _bin3(bop, swap, sigmoid_given(v, exp_one_step(-abs(v))), z[k])
            outside |= not (abs(v) <= -EXP1_LO)
        if outside:
            for k in range(n):
                o[k] = _bin3(bop, swap, sigmoidf(x[k]), z[k])
    elif uop == OP_TANH:
        for k in range(n):
            o[k] = _bin3(bop, swap, tanhf(x[k]), z[k])
    elif uop == OP_GELU:
        for k in range(n):
            o[k] = _bin3(bop, swap, geluf(x[k]), z[k])
    elif uop == OP_GELU_TANH:
        for k in range(n):
            o[k] = _bin3(bop, swap, gelu_tanhf(x[k]), z[k])
    else:
        return False
    return True


# where the constant's form puts its result: a tile of its own, or x's or z's (an in-place update)
AT_NEW, AT_X, AT_Z = 0, 1, 2


@njit(**OPTS)
def _scaled_bin(uop, uswap, c, bop, swap, o, x, z, at):
    """o = B(U(x, c), z) lane by lane, U(c, x) when uswap, B's operands swapped when swap; at: o
    is a tile of its own, or x's lanes (AT_X: x is not read through its own view), or z's (AT_Z)."""
    n = o.shape[0]
    if at == AT_X:
        for k in range(n):
            o[k] = _bin3(bop, swap, _bin3(uop, uswap, o[k], c), z[k])
    elif at == AT_Z:
        for k in range(n):
            o[k] = _bin3(bop, swap, _bin3(uop, uswap, x[k], c), o[k])
    else:
        for k in range(n):
            o[k] = _bin3(bop, swap, _bin3(uop, uswap, x[k], c), z[k])


# z's rows are read where they lie only where they are this long: shorter rows cost more per row
# (a call, its loop's setup) than the load's copy saves (SiLU(g) * u, one thread, rows of 64 lanes
# 1.14x, 128 lanes 0.92x, 1024 lanes 0.71x the time of the instructions one by one)
ROWS_MIN_LANES = 128


NO_ROWS = -1   # rows_at: operand j's rows cannot be addressed so


@njit(inline='always', **OPTS)
def rows_at(ix, j, nrows, optab, dims, meta, addrs, r0, c0):
    """ix[:BM] = the addresses of lane c0 of the tile's rows in operand j (f32, f16 or bf16:
    addr.row_addrs_sized), rows past nrows the last row's (the load's clamping). Returns j's dtype,
    or NO_ROWS."""
    if row_addrs_sized(ix, j, optab, dims, meta, addrs, r0, c0, nrows) == 0:
        return NO_ROWS
    for r in range(nrows, meta[M_BM]):
        ix[r] = ix[nrows - 1]
    return optab[j, 2]


@njit(**OPTS)
def _clamped_rows(ix, j, optab, dims, meta, addrs, r0, c0):
    """rows_at of an f32 operand j when the tile holds whole rows of BN >= ROWS_MIN_LANES valid
    lanes; else False."""
    bm, bn = meta[M_BM], meta[M_BN]
    nrows = min(bm, meta[M_ROWS] - r0)
    if bn < ROWS_MIN_LANES or meta[M_COLS] - c0 < bn or nrows <= 0 or ix.shape[0] < bm:
        return False
    return rows_at(ix, j, nrows, optab, dims, meta, addrs, r0, c0) == DT_F32


@njit(**OPTS)
def _rows_bin(uop, uswap, cv, bop, swap, y, x, z, ix, xrows, zrows, bm, bn, scaled, at):
    """The run row by row: x's rows at the addresses ix[bm:2 * bm] where xrows (else the tile x),
    z's at ix[:bm] where zrows (else the tile z); _scaled_bin (scaled) or _un_bin per row."""
    for r in range(bm):
        lo, hi = r * bn, (r + 1) * bn
        xr = carray(ptr_f32(ix[bm + r]), bn) if xrows else x[lo:hi]
        zr = carray(ptr_f32(ix[r]), bn) if zrows else z[lo:hi]
        if scaled:
            _scaled_bin(uop, uswap, cv, bop, swap, y[lo:hi], xr, zr, at)
        else:
            _un_bin(uop, bop, swap, y[lo:hi], xr, zr)


@njit(inline='always', **OPTS)
def unbin_fields(fz, pc):
    """FK_UNBIN's fields: n, x, t, z, y, o (the load's operand or NO_LOAD), swap, uswap, c (U's
    constant operand, the prologue's, or -1: a math op U), ox (x's load, where the run starts with
    it, else -1)."""
    swap, uswap = (fz[pc, 7] & UNBIN_SWAP) != 0, (fz[pc, 7] & UNBIN_USWAP) != 0
    c = ((fz[pc, 7] & ((1 << UNBIN_X_SHIFT) - 1)) >> UNBIN_C_SHIFT) - 1
    ox = (fz[pc, 7] >> UNBIN_X_SHIFT) - 1
    return fz[pc, 1], fz[pc, 2], fz[pc, 3], fz[pc, 4], fz[pc, 5], fz[pc, 6], swap, uswap, c, ox


@njit(inline='always', **OPTS)
def unbin_states(st, x, z, j, c, ox):
    """x and z, where registers, are full tiles, and c (where U takes one) is the prologue's value:
    the same in every lane it holds, whatever its state."""
    if (ox < 0 and st[0, x] != RS_FULL) or (j == NO_LOAD and st[0, z] != RS_FULL):
        return False
    return c < 0 or st[0, c] == RS_UNIFORM or st[0, c] == RS_UNIFORM_ALL or st[0, c] == RS_COMPACT


@njit(inline='always', **OPTS)
def unbin_ops(fr, pc, n, ox):
    """U's and B's op codes: the run's instruction after x's load (or its first) and its last."""
    instrs, dec = fm.instrs(fr), fm.decode(fr)
    return dec[instrs[pc + 1 if ox >= 0 else pc, 0], DEC_OP], dec[instrs[pc + n - 1, 0], DEC_OP]


@njit(inline='always', **OPTS)   # one call site: a call would pass every view's fields per tile
def run_unbin(fr, pc, fz, meta, F, fp, st, optab, dims, addrs, r0, c0, aok):
    """FK_UNBIN = (kind, n, x, t, z, y, o, swap | uswap | (c + 1) << UNBIN_C_SHIFT), o: the load's
    operand or NO_LOAD, c: U's constant operand (the prologue's) or -1 (a math op U). Returns the
    instructions done (the store after the run too when y is written straight into its tile), 0
    when x or z is not a full tile here, the load's tile can be read in place neither as one
    contiguous run nor row by row (_clamped_rows: z dead after the run, no overlaps), or a math op's
    y would be written over x or z (a loop whose output may alias an input does not vectorize: the
    two instructions are faster then)."""
    n, x, t, z, y, j, swap, uswap, c, ox = unbin_fields(fz, pc)
    if not unbin_states(st, x, z, j, c, ox):
        return 0
    lanes, ix = meta[M_BM] * meta[M_BN], fm.ix(fr)
    px, xrows = 0, False
    if ox >= 0:   # x's tile where it lies: one contiguous run, or its rows (x is dead after the run)
        px = direct_addr(ox, optab, dims, meta, addrs, r0, c0) if aok else 0
        xrows = px == 0 and fr[FR_AOK] == 1 and ix.shape[0] >= 2 * meta[M_BM] and \
            _clamped_rows(ix[meta[M_BM]:], ox, optab, dims, meta, addrs, r0, c0)
        if px == 0 and not xrows:
            return 0
    pz, zrows = 0, False
    if j != NO_LOAD:
        pz = direct_addr(j, optab, dims, meta, addrs, r0, c0) if aok else 0
        zrows = pz == 0 and fr[FR_AOK] == 1 and (fz[pc, 7] & UNBIN_ZDEAD) != 0 and \
            _clamped_rows(ix, j, optab, dims, meta, addrs, r0, c0)
        if pz == 0 and not zrows:
            return 0
    js = fm.peep(fr)[pc + n - 1]   # as B's own dispatch (jit/interp): y written into the tile of the store after
    # the run (js >= 0: nothing else reads y, the store is done) or of a later one (js <= PEEP_LATER)
    po = direct_addr(js if js >= 0 else PEEP_LATER - js, optab, dims, meta, addrs, r0, c0) \
        if aok and (js >= 0 or js <= PEEP_LATER) else 0
    xv = carray(ptr_f32(px), lanes) if px != 0 else freg(F, fp, x)   # (xrows: not read)
    zv = carray(ptr_f32(pz), lanes) if pz != 0 else freg(F, fp, z)
    out = po if po != 0 else F[y].ctypes.data
    at = AT_X if out == xv.ctypes.data and not xrows else (AT_Z if out == zv.ctypes.data and not zrows else AT_NEW)
    if at != AT_NEW and c < 0:
        return 0
    cv = freg(F, fp, c)[0] if c >= 0 else np.float32(0)
    if ox >= 0:   # x is dead after the run: left as its load would (its tile, or its bank row unread)
        fp[x] = px
        st[0, x] = RS_FULL
    fp[t] = 0   # t is dead after the run: left as a full tile, never written
    st[0, t] = RS_FULL
    if pz != 0 or zrows:   # z as the load leaves it, or dead (y below, if it is z's register)
        fp[z] = pz
        st[0, z] = RS_FULL
    fp[y] = po
    st[0, y] = RS_FULL
    (uop, bop), yv = unbin_ops(fr, pc, n, ox), freg(F, fp, y)[:lanes]
    if xrows or zrows:
        _rows_bin(uop, uswap, cv, bop, swap, yv, xv[:lanes], zv[:lanes], ix, xrows, zrows, meta[M_BM], meta[M_BN],
                  c >= 0, at)
    elif c >= 0:
        _scaled_bin(uop, uswap, cv, bop, swap, yv, xv[:lanes], zv[:lanes], at)
    else:
        _un_bin(uop, bop, swap, yv, xv[:lanes], zv[:lanes])
    return n + 1 if po != 0 and js >= 0 else n
