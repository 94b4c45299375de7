"""Loops over tiles built from the scalar ops of jit/ops: one loop (or loop nest) per op, made at
import time, each calling its op directly, so LLVM inlines and vectorizes it (a loop that selects
the op per lane does not vectorize; an op passed as an argument would make the
code uncacheable). The dispatchers below pick the loop once per tile, never per row.

Row forms (row-major tiles, row r at lanes [r*bn, r*bn + n)): `rows` with a compact operand (one
value per row), `vec` with a row vector (one value per column), `outer` both.
"""
from __future__ import annotations

from numba import carray, njit

from ..abi import OP_ADD, OP_DIV, OP_EQ, OP_GT, OP_LE, OP_LT, OP_MAX, OP_MIN, OP_MUL, OP_NE, OP_SUB
from . import ops
from .bits import OPTS, ptr_f32


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


def loop2i(f):
    """A loop o[i] = f(o[i], b[i]): o is also the first operand (an in-place update's tile, which
    a loop2 given two views of one address would run unvectorized, as possibly overlapping)."""
    @njit(**OPTS)
    def loop(o, b):
        for i in range(o.shape[0]):
            o[i] = f(o[i], b[i])
    return loop


def loop2s(f):
    """A loop o[i] = f(a[i], v) for a scalar v."""
    @njit(**OPTS)
    def loop(o, a, v):
        for i in range(o.shape[0]):
            o[i] = f(a[i], v)
    return loop


def _rows(f):
    """o[r, k] = f(a[r, k], b[r]) over nr rows of n lanes (rows bn apart)."""
    @njit(**OPTS)
    def nest(o, a, b, nr, bn, n):
        for r in range(nr):
            v = b[r]
            orow = o[r * bn:r * bn + n]
            arow = a[r * bn:r * bn + n]
            for k in range(n):
                orow[k] = f(arow[k], v)
    return nest


def _rows_at(f):
    """Row r's n lanes at address ra[r] = f(a[r, k], b[r]): the rows written straight into a buffer."""
    @njit(**OPTS)
    def nest(ra, a, b, nr, bn, n):
        for r in range(nr):
            v = b[r]
            orow = carray(ptr_f32(ra[r]), n)
            arow = a[r * bn:r * bn + n]
            for k in range(n):
                orow[k] = f(arow[k], v)
    return nest


def _vec(f):
    """o[r, k] = f(a[r, k], v[k]) over nr rows of bn lanes."""
    @njit(**OPTS)
    def nest(o, a, v, nr, bn):
        for r in range(nr):
            orow = o[r * bn:(r + 1) * bn]
            arow = a[r * bn:(r + 1) * bn]
            for k in range(bn):
                orow[k] = f(arow[k], v[k])
    return nest


def _outer(f):
    """o[r, k] = f(c[r], v[k]) over nr rows of bn lanes."""
    @njit(**OPTS)
    def nest(o, c, v, nr, bn):
        for r in range(nr):
            x = c[r]
            orow = o[r * bn:(r + 1) * bn]
            for k in range(bn):
                orow[k] = f(x, v[k])
    return nest


