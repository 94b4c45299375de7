"""A rotary embedding one row at a time, from its operands' rows: the PC_FUSED_ROTARY piece
(FK_ROTARY, planned by host/fuse_rotary).

    load a ; load b ; mul p, a, b ; load c ; load d ; mul q, c, d ; load e ; mul r, q, e ;
    add y, p, r ; store y                  (y = x * cos + (x_swapped * sign) * sin)

The torch frontend writes RoPE over [..., 2, d/2] with the halves swapped by a view (a negative
stride), so the tile form's rows are d/2 lanes (16 for a 32-wide head) and a tile of 1024 such
rows makes five loads and a store of 1024 short row moves each, through the tile registers. This
form reads each operand's row where it is and writes y's row into the store's buffer: no tile
register is filled. Each lane takes the same f32 operations in the same order as the
instructions (each product's and the sum's operands as they were written), so the results are
bitwise the tile form's. The six operands are all f32, or all one 16-bit dtype (a 16-bit model's
RoPE): then each lane is converted to f32 as a load converts it and y rounded as a store rounds
it, inside the one loop over the row (a row's five conversions as runs of their own cost what the
tile form's short-row conversions do). It takes a tile only when no output overlaps any other
argument (aok without in-place updates), its rows hold at least MIN_LANES lanes and every
operand's rows can be addressed (unit column stride: addr.row_addrs_sized); otherwise it returns
0 and the instructions run. A run planned with ROT_THEN (its loads are factors of the rotary run
right after it, which reads their rows itself) takes a tile only where the runs after it can take
it too: their registers are never read unloaded.
"""
from __future__ import annotations

from numba import carray, njit

from ...abi import (DT_BF16, DT_F32, FK_ROTARY, FR_AOK, FR_C0, FR_R0, M_BM, M_BN, M_COLS, M_NR, M_ROWS,
                    OPTAB_FIXED, ROT_R_SWAP, ROT_THEN, ROT_Y_SWAP, RS_FULL)
from .. import frame as fm
from .. import ops
from ..addr import lane_bytes, row_addrs_sized
from ..bits import OPTS, bf2f, f2bf, f2h, h2f, ptr_f32, ptr_u16
from .states import bracket

N_ROWS = 6   # the rows a lane reads and writes: a, b, c, d, e's and y's
# Rows shorter than this stay in the tile form, where a row's fixed cost (six row addresses moved by
# their carries) outweighs what it saves. GPT-NeoX's partial rotary (4-lane rows of q and k sharing
# cos and sin) takes the row form: its segment ~15 % less time at 1x256 tokens, level at 4x1024
MIN_LANES = 4
_S = OPTAB_FIXED


@njit(inline='always', **OPTS)
def _start(src, optab, dims, addrs, nr, r0, c0, sc, size):
    """sc[:nr]: row r0's index over the nr row dims; sc[nr:nr + N_ROWS]: each row's element offset
    there; sc[nr + N_ROWS:nr + 2 * N_ROWS]: the address of each operand's lane c0 of its first row
    (size: a lane's bytes)."""
    rem = r0
    for d in range(nr - 1, -1, -1):
        n_d = max(dims[d], 1)
        sc[d] = rem % n_d
        rem //= n_d
    for j in range(N_ROWS):
        o = src[j]
        acc = optab[o, 3] * 0
        for d in range(nr):
            acc += sc[d] * optab[o, _S + d]
        sc[nr + j] = acc
        sc[nr + N_ROWS + j] = addrs[optab[o, 1]] + size * (optab[o, 3] + c0)


@njit(inline='always', **OPTS)
def _carries(src, optab, dims, nr, inc, size):
    """inc[d * N_ROWS + j]: the bytes operand j's row address moves when the odometer's digit d
    goes up by one and every later digit goes back to 0 (one add a row and operand, whichever
    digit moves: the row addresses stay in registers)."""
    for d in range(nr):
        for j in range(N_ROWS):
            o = src[j]
            v = optab[o, _S + d]
            for e in range(d + 1, nr):
                v -= (max(dims[e], 1) - 1) * optab[o, _S + e]
            inc[d * N_ROWS + j] = size * v


@njit(inline='always', **OPTS)
def _lane(a, b, c, d, e, r_swap, y_swap):
    """y = a * b + (c * d) * e, each product's and the sum's operands in the instructions' order."""
    p = ops.mul(a, b)
    q = ops.mul(c, d)
    r = ops.mul(e, q) if r_swap else ops.mul(q, e)
    return ops.add(r, p) if y_swap else ops.add(p, r)


def _half_row(to_f32, to_half):
    """_row's loop over 16-bit rows: each lane converted by to_f32 (as its load converts it), y
    rounded by to_half (as its store rounds it). One function per 16-bit dtype."""
    @njit(inline='always', **OPTS)
    def row(pa, pb, pc, pd, pe, py, ncv, r_swap, y_swap):
        a, b = carray(ptr_u16(pa), ncv), carray(ptr_u16(pb), ncv)
        c, d = carray(ptr_u16(pc), ncv), carray(ptr_u16(pd), ncv)
        e, y = carray(ptr_u16(pe), ncv), carray(ptr_u16(py), ncv)
        for k in range(ncv):
            y[k] = to_half(_lane(to_f32(a[k]), to_f32(b[k]), to_f32(c[k]), to_f32(d[k]), to_f32(e[k]),
                                 r_swap, y_swap))
    return row


_row_bf16, _row_f16 = _half_row(bf2f, f2bf), _half_row(h2f, f2h)


