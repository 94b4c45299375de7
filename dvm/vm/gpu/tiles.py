"""Tile-level pieces of the GPU VM's kernel: buffer addresses, operand addressing, typed loads and
stores, the pairwise-halving reduction trees, and the register file (hot registers as SSA tiles,
the rest in scratch memory).

A tile is a 1-D block of TILE lanes; lane l holds (row r0 + l // BN, column c0 + l % BN) of the
kernel's rows x cols domain, so one compiled kernel serves every tile shape with BM * BN <= TILE.
Lanes outside the domain are masked on loads and stores (the reference VM clamps their indices
instead; their values never reach a valid result or memory either way).
"""
from __future__ import annotations

import triton
import triton.language as tl

from . import ops
from .kabi import *  # noqa: F401,F403


# --- buffers --------------------------------------------------------------------------------------
@triton.jit
def _pick4(s, a0, a1, a2, a3):
    if s < 2:
        if s == 0:
            v = a0
        else:
            v = a1
    elif s == 2:
        v = a2
    else:
        v = a3
    return v


@triton.jit
def slot_address(s, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, ext):
    """The byte address of argument s: one of the N_SLOTS kernel arguments, or the table at ext."""
    if s < 8:
        if s < 4:
            v = _pick4(s, a0, a1, a2, a3)
        else:
            v = _pick4(s - 4, a4, a5, a6, a7)
    elif s < N_SLOTS:
        if s < 12:
            v = _pick4(s - 8, a8, a9, a10, a11)
        else:
            v = _pick4(s - 12, a12, a13, a14, a15)
    else:
        v = tl.load(ext.to(tl.pointer_type(tl.int64)) + (s - N_SLOTS))
    return v


@triton.jit
def _unravel(idx, blk, sizes_at, opnd, strides_at, n):
    """sum over n folded dims of digit_d(idx) * stride_d (row-major flat idx, int64)."""
    acc = tl.full(idx.shape, 0, tl.int64)
    d = n - 1
    while d > 0:
        size = tl.maximum(tl.load(blk + sizes_at + d), 1)
        q = idx // size
        acc += (idx - q * size) * tl.load(opnd + strides_at + d)
        idx = q
        d -= 1
    if n > 0:
        acc += idx * tl.load(opnd + strides_at)
    return acc


@triton.jit
def element_index(blk, j, row, col):
    """Element index of operand j at each lane's (row, col): offset + row digits . row strides +
    col digits . col strides."""
    opnd = blk + tl.load(blk + H_OPNDS) + j * OW
    nr = tl.load(blk + H_NR)
    nc = tl.load(blk + H_NC)
    idx = tl.load(opnd + O_OFFSET) + _unravel(row, blk, H_SIZES, opnd, O_STRIDES, nr)
    return idx + _unravel(col, blk, H_SIZES + nr, opnd, O_STRIDES + nr, nc)


@triton.jit
def lane_rows(row0, li, bm, rows):
    """(row index, valid) of each lane: row0 + l // BN, inside the tile's BM rows and the domain."""
    row = row0 + li
    return row, (li < bm) & (row < rows)


@triton.jit
def lane_cols(col0, lj, body, cols):
    """(column index, valid) of each lane: col0 + l % BN in a body; column 0, valid, in the other
    sections (a finalize reads column 0 broadcast over the tile)."""
    on = (lj * 0 + body) != 0   # (broadcast first: Triton's interpreter mode mistypes a scalar compare)
    col = tl.where(on, col0 + lj, 0)
    return col, (col < cols) | ~on


@triton.jit
def operand(blk, j):
    """(argument slot, dtype code) of operand j."""
    opnd = blk + tl.load(blk + H_OPNDS) + j * OW
    return tl.load(opnd + O_SLOT), tl.load(opnd + O_DTYPE)


# --- typed memory ---------------------------------------------------------------------------------
# ALIGNED (specialised kernels' fast path under DVM_GPU_VECTOR, specialize.body()): the caller
# checked at run time that addr is 16-byte aligned, idx is a multiple of 4 plus tl.arange and the
# mask is lanes < a multiple of 4; given as compiler hints, they let it move 4 lanes per thread at
# once (16-byte accesses for f32, 8-byte for bf16).
@triton.jit
def _ptr(addr, ty: tl.constexpr, ALIGNED: tl.constexpr):
    p = addr.to(tl.pointer_type(ty))
    if ALIGNED:
        p = tl.multiple_of(p, 16)
    return p


