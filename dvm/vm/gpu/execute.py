"""One instruction of the GPU VM: the handlers of each kind, per register bank.

Every handler takes the decoded instruction, the tile context and the whole register file
(f: 8 float32, d: 2 float64, i: 4 int64, b: 4 bool tiles, fewer hot in a lean abi.VARIANTS entry; higher registers in
scratch at sp_*) and returns the register file. Decode is uniform across a program instance: every
branch is on scalars read from the device image, so interpretation costs per tile, not per lane.
"""
from __future__ import annotations

import triton
import triton.language as tl

from . import ops
from . import tiles as t
from .kabi import *  # noqa: F401,F403


@triton.jit
def exec_memory(B, kind, bank, r1, aux, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13,
                a14, a15, ext, rows, cols, bm, row0, col0, body, fin, lanes, li, lj, sp_f, sp_d, sp_i, sp_b,
                f0, f1, f2, f3, f4, f5, f6, f7, d0, d1, i0, i1, i2, i3, b0, b1, b2, b3,
                TILE: tl.constexpr, HOT_D: tl.constexpr, HOT_I: tl.constexpr):
    """const, load, store, storerow, index."""
    row, rvalid = t.lane_rows(row0, li, bm, rows)
    col, cvalid = t.lane_cols(col0, lj, body, cols)
    if kind == K_CONST:
        if bank == B_F32:
            vf = tl.full([TILE], 0, tl.float32) + aux.to(tl.float64, bitcast=True).to(tl.float32)
            f0, f1, f2, f3, f4, f5, f6, f7 = t.put8(r1, vf, f0, f1, f2, f3, f4, f5, f6, f7, sp_f, lanes, TILE)
        elif bank == B_F64:
            vd = tl.full([TILE], 0, tl.float64) + aux.to(tl.float64, bitcast=True)
            d0, d1 = t.put2(r1, vd, d0, d1, sp_d, lanes, TILE, HOT_D)
        elif bank == B_I64:
            vi = tl.full([TILE], 0, tl.int64) + aux
            i0, i1, i2, i3 = t.put4(r1, vi, i0, i1, i2, i3, sp_i, lanes, TILE, HOT_I)
        else:
            vb = (tl.full([TILE], 0, tl.int64) + aux) != 0
            b0, b1, b2, b3 = t.put_b(r1, vb, b0, b1, b2, b3, sp_b, lanes, TILE)
    elif kind == K_INDEX:
        i0, i1, i2, i3 = t.put4(r1, t.element_index(B, aux, row, col), i0, i1, i2, i3, sp_i, lanes, TILE, HOT_I)
    else:
        slot, dt = t.operand(B, aux)
        addr = t.slot_address(slot, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15,
                              ext)
        if kind == K_LOAD:
            idx = t.element_index(B, aux, row, col)
            mask = rvalid & cvalid
            if bank == B_F32:
                f0, f1, f2, f3, f4, f5, f6, f7 = t.put8(r1, t.load_f32(addr, dt, idx, mask), f0, f1, f2, f3, f4,
                                                        f5, f6, f7, sp_f, lanes, TILE)
            elif bank == B_F64:
                d0, d1 = t.put2(r1, t.load_f64(addr, idx, mask), d0, d1, sp_d, lanes, TILE, HOT_D)
            elif bank == B_I64:
                i0, i1, i2, i3 = t.put4(r1, t.load_i64(addr, dt, idx, mask), i0, i1, i2, i3, sp_i, lanes, TILE, HOT_I)
            else:
                b0, b1, b2, b3 = t.put_b(r1, t.load_b8(addr, idx, mask), b0, b1, b2, b3, sp_b, lanes, TILE)
        else:
            # store: valid lanes; finalize stores and storerow write column 0 of valid rows
            row_form = (kind == K_STOREROW) | (fin != 0)
            if kind == K_STOREROW:
                col = col * 0
            idx = t.element_index(B, aux, row, col)
            mask = rvalid & cvalid
            if row_form:
                mask = mask & (lj == 0)
            if bank == B_F32:
                t.store_f32(addr, dt, idx, t.pick8(r1, f0, f1, f2, f3, f4, f5, f6, f7, sp_f, lanes, TILE), mask)
            elif bank == B_F64:
                t.store_f64(addr, idx, t.pick2(r1, d0, d1, sp_d, lanes, TILE, HOT_D), mask)
            elif bank == B_I64:
                t.store_i64(addr, dt, idx, t.pick4(r1, i0, i1, i2, i3, sp_i, lanes, TILE, HOT_I), mask)
            else:
                t.store_b8(addr, idx, t.pick_b(r1, b0, b1, b2, b3, sp_b, lanes, TILE), mask)
    return f0, f1, f2, f3, f4, f5, f6, f7, d0, d1, i0, i1, i2, i3, b0, b1, b2, b3


