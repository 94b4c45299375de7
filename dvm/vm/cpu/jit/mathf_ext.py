"""float32 math of the CPU VM beyond jit/mathf's exp / log / tanh / sigmoid: erf, GELU (exact and
tanh forms) and sin / cos, written as jit/mathf is (straight-line code LLVM vectorizes, NaN, +-inf
and -0.0 as PyTorch). exp_hl, the exp of an argument known to more than f32 precision, serves
erf and the GELUs. Measured errors: tests/test_math_ulp.py (table in BENCHMARKS.md).
"""
from __future__ import annotations

import numpy as np
from numba import njit

from .bits import fmaf
from .mathf import _C1, _C2, _HALF, _LOG2E, _ONE, _P0, _P1, _P2, _P3, _P4, _ZERO, MOPTS, _scale2

f32 = np.float32


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