_BIN = (ops.add, ops.sub, ops.mul, ops.div, ops.maximum, ops.minimum)
_BIN_SW = (ops.add_sw, ops.sub_sw, ops.mul_sw, ops.div_sw, ops.maximum_sw, ops.minimum_sw)
_ADD, _SUB, _MUL, _DIV, _MAX, _MIN = (loop2(f) for f in _BIN)
_ADD_SW, _SUB_SW, _MUL_SW, _DIV_SW, _MAX_SW, _MIN_SW = (loop2(f) for f in _BIN_SW)
_I_ADD, _I_SUB, _I_MUL, _I_DIV, _I_MAX, _I_MIN = (loop2i(f) for f in _BIN)
_I_ADD_SW, _I_SUB_SW, _I_MUL_SW, _I_DIV_SW, _I_MAX_SW, _I_MIN_SW = (loop2i(f) for f in _BIN_SW)
_ADD_S, _SUB_S, _MUL_S, _DIV_S, _MAX_S, _MIN_S = (loop2s(f) for f in _BIN)
_ADD_S_SW, _SUB_S_SW, _MUL_S_SW, _DIV_S_SW, _MAX_S_SW, _MIN_S_SW = (loop2s(f) for f in _BIN_SW)
_R_ADD, _R_SUB, _R_MUL, _R_DIV, _R_MAX, _R_MIN = (_rows(f) for f in _BIN)
_R_ADD_SW, _R_SUB_SW, _R_MUL_SW, _R_DIV_SW, _R_MAX_SW, _R_MIN_SW = (_rows(f) for f in _BIN_SW)
_A_ADD, _A_SUB, _A_MUL, _A_DIV, _A_MAX, _A_MIN = (_rows_at(f) for f in _BIN)
_A_ADD_SW, _A_SUB_SW, _A_MUL_SW, _A_DIV_SW, _A_MAX_SW, _A_MIN_SW = (_rows_at(f) for f in _BIN_SW)
_V_ADD, _V_SUB, _V_MUL, _V_DIV, _V_MAX, _V_MIN = (_vec(f) for f in _BIN)
_V_ADD_SW, _V_SUB_SW, _V_MUL_SW, _V_DIV_SW, _V_MAX_SW, _V_MIN_SW = (_vec(f) for f in _BIN_SW)
_EQ, _NE, _LT, _LE, _GT, _GE = (loop2(f) for f in (ops.eq, ops.ne, ops.lt, ops.le, ops.gt, ops.ge))
_O_EQ, _O_NE, _O_LT, _O_LE, _O_GT, _O_GE = (_outer(f) for f in (ops.eq, ops.ne, ops.lt, ops.le, ops.gt, ops.ge))


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
def bin_in_place(op, o, b, swap):
    """o = o . b lane-wise (b . o when swap) for bin_tile's ops, o both written and read; False
    (nothing computed) for any other op."""
    if op == OP_ADD:
        _I_ADD_SW(o, b) if swap else _I_ADD(o, b)
    elif op == OP_MUL:
        _I_MUL_SW(o, b) if swap else _I_MUL(o, b)
    elif op == OP_SUB:
        _I_SUB_SW(o, b) if swap else _I_SUB(o, b)
    elif op == OP_DIV:
        _I_DIV_SW(o, b) if swap else _I_DIV(o, b)
    elif op == OP_MAX:
        _I_MAX_SW(o, b) if swap else _I_MAX(o, b)
    elif op == OP_MIN:
        _I_MIN_SW(o, b) if swap else _I_MIN(o, b)
    else:
        return False
    return True


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
def bin_rows(op, o, a, b, nr, bn, n, swap):
    """o[r, k] = a[r, k] . b[r] (swapped: b[r] . a[r, k]), row-major rows of n valid lanes."""
    if op == OP_ADD:
        _R_ADD_SW(o, a, b, nr, bn, n) if swap else _R_ADD(o, a, b, nr, bn, n)
    elif op == OP_MUL:
        _R_MUL_SW(o, a, b, nr, bn, n) if swap else _R_MUL(o, a, b, nr, bn, n)
    elif op == OP_SUB:
        _R_SUB_SW(o, a, b, nr, bn, n) if swap else _R_SUB(o, a, b, nr, bn, n)
    elif op == OP_DIV:
        _R_DIV_SW(o, a, b, nr, bn, n) if swap else _R_DIV(o, a, b, nr, bn, n)
    elif op == OP_MAX:
        _R_MAX_SW(o, a, b, nr, bn, n) if swap else _R_MAX(o, a, b, nr, bn, n)
    else:
        _R_MIN_SW(o, a, b, nr, bn, n) if swap else _R_MIN(o, a, b, nr, bn, n)


@njit(**OPTS)
def bin_rows_at(op, ra, a, b, nr, bn, n, swap):
    """bin_rows with row r written at address ra[r] (its n valid lanes)."""
    if op == OP_ADD:
        _A_ADD_SW(ra, a, b, nr, bn, n) if swap else _A_ADD(ra, a, b, nr, bn, n)
    elif op == OP_MUL:
        _A_MUL_SW(ra, a, b, nr, bn, n) if swap else _A_MUL(ra, a, b, nr, bn, n)
    elif op == OP_SUB:
        _A_SUB_SW(ra, a, b, nr, bn, n) if swap else _A_SUB(ra, a, b, nr, bn, n)
    elif op == OP_DIV:
        _A_DIV_SW(ra, a, b, nr, bn, n) if swap else _A_DIV(ra, a, b, nr, bn, n)
    elif op == OP_MAX:
        _A_MAX_SW(ra, a, b, nr, bn, n) if swap else _A_MAX(ra, a, b, nr, bn, n)
    else:
        _A_MIN_SW(ra, a, b, nr, bn, n) if swap else _A_MIN(ra, a, b, nr, bn, n)


@njit(**OPTS)
def bin_vec(op, o, a, v, nr, bn, swap):
    """o[r, k] = a[r, k] . v[k] (swapped: v[k] . a[r, k]), row-major rows of bn lanes."""
    if op == OP_ADD:
        _V_ADD_SW(o, a, v, nr, bn) if swap else _V_ADD(o, a, v, nr, bn)
    elif op == OP_MUL:
        _V_MUL_SW(o, a, v, nr, bn) if swap else _V_MUL(o, a, v, nr, bn)
    elif op == OP_SUB:
        _V_SUB_SW(o, a, v, nr, bn) if swap else _V_SUB(o, a, v, nr, bn)
    elif op == OP_DIV:
        _V_DIV_SW(o, a, v, nr, bn) if swap else _V_DIV(o, a, v, nr, bn)
    elif op == OP_MAX:
        _V_MAX_SW(o, a, v, nr, bn) if swap else _V_MAX(o, a, v, nr, bn)
    else:
        _V_MIN_SW(o, a, v, nr, bn) if swap else _V_MIN(o, a, v, nr, bn)


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
def cmp_outer(op, o, c, v, nr, bn):
    """o[r, k] = c[r] . v[k] for the comparisons, row-major rows of bn lanes."""
    if op == OP_EQ:
        _O_EQ(o, c, v, nr, bn)
    elif op == OP_NE:
        _O_NE(o, c, v, nr, bn)
    elif op == OP_LT:
        _O_LT(o, c, v, nr, bn)
    elif op == OP_LE:
        _O_LE(o, c, v, nr, bn)
    elif op == OP_GT:
        _O_GT(o, c, v, nr, bn)
    else:
        _O_GE(o, c, v, nr, bn)
