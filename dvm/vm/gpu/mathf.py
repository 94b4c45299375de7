"""float32 and float64 math of the GPU VM, in Triton: the helpers, exp, log, tanh, sigmoid and powd
(erf, the GELUs, sin and cos: mathf_ext).

float32 functions use the CPU VM's algorithms (vm/cpu/jit/mathf.py, mathf_ext.py: range reduction and near-minimax
polynomials, the same constants), written branch-free with explicit FMAs: with FP contraction
off (launch.py compiles with enable_fp_fusion=False) every operation is IEEE-rounded, so a GPU
computes the same bits as Triton's interpreter mode, where the differential tests run. float64
functions build on Triton's core float64 math (libdevice on the GPU, NumPy in interpreter mode).
Division and square root are the correctly rounded forms (div_rn, sqrt_rn): plain `/` on a GPU
is an approximation. NaN, +-inf and -0.0 follow PyTorch.
"""
from __future__ import annotations

import os

import triton
import triton.language as tl
from triton.language.extra import libdevice

# kernels defined in Triton's interpreter mode (TRITON_INTERPRET=1 when they were decorated)
INTERPRET = tl.constexpr(bool(triton.knobs.runtime.interpret) if hasattr(triton, "knobs")
                         else os.environ.get("TRITON_INTERPRET", "0") == "1")

_LOG2E = tl.constexpr(1.44269504088896341)
_LN2 = tl.constexpr(0.693147180559945309)
_C1 = tl.constexpr(0.693359375)
_C2 = tl.constexpr(-2.12194440e-4)
_P0 = tl.constexpr(1.3814611593261361e-3)
_P1 = tl.constexpr(8.368710055947304e-3)
_P2 = tl.constexpr(4.166838899254799e-2)
_P3 = tl.constexpr(1.666652113199234e-1)
_P4 = tl.constexpr(4.999999403953552e-1)
_SHIFT = tl.constexpr(12582912.0)          # 1.5 * 2**23: x + _SHIFT - _SHIFT rounds to an integer
_E2 = tl.constexpr(1 / 2)
_E3 = tl.constexpr(1 / 6)
_E4 = tl.constexpr(1 / 24)
_E5 = tl.constexpr(1 / 120)
_E6 = tl.constexpr(1 / 720)
_E7 = tl.constexpr(1 / 5040)
_E8 = tl.constexpr(1 / 40320)
_E9 = tl.constexpr(1 / 362880)
_SQRTHF = tl.constexpr(0.707106781186547524)
_L0 = tl.constexpr(7.0376836292e-2)
_L1 = tl.constexpr(-1.1514610310e-1)
_L2 = tl.constexpr(1.1676998740e-1)
_L3 = tl.constexpr(-1.2420140846e-1)
_L4 = tl.constexpr(1.4249322787e-1)
_L5 = tl.constexpr(-1.6668057665e-1)
_L6 = tl.constexpr(2.0000714765e-1)
_L7 = tl.constexpr(-2.4999993993e-1)
_L8 = tl.constexpr(3.3333331174e-1)
_TINY = tl.constexpr(1.17549435e-38)
_TWO23 = tl.constexpr(8388608.0)
_LOG2EA = tl.constexpr(0.44269504088896340736)
_T0 = tl.constexpr(-5.70498872745e-3)
_T1 = tl.constexpr(2.06390887954e-2)
_T2 = tl.constexpr(-5.37397155531e-2)
_T3 = tl.constexpr(1.33314422036e-1)
_T4 = tl.constexpr(-3.33332819422e-1)


# --- exact helpers ------------------------------------------------------------------------------
@triton.jit
def div(a, b):
    """Correctly rounded a / b (float64 `/` is; float32 `/` on a GPU is an approximation)."""
    if a.dtype == tl.float64:
        q = a / b
    else:
        q = tl.math.div_rn(a, b)
    return q


@triton.jit
def sqrt(x):
    """Correctly rounded square root (float64 sqrt is; float32 needs sqrt_rn)."""
    if x.dtype == tl.float64:
        r = tl.sqrt(x)
    else:
        r = tl.sqrt_rn(x)
    return r


@triton.jit
def fmod(a, b):
    """C fmod (exact; the sign of a). Interpreter mode: NumPy's fmod; a GPU: libdevice's."""
    if INTERPRET:
        r = a % b
    else:
        r = libdevice.fmod(a, b)
    return r


