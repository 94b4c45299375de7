"""float32 math of the CPU VM (exp, exp2, expm1, log, log2, log1p, tanh, sigmoid; erf, GELU, sin
and cos are in jit/mathf_ext), written so that LLVM vectorizes the loops that call it: range reduction and
polynomials in straight-line code (selects, no calls). NaN, +-inf and -0.0 follow PyTorch.
Measured errors vs a float64 reference: tests/test_math_ulp.py (table in BENCHMARKS.md) and
dvm/tools/cpu_probe.py (`ulp` mode). exp_into / sigmoid_into run a whole span (see there).
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from .bits import OPTS, bits_f32, f32_bits, fmaf

# polynomial kernels: let LLVM fuse a*b+c into FMA (never nnan/ninf/reassoc: IEEE specials stay exact)
MOPTS = dict(OPTS, fastmath={"contract"})
f32 = np.float32


# --- float32 math -------------------------------------------------------------------------------
_LOG2E = f32(1.44269504088896341)
_LN2 = f32(0.693147180559945309)
_C1 = f32(0.693359375)
_C2 = f32(-2.12194440e-4)
# e^r ~ 1 + r + r^2 p(r) on |r| <= ln2/2: p near-minimax (Lawson) for the relative error of e^r,
# 3.1e-9 (~0.03 ULP); one term fewer than Cephes' expf polynomial with the same accuracy.
_P0, _P1, _P2 = f32(1.3814611593261361e-3), f32(8.368710055947304e-3), f32(4.166838899254799e-2)
_P3, _P4 = f32(1.666652113199234e-1), f32(4.999999403953552e-1)
_ONE, _TWO, _HALF, _ZERO = f32(1.0), f32(2.0), f32(0.5), f32(0.0)
_EXP_HI, _EXP_LO = f32(88.8), f32(-104.0)


@intrinsic
def _scale2(typingctx, y, n):
    """y * 2**n for float32 n integral in [-151, 129] (NaN n counts as 0): two exact steps, one
    final rounding, in 32-bit integer lanes (an int64 detour halves the vector width)."""
    if y != types.float32 or n != types.float32:
        return None

    def codegen(context, builder, sig, args):
        yv, nv = args
        i32, f = ir.IntType(32), ir.FloatType()
        nv = builder.select(builder.fcmp_ordered("ord", nv, nv), nv, ir.Constant(f, 0.0))
        k = builder.fptosi(nv, i32)
        k1 = builder.ashr(k, ir.Constant(i32, 1))
        k2 = builder.sub(k, k1)
        bias = ir.Constant(i32, 127)
        s1 = builder.bitcast(builder.shl(builder.add(k1, bias), ir.Constant(i32, 23)), f)
        s2 = builder.bitcast(builder.shl(builder.add(k2, bias), ir.Constant(i32, 23)), f)
        return builder.fmul(builder.fmul(yv, s1), s2)
    return types.float32(y, n), codegen


@njit(**MOPTS)
def _exp_poly(r):
    p = (((_P0 * r + _P1) * r + _P2) * r + _P3) * r + _P4
    return p * r * r + r + _ONE


@intrinsic
def _scale_exp_bits(typingctx, y, t):
    """y * 2**n by adding n to y's exponent field, where t = n + _SHIFT (n's bits sit in t's
    mantissa, so bits(t) << 23 == n << 23 mod 2**32). Exact only while the result is a normal
    number: the caller guarantees that (exp_into's range check)."""
    if y != types.float32 or t != types.float32:
        return None

    def codegen(context, builder, sig, args):
        i32 = ir.IntType(32)
        yb, tb = (builder.bitcast(v, i32) for v in args)
        return builder.bitcast(builder.add(yb, builder.shl(tb, ir.Constant(i32, 23))), ir.FloatType())
    return types.float32(y, t), codegen


_SHIFT = f32(12582912.0)   # 1.5 * 2**23: x + _SHIFT rounds x to an integer held in the low mantissa
# exp's one-step scaling is exact (and bitwise equal to expf) for x in this range: n <= 127, and
# n >= -125 keeps the result normal for any polynomial value in [2**-0.5, 2**0.5].
EXP1_LO, EXP1_HI = f32(-86.5), f32(88.0)
EXP1_MID, EXP1_HALF = (EXP1_HI + EXP1_LO) / f32(2), (EXP1_HI - EXP1_LO) / f32(2)   # exact: 0.75, 87.25


@njit(**MOPTS)
def _exp_parts(x):
    """(n + _SHIFT, e**r) with x = n*ln2 + r, |r| <= ln2/2, for x clamped to [-104, 88.8]."""
    xc = x
    if xc > _EXP_HI:
        xc = _EXP_HI
    if xc < _EXP_LO:
        xc = _EXP_LO
    t = xc * _LOG2E + _SHIFT   # one FMA: n = x*log2(e) rounded to nearest even
    n = t - _SHIFT
    r = xc - n * _C1 - n * _C2
    return t, _exp_poly(r)


@njit(**MOPTS)
def expf(x):
    t, p = _exp_parts(x)
    return _scale2(p, t - _SHIFT)


@njit(**MOPTS)
def exp_one_step(x):
    """expf(x) bitwise for x in [EXP1_LO, EXP1_HI]; anything outside (NaN too) is garbage."""
    t, p = _exp_parts(x)
    return _scale_exp_bits(p, t)


# expf is +0 below this: it clamps x to _EXP_LO, and p * 2**-150 (p < 1) rounds to +0. A masked
# softmax's lanes (finfo.min, -inf) sit there: exp_lane takes them without expf's re-run.
EXP_ZERO = _EXP_LO


@njit(**MOPTS)
def exp_lane(x):
    """expf(x) bit for bit where exp_lane_exact(x); garbage elsewhere."""
    return exp_one_step(x) if x >= EXP_ZERO else _ZERO


@njit(**MOPTS)
def exp_lane_exact(x):
    """x in [EXP1_LO, EXP1_HI] or below EXP_ZERO (False for NaN)."""
    return abs(x - EXP1_MID) <= EXP1_HALF or x < EXP_ZERO


@njit(inline="always", **OPTS)
def exp_into(o, a, n):
    """o[:n] = expf(a[:n]). First with one-step scaling (no float -> int conversion, one
    exponent add instead of two multiplies) and +0 below EXP_ZERO, while flagging any other lane
    outside [EXP1_LO, EXP1_HI]; if one was (NaN, overflow, subnormal results), the whole span
    again with expf. Either way the values are expf's bit for bit, so a lane's result never
    depends on its neighbours (thread and tile splits stay bitwise stable). o must not overlap a
    (the verifier's dst_alias rule; fused callers pass a scratch row)."""
    outside = False
    for k in range(n):
        v = a[k]
        o[k] = exp_lane(v)
        outside |= not exp_lane_exact(v)
    if outside:
        for k in range(n):
            o[k] = expf(a[k])


@njit(**MOPTS)
def exp2f(x):
    xc = x
    if xc > f32(129.0):
        xc = f32(129.0)
    if xc < f32(-151.0):
        xc = f32(-151.0)
    n = np.rint(xc)
    r = (xc - n) * _LN2
    return _scale2(_exp_poly(r), n)


_E2, _E3, _E4, _E5 = f32(1 / 2), f32(1 / 6), f32(1 / 24), f32(1 / 120)
_E6, _E7, _E8, _E9 = f32(1 / 720), f32(1 / 5040), f32(1 / 40320), f32(1 / 362880)


@njit(inline="always", **MOPTS)   # LLVM does not inline it: numba does; FMAs explicit (see exp_hl)
def expm1f(x):
    xc = x
    if xc > f32(88.0):
        xc = f32(88.0)
    if xc < f32(-30.0):
        xc = f32(-30.0)
    n = np.rint(xc * _LOG2E)
    r = fmaf(-n, _C2, fmaf(-n, _C1, xc))
    if n == 0:
        r = xc
    pe = fmaf(fmaf(fmaf(fmaf(fmaf(fmaf(fmaf(_E9, r, _E8), r, _E7), r, _E6), r, _E5), r, _E4), r, _E3), r, _E2)
    p = fmaf(r * r, pe, r)
    t = _scale2(_ONE, n)
    y = fmaf(t, p, t - _ONE)
    if x > f32(88.0):
        y = expf(x)
    if x == 0:
        y = x
    return y


_SQRTHF = f32(0.707106781186547524)
_L0, _L1, _L2 = f32(7.0376836292e-2), f32(-1.1514610310e-1), f32(1.1676998740e-1)
_L3, _L4, _L5 = f32(-1.2420140846e-1), f32(1.4249322787e-1), f32(-1.6668057665e-1)
_L6, _L7, _L8 = f32(2.0000714765e-1), f32(-2.4999993993e-1), f32(3.3333331174e-1)
_TINY = f32(1.17549435e-38)
_TWO23 = f32(8388608.0)
_LOG2EA = f32(0.44269504088896340736)
_INF32 = f32(np.inf)
_NAN32 = f32(np.nan)


@njit(**MOPTS)
def _log_parts(x):
    """x > 0 finite: (e, t) with log(x) = e*ln2 + t, t = log(m) for m in [sqrt(.5), sqrt(2))."""
    xs = x * _TWO23 if x < _TINY else x
    adj = f32(-23.0) if x < _TINY else _ZERO
    u = f32_bits(xs)
    e = np.float32(((u >> 23) & 0xFF) - 126) + adj
    m = bits_f32((u & 0x007FFFFF) | 0x3F000000)   # [0.5, 1)
    if m < _SQRTHF:
        e = e - _ONE
        m = m + m - _ONE
    else:
        m = m - _ONE
    z = m * m
    y = ((((((((_L0 * m + _L1) * m + _L2) * m + _L3) * m + _L4) * m + _L5) * m + _L6) * m + _L7) * m + _L8) * m * z
    y = y - _HALF * z
    return e, m, y


@njit(**MOPTS)
def _log_special(x, v):
    if x == 0:
        v = -_INF32
    if x < 0:
        v = _NAN32
    if x == _INF32:
        v = x
    if x != x:
        v = x
    return v


@njit(**MOPTS)
def logf(x):
    e, m, y = _log_parts(x)
    v = y + e * _C2 + m + e * _C1
    return _log_special(x, v)


@njit(**MOPTS)
def log2f(x):
    e, m, y = _log_parts(x)
    v = y * _LOG2EA + m * _LOG2EA + y + m + e
    return _log_special(x, v)


@njit(**MOPTS)
def log1pf(x):
    u = _ONE + x
    d = u - _ONE
    v = logf(u) * (x / d)
    if d == 0:
        v = x
    if x == _INF32:
        v = x
    return v


_T0, _T1, _T2 = f32(-5.70498872745e-3), f32(2.06390887954e-2), f32(-5.37397155531e-2)
_T3, _T4 = f32(1.33314422036e-1), f32(-3.33332819422e-1)


@intrinsic
def _pow2i(typingctx, n):
    """2**n for float32 n integral in [-126, 127] (32-bit lanes: cvttps2dq, add, shift)."""
    if n != types.float32:
        return None

    def codegen(context, builder, sig, args):
        i32 = ir.IntType(32)
        k = builder.fptosi(args[0], i32)
        e = builder.shl(builder.add(k, ir.Constant(i32, 127)), ir.Constant(i32, 23))
        return builder.bitcast(e, ir.FloatType())
    return types.float32(n), codegen


_TANH_SAT = f32(9.5)   # tanh(x) rounds to +-1 in float32 beyond ~9.01


@njit(**MOPTS)
def tanhf(x):
    """Odd polynomial below 0.625, else 1 - 2/(exp(2|x|) + 1) with an exp specialised to the
    range [0, 19] (one scaling step, no clamping of specials: NaN takes the polynomial path)."""
    a = abs(x)
    a = a if a < _TANH_SAT else _TANH_SAT   # NaN -> 9.5 here; the select below returns NaN
    t = a + a
    n = np.rint(t * _LOG2E)
    r = t - n * _C1 - n * _C2
    e = _exp_poly(r) * _pow2i(n)
    big = _ONE - _TWO / (e + _ONE)
    big = big if x > 0 else -big
    z = x * x
    small = (((((_T0 * z + _T1) * z + _T2) * z + _T3) * z + _T4) * z) * x + x
    v = small if a < f32(0.625) or x != x else big
    return x if x == 0 else v   # keeps -0.0


@njit(**MOPTS)
def sigmoid_given(x, e):
    """sigmoid(x) from e = exp(-|x|)."""
    d = _ONE + e
    return _ONE / d if x >= 0 else e / d


@njit(**MOPTS)
def sigmoidf(x):
    return sigmoid_given(x, expf(-abs(x)))


@njit(inline="always", **OPTS)
def sigmoid_into(o, a, n, times_x):
    """o[:n] = sigmoid(a[:n]), or a * sigmoid(a) (SiLU) if times_x: exp_into's one-step scheme
    (exp(-|x|) is in its exact range while |x| <= -EXP1_LO), so again sigmoidf's values bit for
    bit. o must not overlap a."""
    outside = False
    if times_x:
        for k in range(n):
            x = a[k]
            o[k] = x * sigmoid_given(x, exp_one_step(-abs(x)))
            outside |= not (abs(x) <= -EXP1_LO)
    else:
        for k in range(n):
            x = a[k]
            o[k] = sigmoid_given(x, exp_one_step(-abs(x)))
            outside |= not (abs(x) <= -EXP1_LO)
    if outside and times_x:
        for k in range(n):
            o[k] = a[k] * sigmoidf(a[k])
    elif outside:
        for k in range(n):
            o[k] = sigmoidf(a[k])