@triton.jit
def load_f32(addr, dt, idx, mask, ALIGNED: tl.constexpr = False):
    if dt == DT_F32:
        v = tl.load(_ptr(addr, tl.float32, ALIGNED) + idx, mask=mask, other=0.0)
    elif dt == DT_BF16:
        v = ops.bf16_value(tl.load(_ptr(addr, tl.int16, ALIGNED) + idx, mask=mask, other=0))
    else:
        v = tl.load(_ptr(addr, tl.float16, ALIGNED) + idx, mask=mask, other=0.0).to(tl.float32)
    return v


@triton.jit
def store_f32(addr, dt, idx, v, mask, ALIGNED: tl.constexpr = False):
    if dt == DT_F32:
        tl.store(_ptr(addr, tl.float32, ALIGNED) + idx, v, mask=mask)
    elif dt == DT_BF16:
        tl.store(_ptr(addr, tl.int16, ALIGNED) + idx, ops.bf16_bits(v), mask=mask)
    else:
        tl.store(_ptr(addr, tl.float16, ALIGNED) + idx, ops.to_f16(v), mask=mask)


@triton.jit
def load_f64(addr, idx, mask, ALIGNED: tl.constexpr = False):
    return tl.load(_ptr(addr, tl.float64, ALIGNED) + idx, mask=mask, other=0.0)


@triton.jit
def store_f64(addr, idx, v, mask, ALIGNED: tl.constexpr = False):
    tl.store(_ptr(addr, tl.float64, ALIGNED) + idx, v, mask=mask)


@triton.jit
def load_i64(addr, dt, idx, mask, ALIGNED: tl.constexpr = False):
    if dt == DT_I32:
        v = tl.load(_ptr(addr, tl.int32, ALIGNED) + idx, mask=mask, other=0).to(tl.int64)
    else:
        v = tl.load(_ptr(addr, tl.int64, ALIGNED) + idx, mask=mask, other=0)
    return v


@triton.jit
def store_i64(addr, dt, idx, v, mask, ALIGNED: tl.constexpr = False):
    if dt == DT_I32:
        tl.store(_ptr(addr, tl.int32, ALIGNED) + idx, v.to(tl.int32), mask=mask)
    else:
        tl.store(_ptr(addr, tl.int64, ALIGNED) + idx, v, mask=mask)


@triton.jit
def load_b8(addr, idx, mask, ALIGNED: tl.constexpr = False):
    return tl.load(_ptr(addr, tl.int8, ALIGNED) + idx, mask=mask, other=0) != 0


@triton.jit
def store_b8(addr, idx, v, mask, ALIGNED: tl.constexpr = False):
    tl.store(_ptr(addr, tl.int8, ALIGNED) + idx, v.to(tl.int8), mask=mask)


# --- reductions over a tile's columns ---------------------------------------------------------------
@triton.jit
def _pow2_at_least(n):
    p = n * 0 + 1
    while p < n:
        p *= 2
    return p


@triton.jit
def broadcast_row(x, li, bn, TILE: tl.constexpr):
    """Each lane gets the value of column 0 of its row."""
    return tl.gather(x, tl.minimum(li * bn, TILE - 1), 0)


@triton.jit
def tree(x, op, lanes, li, lj, bn, TILE: tl.constexpr):
    """Reduce each row's BN lanes with a pairwise-halving tree over the next power of two (lanes
    past BN are the identity padding: they leave their partner unchanged), the reference VM's
    order; the result is broadcast over the row."""
    width = bn
    h = _pow2_at_least(bn) // 2
    while h >= 1:
        pair = lj < tl.minimum(h, width - h)
        y = tl.gather(x, tl.minimum(lanes + h, TILE - 1), 0)
        x = tl.where(pair, ops.combine(op, x, y), x)
        width = tl.minimum(width, h)
        h = h // 2
    return broadcast_row(x, li, bn, TILE)


@triton.jit
def arg_tree(v, i, op, lanes, li, lj, bn, TILE: tl.constexpr):
    """The (value, index) tree of argmax/argmin: NaNs and ties pick the lower index; returns the
    winning index broadcast over the row."""
    width = bn
    h = _pow2_at_least(bn) // 2
    while h >= 1:
        pair = lj < tl.minimum(h, width - h)
        partner = tl.minimum(lanes + h, TILE - 1)
        vr = tl.gather(v, partner, 0)
        ir = tl.gather(i, partner, 0)
        take = pair & ops.arg_better(op, vr, ir, v, i, True)
        v = tl.where(take, vr, v)
        i = tl.where(take, ir, i)
        width = tl.minimum(width, h)
        h = h // 2
    return broadcast_row(i, li, bn, TILE)


