"""What the fused runs share (jit/fused/tile, jit/fused/rows): the squares' first tree levels, the
scale-and-affine of a row, a residual sum's row, and the row vectors (a norm's weight and bias) with their per-launch
cache.
"""
from __future__ import annotations

import numpy as np
from numba import carray, njit

from ...abi import DT_BF16, DT_F16, DT_F32, OP_ADD, RS_ROWVEC, ST_CACHE
from .. import ops
from ..addr import row_uniform
from ..bits import NUMBA_INLINE, OPTS, ptr_f32, ptr_u16
from ..loops import bin_in_place, loop2
from ..mem import mem_tile
from .rowpart import levels_sqsum, part_fits


@njit(**OPTS)
def _sq(v):
    return ops.mul(v, v)


@njit(inline='always', **OPTS)
def sq8(v, k, q):
    """Three tree levels (rowtree._stage's order) of the squares of v[k + j*q], j < 8."""
    return ops.add(ops.add(ops.add(_sq(v[k]), _sq(v[k + 4 * q])), ops.add(_sq(v[k + 2 * q]), _sq(v[k + 6 * q]))),
                   ops.add(ops.add(_sq(v[k + q]), _sq(v[k + 5 * q])), ops.add(_sq(v[k + 3 * q]), _sq(v[k + 7 * q]))))


@njit(inline='always', **OPTS)
def sq_level(lvl, v, q, ncv, bn, pad):
    """lvl[k] = the first three tree levels of v's squares (sq8); lanes past ncv count as +0.0,
    the sum's identity, as the reductions pad. A partial row of a tile narrower than fused/rowpart takes
    is first copied into pad (bn lanes) and padded with zeros: a per-lane select on the index
    (`v[i]^2 if i < ncv else 0`) does not vectorize."""
    if ncv == bn:
        for k in range(q):
            lvl[k] = sq8(v, k, q)
    elif part_fits(ncv, bn):   # from the valid lanes alone (fused/rowpart)
        levels_sqsum(lvl, v, ncv, bn, np.float32(0.0))
    else:
        for k in range(ncv):
            pad[k] = v[k]
        for k in range(ncv, bn):
            pad[k] = np.float32(0.0)
        for k in range(q):
            lvl[k] = sq8(pad, k, q)


@njit(inline=NUMBA_INLINE, **OPTS)   # the narrow-row RMSNorm's loop: slower inlined by LLVM
def apply_row(orow, xr, sv, w, b, n, bias):
    """orow[:n] = ((xr * sv) * w) + b (without `+ b` unless bias)."""
    if bias:
        for k in range(n):
            orow[k] = ops.add(ops.mul(ops.mul(xr[k], sv), w[k]), b[k])
    else:
        for k in range(n):
            orow[k] = ops.mul(ops.mul(xr[k], sv), w[k])


# xr = a + b of two rows (the residual add's operand order; xr overlaps neither). A call, not
# inlined: inlined into the row loops it slows the plain norms' loops.
add_row = loop2(ops.add)


@njit(**OPTS)
def add_terms(xr, a, b, r, nt, rt, bm, swaps):
    """xr = row r of a residual sum ((a + b) + c) + ... in the sum's order (xr overlaps no term):
    the nt >= 1 terms after a and b, term j's row at rt[j * bm + r], added as its add has it (swaps
    bit j: the term is the add's first operand); the first of them joins a + b in one pass. (Sums
    of two terms take add_row: routing them through here cost a 4096x128 norm ~10 %.)"""
    n = xr.shape[0]
    c = carray(ptr_f32(rt[r]), n)
    if swaps & 1:
        for k in range(n):
            xr[k] = ops.add(c[k], ops.add(a[k], b[k]))
    else:
        for k in range(n):
            xr[k] = ops.add(ops.add(a[k], b[k]), c[k])
    for j in range(1, nt):
        bin_in_place(OP_ADD, xr, carray(ptr_f32(rt[j * bm + r]), n), (swaps >> j) & 1 != 0)


@njit(inline='always', **OPTS)
def row_vector(dst, src, F, st, optab, dims, meta, addrs, numels, r0, c0, ix):
    """Row 0 of a row vector into dst (bn lanes): loaded from operand `src` (>= 0) when its rows
    are all the same (addr.row_uniform), or read from register -2 - src when that register is a row
    vector now. False if neither."""
    if src >= 0:
        if not row_uniform(src, optab, meta):
            return False
        arg, dt = optab[src, 1], optab[src, 2]
        a, n = addrs[arg], numels[arg]
        if dt == DT_F32:
            mem_tile(np.bool_(False), dst, carray(ptr_f32(a), n), dt, src, optab, dims, meta, r0, c0,
                 np.bool_(False), ix, np.bool_(True))
        elif dt == DT_F16 or dt == DT_BF16:
            mem_tile(np.bool_(False), dst, carray(ptr_u16(a), n), dt, src, optab, dims, meta, r0, c0,
                 np.bool_(False), ix, np.bool_(True))
        else:
            return False
        return True
    reg = -2 - src
    if st[0, reg] != RS_ROWVEC:
        return False
    dst[:] = F[reg][:dst.shape[0]]
    return True


@njit(inline='always', **OPTS)
def cached_row(dst, slot, src, pc, F, st, optab, dims, meta, addrs, numels, r0, c0, ix, aok):
    """row_vector into dst unless dst already holds it: the same run (pc) loaded it from a buffer
    at the same c0 in this launch. Tagged only when aok: no output overlaps the buffer."""
    k = 2 * slot
    if src >= 0 and st[ST_CACHE, k] == pc + 1 and st[ST_CACHE, k + 1] == c0:
        return True
    st[ST_CACHE, k] = 0
    if not row_vector(dst, src, F, st, optab, dims, meta, addrs, numels, r0, c0, ix):
        return False
    if src >= 0 and aok:
        st[ST_CACHE, k] = pc + 1
        st[ST_CACHE, k + 1] = c0
    return True