@triton.jit
def exec_cast(bank, src, dt, r1, r2, lanes, sp_f, sp_d, sp_i, sp_b,
              f0, f1, f2, f3, f4, f5, f6, f7, d0, d1, i0, i1, i2, i3, b0, b1, b2, b3, TILE: tl.constexpr, HOT_D: tl.constexpr, HOT_I: tl.constexpr):
    """cast.<src>.<bank> to dtype dt (graph/dtypes codes): reference.cast_value."""
    if bank == B_F32:
        if src == B_F32:
            vf = ops.to_f32_bank(t.pick8(r2, f0, f1, f2, f3, f4, f5, f6, f7, sp_f, lanes, TILE), dt)
        elif src == B_F64:
            vf = ops.to_f32_bank(t.pick2(r2, d0, d1, sp_d, lanes, TILE, HOT_D), dt)
        elif src == B_I64:
            vf = ops.to_f32_bank(t.pick4(r2, i0, i1, i2, i3, sp_i, lanes, TILE, HOT_I), dt)
        else:
            vf = t.pick_b(r2, b0, b1, b2, b3, sp_b, lanes, TILE).to(tl.float32)
        f0, f1, f2, f3, f4, f5, f6, f7 = t.put8(r1, vf, f0, f1, f2, f3, f4, f5, f6, f7, sp_f, lanes, TILE)
    elif bank == B_F64:
        if src == B_F32:
            vd = t.pick8(r2, f0, f1, f2, f3, f4, f5, f6, f7, sp_f, lanes, TILE).to(tl.float64)
        elif src == B_F64:
            vd = t.pick2(r2, d0, d1, sp_d, lanes, TILE, HOT_D)
        elif src == B_I64:
            vd = t.pick4(r2, i0, i1, i2, i3, sp_i, lanes, TILE, HOT_I).to(tl.float64)
        else:
            vd = t.pick_b(r2, b0, b1, b2, b3, sp_b, lanes, TILE).to(tl.float64)
        d0, d1 = t.put2(r1, vd, d0, d1, sp_d, lanes, TILE, HOT_D)
    elif bank == B_I64:
        if src == B_F32:
            vi = ops.float_to_int(t.pick8(r2, f0, f1, f2, f3, f4, f5, f6, f7, sp_f, lanes, TILE), dt)
        elif src == B_F64:
            vi = ops.float_to_int(t.pick2(r2, d0, d1, sp_d, lanes, TILE, HOT_D), dt)
        elif src == B_I64:
            vi = ops.int_to_int(t.pick4(r2, i0, i1, i2, i3, sp_i, lanes, TILE, HOT_I), dt)
        else:
            vi = t.pick_b(r2, b0, b1, b2, b3, sp_b, lanes, TILE).to(tl.int64)
        i0, i1, i2, i3 = t.put4(r1, vi, i0, i1, i2, i3, sp_i, lanes, TILE, HOT_I)
    else:
        if src == B_F32:
            vb = t.pick8(r2, f0, f1, f2, f3, f4, f5, f6, f7, sp_f, lanes, TILE) != 0
        elif src == B_F64:
            vb = t.pick2(r2, d0, d1, sp_d, lanes, TILE, HOT_D) != 0
        elif src == B_I64:
            vb = t.pick4(r2, i0, i1, i2, i3, sp_i, lanes, TILE, HOT_I) != 0
        else:
            vb = t.pick_b(r2, b0, b1, b2, b3, sp_b, lanes, TILE)
        b0, b1, b2, b3 = t.put_b(r1, vb, b0, b1, b2, b3, sp_b, lanes, TILE)
    return f0, f1, f2, f3, f4, f5, f6, f7, d0, d1, i0, i1, i2, i3, b0, b1, b2, b3


