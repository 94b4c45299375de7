"""float32 and float64 erf, GELU (exact and tanh forms), sin and cos of the GPU VM, beyond mathf's
exp / log / tanh / sigmoid: float32 as the CPU VM's jit/mathf_ext (exp_hl, the exp of an argument
known to more than f32 precision, serves erf and the GELUs), float64 through Triton's math, and
each by dtype as in mathf (IEEE-rounded operations, explicit FMAs; see mathf).
"""
from __future__ import annotations

import triton
import triton.language as tl

from .mathf import _C1, _C2, _LOG2E, _P0, _P1, _P2, _P3, _P4, div, rint32, scale2, sigmoidd

_GC = tl.constexpr(0.4)
_GK1 = tl.constexpr(2.357142925262451)
_GK0 = tl.constexpr(-1.3571428060531616)
_G0 = tl.constexpr(0.31014278531074524)
_G1 = tl.constexpr(0.16047541797161102)
_G2 = tl.constexpr(0.03617057949304581)
_G3 = tl.constexpr(-0.00455401511862874)
_G4 = tl.constexpr(-0.0029826697427779436)
_G5 = tl.constexpr(0.0006187267135828733)
_G6 = tl.constexpr(0.00023966528533492237)
_G7 = tl.constexpr(-0.00011851642921101302)
_G8 = tl.constexpr(-4.246418939146679e-06)
_G9 = tl.constexpr(1.4599575479223859e-05)
_G10 = tl.constexpr(-2.3463715024263365e-06)
_R0 = tl.constexpr(1.2837916709551256e-01)
_R1 = tl.constexpr(-3.7612625956535339e-01)
_R2 = tl.constexpr(1.1283585429191589e-01)
_R3 = tl.constexpr(-2.6853810995817184e-02)
_R4 = tl.constexpr(5.1883277483284473e-03)
_R5 = tl.constexpr(-8.0101925414055586e-04)
_R6 = tl.constexpr(7.8538578236475587e-05)
_SQRT2 = tl.constexpr(1.4142135623730951)
_SQRT1_2 = tl.constexpr(0.70710678118654752440)
_GT_C1 = tl.constexpr(1.5957691216057308)     # 2 sqrt(2/pi)
_GT_C3 = tl.constexpr(0.071354816273287509)   # 2 sqrt(2/pi) 0.044715
_TWO_OVER_PI = tl.constexpr(0.636619772367581382433)
_SHIFT64 = tl.constexpr(6755399441055744.0)  # 1.5 * 2**52
_PIO2_1 = tl.constexpr(1.57079632673412561417e+00)
_PIO2_1T = tl.constexpr(6.07710050650619224932e-11)
_S1 = tl.constexpr(-1.66666666666666324348e-01)
_S2 = tl.constexpr(8.33333333332248946124e-03)
_S3 = tl.constexpr(-1.98412698298579493134e-04)
_S4 = tl.constexpr(2.75573137070700676789e-06)
_S5 = tl.constexpr(-2.50507602534068634195e-08)
_S6 = tl.constexpr(1.58969099521155010221e-10)
_K1 = tl.constexpr(4.16666666666666019037e-02)
_K2 = tl.constexpr(-1.38888888888741095749e-03)
_K3 = tl.constexpr(2.48015872894767294178e-05)
_K4 = tl.constexpr(-2.75573143513906633035e-07)
_K5 = tl.constexpr(2.08757232129817482790e-09)
_K6 = tl.constexpr(-1.13596475577881948265e-11)
_SINCOS_BIG = tl.constexpr(1.0e6)


# --- float32 ------------------------------------------------------------------------------------
@triton.jit
def exp_hl(xh, xl):
    """exp(xh + xl), |xl| <= ulp(xh), xh in [-103, 88] (the reduced argument keeps its error)."""
    n = rint32(xh * _LOG2E)
    r1 = tl.fma(-n, _C1, xh)
    r = tl.fma(-n, _C2, r1)
    rl = tl.fma(-n, _C2, r1 - r) + xl
    p = tl.fma(tl.fma(tl.fma(tl.fma(_P0, r, _P1), r, _P2), r, _P3), r, _P4)
    q2 = r * r * p
    t = tl.fma(rl, r + q2, q2 + rl) + r
    return scale2(t + 1.0, n)


@triton.jit
def normal_tail_scaled(a):
    """exp(a^2/2) erfc(a/sqrt2) / 2 for a in [0, 14] (cpu/jit/mathf_ext.normal_tail_scaled)."""
    d = tl.fma(_GC, a, 1.0)
    d_lo = tl.fma(_GC, a, 1.0 - d)
    t = div(tl.full(a.shape, 1.0, tl.float32), d)
    t_lo = t * tl.fma(-t, d_lo, tl.fma(-t, d, 1.0))
    s = tl.fma(t, _GK1, _GK0)
    p = tl.fma(tl.fma(tl.fma(tl.fma(tl.fma(_G10, s, _G9), s, _G8), s, _G7), s, _G6), s, _G5)
    p = tl.fma(tl.fma(tl.fma(tl.fma(p, s, _G4), s, _G3), s, _G2), s, _G1)
    sp = s * p
    return tl.fma(t, _G0, tl.fma(t_lo, _G0 + sp, t * sp))


