"""The scalar semantics of the CPU VM's ops, each written once: every tile loop, fused run and row
form calls these (directly or through the loop templates at the bottom), so a fast path computes
the same f32 operations as the generic path, bit for bit.

Binary ops come in a plain and a swapped form (`swap`: the compact or uniform operand is the
left one); the loop templates are instantiated per op function (numba compiles one loop per
function passed in), so each op gets its own loop, which LLVM vectorizes: one loop that selects
the op per lane did not (13-20x slower a tile).
"""
from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.extending import overload

from ..abi import OP_ADD, OP_DIV, OP_EQ, OP_GT, OP_LE, OP_LT, OP_MAX, OP_MUL, OP_NE, OP_SUB
from .bits import OPTS


def fmax(a, b):
    """np.maximum of two scalars: NaN propagates, b on ties (+-0). numba only."""
    raise NotImplementedError


def fmin(a, b):
    """np.minimum of two scalars: NaN propagates, b on ties (+-0). numba only."""
    raise NotImplementedError


# The float forms are max/min plus one NaN select: `a if (a > b or a != a) else b` did not
# vectorize in place (lo[j] = f(lo[j], hi[j]), the reductions' combine) for AVX2, 7x slower a
# tile. Integers keep the plain select (int64 max has no AVX2 instruction; the select is faster).
@overload(fmax)
def _fmax_impl(a, b):
    if isinstance(a, types.Float) or isinstance(b, types.Float):
        def fmax_float(a, b):
            m = max(b, a)
            return m if (a == a) & (b == b) else a + b
        return fmax_float
    return lambda a, b: a if a > b else b


@overload(fmin)
def _fmin_impl(a, b):
    if isinstance(a, types.Float) or isinstance(b, types.Float):
        def fmin_float(a, b):
            m = min(b, a)
            return m if (a == a) & (b == b) else a + b
        return fmin_float
    return lambda a, b: a if a < b else b


# --- binary ops: (a, b) and swapped (b, a) ---------------------------------------------------------
@njit(**OPTS)
def add(a, b):
    return a + b


@njit(**OPTS)
def sub(a, b):
    return a - b


@njit(**OPTS)
def mul(a, b):
    return a * b


@njit(**OPTS)
def div(a, b):
    return a / b


@njit(**OPTS)
def maximum(a, b):
    return fmax(a, b)


@njit(**OPTS)
def minimum(a, b):
    return fmin(a, b)


@njit(**OPTS)
def add_sw(a, b):
    return b + a


@njit(**OPTS)
def sub_sw(a, b):
    return b - a


@njit(**OPTS)
def mul_sw(a, b):
    return b * a


@njit(**OPTS)
def div_sw(a, b):
    return b / a


@njit(**OPTS)
def maximum_sw(a, b):
    return fmax(b, a)


@njit(**OPTS)
def minimum_sw(a, b):
    return fmin(b, a)


@njit(**OPTS)
def binary(op, a, b):
    """One lane of the f32/f64 add, sub, mul, div, maximum, minimum (scalar contexts: a fused
    run's per-row chain)."""
    if op == OP_ADD:
        return add(a, b)
    if op == OP_SUB:
        return sub(a, b)
    if op == OP_MUL:
        return mul(a, b)
    if op == OP_DIV:
        return div(a, b)
    if op == OP_MAX:
        return maximum(a, b)
    return minimum(a, b)


# --- comparisons (a bool lane) ---------------------------------------------------------------------
@njit(**OPTS)
def eq(a, b):
    return a == b


@njit(**OPTS)
def ne(a, b):
    return a != b


@njit(**OPTS)
def lt(a, b):
    return a < b


@njit(**OPTS)
def le(a, b):
    return a <= b


@njit(**OPTS)
def gt(a, b):
    return a > b


@njit(**OPTS)
def ge(a, b):
    return a >= b


# --- float unary ops whose result is the correctly rounded one (generic over f32 / f64) -----------
@njit(**OPTS)
def neg(x):
    return -x


@njit(**OPTS)
def absolute(x):
    return abs(x)


@njit(**OPTS)
def sqrt(x):
    return np.sqrt(x)


def rsqrt(x):
    """1 / sqrt(x) computed in float64, rounded once to x's type. numba only."""
    raise NotImplementedError


def reciprocal(x):
    """1 / x: a float32 division (the float64 quotient rounded once, bit for bit) for float32,
    float64 otherwise. numba only."""
    raise NotImplementedError


@overload(rsqrt)
def _rsqrt_impl(x):
    if x == types.float32:
        return lambda x: np.float32(1.0 / np.sqrt(np.float64(x)))
    return lambda x: 1.0 / np.sqrt(np.float64(x))


@overload(reciprocal)
def _reciprocal_impl(x):
    if x == types.float32:
        return lambda x: np.float32(1.0) / x
    return lambda x: 1.0 / np.float64(x)


@njit(**OPTS)
def relu(x):
    return 0.0 if x < 0 else x


@njit(**OPTS)
def floor(x):
    return np.floor(x)


@njit(**OPTS)
def ceil(x):
    return np.ceil(x)


@njit(**OPTS)
def rint(x):
    return np.rint(x)