@triton.jit
def exec_ew(kind, bank, op, obank, r1, r2, r3, r4, lanes, sp_f, sp_d, sp_i, sp_b,
            f0, f1, f2, f3, f4, f5, f6, f7, d0, d1, i0, i1, i2, i3, b0, b1, b2, b3, TILE: tl.constexpr, HOT_D: tl.constexpr, HOT_I: tl.constexpr):
    """Unary, binary and ternary elementwise ops; comparisons and float predicates write bools.
    where's first source is a bool register; every other source is in the instruction's bank.
    (Names carry their type, f/d/i/b: Triton merges a name assigned in sibling branches.)"""
    if obank == B_B8:
        if bank == B_F32:
            xf = t.pick8(r2, f0, f1, f2, f3, f4, f5, f6, f7, sp_f, lanes, TILE)
            if kind == K_EW1:
                vb = ops.float_pred(op, xf)
            else:
                vb = ops.compare(op, xf, t.pick8(r3, f0, f1, f2, f3, f4, f5, f6, f7, sp_f, lanes, TILE))
        elif bank == B_F64:
            xd = t.pick2(r2, d0, d1, sp_d, lanes, TILE, HOT_D)
            if kind == K_EW1:
                vb = ops.float_pred(op, xd)
            else:
                vb = ops.compare(op, xd, t.pick2(r3, d0, d1, sp_d, lanes, TILE, HOT_D))
        elif bank == B_I64:
            vb = ops.compare(op, t.pick4(r2, i0, i1, i2, i3, sp_i, lanes, TILE, HOT_I),
                             t.pick4(r3, i0, i1, i2, i3, sp_i, lanes, TILE, HOT_I))
        else:
            xb = t.pick_b(r2, b0, b1, b2, b3, sp_b, lanes, TILE)
            if kind == K_EW1:
                vb = xb == 0
            elif kind == K_EW2:
                vb = ops.binary_b8(op, xb, t.pick_b(r3, b0, b1, b2, b3, sp_b, lanes, TILE))
            else:
                vb = tl.where(xb, t.pick_b(r3, b0, b1, b2, b3, sp_b, lanes, TILE),
                              t.pick_b(r4, b0, b1, b2, b3, sp_b, lanes, TILE))
        b0, b1, b2, b3 = t.put_b(r1, vb, b0, b1, b2, b3, sp_b, lanes, TILE)
    elif kind == K_EW3:
        if op == T_WHERE:
            c = t.pick_b(r2, b0, b1, b2, b3, sp_b, lanes, TILE)
        else:
            c = lanes >= 0
        if bank == B_F32:
            yf = t.pick8(r3, f0, f1, f2, f3, f4, f5, f6, f7, sp_f, lanes, TILE)
            zf = t.pick8(r4, f0, f1, f2, f3, f4, f5, f6, f7, sp_f, lanes, TILE)
            if op == T_WHERE:
                vf = tl.where(c, yf, zf)
            else:
                vf = ops.clamp(t.pick8(r2, f0, f1, f2, f3, f4, f5, f6, f7, sp_f, lanes, TILE), yf, zf)
            f0, f1, f2, f3, f4, f5, f6, f7 = t.put8(r1, vf, f0, f1, f2, f3, f4, f5, f6, f7, sp_f, lanes, TILE)
        elif bank == B_F64:
            yd = t.pick2(r3, d0, d1, sp_d, lanes, TILE, HOT_D)
            zd = t.pick2(r4, d0, d1, sp_d, lanes, TILE, HOT_D)
            if op == T_WHERE:
                vd = tl.where(c, yd, zd)
            else:
                vd = ops.clamp(t.pick2(r2, d0, d1, sp_d, lanes, TILE, HOT_D), yd, zd)
            d0, d1 = t.put2(r1, vd, d0, d1, sp_d, lanes, TILE, HOT_D)
        else:
            yi = t.pick4(r3, i0, i1, i2, i3, sp_i, lanes, TILE, HOT_I)
            zi = t.pick4(r4, i0, i1, i2, i3, sp_i, lanes, TILE, HOT_I)
            if op == T_WHERE:
                vi = tl.where(c, yi, zi)
            else:
                vi = ops.clamp(t.pick4(r2, i0, i1, i2, i3, sp_i, lanes, TILE, HOT_I), yi, zi)
            i0, i1, i2, i3 = t.put4(r1, vi, i0, i1, i2, i3, sp_i, lanes, TILE, HOT_I)
    elif bank == B_F32:
        xf = t.pick8(r2, f0, f1, f2, f3, f4, f5, f6, f7, sp_f, lanes, TILE)
        if kind == K_EW1:
            vf = ops.unary_float(op, xf)
        else:
            vf = ops.float_binary(op, xf, t.pick8(r3, f0, f1, f2, f3, f4, f5, f6, f7, sp_f, lanes, TILE))
        f0, f1, f2, f3, f4, f5, f6, f7 = t.put8(r1, vf, f0, f1, f2, f3, f4, f5, f6, f7, sp_f, lanes, TILE)
    elif bank == B_F64:
        xd = t.pick2(r2, d0, d1, sp_d, lanes, TILE, HOT_D)
        if kind == K_EW1:
            vd = ops.unary_float(op, xd)
        else:
            vd = ops.float_binary(op, xd, t.pick2(r3, d0, d1, sp_d, lanes, TILE, HOT_D))
        d0, d1 = t.put2(r1, vd, d0, d1, sp_d, lanes, TILE, HOT_D)
    else:
        xi = t.pick4(r2, i0, i1, i2, i3, sp_i, lanes, TILE, HOT_I)
        if kind == K_EW1:
            vi = ops.unary_i64(op, xi)
        else:
            vi = ops.binary_i64(op, xi, t.pick4(r3, i0, i1, i2, i3, sp_i, lanes, TILE, HOT_I))
        i0, i1, i2, i3 = t.put4(r1, vi, i0, i1, i2, i3, sp_i, lanes, TILE, HOT_I)
    return f0, f1, f2, f3, f4, f5, f6, f7, d0, d1, i0, i1, i2, i3, b0, b1, b2, b3


