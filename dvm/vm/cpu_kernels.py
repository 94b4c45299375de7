"""Tile kernels of the CPU VM: loads/stores with dtype conversion, casts, elementwise ops,
reductions. Every function works on whole tiles (1-D register rows of BM*BN lanes) with one
loop per op, so the per-instruction dispatch costs nanoseconds per tile and each loop vectorizes.

Op ids below are this module's own numbering (frozen into the numba disk cache); cpu.py maps the
ISA table onto them at import time, so a renumbered ISA never meets a stale cache.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, types
from numba.extending import overload

from .cpu_bits import OPTS, bf2f, f2bf, f2h, f64_to_f16_f32, h2f
from .cpu_math import (SINCOS_BIG, erff, exp2f, exp_into, expm1f, gelu_tanhf, geluf, log1pf, log2f, logf,
                       sigmoid_into, sincosf, tanhf)

# banks / dtype codes (checked against dvm.graph.dtypes in cpu.py)
BK_F32, BK_F64, BK_I64, BK_B8 = 0, 1, 2, 3
DT_BOOL, DT_I32, DT_I64, DT_F16, DT_BF16, DT_F32, DT_F64 = 0, 1, 2, 3, 4, 5, 6

# elementwise ops (this module's numbering)
EW_NAMES = ("neg", "abs", "exp", "exp2", "expm1", "log", "log2", "log1p", "sqrt", "rsqrt",
            "reciprocal", "sin", "cos", "tanh", "sigmoid", "erf", "gelu", "gelu_tanh", "silu", "relu",
            "floor", "ceil", "round", "trunc", "sign", "logical_not", "isnan", "isinf", "isfinite",
            "add", "sub", "mul", "div", "floor_divide", "remainder", "pow", "maximum", "minimum",
            "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor",
            "bitwise_and", "bitwise_or", "bitwise_xor", "where", "clamp")
(OP_NEG, OP_ABS, OP_EXP, OP_EXP2, OP_EXPM1, OP_LOG, OP_LOG2, OP_LOG1P, OP_SQRT, OP_RSQRT,
 OP_RECIP, OP_SIN, OP_COS, OP_TANH, OP_SIGMOID, OP_ERF, OP_GELU, OP_GELU_TANH, OP_SILU, OP_RELU,
 OP_FLOOR, OP_CEIL, OP_ROUND, OP_TRUNC, OP_SIGN, OP_LNOT, OP_ISNAN, OP_ISINF, OP_ISFINITE,
 OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_FLOORDIV, OP_REM, OP_POW, OP_MAX, OP_MIN,
 OP_EQ, OP_NE, OP_LT, OP_LE, OP_GT, OP_GE, OP_LAND, OP_LOR, OP_LXOR,
 OP_BAND, OP_BOR, OP_BXOR, OP_WHERE, OP_CLAMP) = range(len(EW_NAMES))
RED_NAMES = ("sum", "prod", "max", "min", "argmax", "argmin")
R_SUM, R_PROD, R_MAX, R_MIN, R_ARGMAX, R_ARGMIN = range(len(RED_NAMES))

# what each elementwise handler implements, per bank (the ISA coverage test reads these)
_FMATH = {"neg", "abs", "exp", "exp2", "expm1", "log", "log2", "log1p", "sqrt", "rsqrt", "reciprocal",
          "sin", "cos", "tanh", "sigmoid", "erf", "gelu", "gelu_tanh", "silu", "relu", "floor", "ceil",
          "round", "trunc", "sign"}
HANDLED = {
    ("un", BK_F32): _FMATH, ("un", BK_F64): _FMATH, ("un", BK_I64): {"neg", "abs", "relu", "sign"},
    ("un", BK_B8): {"logical_not"},
    ("pred", BK_F32): {"isnan", "isinf", "isfinite"}, ("pred", BK_F64): {"isnan", "isinf", "isfinite"},
    ("bin", BK_F32): {"add", "sub", "mul", "div", "floor_divide", "remainder", "pow", "maximum", "minimum"},
    ("bin", BK_F64): {"add", "sub", "mul", "div", "floor_divide", "remainder", "pow", "maximum", "minimum"},
    ("bin", BK_I64): {"add", "sub", "mul", "floor_divide", "remainder", "pow", "maximum", "minimum",
                      "bitwise_and", "bitwise_or", "bitwise_xor"},
    ("bin", BK_B8): {"logical_and", "logical_or", "logical_xor", "bitwise_and", "bitwise_or", "bitwise_xor"},
    ("cmp", BK_F32): {"eq", "ne", "lt", "le", "gt", "ge"}, ("cmp", BK_F64): {"eq", "ne", "lt", "le", "gt", "ge"},
    ("cmp", BK_I64): {"eq", "ne", "lt", "le", "gt", "ge"},
    ("where", BK_F32): {"where"}, ("where", BK_F64): {"where"}, ("where", BK_I64): {"where"},
    ("where", BK_B8): {"where"},
    ("clamp", BK_F32): {"clamp"}, ("clamp", BK_F64): {"clamp"}, ("clamp", BK_I64): {"clamp"},
}
REDUCTIONS_HANDLED = {BK_F32: set(RED_NAMES), BK_F64: set(RED_NAMES), BK_I64: set(RED_NAMES)}

ERR_UNHANDLED, ERR_ZERODIV = 1, 2
# instruction groups / elementwise kinds of the interpreter (cpu.py maps the ISA onto them)
G_LOAD, G_STORE, G_CONST, G_INDEX, G_CAST, G_EW, G_ACCINIT, G_ACC, G_RFIN, G_ROWRED, G_STOREROW = range(11)
K_UN, K_PRED, K_BIN, K_CMP, K_WHERE, K_CLAMP = range(6)
_SQRT1_2 = 0.70710678118654752440
_SQRT_2_OVER_PI = 0.79788456080286535588
_I64_MIN = np.int64(-2 ** 63)


# --- elementwise: float banks ------------------------------------------------------------------
@njit(**OPTS)
def _un_common(op, o, a):
    """Ops whose float32 result is exactly the rounded float64 result; generic over f32/f64."""
    n = o.shape[0]
    if op == OP_NEG:
        for i in range(n):
            o[i] = -a[i]
    elif op == OP_ABS:
        for i in range(n):
            o[i] = abs(a[i])
    elif op == OP_SQRT:
        for i in range(n):
            o[i] = np.sqrt(a[i])
    elif op == OP_RSQRT:
        for i in range(n):
            o[i] = 1.0 / np.sqrt(np.float64(a[i]))
    elif op == OP_RECIP:   # (float32: _un_f32)
        for i in range(n):
            o[i] = 1.0 / np.float64(a[i])
    elif op == OP_RELU:
        for i in range(n):
            x = a[i]
            o[i] = 0.0 if x < 0 else x
    elif op == OP_FLOOR:
        for i in range(n):
            o[i] = np.floor(a[i])
    elif op == OP_CEIL:
        for i in range(n):
            o[i] = np.ceil(a[i])
    elif op == OP_ROUND:
        for i in range(n):
            o[i] = np.rint(a[i])
    elif op == OP_TRUNC:
        for i in range(n):
            o[i] = np.trunc(a[i])
    elif op == OP_SIGN:
        for i in range(n):
            x = a[i]
            o[i] = 1.0 if x > 0 else (-1.0 if x < 0 else 0.0)
    else:
        return False
    return True


@njit(**OPTS)
def _sigmoid64(x):
    e = np.exp(-abs(x))
    return 1.0 / (1.0 + e) if x >= 0 else e / (1.0 + e)


@njit(inline='always', **OPTS)
def _sincos_huge(x, big):
    """|x| beyond the float32 reduction's range (big: SINCOS_BIG in x's type), and finite."""
    v = abs(x)
    return (v > big) & (v != np.inf)


@njit(**OPTS)
def _un_f32(op, o, a):
    n = o.shape[0]
    if op == OP_RECIP:   # float32 division: the float64 quotient rounded once, bit for bit
        for i in range(n):
            o[i] = np.float32(1.0) / a[i]
        return True
    if _un_common(op, o, a):
        return True
    if op == OP_EXP:
        exp_into(o, a, n)
    elif op == OP_EXP2:
        for i in range(n):
            o[i] = exp2f(a[i])
    elif op == OP_EXPM1:
        for i in range(n):
            o[i] = expm1f(a[i])
    elif op == OP_LOG:
        for i in range(n):
            o[i] = logf(a[i])
    elif op == OP_LOG2:
        for i in range(n):
            o[i] = log2f(a[i])
    elif op == OP_LOG1P:
        for i in range(n):
            o[i] = log1pf(a[i])
    elif op == OP_SIN or op == OP_COS:
        q = 0 if op == OP_SIN else 1
        for i in range(n):
            o[i] = sincosf(a[i], q)
        # Huge arguments are rare: an OR-reduction finds them. A loop that tests each lane and
        # calls libm where it holds is if-converted, and libm then runs on every lane (~7x).
        big = 0
        for i in range(n):
            big |= 1 if _sincos_huge(a[i], np.float32(SINCOS_BIG)) else 0
        if big:
            for i in range(n):   # recomputed with libm in float64
                x = np.float64(a[i])
                if _sincos_huge(x, SINCOS_BIG):
                    o[i] = np.sin(x) if q == 0 else np.cos(x)
    elif op == OP_TANH:
        for i in range(n):
            o[i] = tanhf(a[i])
    elif op == OP_SIGMOID:
        sigmoid_into(o, a, n, False)
    elif op == OP_ERF:
        for i in range(n):
            o[i] = erff(a[i])
    elif op == OP_GELU:
        for i in range(n):
            o[i] = geluf(a[i])
    elif op == OP_GELU_TANH:
        for i in range(n):
            o[i] = gelu_tanhf(a[i])
    elif op == OP_SILU:
        sigmoid_into(o, a, n, True)
    else:
        return False
    return True


@njit(**OPTS)
def _un_f64(op, o, a):
    n = o.shape[0]
    if _un_common(op, o, a):
        return True
    if op == OP_EXP:
        for i in range(n):
            o[i] = np.exp(a[i])
    elif op == OP_EXP2:
        for i in range(n):
            o[i] = np.exp2(a[i])
    elif op == OP_EXPM1:
        for i in range(n):
            o[i] = np.expm1(a[i])
    elif op == OP_LOG:
        for i in range(n):
            o[i] = np.log(a[i])
    elif op == OP_LOG2:
        for i in range(n):
            o[i] = np.log2(a[i])
    elif op == OP_LOG1P:
        for i in range(n):
            o[i] = np.log1p(a[i])
    elif op == OP_SIN:
        for i in range(n):
            o[i] = np.sin(a[i])
    elif op == OP_COS:
        for i in range(n):
            o[i] = np.cos(a[i])
    elif op == OP_TANH:
        for i in range(n):
            o[i] = np.tanh(a[i])
    elif op == OP_SIGMOID:
        for i in range(n):
            o[i] = _sigmoid64(a[i])
    elif op == OP_ERF:
        for i in range(n):
            o[i] = math.erf(a[i])
    elif op == OP_GELU:
        for i in range(n):
            x = a[i]
            o[i] = 0.5 * x * (1.0 + math.erf(x * _SQRT1_2))
    elif op == OP_GELU_TANH:
        for i in range(n):
            x = a[i]
            o[i] = 0.5 * x * (1.0 + np.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)))
    elif op == OP_SILU:
        for i in range(n):
            x = a[i]
            o[i] = x * _sigmoid64(x)
    else:
        return False
    return True


@njit(**OPTS)
def _pred(op, o, a):
    n = o.shape[0]
    if op == OP_ISNAN:
        for i in range(n):
            o[i] = np.isnan(a[i])
    elif op == OP_ISINF:
        for i in range(n):
            o[i] = np.isinf(a[i])
    elif op == OP_ISFINITE:
        for i in range(n):
            o[i] = np.isfinite(a[i])
    else:
        return False
    return True


def _fmax(a, b):
    """np.maximum of two scalars: NaN propagates, b on ties (+-0). numba only."""
    raise NotImplementedError


def _fmin(a, b):
    """np.minimum of two scalars: NaN propagates, b on ties (+-0). numba only."""
    raise NotImplementedError


# The float forms are max/min plus one NaN select: `a if (a > b or a != a) else b` did not
# vectorize in place (lo[j] = f(lo[j], hi[j]), the reductions' combine) for AVX2, 7x slower a
# tile. Integers keep the plain select (int64 max has no AVX2 instruction; the select is faster).
@overload(_fmax)
def _fmax_impl(a, b):
    if isinstance(a, types.Float) or isinstance(b, types.Float):
        def fmax_float(a, b):
            m = max(b, a)
            return m if (a == a) & (b == b) else a + b
        return fmax_float
    return lambda a, b: a if a > b else b


@overload(_fmin)
def _fmin_impl(a, b):
    if isinstance(a, types.Float) or isinstance(b, types.Float):
        def fmin_float(a, b):
            m = min(b, a)
            return m if (a == a) & (b == b) else a + b
        return fmin_float
    return lambda a, b: a if a < b else b


@njit(**OPTS)
def _floordiv64(a, b):
    if b == 0:
        return a / b
    mod = np.fmod(a, b)
    div = (a - mod) / b
    if mod != 0 and (b < 0) != (mod < 0):
        div -= 1.0
    if div == 0:
        return np.copysign(0.0, a / b)
    fl = np.floor(div)
    if div - fl > 0.5:
        fl += 1.0
    return fl


@njit(**OPTS)
def _rem64(a, b):
    mod = np.fmod(a, b)
    if mod != 0 and (b < 0) != (mod < 0):
        mod += b
    return mod


@njit(**OPTS)
def _bin_float(op, o, a, b):
    n = o.shape[0]
    if op == OP_ADD:
        for i in range(n):
            o[i] = a[i] + b[i]
    elif op == OP_SUB:
        for i in range(n):
            o[i] = a[i] - b[i]
    elif op == OP_MUL:
        for i in range(n):
            o[i] = a[i] * b[i]
    elif op == OP_DIV:
        for i in range(n):
            o[i] = a[i] / b[i]
    elif op == OP_MAX:
        for i in range(n):
            o[i] = _fmax(a[i], b[i])
    elif op == OP_MIN:
        for i in range(n):
            o[i] = _fmin(a[i], b[i])
    elif op == OP_FLOORDIV:
        for i in range(n):
            o[i] = _floordiv64(np.float64(a[i]), np.float64(b[i]))
    elif op == OP_REM:
        for i in range(n):
            o[i] = _rem64(np.float64(a[i]), np.float64(b[i]))
    elif op == OP_POW:
        for i in range(n):
            o[i] = np.power(np.float64(a[i]), np.float64(b[i]))
    else:
        return False
    return True


# --- elementwise: int64 and bool banks ----------------------------------------------------------
@njit(**OPTS)
def _un_i64(op, o, a):
    n = o.shape[0]
    if op == OP_NEG:
        for i in range(n):
            o[i] = -a[i]
    elif op == OP_ABS:
        for i in range(n):
            x = a[i]
            o[i] = -x if x < 0 else x
    elif op == OP_RELU:
        for i in range(n):
            x = a[i]
            o[i] = 0 if x < 0 else x
    elif op == OP_SIGN:
        for i in range(n):
            x = a[i]
            o[i] = 1 if x > 0 else (-1 if x < 0 else 0)
    else:
        return False
    return True


@njit(**OPTS)
def _ipow(a, b):
    if b < 0:
        if a == 1:
            return np.int64(1)
        if a == -1:
            return np.int64(1) if b % 2 == 0 else np.int64(-1)
        return np.int64(0)
    r = np.int64(1)
    base = a
    e = b
    while e > 0:
        if e & 1:
            r = r * base
        base = base * base
        e >>= 1
    return r


@njit(**OPTS)
def _bin_i64(op, o, a, b):
    """Returns 0, ERR_UNHANDLED or ERR_ZERODIV."""
    n = o.shape[0]
    if op == OP_ADD:
        for i in range(n):
            o[i] = a[i] + b[i]
    elif op == OP_SUB:
        for i in range(n):
            o[i] = a[i] - b[i]
    elif op == OP_MUL:
        for i in range(n):
            o[i] = a[i] * b[i]
    elif op == OP_MAX:
        for i in range(n):
            o[i] = max(a[i], b[i])
    elif op == OP_MIN:
        for i in range(n):
            o[i] = min(a[i], b[i])
    elif op == OP_BAND:
        for i in range(n):
            o[i] = a[i] & b[i]
    elif op == OP_BOR:
        for i in range(n):
            o[i] = a[i] | b[i]
    elif op == OP_BXOR:
        for i in range(n):
            o[i] = a[i] ^ b[i]
    elif op == OP_POW:
        for i in range(n):
            o[i] = _ipow(a[i], b[i])
    elif op == OP_FLOORDIV or op == OP_REM:
        for i in range(n):
            if b[i] == 0:
                return ERR_ZERODIV
        if op == OP_FLOORDIV:
            for i in range(n):
                x, y = a[i], b[i]
                o[i] = -x if y == -1 else x // y
        else:
            for i in range(n):
                x, y = a[i], b[i]
                o[i] = 0 if y == -1 else x % y
    else:
        return ERR_UNHANDLED
    return 0


@njit(**OPTS)
def _un_b8(op, o, a):
    if op != OP_LNOT:
        return False
    for i in range(o.shape[0]):
        o[i] = 1 if a[i] == 0 else 0
    return True


@njit(**OPTS)
def _bin_b8(op, o, a, b):
    n = o.shape[0]
    if op == OP_LAND or op == OP_BAND:
        for i in range(n):
            o[i] = a[i] & b[i]
    elif op == OP_LOR or op == OP_BOR:
        for i in range(n):
            o[i] = a[i] | b[i]
    elif op == OP_LXOR or op == OP_BXOR:
        for i in range(n):
            o[i] = a[i] ^ b[i]
    else:
        return False
    return True


@njit(**OPTS)
def _cmp(op, o, a, b):
    n = o.shape[0]
    if op == OP_EQ:
        for i in range(n):
            o[i] = a[i] == b[i]
    elif op == OP_NE:
        for i in range(n):
            o[i] = a[i] != b[i]
    elif op == OP_LT:
        for i in range(n):
            o[i] = a[i] < b[i]
    elif op == OP_LE:
        for i in range(n):
            o[i] = a[i] <= b[i]
    elif op == OP_GT:
        for i in range(n):
            o[i] = a[i] > b[i]
    elif op == OP_GE:
        for i in range(n):
            o[i] = a[i] >= b[i]
    else:
        return False
    return True


@njit(**OPTS)
def _where(o, c, a, b):
    for i in range(o.shape[0]):
        o[i] = a[i] if c[i] != 0 else b[i]


@njit(**OPTS)
def _clamp(o, x, lo, hi):
    for i in range(o.shape[0]):
        o[i] = _fmin(_fmax(x[i], lo[i]), hi[i])


# --- casts -------------------------------------------------------------------------------------
@njit(**OPTS)
def _cast_to_int(o, a, t, is_float):
    n = o.shape[0]
    if is_float:
        lo = -2147483648.0 if t == DT_I32 else -9223372036854775808.0
        hi = 2147483648.0 if t == DT_I32 else 9223372036854775808.0
        for i in range(n):
            x = np.float64(a[i])
            ok = x >= lo and x < hi
            v = np.int64(x if ok else 0.0)
            o[i] = v if ok else np.int64(lo)
    elif t == DT_I32:
        for i in range(n):
            o[i] = np.int64(np.int32(a[i]))
    else:
        for i in range(n):
            o[i] = np.int64(a[i])


@njit(**OPTS)
def _cast_to_f32(o, a, t, src):
    n = o.shape[0]
    if t == DT_F16:
        if src == BK_F64:
            for i in range(n):
                o[i] = f64_to_f16_f32(np.float64(a[i]))
        else:   # f32 (exact from bool; ints >= 2**24 round to inf in f16 anyway)
            for i in range(n):
                o[i] = h2f(f2h(np.float32(a[i])))
    elif t == DT_BF16:
        for i in range(n):
            o[i] = bf2f(f2bf(np.float32(a[i])))
    else:
        for i in range(n):
            o[i] = np.float32(a[i])


@njit(**OPTS)
def _cast_to_b8(o, a):
    for i in range(o.shape[0]):
        o[i] = a[i] != 0


@njit(**OPTS)
def _cast_to_f64(o, a):
    for i in range(o.shape[0]):
        o[i] = np.float64(a[i])