# --- the register file --------------------------------------------------------------------------------
@triton.jit
def spill_load(sp, r, hot, lanes, TILE: tl.constexpr, DTYPE: tl.constexpr):
    tl.debug_barrier()
    return tl.load(sp.to(tl.pointer_type(DTYPE)) + (r - hot) * TILE + lanes)


@triton.jit
def spill_store(sp, r, hot, v, lanes, TILE: tl.constexpr, DTYPE: tl.constexpr):
    tl.store(sp.to(tl.pointer_type(DTYPE)) + (r - hot) * TILE + lanes, v)
    tl.debug_barrier()


@triton.jit
def pick8(r, x0, x1, x2, x3, x4, x5, x6, x7, sp, lanes, TILE: tl.constexpr):
    if r < 4:
        v = _pick4(r, x0, x1, x2, x3)
    elif r < 8:
        v = _pick4(r - 4, x4, x5, x6, x7)
    else:
        v = spill_load(sp, r, 8, lanes, TILE, x0.dtype)
    return v


@triton.jit
def put8(r, v, x0, x1, x2, x3, x4, x5, x6, x7, sp, lanes, TILE: tl.constexpr):
    if r < 4:
        if r < 2:
            if r == 0:
                x0 = v
            else:
                x1 = v
        elif r == 2:
            x2 = v
        else:
            x3 = v
    elif r < 8:
        if r < 6:
            if r == 4:
                x4 = v
            else:
                x5 = v
        elif r == 6:
            x6 = v
        else:
            x7 = v
    else:
        spill_store(sp, r, 8, v, lanes, TILE, x0.dtype)
    return x0, x1, x2, x3, x4, x5, x6, x7


@triton.jit
def pick4(r, x0, x1, x2, x3, sp, lanes, TILE: tl.constexpr, HOT: tl.constexpr):
    """HOT (4 or 0): how many of the bank's registers are tiles; the rest live in scratch."""
    if HOT == 0:
        v = spill_load(sp, r, 0, lanes, TILE, x0.dtype)
    elif r < 4:
        v = _pick4(r, x0, x1, x2, x3)
    else:
        v = spill_load(sp, r, 4, lanes, TILE, x0.dtype)
    return v


@triton.jit
def put4(r, v, x0, x1, x2, x3, sp, lanes, TILE: tl.constexpr, HOT: tl.constexpr):
    if HOT == 0:
        spill_store(sp, r, 0, v, lanes, TILE, x0.dtype)
    elif r < 2:
        if r == 0:
            x0 = v
        else:
            x1 = v
    elif r < 4:
        if r == 2:
            x2 = v
        else:
            x3 = v
    else:
        spill_store(sp, r, 4, v, lanes, TILE, x0.dtype)
    return x0, x1, x2, x3


@triton.jit
def pick2(r, x0, x1, sp, lanes, TILE: tl.constexpr, HOT: tl.constexpr):
    """HOT (2 or 0): as pick4."""
    if HOT == 0:
        v = spill_load(sp, r, 0, lanes, TILE, x0.dtype)
    elif r == 0:
        v = x0
    elif r == 1:
        v = x1
    else:
        v = spill_load(sp, r, 2, lanes, TILE, x0.dtype)
    return v


@triton.jit
def put2(r, v, x0, x1, sp, lanes, TILE: tl.constexpr, HOT: tl.constexpr):
    if HOT == 0:
        spill_store(sp, r, 0, v, lanes, TILE, x0.dtype)
    elif r == 0:
        x0 = v
    elif r == 1:
        x1 = v
    else:
        spill_store(sp, r, 2, v, lanes, TILE, x0.dtype)
    return x0, x1


@triton.jit
def pick_b(r, x0, x1, x2, x3, sp, lanes, TILE: tl.constexpr):
    """Bool registers spill as int8."""
    if r < 4:
        v = _pick4(r, x0, x1, x2, x3)
    else:
        v = spill_load(sp, r, 4, lanes, TILE, tl.int8) != 0
    return v


@triton.jit
def put_b(r, v, x0, x1, x2, x3, sp, lanes, TILE: tl.constexpr):
    if r < 2:
        if r == 0:
            x0 = v
        else:
            x1 = v
    elif r < 4:
        if r == 2:
            x2 = v
        else:
            x3 = v
    else:
        spill_store(sp, r, 4, v.to(tl.int8), lanes, TILE, tl.int8)
    return x0, x1, x2, x3