@triton.jit
def rint32(x):
    """x rounded to an integer, ties to even, for |x| < 2**22 (NaN stays NaN)."""
    return (x + _SHIFT) - _SHIFT


@triton.jit
def scale2(y, n):
    """y * 2**n for float32 n integral in [-151, 129] (NaN n counts as 0): two exact steps."""
    k = tl.where(n == n, n, 0.0).to(tl.int32)
    k1 = k >> 1
    k2 = k - k1
    s1 = ((k1 + 127) << 23).to(tl.float32, bitcast=True)
    s2 = ((k2 + 127) << 23).to(tl.float32, bitcast=True)
    return (y * s1) * s2


@triton.jit
def exp_poly(r):
    p = tl.fma(tl.fma(tl.fma(tl.fma(_P0, r, _P1), r, _P2), r, _P3), r, _P4)
    return tl.fma(p * r, r, r) + 1.0


# --- float32 ------------------------------------------------------------------------------------
@triton.jit
def expf(x):
    xc = tl.where(x > 88.8, 88.8, x)
    xc = tl.where(xc < -104.0, -104.0, xc)
    t = tl.fma(xc, _LOG2E, _SHIFT)
    n = t - _SHIFT
    r = tl.fma(-n, _C2, tl.fma(-n, _C1, xc))
    return scale2(exp_poly(r), n)


@triton.jit
def exp2f(x):
    xc = tl.where(x > 129.0, 129.0, x)
    xc = tl.where(xc < -151.0, -151.0, xc)
    n = rint32(xc)
    return scale2(exp_poly((xc - n) * _LN2), n)


@triton.jit
def expm1f(x):
    xc = tl.where(x > 88.0, 88.0, x)
    xc = tl.where(xc < -30.0, -30.0, xc)
    n = rint32(xc * _LOG2E)
    r = tl.fma(-n, _C2, tl.fma(-n, _C1, xc))
    r = tl.where(n == 0, xc, r)
    pe = tl.fma(tl.fma(tl.fma(tl.fma(_E9, r, _E8), r, _E7), r, _E6), r, _E5)
    pe = tl.fma(tl.fma(tl.fma(pe, r, _E4), r, _E3), r, _E2)
    p = tl.fma(r * r, pe, r)
    t = scale2(tl.full(x.shape, 1.0, tl.float32), n)
    y = tl.fma(t, p, t - 1.0)
    y = tl.where(x > 88.0, expf(x), y)
    return tl.where(x == 0, x, y)


@triton.jit
def _log_parts(x):
    """For x > 0 finite: (e, m, y) with log(x) = e*ln2 + m + y."""
    small = x < _TINY
    xs = tl.where(small, x * _TWO23, x)
    u = xs.to(tl.int32, bitcast=True)
    e = (((u >> 23) & 0xFF) - 126).to(tl.float32) + tl.where(small, -23.0, 0.0)
    m = ((u & 0x007FFFFF) | 0x3F000000).to(tl.float32, bitcast=True)
    lo = m < _SQRTHF
    e = tl.where(lo, e - 1.0, e)
    m = tl.where(lo, m + m - 1.0, m - 1.0)
    z = m * m
    p = tl.fma(tl.fma(tl.fma(tl.fma(_L0, m, _L1), m, _L2), m, _L3), m, _L4)
    p = tl.fma(tl.fma(tl.fma(tl.fma(p, m, _L5), m, _L6), m, _L7), m, _L8)
    y = tl.fma(-0.5, z, p * m * z)
    return e, m, y


@triton.jit
def _log_special(x, v):
    v = tl.where(x == 0, float("-inf"), v)
    v = tl.where(x < 0, float("nan"), v)
    v = tl.where(x == float("inf"), x, v)
    return tl.where(x != x, x, v)


@triton.jit
def logf(x):
    e, m, y = _log_parts(x)
    return _log_special(x, tl.fma(e, _C1, tl.fma(e, _C2, y) + m))


@triton.jit
def log2f(x):
    e, m, y = _log_parts(x)
    return _log_special(x, ((tl.fma(y, _LOG2EA, m * _LOG2EA) + y) + m) + e)


@triton.jit
def log1pf(x):
    u = 1.0 + x
    d = u - 1.0
    v = logf(u) * div(x, d)
    v = tl.where(d == 0, x, v)
    return tl.where(x == float("inf"), x, v)


