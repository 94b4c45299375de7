"""The scalar semantics of the CPU VM's ops, each written once: every tile loop (jit/loops), fused
run and row form calls these, so a fast path computes the same f32 operations as the generic
path, bit for bit. Binary ops come in a plain and a swapped form (`_sw`: the compact or uniform
operand is the left one).
"""
from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.extending import overload

from ..abi import OP_ADD, OP_DIV, OP_MAX, OP_MUL, OP_SUB
from .bits import OPTS


def fmax(a, b):
    """np.maximum of two scalars: NaN propagates, b on ties (+-0). numba only."""
    raise NotImplementedError


def fmin(a, b):
    """np.minimum of two scalars: NaN propagates, b on ties (+-0). numba only."""
    raise NotImplementedError


# The float forms are max/min plus one NaN select: `a if (a > b or a != a) else b` did not
# vectorize in place (lo[j] = f(lo[j], hi[j]), the reductions' combine) for AVX2. Integers keep the plain select (int64 max has no AVX2 instruction; the select is faster).
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


@njit(inline='always', **OPTS)   # per row in the row forms: a call with its run-time dispatch cost more
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
