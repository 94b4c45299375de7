"""The GPU VM's elementwise ops, casts and reduction combines, per register bank.

Each function switches on an op number (abi.py: positions in the op table's lists) with scalar,
uniform branches in two levels (a range, then the op), so a decode costs a few compares. Semantics
are the reference VM's (vm/reference.py, graph/ops.py): NaN-propagating maximum/minimum, PyTorch's
integer division and remainder, float32-bank results rounded once per instruction.
"""
from __future__ import annotations

import triton
import triton.language as tl

from . import mathf as m
from . import mathf_ext as mx
from .kabi import *  # noqa: F401,F403 (constexpr ids)

I64_MIN = tl.constexpr(-9223372036854775808)
I64_MAX = tl.constexpr(9223372036854775807)


# --- shared -------------------------------------------------------------------------------------
@triton.jit
def maxnan(a, b):
    """NumPy's maximum: a NaN in either operand wins."""
    return tl.where((a >= b) | (a != a), a, b)


@triton.jit
def minnan(a, b):
    return tl.where((a <= b) | (a != a), a, b)


@triton.jit
def compare(op, a, b):
    """eq, ne, lt, le, gt, ge (any bank) -> bool."""
    if op < B_LT:
        if op == B_EQ:
            v = a == b
        else:
            v = a != b
    elif op < B_GT:
        if op == B_LT:
            v = a < b
        else:
            v = a <= b
    elif op == B_GT:
        v = a > b
    else:
        v = a >= b
    return v


@triton.jit
def float_pred(op, x):
    """isnan, isinf, isfinite -> bool."""
    if op == U_ISNAN:
        v = x != x
    elif op == U_ISINF:
        v = tl.abs(x) == float("inf")
    else:
        v = tl.abs(x) < float("inf")
    return v


@triton.jit
def round_even(x, BIG: tl.constexpr):
    """Round half to even (BIG = 2**mantissa bits: larger values are integers already)."""
    a = tl.abs(x)
    r = (a + BIG) - BIG
    r = tl.where(x < 0, -r, r)
    return tl.where((a < BIG) & (x != 0), r, x)


@triton.jit
def _float_common(op, x):
    """neg, abs, relu, floor, ceil, trunc, sign (any float bank)."""
    if op < U_RELU:
        if op == U_NEG:
            v = -x
        else:
            v = tl.abs(x)
    elif op < U_CEIL:
        if op == U_RELU:
            v = tl.where(x < 0, 0.0, x)
        else:
            v = tl.floor(x)
    elif op == U_CEIL:
        v = tl.ceil(x)
    elif op == U_TRUNC:
        v = tl.where(x < 0, tl.ceil(x), tl.floor(x))
    else:
        v = tl.where(x > 0, 1.0, tl.where(x < 0, -1.0, 0.0)).to(x.dtype)
    return v


# --- float banks ----------------------------------------------------------------------------------
@triton.jit
def unary_float(op, x):
    """Every unary op of a float bank (float32 or float64 tiles: mathf picks the precision)."""
    if op < U_SQRT:
        if op < U_EXP:
            v = _float_common(op, x)
        elif op < U_EXPM1:
            if op == U_EXP:
                v = m.exp(x)
            else:
                v = m.exp2(x)
        elif op < U_LOG2:
            if op == U_EXPM1:
                v = m.expm1(x)
            else:
                v = m.log(x)
        elif op == U_LOG2:
            v = m.log2(x)
        else:
            v = m.log1p(x)
    elif op < U_TANH:
        if op < U_RECIP:
            if op == U_SQRT:
                v = m.sqrt(x)
            else:
                v = m.rsqrt_exact(x)
        elif op == U_RECIP:
            v = m.div(tl.full(x.shape, 1.0, x.dtype), x)
        elif op == U_SIN:
            v = mx.sin(x)
        else:
            v = mx.cos(x)
    elif op < U_GELU_TANH:
        if op < U_ERF:
            if op == U_TANH:
                v = m.tanh(x)
            else:
                v = m.sigmoid(x)
        elif op == U_ERF:
            v = mx.erf(x)
        else:
            v = mx.gelu(x)
    elif op < U_RELU:
        if op == U_GELU_TANH:
            v = mx.gelu_tanh(x)
        else:
            v = x * m.sigmoid(x)
    elif op == U_ROUND:
        if x.dtype == tl.float64:
            v = round_even(x, 4503599627370496.0)
        else:
            v = round_even(x, 8388608.0)
    else:
        v = _float_common(op, x)
    return v


