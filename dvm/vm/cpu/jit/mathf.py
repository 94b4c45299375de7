"""float32 math of the CPU VM (exp, exp2, expm1, log, log2, log1p, tanh, sigmoid, erf, gelu,
sin, cos), written so that LLVM vectorizes the loops that call it: range reduction and
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


# The functions below are inlined by numba (inline="always": LLVM would not inline them), so they
# are compiled with the caller's flags, without fastmath contract: FMAs are explicit (fmaf).
@njit(inline="always", **MOPTS)
def exp_hl(xh, xl):
    """exp(xh + xl) for xh in [-103, 88], |xl| <= ulp(xh) (an argument known to more than f32
    precision). The reduced argument is carried with its rounding error, r + rl, and e^rl is
    applied as rl * e^r, so the only large rounding is the final 1 + t (max ~0.8 ULP)."""
    n = np.rint(xh * _LOG2E)
    r1 = fmaf(-n, _C1, xh)                # exact (n*_C1 has <= 18 significant bits)
    r = fmaf(-n, _C2, r1)
    rl = fmaf(-n, _C2, r1 - r) + xl        # r1 - r exact: the rounding error of r, plus xl
    p = fmaf(fmaf(fmaf(fmaf(_P0, r, _P1), r, _P2), r, _P3), r, _P4)
    q2 = r * r * p
    t = fmaf(rl, r + q2, q2 + rl) + r       # e^(r + rl) - 1 ~ r + r^2 p + rl e^r
    return _scale2(t + _ONE, n)


# erfc(a/sqrt2) = 2 exp(-a^2/2) t P(s) for a in [0, 14]: t = 1/(1 + _GC a), s = _GK1 t + _GK0
# maps t in [1/(1 + 14 _GC), 1] onto [-1, 1]; P of degree 10, near-minimax (Lawson) for the
# relative error with f32 coefficients (rounded one by one, the rest refitted): 1.1e-8.
_FOUR, _SQRT2 = f32(4.0), f32(1.4142135623730951)
_GC, _GK1, _GK0 = f32(0.4), f32(2.357142925262451), f32(-1.3571428060531616)
_G0, _G1, _G2 = f32(0.31014278531074524), f32(0.16047541797161102), f32(0.03617057949304581)
_G3, _G4, _G5 = f32(-0.00455401511862874), f32(-0.0029826697427779436), f32(0.0006187267135828733)
_G6, _G7, _G8 = f32(0.00023966528533492237), f32(-0.00011851642921101302), f32(-4.246418939146679e-06)
_G9, _G10 = f32(1.4599575479223859e-05), f32(-2.3463715024263365e-06)


@njit(inline="always", **MOPTS)
def normal_tail_scaled(a):
    """exp(a^2/2) erfc(a/sqrt2) / 2 (the standard normal's upper tail over exp(-a^2/2)) for a in
    [0, 14]. t carries the rounding of 1 + _GC a and of the division (t_lo, first order), and
    the last Horner step is folded into the product with t, so P's largest term is rounded once."""
    d = fmaf(_GC, a, _ONE)
    d_lo = fmaf(_GC, a, _ONE - d)                  # 1 - d is exact for d in [1, 8]
    t = _ONE / d
    t_lo = t * fmaf(-t, d_lo, fmaf(-t, d, _ONE))  # 1/(d + d_lo) - t
    s = fmaf(t, _GK1, _GK0)
    p = fmaf(fmaf(fmaf(fmaf(fmaf(_G10, s, _G9), s, _G8), s, _G7), s, _G6), s, _G5)
    p = fmaf(fmaf(fmaf(fmaf(p, s, _G4), s, _G3), s, _G2), s, _G1)
    sp = s * p
    return fmaf(t, _G0, fmaf(t_lo, _G0 + sp, t * sp))


# erf(x) = x + x*P(x^2) on |x| < 1 (P: erf(x)/x - 1, Lawson fit, rel. error 1.2e-9)
_R0, _R1, _R2 = f32(1.2837916709551256e-01), f32(-3.7612625956535339e-01), f32(1.1283585429191589e-01)
_R3, _R4, _R5 = f32(-2.6853810995817184e-02), f32(5.1883277483284473e-03), f32(-8.0101925414055586e-04)
_R6 = f32(7.8538578236475587e-05)


@njit(inline="always", **MOPTS)
def erff(x):
    """|x| < 1: odd polynomial; else +-(1 - erfc(|x|)) (|x| clamped to 4, where erf rounds to
    +-1), erfc(a) = 2 exp(-a^2) normal_tail_scaled(a sqrt2) (exp's argument split exactly; the
    rounding of a sqrt2 moves that factor by ~1e-7 of erfc <= 0.16). NaN takes the polynomial
    path."""
    ax = abs(x)
    z = x * x
    pz = fmaf(fmaf(fmaf(fmaf(fmaf(fmaf(_R6, z, _R5), z, _R4), z, _R3), z, _R2), z, _R1), z, _R0)
    small = fmaf(x, pz, x)
    a = ax if ax < _FOUR else _FOUR
    h = a * a
    e = exp_hl(-h, -fmaf(a, a, -h))
    big = _ONE - (e + e) * normal_tail_scaled(a * _SQRT2)
    big = -big if x < 0 else big
    return small if (ax < _ONE or x != x) else big


_GELU_BIG = f32(14.0)    # |x| beyond: gelu(x) = x, or a result below the f32 normal range


@njit(inline="always", **MOPTS)
def geluf(x):
    """0.5 x erfc(-x/sqrt2) = x - 0.5 x erfc(|x|/sqrt2) (x > 0): no cancellation, no libm, one
    division. The exponent x*x/2 is split hi/lo exactly (FMA), so exp(-x*x/2) keeps its
    relative accuracy in the negative tail, and the product with it is carried with its
    rounding error. Max ~3.5 ULP."""
    ax = abs(x)
    ax = ax if ax < _GELU_BIG else _GELU_BIG    # NaN -> _GELU_BIG; x itself carries the NaN
    h = ax * ax
    e = exp_hl(-_HALF * h, -_HALF * fmaf(ax, ax, -h))
    e2 = e + e if abs(x) < _GELU_BIG else _ZERO  # -inf: -inf * 0 = NaN, as 0.5 x erfc(inf)
    r = normal_tail_scaled(ax)
    q = e2 * r                                   # erfc(|x|/sqrt2) = q + q_lo
    q_lo = fmaf(e2, r, -q)
    hx = _HALF * x
    pos = fmaf(-hx, q, x)
    pos = x if x > f32(10.0) else pos            # +inf stays inf
    neg = fmaf(hx, q, hx * q_lo) if hx != 0 else hx  # keeps the sign of zero (-0.0, -1e-45)
    return neg if x <= 0 else pos


_GT_C1 = 1.5957691216057308        # 2 sqrt(2/pi)
_GT_C3 = 0.071354816273287509      # 2 sqrt(2/pi) 0.044715


@njit(inline="always", **MOPTS)
def gelu_tanhf(x):
    """0.5 x (1 + tanh(u)) = x sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3). 2u is formed in
    float64 and split hi/lo, so exp(-|2u|) keeps its relative accuracy in the negative tail."""
    xd = np.float64(x)
    w = xd * (_GT_C1 + _GT_C3 * xd * xd)
    w = -abs(w)
    inside = w > -103.0                        # beyond, e = 0: -inf -> -inf * 0 = NaN, as the
    w = w if inside else -103.0                # reference; NaN -> -103, x carries the NaN
    wh = np.float32(w)
    e = exp_hl(wh, np.float32(w - np.float64(wh)))
    e = e if inside else _ZERO
    num = e if x < 0 else _ONE
    return x * (num / (_ONE + e))


# sin / cos: reduction and polynomials in float64 (fdlibm kernels), rounded once at the end.
_TWO_OVER_PI = 0.636619772367581382433
_PIO2_1 = 1.57079632673412561417e+00
_PIO2_1T = 6.07710050650619224932e-11
_S1, _S2, _S3 = -1.66666666666666324348e-01, 8.33333333332248946124e-03, -1.98412698298579493134e-04
_S4, _S5, _S6 = 2.75573137070700676789e-06, -2.50507602534068634195e-08, 1.58969099521155010221e-10
_K1, _K2, _K3 = 4.16666666666666019037e-02, -1.38888888888741095749e-03, 2.48015872894767294178e-05
_K4, _K5, _K6 = -2.75573143513906633035e-07, 2.08757232129817482790e-09, -1.13596475577881948265e-11
SINCOS_BIG = 1.0e6   # |x| above this: the caller recomputes with libm (float64)


@njit(**MOPTS)
def sincosf(x, quad_shift):
    """sin(x) (quad_shift=0) or cos(x) (quad_shift=1) of a float32, as float32."""
    xd = np.float64(x)
    k = np.rint(xd * _TWO_OVER_PI)
    r = (xd - k * _PIO2_1) - k * _PIO2_1T
    # The quadrant stays in float64: AVX2 has no float64 -> int64 conversion, and one in the
    # loop keeps it scalar. kq - 4 floor(kq / 4) is exact (|kq| < 2^53) and in {0, 1, 2, 3};
    # NaN (from NaN or inf arguments, where r is NaN too) fails every test below.
    kq = k + quad_shift
    m = kq - 4.0 * np.floor(kq * 0.25)
    z = r * r
    s = r + r * z * (_S1 + z * (_S2 + z * (_S3 + z * (_S4 + z * (_S5 + z * _S6)))))
    c = 1.0 - 0.5 * z + z * z * (_K1 + z * (_K2 + z * (_K3 + z * (_K4 + z * (_K5 + z * _K6)))))
    v = c if (m == 1.0 or m == 3.0) else s
    v = -v if m >= 2.0 else v
    if quad_shift == 0 and x == 0:
        v = xd
    return np.float32(v)
