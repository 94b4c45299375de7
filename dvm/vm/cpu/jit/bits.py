"""Bit-level building blocks of the CPU VM (numba), written so that LLVM vectorizes the loops
that call them:

- bit casts (float32 <-> int, float64 <-> int64), a fused multiply-add and address -> typed
  pointer, as numba intrinsics;
- float16 <-> float32 conversions: the CPU's own instructions (x86 F16C: LLVM's fpext / fptrunc
  of `half`) where the code is compiled for a CPU that has them, else bit manipulation; both round
  to nearest even and give the same value for every input, a NaN's payload aside;
- bfloat16 <-> float32 conversions by bit manipulation (round to nearest even).
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import config as numba_config
from numba.core.codegen import get_host_cpu_features
from numba.extending import intrinsic

OPTS = dict(nogil=True, error_model="numpy")
f32 = np.float32


def NUMBA_INLINE(call, caller_ir, callee_ir) -> bool:
    """`inline=NUMBA_INLINE`: numba copies the function into each caller's IR, as 'always' does,
    also in the build processes, which leave 'always' to LLVM (host/lean_compile). For a function
    whose callers' loops measured slower inlined by LLVM (each use says which)."""
    return True


# --- intrinsics ---------------------------------------------------------------------------------
@intrinsic
def bits_f32(typingctx, v):
    """Integer (low 32 bits) -> float32 with that bit pattern."""
    if not isinstance(v, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        val, w = args[0], args[0].type.width
        if w > 32:
            val = builder.trunc(val, ir.IntType(32))
        elif w < 32:
            val = builder.zext(val, ir.IntType(32))
        return builder.bitcast(val, ir.FloatType())
    return types.float32(v), codegen


@intrinsic
def f32_bits(typingctx, x):
    """float32 -> its bit pattern as a non-negative int64."""
    if x != types.float32:
        return None

    def codegen(context, builder, sig, args):
        return builder.zext(builder.bitcast(args[0], ir.IntType(32)), ir.IntType(64))
    return types.int64(x), codegen


@intrinsic
def bits_f64(typingctx, v):
    if not isinstance(v, types.Integer) or v.bitwidth != 64:
        return None

    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], ir.DoubleType())
    return types.float64(v), codegen


@intrinsic
def f64_bits(typingctx, x):
    if x != types.float64:
        return None

    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], ir.IntType(64))
    return types.int64(x), codegen


@intrinsic
def fmaf(typingctx, a, b, c):
    """a*b + c with one rounding (llvm.fma.f32: vfmadd on x86, vectorizes)."""
    if not (a == types.float32 and b == types.float32 and c == types.float32):
        return None

    def codegen(context, builder, sig, args):
        f = ir.FloatType()
        fn = builder.module.declare_intrinsic("llvm.fma", [f], ir.FunctionType(f, [f, f, f]))
        return builder.call(fn, args)
    return types.float32(a, b, c), codegen


def _ptr_intrinsic(nbtype):
    def impl(typingctx, addr):
        if not isinstance(addr, types.Integer):
            return None
        sig = types.CPointer(nbtype)(addr)

        def codegen(context, builder, sig, args):
            return builder.inttoptr(args[0], context.get_value_type(sig.return_type))
        return sig, codegen
    impl.__name__ = f"ptr_{nbtype}"
    return intrinsic(impl)


ptr_u8 = _ptr_intrinsic(types.uint8)
ptr_u16 = _ptr_intrinsic(types.uint16)
ptr_i32 = _ptr_intrinsic(types.int32)
ptr_i64 = _ptr_intrinsic(types.int64)
ptr_f32 = _ptr_intrinsic(types.float32)
ptr_f64 = _ptr_intrinsic(types.float64)


# --- half / bfloat16 ----------------------------------------------------------------------------
_HALF_MAGIC = f32(2.0 ** -14)   # bits 113 << 23
_DENORM_MAGIC = f32(0.5)        # bits 126 << 23


