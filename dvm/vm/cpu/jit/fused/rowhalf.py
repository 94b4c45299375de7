"""16-bit rows in the norms' row form (jit/fused/rownorm): a float16 or bfloat16 operand's row
converted into an f32 scratch row, an f32 row converted out into a 16-bit buffer row, and the
rounding casts a 16-bit model's norm has inside it (`cast.f32.f32 y, x, T`: x rounded to T's
precision, kept in f32), each with the conversions of jit/bits that the cast and the loads and
stores use, so the results are bitwise the tile form's.
"""
from __future__ import annotations

from numba import carray, njit

from ...abi import DT_BF16, DT_F32, OP_ADD
from .. import ops
from ..bits import OPTS, bf2f, f2bf, f2h, h2f, ptr_f32, ptr_u16
from ..loops import bin_in_place
from ..mem import convert_run, copy_run


@njit(**OPTS)   # a call, not inlined: the row loops of the f32 norms stay as they were
def row_move(is_store, row, addr, dt):
    """Between the f32 row `row` and the row of its length at addr in dtype dt: that row = row
    converted (rounded as a store rounds) when is_store, else row = that row as f32 (f32: copies)."""
    n = row.shape[0]
    if dt != DT_F32:
        convert_run(is_store, row, carray(ptr_u16(addr), n), dt, n)
    else:
        copy_run(is_store, row, carray(ptr_f32(addr), n), n)


@njit(**OPTS)
def row_f32(addr, dt, scratch, n):
    """The n-lane row at addr as f32: where it lies when dt is f32, else converted into scratch (an
    address of n f32 lanes)."""
    if dt == DT_F32:
        return carray(ptr_f32(addr), n)
    out = carray(ptr_f32(scratch), n)
    row_move(False, out, addr, dt)
    return out


@njit(**OPTS)
def add_half_terms(xr, nt, rt, bm, r, swaps, dt, scratch):
    """xr += each of a residual sum's nt later terms in the sum's order, their rows of the 16-bit
    dtype dt at rt[j * bm + r], each converted into the scratch row first (swaps bit j: the term
    is its add's first operand): common.add_terms for 16-bit terms."""
    n = xr.shape[0]
    for j in range(nt):
        bin_in_place(OP_ADD, xr, row_f32(rt[j * bm + r], dt, scratch, n), (swaps >> j) & 1 != 0)


@njit(**OPTS)
def round_row(x, dt):
    """x[:] rounded to dt's precision (DT_BF16, else DT_F16) in place: the cast's arithmetic
    (jit/kernels_other's casts to f32 from f32)."""
    if dt == DT_BF16:
        for k in range(x.shape[0]):
            x[k] = bf2f(f2bf(x[k]))
    else:
        for k in range(x.shape[0]):
            x[k] = h2f(f2h(x[k]))


@njit(**OPTS)
def apply_rounded(orow, xr, mv, centered, sv, rdt, w, b, n, bias):
    """orow[:n] = (round((xr - mv or xr) * sv) to rdt) * w [+ b]: the scale-and-affine of
    common.apply_row with the rounding cast of its first product (an RMSNorm's `.to(dtype)` before
    the weight). One pass for the bfloat16 RMSNorm without a bias, else three."""
    if rdt == DT_BF16 and not centered and not bias:
        for k in range(n):
            orow[k] = ops.mul(bf2f(f2bf(ops.mul(xr[k], sv))), w[k])
        return
    if centered:
        for k in range(n):
            orow[k] = ops.mul(ops.sub(xr[k], mv), sv)
    else:
        for k in range(n):
            orow[k] = ops.mul(xr[k], sv)
    round_row(orow[:n], rdt)
    if bias:
        for k in range(n):
            orow[k] = ops.add(ops.mul(orow[k], w[k]), b[k])
    else:
        for k in range(n):
            orow[k] = ops.mul(orow[k], w[k])


@njit(**OPTS)
def sum_rounded_bf16(xr, a_addr, b_addr, z_addr):
    """xr[:] = the bfloat16 rounding of a + b, rows of bfloat16 at a_addr and b_addr, and the
    same bits stored at z_addr (0: none): the residual sum of a bfloat16 model, its rounding and
    its store in one pass (a store of the rounded row or of the sum, both round to those bits)."""
    n = xr.shape[0]
    a, b = carray(ptr_u16(a_addr), n), carray(ptr_u16(b_addr), n)
    if z_addr == 0:
        for k in range(n):
            xr[k] = bf2f(f2bf(ops.add(bf2f(a[k]), bf2f(b[k]))))
    else:
        z = carray(ptr_u16(z_addr), n)
        for k in range(n):
            h = f2bf(ops.add(bf2f(a[k]), bf2f(b[k])))
            z[k] = h
            xr[k] = bf2f(h)


@njit(**OPTS)
def scale_rounded_bf16(y_addr, xr, sv, w):
    """The bfloat16 row at y_addr = round(round(xr * sv) * w), bfloat16 roundings: apply_rounded
    of an RMSNorm without a bias and its store in one pass."""
    n = xr.shape[0]
    y = carray(ptr_u16(y_addr), n)
    for k in range(n):
        y[k] = f2bf(ops.mul(bf2f(f2bf(ops.mul(xr[k], sv))), w[k]))