@triton.jit
def tanhf(x):
    a = tl.abs(x)
    a = tl.where(a < 9.5, a, 9.5)
    t = a + a
    n = rint32(t * _LOG2E)
    r = tl.fma(-n, _C2, tl.fma(-n, _C1, t))
    e = exp_poly(r) * ((n.to(tl.int32) + 127) << 23).to(tl.float32, bitcast=True)
    big = 1.0 - div(tl.full(x.shape, 2.0, tl.float32), e + 1.0)
    big = tl.where(x > 0, big, -big)
    z = x * x
    p = tl.fma(tl.fma(tl.fma(tl.fma(_T0, z, _T1), z, _T2), z, _T3), z, _T4)
    small = tl.fma(p * z, x, x)
    v = tl.where((a < 0.625) | (x != x), small, big)
    return tl.where(x == 0, x, v)


@triton.jit
def sigmoidf(x):
    e = expf(-tl.abs(x))
    d = 1.0 + e
    return tl.where(x >= 0, div(tl.full(x.shape, 1.0, tl.float32), d), div(e, d))


# --- float64 ------------------------------------------------------------------------------------
@triton.jit
def expm1d(x):
    small = x + x * x * 0.5 + x * x * x * (1.0 / 6.0)
    v = tl.where(tl.abs(x) < 1e-5, small, tl.exp(x) - 1.0)
    return tl.where(x == 0, x, v)


@triton.jit
def log1pd(x):
    u = 1.0 + x
    v = tl.where(u == 1.0, x, tl.log(u) * div(x, u - 1.0))
    return tl.where(x == float("inf"), x, v)


@triton.jit
def tanhd(x):
    a = tl.abs(x)
    e = expm1d(-2.0 * tl.where(a < 40.0, a, 40.0))
    t = div(-e, e + 2.0)
    v = tl.where(x < 0, -t, t)
    return tl.where((x == 0) | (x != x), x, v)


@triton.jit
def sigmoidd(x):
    e = tl.exp(-tl.abs(x))
    d = 1.0 + e
    return tl.where(x >= 0, div(tl.full(x.shape, 1.0, tl.float64), d), div(e, d))


@triton.jit
def rsqrt_exact(x):
    """1 / sqrt(x) correctly rounded for float32 x (computed in float64), float64 x: rounded twice."""
    xd = x.to(tl.float64)
    return div(tl.full(x.shape, 1.0, tl.float64), sqrt(xd)).to(x.dtype)


@triton.jit
def powd(x, y):
    """x ** y in float64 (NumPy's special cases), through exp(y log|x|)."""
    ax = tl.abs(x)
    mag = tl.exp(y * tl.log(ax))
    y_int = tl.floor(y) == y
    half = y * 0.5
    y_odd = y_int & (tl.floor(half) != half) & (tl.abs(y) < 9007199254740992.0)
    neg = x.to(tl.int64, bitcast=True) < 0
    v = tl.where(neg & y_odd, -mag, mag)
    v = tl.where((x < 0) & (x > float("-inf")) & ~y_int & (tl.abs(y) < float("inf")), float("nan"), v)
    v = tl.where((x == 1.0) | ((x == -1.0) & (tl.abs(y) == float("inf"))), 1.0, v)
    return tl.where(y == 0, 1.0, v)


# --- by dtype: float32 (the functions above) or float64 (Triton's float64 math) -------------------
@triton.jit
def exp(x):
    if x.dtype == tl.float64:
        v = tl.exp(x)
    else:
        v = expf(x)
    return v


@triton.jit
def exp2(x):
    if x.dtype == tl.float64:
        v = tl.exp2(x)
    else:
        v = exp2f(x)
    return v


@triton.jit
def expm1(x):
    if x.dtype == tl.float64:
        v = expm1d(x)
    else:
        v = expm1f(x)
    return v


@triton.jit
def log(x):
    if x.dtype == tl.float64:
        v = tl.log(x)
    else:
        v = logf(x)
    return v


@triton.jit
def log2(x):
    if x.dtype == tl.float64:
        v = tl.log2(x)
    else:
        v = log2f(x)
    return v


@triton.jit
def log1p(x):
    if x.dtype == tl.float64:
        v = log1pd(x)
    else:
        v = log1pf(x)
    return v


@triton.jit
def tanh(x):
    if x.dtype == tl.float64:
        v = tanhd(x)
    else:
        v = tanhf(x)
    return v


@triton.jit
def sigmoid(x):
    if x.dtype == tl.float64:
        v = sigmoidd(x)
    else:
        v = sigmoidf(x)
    return v
