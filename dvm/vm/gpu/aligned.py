"""Typed memory over a contiguous tile of one row: the fast path of specialised kernels under
DVM_GPU_VECTOR (specialize.py, body()). The caller checked at run time that the base address is
16-byte aligned, the index is a multiple of 4 plus tl.arange and the mask is lanes < a multiple of
4: those facts, given to the compiler as hints, let it move 4 lanes per thread at once (16-byte
loads and stores for f32, 8-byte for bf16; tiles.py's forms move one lane at a time)."""
import triton
import triton.language as tl

from . import ops
from .kabi import DT_BF16, DT_F32, DT_I32


@triton.jit
def _aligned(addr, ty):
    return tl.multiple_of(addr.to(tl.pointer_type(ty)), 16)


@triton.jit
def load_f32_aligned(addr, dt, idx, mask):
    if dt == DT_F32:
        v = tl.load(_aligned(addr, tl.float32) + idx, mask=mask, other=0.0)
    elif dt == DT_BF16:
        v = ops.bf16_value(tl.load(_aligned(addr, tl.int16) + idx, mask=mask, other=0))
    else:
        v = tl.load(_aligned(addr, tl.float16) + idx, mask=mask, other=0.0).to(tl.float32)
    return v


@triton.jit
def store_f32_aligned(addr, dt, idx, v, mask):
    if dt == DT_F32:
        tl.store(_aligned(addr, tl.float32) + idx, v, mask=mask)
    elif dt == DT_BF16:
        tl.store(_aligned(addr, tl.int16) + idx, ops.bf16_bits(v), mask=mask)
    else:
        tl.store(_aligned(addr, tl.float16) + idx, ops.to_f16(v), mask=mask)


@triton.jit
def load_f64_aligned(addr, idx, mask):
    return tl.load(_aligned(addr, tl.float64) + idx, mask=mask, other=0.0)


@triton.jit
def store_f64_aligned(addr, idx, v, mask):
    tl.store(_aligned(addr, tl.float64) + idx, v, mask=mask)


@triton.jit
def load_i64_aligned(addr, dt, idx, mask):
    if dt == DT_I32:
        v = tl.load(_aligned(addr, tl.int32) + idx, mask=mask, other=0).to(tl.int64)
    else:
        v = tl.load(_aligned(addr, tl.int64) + idx, mask=mask, other=0)
    return v


@triton.jit
def store_i64_aligned(addr, dt, idx, v, mask):
    if dt == DT_I32:
        tl.store(_aligned(addr, tl.int32) + idx, v.to(tl.int32), mask=mask)
    else:
        tl.store(_aligned(addr, tl.int64) + idx, v, mask=mask)


@triton.jit
def load_b8_aligned(addr, idx, mask):
    return tl.load(_aligned(addr, tl.int8) + idx, mask=mask, other=0) != 0


@triton.jit
def store_b8_aligned(addr, idx, v, mask):
    tl.store(_aligned(addr, tl.int8) + idx, v.to(tl.int8), mask=mask)
