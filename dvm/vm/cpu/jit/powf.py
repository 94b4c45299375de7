"""float32 pow of the CPU VM: exp(y ln x) in float64 arithmetic that LLVM vectorizes, rounded to
float32 once, on the tiles whose lanes are all ordinary (x +0 or positive and finite, y finite);
any other tile (a negative, infinite or NaN x, an infinite or NaN y) takes libm's float64 pow on
every lane (jit/kernels: _bin_float's loop), as before. Both round a float64 result to float32:
the polynomials below (FMAs contracted) carry ~1e-16 of relative error, so a result differs from
libm's rounding only where the float64 value lies within that distance of a float32 rounding
boundary (then by one ULP). Measured errors: tests/test_math_ulp.py, tests/test_cpu_pow.py.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from .bits import bits_f32, bits_f64, f32_bits
from .mathf import MOPTS

_INV_LN2 = 1.4426950408889634
_LN2 = 0.6931471805599453
_SQRT2 = 1.4142135623730951
_F32_INF_BITS = 0x7F800000      # x's bits below this: +0, a subnormal or a positive finite float
_F32_MAX = np.float32(3.4028234663852886e38)
_SUBNORMAL_BITS = 0x00800000    # below: +0 or a subnormal (scaled by 2^23 first)
_TWO_23 = np.float32(8388608.0)
# |t| = |y log2 x| beyond this: 2^t is 0 or inf in float32 (and a normal float64: no overflow)
_T_CLAMP = 300.0
# log(m) = 2 atanh(s) = 2 (s + s^3/3 + ... + s^19/19), s = (m - 1)/(m + 1), |s| <= 0.1716 for m
# in [sqrt(1/2), sqrt(2)): the terms left out are below 1e-17 of the sum
_A0, _A1, _A2, _A3, _A4, _A5, _A6, _A7, _A8, _A9 = (2.0 / (2 * k + 1) for k in range(10))
# exp(r) = sum r^k / k! for |r| <= ln2 / 2, k <= 13 (the rest below 2e-17)
_E0, _E1, _E2, _E3, _E4, _E5, _E6, _E7, _E8, _E9, _E10, _E11, _E12, _E13 = (
    1.0 / float(np.prod(np.arange(1, k + 1, dtype=np.float64))) for k in range(14))


@njit(inline="always", **MOPTS)
def _log2_positive(x):
    """log2(x) in float64 for a float32 x > 0 (subnormals too), to ~1e-16."""
    sub = f32_bits(x) < _SUBNORMAL_BITS
    b = f32_bits(x * _TWO_23 if sub else x)
    e = (b >> 23) - (150 if sub else 127)
    m = np.float64(bits_f32((b & 0x7FFFFF) | 0x3F800000))
    big = m > _SQRT2
    m = m * 0.5 if big else m
    s = (m - 1.0) / (m + 1.0)
    z = s * s
    p = ((((((((_A9 * z + _A8) * z + _A7) * z + _A6) * z + _A5) * z + _A4) * z + _A3) * z + _A2) * z + _A1) * z + _A0
    return np.float64(e + (1 if big else 0)) + s * p * _INV_LN2


@njit(inline="always", **MOPTS)
def _exp2(t):
    """2^t in float64 for |t| <= _T_CLAMP, to ~1e-16."""
    n = np.rint(t)
    r = (t - n) * _LN2
    p = (((((((_E13 * r + _E12) * r + _E11) * r + _E10) * r + _E9) * r + _E8) * r + _E7) * r + _E6) * r + _E5
    p = ((((p * r + _E4) * r + _E3) * r + _E2) * r + _E1) * r + _E0
    return p * bits_f64((np.int64(n) + 1023) << 52)


@njit(inline="always", **MOPTS)
def pow_ordinary(x, y):
    """pow(x, y) rounded to float32 for x +0 or positive finite, y finite."""
    t = np.float64(y) * _log2_positive(x)
    t = min(max(t, -_T_CLAMP), _T_CLAMP)
    v = np.float32(_exp2(t))
    zero = np.float32(0.0) if y > 0 else np.float32(np.inf)   # pow(+0, y), y != 0
    v = zero if f32_bits(x) == 0 else v
    return np.float32(1.0) if y == 0 else v


@njit(**MOPTS)
def all_ordinary(a, b) -> bool:
    """Every lane of the tile is pow_ordinary's (checked before any output lane is written: the
    output may be a's or b's register)."""
    other = 0
    for i in range(a.shape[0]):
        other |= 0 if (f32_bits(a[i]) < _F32_INF_BITS and abs(b[i]) <= _F32_MAX) else 1
    return other == 0


@njit(**MOPTS)
def pow_ordinary_into(o, a, b):
    """o[i] = pow_ordinary(a[i], b[i]) over a tile of ordinary lanes."""
    for i in range(o.shape[0]):
        o[i] = pow_ordinary(a[i], b[i])
