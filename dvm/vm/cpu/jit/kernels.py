"""Elementwise tile kernels of the CPU VM: the PC_EW_* pieces (one per register bank) and PC_CAST.
A piece's C entry stays small (decode, then calls): LLVM does not inline compiled functions into
it, so a loop there that called one would not vectorize, and a large entry costs every call.
Every function works on whole tiles (1-D register rows of BM*BN lanes, or BM lanes of compact
registers) with one loop per op, so the per-instruction dispatch costs nanoseconds per tile and
each loop vectorizes. The lane arithmetic of the ops is jit/ops (and jit/mathf for the f32 math).
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from ..abi import (BK_F32, BK_F64, BK_I64, DEC_BANK, DEC_GROUP, DEC_KIND, DEC_OP, DEC_SRC, DT_BF16, DT_F16, DT_I32,
                   ERR_UNHANDLED, ERR_ZERODIV, G_CAST, K_BIN, K_CLAMP, K_CMP, K_PRED, K_UN, K_WHERE, OP_ABS, OP_ADD,
                   OP_BAND, OP_BOR, OP_BXOR, OP_CEIL, OP_COS, OP_DIV, OP_EQ, OP_ERF, OP_EXP, OP_EXP2, OP_EXPM1,
                   OP_FLOOR, OP_FLOORDIV, OP_GE, OP_GELU, OP_GELU_TANH, OP_GT, OP_ISFINITE, OP_ISINF, OP_ISNAN,
                   OP_LAND, OP_LE, OP_LNOT, OP_LOG, OP_LOG1P, OP_LOG2, OP_LOR, OP_LT, OP_LXOR, OP_MAX, OP_MIN,
                   OP_MUL, OP_NE, OP_NEG, OP_POW, OP_RECIP, OP_RELU, OP_REM, OP_ROUND, OP_RSQRT, OP_SIGMOID, OP_SIGN,
                   OP_SILU, OP_SIN, OP_SQRT, OP_SUB, OP_TANH, OP_TRUNC)
from . import frame as fm
from . import loops, ops
from .addr import freg
from .bits import OPTS, bf2f, f2bf, f2h, f64_to_f16_f32, h2f
from .mathf import (SINCOS_BIG, erff, exp2f, exp_into, expm1f, gelu_tanhf, geluf, log1pf, log2f, logf, sigmoid_into,
                    sincosf, tanhf)

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


# --- elementwise: int64 and bool banks ----------------------------------------------------------
@njit(**OPTS)
def _un_i64(op, o, a):
    n = o.shape[0]
    if op == OP_NEG:
        for i in range(n):
            o[i] = -a[i]
    elif op == OP_ABS:
        for i in range(n):
            x = a[i]
            o[i] = -x if x < 0 else x
    elif op == OP_RELU:
        for i in range(n):
            x = a[i]
            o[i] = 0 if x < 0 else x
    elif op == OP_SIGN:
        for i in range(n):
            x = a[i]
            o[i] = 1 if x > 0 else (-1 if x < 0 else 0)
    else:
        return False
    return True


@njit(**OPTS)
def _ipow(a, b):
    if b < 0:
        if a == 1:
            return np.int64(1)
        if a == -1:
            return np.int64(1) if b % 2 == 0 else np.int64(-1)
        return np.int64(0)
    r = np.int64(1)
    base = a
    e = b
    while e > 0:
        if e & 1:
            r = r * base
        base = base * base
        e >>= 1
    return r


@njit(**OPTS)
def _bin_i64(op, o, a, b):
    """Returns 0, ERR_UNHANDLED or ERR_ZERODIV."""
    n = o.shape[0]
    if op == OP_ADD or op == OP_SUB or op == OP_MUL or op == OP_MAX or op == OP_MIN:
        loops.bin_tile(op, o, a, b, False)
    elif op == OP_BAND:
        for i in range(n):
            o[i] = a[i] & b[i]
    elif op == OP_BOR:
        for i in range(n):
            o[i] = a[i] | b[i]
    elif op == OP_BXOR:
        for i in range(n):
            o[i] = a[i] ^ b[i]
    elif op == OP_POW:
        for i in range(n):
            o[i] = _ipow(a[i], b[i])
    elif op == OP_FLOORDIV or op == OP_REM:
        for i in range(n):
            if b[i] == 0:
                return ERR_ZERODIV
        if op == OP_FLOORDIV:
            for i in range(n):
                x, y = a[i], b[i]
                o[i] = -x if y == -1 else x // y
        else:
            for i in range(n):
                x, y = a[i], b[i]
                o[i] = 0 if y == -1 else x % y
    else:
        return ERR_UNHANDLED
    return 0


@njit(**OPTS)
def _un_b8(op, o, a):
    if op != OP_LNOT:
        return False
    for i in range(o.shape[0]):
        o[i] = 1 if a[i] == 0 else 0
    return True


@njit(**OPTS)
def _bin_b8(op, o, a, b):
    n = o.shape[0]
    if op == OP_LAND or op == OP_BAND:
        for i in range(n):
            o[i] = a[i] & b[i]
    elif op == OP_LOR or op == OP_BOR:
        for i in range(n):
            o[i] = a[i] | b[i]
    elif op == OP_LXOR or op == OP_BXOR:
        for i in range(n):
            o[i] = a[i] ^ b[i]
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
    for i in range(o.shape[0]):
        o[i] = a[i] if c[i] != 0 else b[i]


@njit(**OPTS)
def _clamp(o, x, lo, hi):
    for i in range(o.shape[0]):
        o[i] = ops.fmin(ops.fmax(x[i], lo[i]), hi[i])


# --- casts -------------------------------------------------------------------------------------
@njit(**OPTS)
def _cast_to_int(o, a, t, is_float):
    n = o.shape[0]
    if is_float:
        lo = -2147483648.0 if t == DT_I32 else -9223372036854775808.0
        hi = 2147483648.0 if t == DT_I32 else 9223372036854775808.0
        for i in range(n):
            x = np.float64(a[i])
            ok = x >= lo and x < hi
            v = np.int64(x if ok else 0.0)
            o[i] = v if ok else np.int64(lo)
    elif t == DT_I32:
        for i in range(n):
            o[i] = np.int64(np.int32(a[i]))
    else:
        for i in range(n):
            o[i] = np.int64(a[i])


@njit(**OPTS)
def _cast_to_f32(o, a, t, src):
    n = o.shape[0]
    if t == DT_F16:
        if src == BK_F64:
            for i in range(n):
                o[i] = f64_to_f16_f32(np.float64(a[i]))
        else:   # f32 (exact from bool; ints >= 2**24 round to inf in f16 anyway)
            for i in range(n):
                o[i] = h2f(f2h(np.float32(a[i])))
    elif t == DT_BF16:
        for i in range(n):
            o[i] = bf2f(f2bf(np.float32(a[i])))
    else:
        for i in range(n):
            o[i] = np.float32(a[i])


@njit(**OPTS)
def _cast_to_b8(o, a):
    for i in range(o.shape[0]):
        o[i] = a[i] != 0


@njit(**OPTS)
def _cast_to_f64(o, a):
    for i in range(o.shape[0]):
        o[i] = np.float64(a[i])


@njit(**OPTS)
def _cast_dispatch(src, dst, t, d, s, F, D, I, B, fp, n):
    if dst == BK_F32:
        o = freg(F, fp, d)[:n]
        if src == BK_F32:
            _cast_to_f32(o, freg(F, fp, s)[:n], t, src)
        elif src == BK_F64:
            _cast_to_f32(o, D[s][:n], t, src)
        elif src == BK_I64:
            _cast_to_f32(o, I[s][:n], t, src)
        else:
            _cast_to_f32(o, B[s][:n], t, src)
    elif dst == BK_I64:
        o = I[d][:n]
        if src == BK_F32:
            _cast_to_int(o, freg(F, fp, s)[:n], t, True)
        elif src == BK_F64:
            _cast_to_int(o, D[s][:n], t, True)
        elif src == BK_I64:
            _cast_to_int(o, I[s][:n], t, False)
        else:
            _cast_to_int(o, B[s][:n], t, False)
    elif dst == BK_F64:
        o = D[d][:n]
        if src == BK_F32:
            _cast_to_f64(o, freg(F, fp, s)[:n])
        elif src == BK_F64:
            _cast_to_f64(o, D[s][:n])
        elif src == BK_I64:
            _cast_to_f64(o, I[s][:n])
        else:
            _cast_to_f64(o, B[s][:n])
    else:
        o = B[d][:n]
        if src == BK_F32:
            _cast_to_b8(o, freg(F, fp, s)[:n])
        elif src == BK_F64:
            _cast_to_b8(o, D[s][:n])
        elif src == BK_I64:
            _cast_to_b8(o, I[s][:n])
        else:
            _cast_to_b8(o, B[s][:n])


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


def ew_other_piece(fra, pc, n, unused):
    """PC_EW_F64, PC_EW_I64, PC_EW_B8 and PC_CAST: an elementwise instruction of the f64, i64 or
    bool bank, or a cast (decoded from instruction pc)."""
    fr = fm.frame(fra)
    ins, dec = fm.instrs(fr), fm.decode(fr)
    opc = ins[pc, 0]
    if dec[opc, DEC_GROUP] == G_CAST:
        return _cast(fr, ins, dec, pc, n)
    bank = dec[opc, DEC_BANK]
    if bank == BK_F64:
        return _ew_f64(fr, ins, dec, pc, n)
    if bank == BK_I64:
        return _ew_i64(fr, ins, dec, pc, n)
    return _ew_b8(fr, ins, dec, pc, n)


@njit(**OPTS)
def _ew_f64(fr, ins, dec, pc, n):
    op, kind = dec[ins[pc, 0], DEC_OP], dec[ins[pc, 0], DEC_KIND]
    f1, f2, f3, f4 = ins[pc, 1], ins[pc, 2], ins[pc, 3], ins[pc, 4]
    D = fm.bank_d(fr)
    if kind == K_UN:
        ok = _un_f64(op, D[f1][:n], D[f2][:n])
    elif kind == K_PRED:
        ok = _pred(op, fm.bank_b(fr)[f1][:n], D[f2][:n])
    elif kind == K_BIN:
        ok = _bin_float(op, D[f1][:n], D[f2][:n], D[f3][:n])
    elif kind == K_CMP:
        ok = _cmp(op, fm.bank_b(fr)[f1][:n], D[f2][:n], D[f3][:n])
    elif kind == K_WHERE:
        _where(D[f1][:n], fm.bank_b(fr)[f2][:n], D[f3][:n], D[f4][:n])
        ok = True
    elif kind == K_CLAMP:
        _clamp(D[f1][:n], D[f2][:n], D[f3][:n], D[f4][:n])
        ok = True
    else:
        ok = False
    return 0 if ok else ERR_UNHANDLED


@njit(**OPTS)
def _ew_i64(fr, ins, dec, pc, n):
    """Integer division by zero: ERR_ZERODIV."""
    op, kind = dec[ins[pc, 0], DEC_OP], dec[ins[pc, 0], DEC_KIND]
    f1, f2, f3, f4 = ins[pc, 1], ins[pc, 2], ins[pc, 3], ins[pc, 4]
    I = fm.bank_i(fr)
    if kind == K_UN:
        return 0 if _un_i64(op, I[f1][:n], I[f2][:n]) else ERR_UNHANDLED
    if kind == K_BIN:
        return _bin_i64(op, I[f1][:n], I[f2][:n], I[f3][:n])
    if kind == K_CMP:
        return 0 if _cmp(op, fm.bank_b(fr)[f1][:n], I[f2][:n], I[f3][:n]) else ERR_UNHANDLED
    if kind == K_WHERE:
        _where(I[f1][:n], fm.bank_b(fr)[f2][:n], I[f3][:n], I[f4][:n])
        return 0
    if kind == K_CLAMP:
        _clamp(I[f1][:n], I[f2][:n], I[f3][:n], I[f4][:n])
        return 0
    return ERR_UNHANDLED


@njit(**OPTS)
def _ew_b8(fr, ins, dec, pc, n):
    op, kind = dec[ins[pc, 0], DEC_OP], dec[ins[pc, 0], DEC_KIND]
    f1, f2, f3, f4 = ins[pc, 1], ins[pc, 2], ins[pc, 3], ins[pc, 4]
    B = fm.bank_b(fr)
    if kind == K_UN:
        ok = _un_b8(op, B[f1][:n], B[f2][:n])
    elif kind == K_BIN:
        ok = _bin_b8(op, B[f1][:n], B[f2][:n], B[f3][:n])
    elif kind == K_WHERE:
        _where(B[f1][:n], B[f2][:n], B[f3][:n], B[f4][:n])
        ok = True
    else:
        ok = False
    return 0 if ok else ERR_UNHANDLED


@njit(**OPTS)
def _cast(fr, ins, dec, pc, n):
    """Instruction pc's conversion between banks (its third field: the stored dtype it rounds to)."""
    opc = ins[pc, 0]
    _cast_dispatch(dec[opc, DEC_SRC], dec[opc, DEC_BANK], ins[pc, 3], ins[pc, 1], ins[pc, 2], fm.bank_f(fr),
                   fm.bank_d(fr), fm.bank_i(fr), fm.bank_b(fr), fm.fptr(fr), n)
    return 0