@triton.jit
def float_binary(op, a, b):
    """add ... minimum on float32 or float64 tiles (float32 results rounded once)."""
    if op < B_DIV:
        if op == B_ADD:
            v = a + b
        elif op == B_SUB:
            v = a - b
        else:
            v = a * b
    elif op < B_POW:
        if op == B_DIV:
            v = m.div(a, b)
        elif op == B_FLOORDIV:
            v = float_floor_divide(a.to(tl.float64), b.to(tl.float64)).to(a.dtype)
        else:
            v = float_remainder(a, b)
    elif op == B_POW:
        v = tl.where(b == 2.0, a * a, m.powd(a.to(tl.float64), b.to(tl.float64)).to(a.dtype))
    elif op == B_MAX:
        v = maxnan(a, b)
    else:
        v = minnan(a, b)
    return v


@triton.jit
def float_floor_divide(a, b):
    """PyTorch's floor division of floats (graph/ops.py _float_floor_divide), in float64."""
    mod = m.fmod(a, b)
    q = m.div(a - mod, b)
    q = tl.where((mod != 0) & ((b < 0) != (mod < 0)), q - 1.0, q)
    fl = tl.floor(q)
    fl = tl.where(q - fl > 0.5, fl + 1.0, fl)
    quot = m.div(a, b)
    zero = tl.where(quot.to(tl.int64, bitcast=True) < 0, -0.0, 0.0)
    out = tl.where(q != 0, fl, zero)
    return tl.where(b == 0, quot, out)


@triton.jit
def float_remainder(a, b):
    mod = m.fmod(a, b)
    return tl.where((mod != 0) & ((b < 0) != (mod < 0)), mod + b, mod)


# --- int64 bank -----------------------------------------------------------------------------------
@triton.jit
def unary_i64(op, x):
    """neg, abs, relu, sign (wrapping: abs(INT64_MIN) == INT64_MIN)."""
    if op == U_NEG:
        v = 0 - x
    elif op == U_ABS:
        v = tl.where(x < 0, 0 - x, x)
    elif op == U_RELU:
        v = tl.where(x < 0, 0, x)
    else:
        v = tl.where(x > 0, 1, tl.where(x < 0, -1, 0)).to(tl.int64)
    return v


@triton.jit
def _int_divmod(a, b):
    """Floor quotient and remainder with the divisor's sign (Python's // and %). A zero divisor
    gives 0 (the reference raises; a GPU cannot); INT64_MIN // -1 wraps."""
    bs = tl.where(b == 0, 1, b)
    q = a // bs
    r = a - q * bs
    fix = (r != 0) & ((r < 0) != (bs < 0))
    q = tl.where(fix, q - 1, q)
    r = tl.where(fix, r + bs, r)
    q = tl.where(b == -1, 0 - a, q)
    r = tl.where(b == -1, 0, r)
    return tl.where(b == 0, 0, q), tl.where(b == 0, 0, r)


@triton.jit
def _int_pow(a, b):
    """a ** b with wrapping; negative exponents as graph/ops.py _pow."""
    e = tl.where(b < 0, 0, b)
    acc = tl.full(a.shape, 1, tl.int64)
    base = a
    for _ in range(64):
        acc = tl.where((e & 1) != 0, acc * base, acc)
        base = base * base
        e = e >> 1
    negval = tl.where(a == 1, 1, tl.where(a == -1, tl.where((b & 1) == 0, 1, -1), 0)).to(tl.int64)
    return tl.where(b < 0, negval, acc)


@triton.jit
def binary_i64(op, a, b):
    if op < B_FLOORDIV:
        if op == B_ADD:
            v = a + b
        elif op == B_SUB:
            v = a - b
        else:
            v = a * b
    elif op < B_POW:
        q, r = _int_divmod(a, b)
        if op == B_FLOORDIV:
            v = q
        else:
            v = r
    elif op < B_BAND:
        if op == B_POW:
            v = _int_pow(a, b)
        elif op == B_MAX:
            v = tl.maximum(a, b)
        else:
            v = tl.minimum(a, b)
    elif op == B_BAND:
        v = a & b
    elif op == B_BOR:
        v = a | b
    else:
        v = a ^ b
    return v