@njit(inline='always', **OPTS)
def _row(pa, pb, pc, pd, pe, py, ncv, r_swap, y_swap, dt):
    """y's row from a, b, c, d, e's rows (their first lanes' addresses), all of dtype dt."""
    if dt == DT_BF16:
        _row_bf16(pa, pb, pc, pd, pe, py, ncv, r_swap, y_swap)
    elif dt != DT_F32:
        _row_f16(pa, pb, pc, pd, pe, py, ncv, r_swap, y_swap)
    else:
        a, b = carray(ptr_f32(pa), ncv), carray(ptr_f32(pb), ncv)
        c, d = carray(ptr_f32(pc), ncv), carray(ptr_f32(pd), ncv)
        e, y = carray(ptr_f32(pe), ncv), carray(ptr_f32(py), ncv)
        for k in range(ncv):
            y[k] = _lane(a[k], b[k], c[k], d[k], e[k], r_swap, y_swap)


@njit(inline='always', **OPTS)
def _rows(sc, inc, dims, nr, nrows, ncv, r_swap, y_swap, dt):
    """The tile's nrows rows from the odometer _start left in sc (its digits move in sc; the six
    row addresses in locals, moved by _carries' amounts)."""
    at, off, size = sc[nr + N_ROWS:nr + 2 * N_ROWS], sc[nr:nr + N_ROWS], lane_bytes(dt)
    p0, p1, p2 = at[0] + size * off[0], at[1] + size * off[1], at[2] + size * off[2]
    p3, p4, p5 = at[3] + size * off[3], at[4] + size * off[4], at[5] + size * off[5]
    for i in range(nrows):
        if i > 0:
            d = nr - 1
            while d > 0 and sc[d] + 1 >= dims[d]:
                sc[d] = 0
                d -= 1
            sc[d] += 1
            k = d * N_ROWS
            p0 += inc[k]
            p1 += inc[k + 1]
            p2 += inc[k + 2]
            p3 += inc[k + 3]
            p4 += inc[k + 4]
            p5 += inc[k + 5]
        _row(p0, p1, p2, p3, p4, p5, ncv, r_swap, y_swap, dt)


@njit(**OPTS)
def _addressable(fz, instrs, pc, optab, dims, meta, addrs, r0, c0, ix):
    """The dtype of the run at pc where its operands (a, b, c, d, e and the store's) share one
    (f32, f16 or bf16) and have rows addressable at the tile (addr.row_addrs_sized; ix[-1:] as
    scratch), and so have the runs after it while ROT_THEN; else -1."""
    first = -1
    while True:
        if fz[pc, 0] != FK_ROTARY:
            return -1
        n = fz[pc, 1]
        dt = optab[instrs[pc + n - 1, 2], 2]
        for j in range(N_ROWS):
            o = fz[pc, 2 + j] if j < N_ROWS - 1 else instrs[pc + n - 1, 2]
            if optab[o, 2] != dt or row_addrs_sized(ix[-1:], o, optab, dims, meta, addrs, r0, c0, 1) == 0:
                return -1
        first = dt if first < 0 else first
        if (fz[pc, 7] & ROT_THEN) == 0:
            return first
        pc += n


def fused_rotary_piece(fra, pc, unused_a, unused_b):
    """PC_FUSED_ROTARY: the FK_ROTARY run at pc = (kind, n, a's, b's, c's, d's, e's operands,
    ROT_R_SWAP | ROT_Y_SWAP) over the frame's tile at (r0, c0); returns n, or 0 when it cannot
    take the tile (nothing changed then but ix, its scratch)."""
    fr = fm.frame(fra)
    fz, instrs, meta, dims, optab = fm.fuse(fr), fm.instrs(fr), fm.meta(fr), fm.dims(fr), fm.optab(fr)
    addrs, fp, st, ix = fm.addrs(fr), fm.fptr(fr), fm.states(fr), fm.ix(fr)
    aok, r0, c0 = fr[FR_AOK], fr[FR_R0], fr[FR_C0]
    if aok != 1:   # (ALIASED: an in-place update; row by row it could read a row it wrote)
        return 0
    n, nr = fz[pc, 1], meta[M_NR]
    nrows, ncv = min(meta[M_BM], meta[M_ROWS] - r0), min(meta[M_BN], meta[M_COLS] - c0)
    if nrows < 1 or ncv < MIN_LANES or ix.shape[0] < nr * (N_ROWS + 1) + 3 * N_ROWS + 1:
        return 0
    # operands of one dtype, one unit-stride column dim, row-major tiles (any row strides)
    dt = _addressable(fz, instrs, pc, optab, dims, meta, addrs, r0, c0, ix)
    if dt < 0:
        return 0
    src = ix[nr + 2 * N_ROWS:nr + 3 * N_ROWS]   # the operands: a, b, c, d, e, then y's (the store's)
    for j in range(N_ROWS - 1):
        src[j] = fz[pc, 2 + j]
    src[N_ROWS - 1] = instrs[pc + n - 1, 2]
    r_swap, y_swap = (fz[pc, 7] & ROT_R_SWAP) != 0, (fz[pc, 7] & ROT_Y_SWAP) != 0
    sc = ix[:nr + 2 * N_ROWS]
    inc = ix[nr + 3 * N_ROWS:nr * (N_ROWS + 1) + 3 * N_ROWS]
    size = lane_bytes(dt)
    _start(src, optab, dims, addrs, nr, r0, c0, sc, size)
    _carries(src, optab, dims, nr, inc, size)
    _rows(sc, inc, dims, nr, nrows, ncv, r_swap, y_swap, dt)
    bracket(fp, st, instrs, pc, n, RS_FULL)
    return n