@triton.jit
def _reduce(kind, op, acc, idx, x, col0, body, cols, lanes, li, lj, bn, TILE: tl.constexpr):
    """(value, index) after accinit / acc / rfin / rowred on one bank's tiles: acc the
    accumulator (rowred: its source), idx the int64 index tile, x acc's source."""
    col, cvalid = t.lane_cols(col0, lj, body, cols)
    if kind == K_ACCINIT:
        acc = ops.identity_like(acc, op)
        idx = idx * 0
    elif kind == K_ACC:
        if op < R_ARGMAX:
            acc = tl.where(cvalid, ops.combine(op, acc, x), acc)
        else:
            take = cvalid & ops.arg_better(op, x, col, acc, idx, False)
            acc = tl.where(take, x, acc)
            idx = tl.where(take, col, idx)
    else:
        if kind == K_ROWRED:
            acc = tl.where(cvalid, acc, ops.identity_like(acc, op))
            idx = tl.where(cvalid, col, ops.I64_MAX)
        if op < R_ARGMAX:
            acc = t.tree(acc, op, lanes, li, lj, bn, TILE)
        else:
            idx = t.arg_tree(acc, idx, op, lanes, li, lj, bn, TILE)
    return acc, idx


@triton.jit
def exec_reduce(kind, bank, op, r1, r2, r3, col0, body, cols, lanes, li, lj, bn, sp_f, sp_d, sp_i, sp_b,
                f0, f1, f2, f3, f4, f5, f6, f7, d0, d1, i0, i1, i2, i3, b0, b1, b2, b3, TILE: tl.constexpr, HOT_D: tl.constexpr, HOT_I: tl.constexpr):
    """accinit d [d_idx]; acc m [m_idx] s; rfin d s [s_idx]; rowred d s (isa.py's fields).
    ra: the accumulator (or source) register, ri: the index register (0 where there is none: a
    hot register, never read for a result), rv: where the value goes (-1: nowhere), rj: where
    the index goes (-1: nowhere)."""
    is_arg = op >= R_ARGMAX
    none = r1 * 0 - 1
    rx = r2
    ri = r1 * 0
    rv = r1
    rj = none
    if kind == K_ACCINIT:
        ra = r1
        if is_arg:
            rj = r2
    elif kind == K_ACC:
        ra = r1
        if is_arg:
            ri = r2
            rx = r3
            rj = r2
    else:
        ra = r2
        if is_arg:
            rv = none
            rj = r1
            if kind == K_RFIN:
                ri = r3
    idx = t.pick4(ri, i0, i1, i2, i3, sp_i, lanes, TILE, HOT_I)
    if bank == B_F32:
        accf, idx = _reduce(kind, op, t.pick8(ra, f0, f1, f2, f3, f4, f5, f6, f7, sp_f, lanes, TILE), idx,
                           t.pick8(rx, f0, f1, f2, f3, f4, f5, f6, f7, sp_f, lanes, TILE), col0, body, cols, lanes,
                           li, lj, bn, TILE)
        if rv >= 0:
            f0, f1, f2, f3, f4, f5, f6, f7 = t.put8(rv, accf, f0, f1, f2, f3, f4, f5, f6, f7, sp_f, lanes, TILE)
    elif bank == B_F64:
        accd, idx = _reduce(kind, op, t.pick2(ra, d0, d1, sp_d, lanes, TILE, HOT_D), idx,
                           t.pick2(rx, d0, d1, sp_d, lanes, TILE, HOT_D), col0, body, cols, lanes, li, lj, bn, TILE)
        if rv >= 0:
            d0, d1 = t.put2(rv, accd, d0, d1, sp_d, lanes, TILE, HOT_D)
    else:
        acci, idx = _reduce(kind, op, t.pick4(ra, i0, i1, i2, i3, sp_i, lanes, TILE, HOT_I), idx,
                           t.pick4(rx, i0, i1, i2, i3, sp_i, lanes, TILE, HOT_I), col0, body, cols, lanes, li, lj, bn, TILE)
        if rv >= 0:
            i0, i1, i2, i3 = t.put4(rv, acci, i0, i1, i2, i3, sp_i, lanes, TILE, HOT_I)
    if rj >= 0:
        i0, i1, i2, i3 = t.put4(rj, idx, i0, i1, i2, i3, sp_i, lanes, TILE, HOT_I)
    return f0, f1, f2, f3, f4, f5, f6, f7, d0, d1, i0, i1, i2, i3, b0, b1, b2, b3