# --- bool bank ------------------------------------------------------------------------------------
@triton.jit
def binary_b8(op, a, b):
    """logical_and/or/xor and bitwise_and/or/xor on bools."""
    if (op == B_LAND) | (op == B_BAND):
        v = a & b
    elif (op == B_LOR) | (op == B_BOR):
        v = a | b
    else:
        v = a ^ b
    return v


@triton.jit
def clamp(x, lo, hi):
    """minimum(maximum(x, lo), hi), NaN-propagating (any numeric bank)."""
    return minnan(maxnan(x, lo), hi)


# --- casts ----------------------------------------------------------------------------------------
@triton.jit
def to_f16(x):
    """x (any bank) rounded to float16, to nearest even (Triton's interpreter mode truncates a
    float downcast unless told; a GPU rounds to nearest either way)."""
    if x.dtype.is_floating():
        v = x.to(tl.float16, fp_downcast_rounding="rtne")
    else:
        v = x.to(tl.float16)
    return v


@triton.jit
def bf16_bits(x):
    """The bfloat16 bit pattern (int16) of x (any bank) rounded through float32 (the reference's
    order) to nearest even, in integer arithmetic: bit-exact on a GPU and in Triton's interpreter
    mode (whose float conversions truncate bfloat16 and flush its subnormals)."""
    xf = x.to(tl.float32)
    u = xf.to(tl.int32, bitcast=True)
    r = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    r = tl.where(xf != xf, (u >> 16) | 0x40, r)     # NaN stays a (quiet) NaN
    return r.to(tl.int16)


@triton.jit
def bf16_value(bits):
    """The float32 value of bfloat16 bit patterns (int16)."""
    return (bits.to(tl.int32) << 16).to(tl.float32, bitcast=True)


@triton.jit
def to_f32_bank(x, dt):
    """A float32-bank value of dtype dt (float16 / bfloat16 / float32) from x of any bank."""
    if dt == DT_F16:
        v = to_f16(x).to(tl.float32)
    elif dt == DT_BF16:
        v = bf16_value(bf16_bits(x))
    else:
        v = x.to(tl.float32)
    return v


@triton.jit
def float_to_int(x, dt):
    """Truncation to int32 / int64; NaN and out-of-range values give the type's minimum."""
    if dt == DT_I32:
        ok = (x >= -2147483648.0) & (x < 2147483648.0)
        low = tl.full(x.shape, -2147483648, tl.int64)
    else:
        ok = (x >= -9223372036854775808.0) & (x < 9223372036854775808.0)
        low = tl.full(x.shape, I64_MIN, tl.int64)
    v = tl.where(ok, x, 0.0).to(tl.int64)
    return tl.where(ok, v, low)


@triton.jit
def int_to_int(x, dt):
    if dt == DT_I32:
        v = x.to(tl.int32).to(tl.int64)
    else:
        v = x
    return v


# --- reductions -----------------------------------------------------------------------------------
@triton.jit
def identity_like(x, op):
    """The accumulator start of reduction op, in x's dtype."""
    if x.dtype.is_floating():
        lo, hi = float("-inf"), float("inf")
    else:
        lo, hi = I64_MIN, I64_MAX
    if op == R_SUM:
        v = tl.full(x.shape, 0, x.dtype)
    elif op == R_PROD:
        v = tl.full(x.shape, 1, x.dtype)
    elif (op == R_MAX) | (op == R_ARGMAX):
        v = tl.full(x.shape, lo, x.dtype)
    else:
        v = tl.full(x.shape, hi, x.dtype)
    return v


@triton.jit
def combine(op, a, b):
    if op == R_SUM:
        v = a + b
    elif op == R_PROD:
        v = a * b
    elif op == R_MAX:
        v = maxnan(a, b)
    else:
        v = minnan(a, b)
    return v


@triton.jit
def arg_better(op, v_new, i_new, v_old, i_old, TIE: tl.constexpr):
    """Whether (v_new, i_new) replaces (v_old, i_old) for argmax/argmin: NaN wins, then the
    strictly better value, then (TIE) the lower index among equal values."""
    nan_new = v_new != v_new
    nan_old = v_old != v_old
    if op == R_ARGMAX:
        strictly = v_new > v_old
    else:
        strictly = v_new < v_old
    better = (strictly & ~nan_old) | (nan_new & ~nan_old)
    if TIE:
        same = (v_new == v_old) | (nan_new & nan_old)
        better = better | (same & (i_new < i_old))
    return better
