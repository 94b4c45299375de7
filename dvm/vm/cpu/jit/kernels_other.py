"""Elementwise tile kernels of the CPU VM's other banks: the ew_other piece (PC_EW_F64, PC_EW_I64,
PC_EW_B8, PC_CAST): f64 ops (the float loops of jit/kernels), int64 and bool ops, and casts
between banks. Written like jit/kernels: one loop per op over whole tiles, a small C entry.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from ..abi import (BK_F32, BK_F64, BK_I64, DEC_BANK, DEC_GROUP, DEC_KIND, DEC_OP, DEC_SRC, DT_BF16, DT_F16, DT_I32,
                   ERR_UNHANDLED, ERR_ZERODIV, G_CAST, K_BIN, K_CLAMP, K_CMP, K_PRED, K_UN, K_WHERE, OP_ABS, OP_ADD,
                   OP_BAND, OP_BOR, OP_BXOR, OP_FLOORDIV, OP_LAND, OP_LNOT, OP_LOR, OP_LXOR, OP_MAX, OP_MIN, OP_MUL,
                   OP_NEG, OP_POW, OP_RELU, OP_REM, OP_SIGN, OP_SUB)
from . import frame as fm
from . import loops
from .addr import freg
from .bits import OPTS, bf2f, f2bf, f2h, f64_to_f16_f32, h2f
from .kernels import _bin_float, _clamp, _cmp, _pred, _un_f64, _where


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
