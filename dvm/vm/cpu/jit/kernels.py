"""Elementwise tile kernels of the CPU VM: the ew_f32 piece (PC_EW_F32) and the float loops the
f64 bank shares (jit/kernels_other: the other banks and the casts).
A piece's C entry stays small (decode, then calls): LLVM does not inline compiled functions into
it, so a loop there that called one would not vectorize, and a large entry costs every call.
Every function works on whole tiles (1-D register rows of BM*BN lanes, or BM lanes of compact
registers) with one loop per op, so the per-instruction dispatch costs nanoseconds per tile and
each loop vectorizes. The lane arithmetic of the ops is jit/ops (and jit/mathf, jit/mathf_ext, jit/powf for
the f32 math).
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from ..abi import (DEC_KIND, DEC_OP, ERR_UNHANDLED, K_BIN, K_CLAMP, K_CMP, K_PRED, K_UN, K_WHERE, OP_ABS, OP_ADD,
                   OP_CEIL, OP_COS, OP_DIV, OP_EQ, OP_ERF, OP_EXP, OP_EXP2, OP_EXPM1, OP_FLOOR, OP_FLOORDIV, OP_GE,
                   OP_GELU, OP_GELU_TANH, OP_GT, OP_ISFINITE, OP_ISINF, OP_ISNAN, OP_LE, OP_LOG, OP_LOG1P, OP_LOG2,
                   OP_LT, OP_MAX, OP_MIN, OP_MUL, OP_NE, OP_NEG, OP_POW, OP_RECIP, OP_RELU, OP_REM, OP_ROUND,
                   OP_RSQRT, OP_SIGMOID, OP_SIGN, OP_SILU, OP_SIN, OP_SQRT, OP_SUB, OP_TANH, OP_TRUNC)
from . import frame as fm
from . import loops, ops
from .addr import freg
from .bits import OPTS
from .mathf import exp2f, exp_into, expm1f, log1pf, log2f, logf, sigmoid_into, tanhf
from .mathf_ext import SINCOS_BIG, erff, gelu_tanhf, geluf, sincosf
from .powf import all_ordinary, pow_ordinary_into

_SQRT1_2 = 0.70710678118654752440
_SQRT_2_OVER_PI = 0.79788456080286535588


# --- elementwise: float banks ------------------------------------------------------------------
_NEG, _ABS, _SQRT, _RSQRT, _RECIP, _RELU, _FLOOR, _CEIL, _RINT, _TRUNC, _SIGN = (
    loops.loop1(f) for f in (ops.neg, ops.absolute, ops.sqrt, ops.rsqrt, ops.reciprocal, ops.relu, ops.floor,
                           ops.ceil, ops.rint, ops.trunc, ops.sign))


@njit(**OPTS)
def _un_common(op, o, a):
    """The float unary ops whose result is the correctly rounded one (jit/ops), f32 or f64."""
    if op == OP_NEG:
        _NEG(o, a)
    elif op == OP_ABS:
        _ABS(o, a)
    elif op == OP_SQRT:
        _SQRT(o, a)
    elif op == OP_RSQRT:
        _RSQRT(o, a)
    elif op == OP_RECIP:
        _RECIP(o, a)
    elif op == OP_RELU:
        _RELU(o, a)
    elif op == OP_FLOOR:
        _FLOOR(o, a)
    elif op == OP_CEIL:
        _CEIL(o, a)
    elif op == OP_ROUND:
        _RINT(o, a)
    elif op == OP_TRUNC:
        _TRUNC(o, a)
    elif op == OP_SIGN:
        _SIGN(o, a)
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
def un_f32(op, o, a):
    n = o.shape[0]
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
def _floordiv(a, b):
    return _floordiv64(np.float64(a), np.float64(b))


@njit(**OPTS)
def _rem(a, b):
    return _rem64(np.float64(a), np.float64(b))


@njit(**OPTS)
def _pow(a, b):
    return np.power(np.float64(a), np.float64(b))


_FLOORDIV, _REM, _POW = loops.loop2(_floordiv), loops.loop2(_rem), loops.loop2(_pow)


@njit(**OPTS)
def _bin_float(op, o, a, b):
    if op == OP_FLOORDIV:
        _FLOORDIV(o, a, b)
    elif op == OP_REM:
        _REM(o, a, b)
    elif op == OP_POW:
        _POW(o, a, b)
    elif op == OP_ADD or op == OP_SUB or op == OP_MUL or op == OP_DIV or op == OP_MAX or op == OP_MIN:
        loops.bin_tile(op, o, a, b, False)
    else:
        return False
    return True


@njit(**OPTS)
def _cmp(op, o, a, b):
    if op == OP_EQ or op == OP_NE or op == OP_LT or op == OP_LE or op == OP_GT or op == OP_GE:
        loops.cmp_tile(op, o, a, b)
        return True
    return False


@njit(**OPTS)
def _where(o, c, a, b):
    # both lanes loaded before the choice: a select, vectorized (a choice of which lane to load
    # is a branch per element, mispredicted on mixed conditions: ~10x slower on random masks)
    for i in range(o.shape[0]):
        x, y = a[i], b[i]
        o[i] = x if c[i] != 0 else y


@njit(**OPTS)
def _clamp(o, x, lo, hi):
    for i in range(o.shape[0]):
        o[i] = ops.fmin(ops.fmax(x[i], lo[i]), hi[i])


# --- the pieces: instruction pc on the first n lanes of its registers (all of them, or BM for
# compact registers); each returns an abi.ERR_* code -------------------------------------------------
def ew_f32_piece(fra, pc, n, unused):
    """PC_EW_F32: an elementwise instruction of the f32 bank (its f32 registers may alias buffers)."""
    fr = fm.frame(fra)
    ins, dec = fm.instrs(fr), fm.decode(fr)
    op, kind = dec[ins[pc, 0], DEC_OP], dec[ins[pc, 0], DEC_KIND]
    f1, f2, f3, f4 = ins[pc, 1], ins[pc, 2], ins[pc, 3], ins[pc, 4]
    F, fp = fm.bank_f(fr), fm.fptr(fr)
    if kind == K_UN:
        ok = un_f32(op, freg(F, fp, f1)[:n], freg(F, fp, f2)[:n])
    elif kind == K_PRED:
        ok = _pred(op, fm.bank_b(fr)[f1][:n], freg(F, fp, f2)[:n])
    elif kind == K_BIN and fp[f1] != 0 and (fp[f1] == fp[f2] or fp[f1] == fp[f3]) and loops.bin_in_place(
            op, freg(F, fp, f1)[:n], freg(F, fp, f3 if fp[f1] == fp[f2] else f2)[:n], fp[f1] != fp[f2]):
        ok = True   # the result over the source whose tile it is (an in-place update: jit/interp)
    elif kind == K_BIN and op == OP_POW and all_ordinary(freg(F, fp, f2)[:n], freg(F, fp, f3)[:n]):
        pow_ordinary_into(freg(F, fp, f1)[:n], freg(F, fp, f2)[:n], freg(F, fp, f3)[:n])
        ok = True   # (other tiles, and the f64 bank's: libm's pow, _bin_float)
    elif kind == K_BIN:
        ok = _bin_float(op, freg(F, fp, f1)[:n], freg(F, fp, f2)[:n], freg(F, fp, f3)[:n])
    elif kind == K_CMP:
        ok = _cmp(op, fm.bank_b(fr)[f1][:n], freg(F, fp, f2)[:n], freg(F, fp, f3)[:n])
    elif kind == K_WHERE:
        _where(freg(F, fp, f1)[:n], fm.bank_b(fr)[f2][:n], freg(F, fp, f3)[:n], freg(F, fp, f4)[:n])
        ok = True
    elif kind == K_CLAMP:
        _clamp(freg(F, fp, f1)[:n], freg(F, fp, f2)[:n], freg(F, fp, f3)[:n], freg(F, fp, f4)[:n])
        ok = True
    else:
        ok = False
    return 0 if ok else ERR_UNHANDLED