@triton.jit
def erff(x):
    ax = tl.abs(x)
    z = x * x
    pz = tl.fma(tl.fma(tl.fma(tl.fma(tl.fma(tl.fma(_R6, z, _R5), z, _R4), z, _R3), z, _R2), z, _R1), z, _R0)
    small = tl.fma(x, pz, x)
    a = tl.where(ax < 4.0, ax, 4.0)
    h = a * a
    e = exp_hl(-h, -tl.fma(a, a, -h))
    big = 1.0 - (e + e) * normal_tail_scaled(a * _SQRT2)
    big = tl.where(x < 0, -big, big)
    return tl.where((ax < 1.0) | (x != x), small, big)


@triton.jit
def geluf(x):
    """0.5 x erfc(-x/sqrt2), without cancellation in either tail (cpu/jit/mathf_ext.geluf)."""
    ax = tl.abs(x)
    ax = tl.where(ax < 14.0, ax, 14.0)
    h = ax * ax
    e = exp_hl(-0.5 * h, -0.5 * tl.fma(ax, ax, -h))
    e2 = tl.where(tl.abs(x) < 14.0, e + e, 0.0)
    r = normal_tail_scaled(ax)
    q = e2 * r
    q_lo = tl.fma(e2, r, -q)
    hx = 0.5 * x
    pos = tl.fma(-hx, q, x)
    pos = tl.where(x > 10.0, x, pos)
    neg = tl.where(hx != 0, tl.fma(hx, q, hx * q_lo), hx)
    return tl.where(x <= 0, neg, pos)


@triton.jit
def gelu_tanhf(x):
    """x sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3); 2u formed in float64, split hi/lo."""
    xd = x.to(tl.float64)
    w = xd * (_GT_C1 + _GT_C3 * xd * xd)
    w = -tl.abs(w)
    inside = w > -103.0
    w = tl.where(inside, w, -103.0)
    wh = w.to(tl.float32)
    e = exp_hl(wh, (w - wh.to(tl.float64)).to(tl.float32))
    e = tl.where(inside, e, 0.0)
    num = tl.where(x < 0, e, 1.0)
    return x * div(num, 1.0 + e)


@triton.jit
def sincosf(x, QUAD: tl.constexpr):
    """sin(x) (QUAD=0) or cos(x) (QUAD=1): fdlibm kernels in float64, rounded once; |x| > 1e6
    (and inf, NaN) through the float64 library functions."""
    xd = x.to(tl.float64)
    k = (xd * _TWO_OVER_PI + _SHIFT64) - _SHIFT64
    r = (xd - k * _PIO2_1) - k * _PIO2_1T
    kq = k + QUAD
    m = kq - 4.0 * tl.floor(kq * 0.25)
    z = r * r
    s = r + r * z * (_S1 + z * (_S2 + z * (_S3 + z * (_S4 + z * (_S5 + z * _S6)))))
    c = 1.0 - 0.5 * z + z * z * (_K1 + z * (_K2 + z * (_K3 + z * (_K4 + z * (_K5 + z * _K6)))))
    v = tl.where((m == 1.0) | (m == 3.0), c, s)
    v = tl.where(m >= 2.0, -v, v)
    if QUAD == 0:
        v = tl.where(x == 0, xd, v)
        lib = tl.sin(xd)
    else:
        lib = tl.cos(xd)
    v = tl.where(tl.abs(xd) <= _SINCOS_BIG, v, lib)
    return v.to(tl.float32)


# --- float64 ------------------------------------------------------------------------------------
@triton.jit
def gelud(x):
    return 0.5 * x * (1.0 + tl.erf(x * _SQRT1_2))


@triton.jit
def gelu_tanhd(x):
    return x * sigmoidd(x * (_GT_C1 + _GT_C3 * x * x))


# --- by dtype ------------------------------------------------------------------------------------
@triton.jit
def sin(x):
    if x.dtype == tl.float64:
        v = tl.sin(x)
    else:
        v = sincosf(x, 0)
    return v


@triton.jit
def cos(x):
    if x.dtype == tl.float64:
        v = tl.cos(x)
    else:
        v = sincosf(x, 1)
    return v


@triton.jit
def erf(x):
    if x.dtype == tl.float64:
        v = tl.erf(x)
    else:
        v = erff(x)
    return v


@triton.jit
def gelu(x):
    if x.dtype == tl.float64:
        v = gelud(x)
    else:
        v = geluf(x)
    return v


@triton.jit
def gelu_tanh(x):
    if x.dtype == tl.float64:
        v = gelu_tanhd(x)
    else:
        v = gelu_tanhf(x)
    return v