@njit(**OPTS)
def _h2f_bits(h):
    """float16 bits -> float32 (exact)."""
    h = np.int64(h) & 0xFFFF
    neg = (h & 0x8000) != 0
    o = (h & 0x7FFF) << 13
    e = o & 0x0F800000
    o = o + (112 << 23)
    if e == 0x0F800000:
        o = o + (112 << 23)
    v = bits_f32(o)
    if e == 0:
        v = bits_f32(o + (1 << 23)) - _HALF_MAGIC
    return -v if neg else v


@njit(**OPTS)
def _f2h_bits(x):
    """float32 -> float16 bits, round to nearest even (NaN -> quiet NaN, overflow -> inf)."""
    u = f32_bits(np.float32(x))
    sign = (u >> 16) & 0x8000
    u = u & 0x7FFFFFFF
    if u >= 0x47800000:
        r = np.int64(0x7E00) if u > 0x7F800000 else np.int64(0x7C00)
    elif u < 0x38800000:
        r = f32_bits(bits_f32(u) + _DENORM_MAGIC) - (126 << 23)
    else:
        r = (u - (112 << 23) + 0xFFF + ((u >> 13) & 1)) >> 13
    return r | sign


@intrinsic
def _h2f_cpu(typingctx, h):
    """float16 bits (the low 16 of an integer) -> float32 by the CPU's conversion (exact)."""
    if not isinstance(h, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        v = args[0]
        if v.type.width > 16:
            v = builder.trunc(v, ir.IntType(16))
        elif v.type.width < 16:
            v = builder.zext(v, ir.IntType(16))
        return builder.fpext(builder.bitcast(v, ir.HalfType()), ir.FloatType())
    return types.float32(h), codegen


@intrinsic
def _f2h_cpu(typingctx, x):
    """float32 -> float16 bits (as a non-negative int64) by the CPU's conversion: round to nearest
    even, overflow to inf, a NaN stays a NaN."""
    if x != types.float32:
        return None

    def codegen(context, builder, sig, args):
        half = builder.fptrunc(args[0], ir.HalfType())
        return builder.zext(builder.bitcast(half, ir.IntType(16)), ir.IntType(64))
    return types.int64(x), codegen


def _cpu_converts_halves() -> bool:
    """The code is compiled for an x86 CPU with F16C (numba's target features: NUMBA_CPU_FEATURES,
    else the host's). Without it LLVM would call a runtime library function numba does not link."""
    features = numba_config.CPU_FEATURES or get_host_cpu_features()
    return "+f16c" in features.split(",")


CPU_HALVES = _cpu_converts_halves()


@njit(**OPTS)
def h2f(h):
    """float16 bits -> float32 (exact)."""
    if CPU_HALVES:
        return _h2f_cpu(np.int64(h))   # (callers' dead branches pass other types)
    return _h2f_bits(h)


@njit(**OPTS)
def f2h(x):
    """float32 -> float16 bits, round to nearest even (overflow -> inf, NaN -> a quiet NaN)."""
    if CPU_HALVES:
        return _f2h_cpu(np.float32(x))
    return _f2h_bits(x)


@njit(**OPTS)
def bf2f(b):
    return bits_f32((np.int64(b) & 0xFFFF) << 16)


def _bf16_round(builder, u):
    """float32 bits u (i32 or a vector of them) -> bfloat16 bits, same shape of i16: round to
    nearest even; a NaN keeps its top bits and becomes quiet. In 32-bit lanes (numba's integer
    arithmetic would widen them to 64 and halve the vector width)."""
    i32 = ir.IntType(32)

    def c(v):
        k = ir.Constant(i32, v)
        return ir.Constant(u.type, [k] * u.type.count) if isinstance(u.type, ir.VectorType) else k
    hi = builder.lshr(u, c(16))
    nan = builder.icmp_unsigned(">", builder.and_(u, c(0x7FFFFFFF)), c(0x7F800000))
    rounded = builder.lshr(builder.add(builder.add(u, c(0x7FFF)), builder.and_(hi, c(1))), c(16))
    out = ir.VectorType(ir.IntType(16), u.type.count) if isinstance(u.type, ir.VectorType) else ir.IntType(16)
    return builder.trunc(builder.select(nan, builder.or_(hi, c(0x40)), rounded), out)


@intrinsic
def _f2bf_ir(typingctx, x):
    if x != types.float32:
        return None

    def codegen(context, builder, sig, args):
        return builder.zext(_bf16_round(builder, builder.bitcast(args[0], ir.IntType(32))), ir.IntType(64))
    return types.int64(x), codegen


@njit(**OPTS)
def f2bf(x):
    """float32 -> bfloat16 bits, round to nearest even."""
    return _f2bf_ir(np.float32(x))


def _block_converter(lanes: int, to_f32: bool, half: bool):
    """An intrinsic (src, dst addresses) converting `lanes` consecutive lanes in one vector:
    16-bit ones (float16 when `half`, else bfloat16) -> float32 when `to_f32`, else back (the
    rounding of f2h / f2bf). A fixed-size block costs a few instructions, where a loop over a
    short run pays its trip-count and alias checks (~30 ns a run)."""
    def impl(typingctx, src, dst):
        if not (isinstance(src, types.Integer) and isinstance(dst, types.Integer)):
            return None

        def codegen(context, builder, sig, args):
            f32v = ir.VectorType(ir.FloatType(), lanes)
            i32v = ir.VectorType(ir.IntType(32), lanes)
            w16v = ir.VectorType(ir.HalfType() if half else ir.IntType(16), lanes)
            src_p, dst_p = (builder.inttoptr(a, t.as_pointer()) for a, t in
                            zip(args, (w16v, f32v) if to_f32 else (f32v, w16v)))
            x = builder.load(src_p, align=2 if to_f32 else 4)
            if to_f32 and half:
                y = builder.fpext(x, f32v)
            elif to_f32:
                sixteen = ir.Constant(i32v, [ir.Constant(ir.IntType(32), 16)] * lanes)
                y = builder.bitcast(builder.shl(builder.zext(x, i32v), sixteen), f32v)
            elif half:
                y = builder.fptrunc(x, w16v)
            else:
                y = _bf16_round(builder, builder.bitcast(x, i32v))
            builder.store(y, dst_p, align=4 if to_f32 else 2)
            return context.get_dummy_value()
        return types.none(src, dst), codegen
    impl.__name__ = f"{'h' if half else 'bf'}{'2f' if to_f32 else '_from_f'}{lanes}"
    return intrinsic(impl)


CONVERT_BLOCK, CONVERT_WIDE = 8, 32   # lanes of the block converters


def _block_run(to_f32: bool, half: bool):
    """convert(src, dst, n): a run of n >= CONVERT_BLOCK lanes (src, dst addresses) converted as
    _block_converter says, in blocks of CONVERT_WIDE then CONVERT_BLOCK lanes; the last block ends
    at lane n (it may convert some lanes twice, to the same values)."""
    wide, block = _block_converter(CONVERT_WIDE, to_f32, half), _block_converter(CONVERT_BLOCK, to_f32, half)
    src_size, dst_size = (2, 4) if to_f32 else (4, 2)

    @njit(inline='always', **OPTS)
    def convert(src, dst, n):
        p = 0
        while p + CONVERT_WIDE <= n:
            wide(src + p * src_size, dst + p * dst_size)
            p += CONVERT_WIDE
        while p + CONVERT_BLOCK <= n:
            block(src + p * src_size, dst + p * dst_size)
            p += CONVERT_BLOCK
        if p < n:
            p = n - CONVERT_BLOCK
            block(src + p * src_size, dst + p * dst_size)
    return convert


bf2f_run, f2bf_run = _block_run(True, False), _block_run(False, False)
h2f_run, f2h_run = _block_run(True, True), _block_run(False, True)   # for code compiled with F16C only


@njit(**OPTS)
def f64_to_f32_odd(x):
    """float64 -> float32 rounded to odd, so that a later f32 -> f16 rounding is exact."""
    f = np.float32(x)
    d = np.float64(f)
    if d != x and f == f and f != 0 and abs(d) != np.inf:
        u = f32_bits(f)
        if (u & 1) == 0:
            up = (d < x) == (f > 0)   # magnitude must grow
            u = u + 1 if up else u - 1
            f = bits_f32(u)
    return f


@njit(**OPTS)
def f64_to_f16_f32(x):
    """float64 -> float16 (one rounding) -> float32."""
    return h2f(f2h(f64_to_f32_odd(x)))