@njit(**OPTS)
def trunc(x):
    return np.trunc(x)


@njit(**OPTS)
def sign(x):
    return 1.0 if x > 0 else (-1.0 if x < 0 else 0.0)


# --- loops: one loop per op function (made at import time: each loop calls its op directly, so
# LLVM inlines and vectorizes it; an op passed as an argument would make the code uncacheable) ---
def loop1(f):
    """A loop o[i] = f(a[i])."""
    @njit(**OPTS)
    def loop(o, a):
        for i in range(o.shape[0]):
            o[i] = f(a[i])
    return loop


def loop2(f):
    """A loop o[i] = f(a[i], b[i])."""
    @njit(**OPTS)
    def loop(o, a, b):
        for i in range(o.shape[0]):
            o[i] = f(a[i], b[i])
    return loop


def loop2s(f):
    """A loop o[i] = f(a[i], v) for a scalar v."""
    @njit(**OPTS)
    def loop(o, a, v):
        for i in range(o.shape[0]):
            o[i] = f(a[i], v)
    return loop


def loop_s2(f):
    """A loop o[i] = f(v, b[i]) for a scalar v."""
    @njit(**OPTS)
    def loop(o, v, b):
        for i in range(o.shape[0]):
            o[i] = f(v, b[i])
    return loop


_ADD, _SUB, _MUL, _DIV, _MAX, _MIN = (loop2(f) for f in (add, sub, mul, div, maximum, minimum))
_ADD_SW, _SUB_SW, _MUL_SW, _DIV_SW, _MAX_SW, _MIN_SW = (loop2(f) for f in (add_sw, sub_sw, mul_sw, div_sw,
                                                                           maximum_sw, minimum_sw))
_ADD_S, _SUB_S, _MUL_S, _DIV_S, _MAX_S, _MIN_S = (loop2s(f) for f in (add, sub, mul, div, maximum, minimum))
_ADD_S_SW, _SUB_S_SW, _MUL_S_SW, _DIV_S_SW, _MAX_S_SW, _MIN_S_SW = (loop2s(f) for f in (add_sw, sub_sw, mul_sw,
                                                                                       div_sw, maximum_sw,
                                                                                       minimum_sw))
_EQ, _NE, _LT, _LE, _GT, _GE = (loop2(f) for f in (eq, ne, lt, le, gt, ge))
_EQ_S, _NE_S, _LT_S, _LE_S, _GT_S, _GE_S = (loop_s2(f) for f in (eq, ne, lt, le, gt, ge))


@njit(**OPTS)
def bin_tile(op, o, a, b, swap):
    """o = a . b lane-wise (b . a when swap) for the add, sub, mul, div, maximum, minimum."""
    if op == OP_ADD:
        _ADD_SW(o, a, b) if swap else _ADD(o, a, b)
    elif op == OP_MUL:
        _MUL_SW(o, a, b) if swap else _MUL(o, a, b)
    elif op == OP_SUB:
        _SUB_SW(o, a, b) if swap else _SUB(o, a, b)
    elif op == OP_DIV:
        _DIV_SW(o, a, b) if swap else _DIV(o, a, b)
    elif op == OP_MAX:
        _MAX_SW(o, a, b) if swap else _MAX(o, a, b)
    else:
        _MIN_SW(o, a, b) if swap else _MIN(o, a, b)


@njit(**OPTS)
def bin_scalar(op, o, a, v, swap):
    """o = a . v (v . a when swap) for a scalar v: bin_tile's ops."""
    if op == OP_ADD:
        _ADD_S_SW(o, a, v) if swap else _ADD_S(o, a, v)
    elif op == OP_MUL:
        _MUL_S_SW(o, a, v) if swap else _MUL_S(o, a, v)
    elif op == OP_SUB:
        _SUB_S_SW(o, a, v) if swap else _SUB_S(o, a, v)
    elif op == OP_DIV:
        _DIV_S_SW(o, a, v) if swap else _DIV_S(o, a, v)
    elif op == OP_MAX:
        _MAX_S_SW(o, a, v) if swap else _MAX_S(o, a, v)
    else:
        _MIN_S_SW(o, a, v) if swap else _MIN_S(o, a, v)


@njit(**OPTS)
def cmp_tile(op, o, a, b):
    """o = a . b lane-wise for the comparisons."""
    if op == OP_EQ:
        _EQ(o, a, b)
    elif op == OP_NE:
        _NE(o, a, b)
    elif op == OP_LT:
        _LT(o, a, b)
    elif op == OP_LE:
        _LE(o, a, b)
    elif op == OP_GT:
        _GT(o, a, b)
    else:
        _GE(o, a, b)


@njit(**OPTS)
def cmp_scalar_first(op, o, v, b):
    """o = v . b lane-wise for a scalar v, the comparisons."""
    if op == OP_EQ:
        _EQ_S(o, v, b)
    elif op == OP_NE:
        _NE_S(o, v, b)
    elif op == OP_LT:
        _LT_S(o, v, b)
    elif op == OP_LE:
        _LE_S(o, v, b)
    elif op == OP_GT:
        _GT_S(o, v, b)
    else:
        _GE_S(o, v, b)
