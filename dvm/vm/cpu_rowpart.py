"""The first three tree levels of a partial row, read where it is (no padded copy).

A single-tile reduction pads a row of ncv valid lanes to its power-of-two width bn with the
reduction's identity, then runs the pairwise-halving tree (cpu_reduce._tree_p2; the spec's
order). Its first pass (_lvl3) combines lanes k + j*q, j < 8, q = bn / 8, into lane k. Lane
k + j*q is valid exactly when j < nv(k): nv = J + 1 for k < ncv - J*q, else J (J = ncv // q).
The functions here compute that pass from the valid lanes alone, with the identity written in
place of the others: the same operations in the same order, so the same bits (an added +0.0
still turns -0.0 into +0.0, as the padded lane does). They save the padded copy and the reads
of padding: a 3072-column row in a 4096-lane tile read 4096 + 3072 * 2 lanes per tree, now 3072
(a tree of that row, standalone: 168 -> 115 ns; 5000 columns in 8192 lanes: 418 -> 101 ns).

bn / 2 < ncv (a single-tile row: bn is the next power of two), so J >= 4 and nv is 4 to 8.
"""
from __future__ import annotations

import numpy as np
from numba import carray, njit

from .cpu_bits import OPTS, ptr_f32
from .cpu_kernels import _fmax

_Z = np.float32(0.0)         # the sum's identity
_NINF = np.float32(-np.inf)  # the max's identity


@njit(inline='always', **OPTS)
def _lanes(base, q, n):
    """Views of lanes k + j*q (k < n) for j < 8, starting at address base: indexed by k alone,
    they vectorize (k + j*q indices kept numba's negative-index wraparound: gathers, ~3x slower).
    Views of padding lanes are never read."""
    return (carray(ptr_f32(base), n), carray(ptr_f32(base + 4 * q), n), carray(ptr_f32(base + 8 * q), n),
            carray(ptr_f32(base + 12 * q), n), carray(ptr_f32(base + 16 * q), n),
            carray(ptr_f32(base + 20 * q), n), carray(ptr_f32(base + 24 * q), n),
            carray(ptr_f32(base + 28 * q), n))


@njit(inline='always', **OPTS)
def _term(x, k, sq, m):
    """Lane k's term: x, x*x (sq 1) or (x - m)*(x - m) (sq 2), the instructions' f32 ops."""
    if sq == 2:
        c = x[k] - m
        return c * c
    return x[k] * x[k] if sq == 1 else x[k]


@njit(inline='always', **OPTS)
def _sums(d, base, q, nv, sq, m):
    """d[k] = _lvl3(R_SUM) of the padded row's terms (_term; sq is a constant at each call site:
    inlined, the branch folds); lanes j >= nv are +0.0, as a padded lane's term is (cpu_reduce
    pads the row it reduces, whatever the lanes held)."""
    z = _Z
    x0, x1, x2, x3, x4, x5, x6, x7 = _lanes(base, q, d.shape[0])
    if nv == 8:
        for k in range(d.shape[0]):
            d[k] = (((_term(x0, k, sq, m) + _term(x4, k, sq, m))
                     + (_term(x2, k, sq, m) + _term(x6, k, sq, m)))
                    + ((_term(x1, k, sq, m) + _term(x5, k, sq, m))
                       + (_term(x3, k, sq, m) + _term(x7, k, sq, m))))
    elif nv == 7:
        for k in range(d.shape[0]):
            d[k] = (((_term(x0, k, sq, m) + _term(x4, k, sq, m))
                     + (_term(x2, k, sq, m) + _term(x6, k, sq, m)))
                    + ((_term(x1, k, sq, m) + _term(x5, k, sq, m)) + (_term(x3, k, sq, m) + z)))
    elif nv == 6:
        for k in range(d.shape[0]):
            d[k] = (((_term(x0, k, sq, m) + _term(x4, k, sq, m)) + (_term(x2, k, sq, m) + z))
                    + ((_term(x1, k, sq, m) + _term(x5, k, sq, m)) + (_term(x3, k, sq, m) + z)))
    elif nv == 5:
        for k in range(d.shape[0]):
            d[k] = (((_term(x0, k, sq, m) + _term(x4, k, sq, m)) + (_term(x2, k, sq, m) + z))
                    + ((_term(x1, k, sq, m) + z) + (_term(x3, k, sq, m) + z)))
    else:   # 4
        for k in range(d.shape[0]):
            d[k] = (((_term(x0, k, sq, m) + z) + (_term(x2, k, sq, m) + z))
                    + ((_term(x1, k, sq, m) + z) + (_term(x3, k, sq, m) + z)))


@njit(inline='always', **OPTS)
def _maxes(d, base, q, nv):
    """d[k] = _lvl3(R_MAX) of the padded row (lanes j >= nv are -inf)."""
    m = _fmax
    z = _NINF
    x0, x1, x2, x3, x4, x5, x6, x7 = _lanes(base, q, d.shape[0])
    if nv == 8:
        for k in range(d.shape[0]):
            d[k] = m(m(m(x0[k], x4[k]), m(x2[k], x6[k])), m(m(x1[k], x5[k]), m(x3[k], x7[k])))
    elif nv == 7:
        for k in range(d.shape[0]):
            d[k] = m(m(m(x0[k], x4[k]), m(x2[k], x6[k])), m(m(x1[k], x5[k]), m(x3[k], z)))
    elif nv == 6:
        for k in range(d.shape[0]):
            d[k] = m(m(m(x0[k], x4[k]), m(x2[k], z)), m(m(x1[k], x5[k]), m(x3[k], z)))
    elif nv == 5:
        for k in range(d.shape[0]):
            d[k] = m(m(m(x0[k], x4[k]), m(x2[k], z)), m(m(x1[k], z), m(x3[k], z)))
    else:
        for k in range(d.shape[0]):
            d[k] = m(m(m(x0[k], z), m(x2[k], z)), m(m(x1[k], z), m(x3[k], z)))


PART_SUM, PART_SQSUM, PART_MAX = 0, 1, 2


PART_MIN_BN = 2048   # narrower rows keep the padded copy: as fast at 1024 lanes, ~20 ns a tree faster
                     # below (two short segments per row; standalone numba loops, one thread)


@njit(inline='always', **OPTS)
def part_fits(ncv, bn):
    """The partial-row pass applies: bn a power of two >= PART_MIN_BN and bn / 2 < ncv < bn."""
    return bn >= PART_MIN_BN and 2 * ncv > bn and ncv < bn


@njit(inline='always', **OPTS)
def levels_inline(d, x, ncv, bn, sq, m):
    """first_levels of the sums of _term(x, sq, m) (sq 2: the centered squares), or of the maxes
    when sq is -1, inlined (sq a constant at the call site): as a call, with the kind dispatched
    at run time, it cost 10-20 ns more a row (128 to 1024 lanes), up to 13 % of a LayerNorm row."""
    q = bn // 8
    j = ncv // q
    rem = ncv - j * q
    for k0, k1, nv in ((0, rem, j + 1), (rem, q, j)):
        if k1 > k0:
            ds = carray(ptr_f32(d.ctypes.data + 4 * k0), k1 - k0)
            if sq < 0:
                _maxes(ds, x.ctypes.data + 4 * k0, q, nv)
            else:
                _sums(ds, x.ctypes.data + 4 * k0, q, nv, sq, m)


@njit(**OPTS)
def first_levels(kind, d, x, ncv, bn):
    """d[:bn // 8] = the padded row's first tree pass (PART_SUM, PART_SQSUM: of x*x, PART_MAX),
    reading x[:ncv] only. Requires bn / 2 < ncv <= bn, bn a power of two >= 16 (part_fits adds
    the widths where it beats a padded copy for a lone tree). Continue with _tree_p2 over d.
    levels_inline with the kind dispatched at run time, for callers outside the row forms."""
    if kind == PART_SUM:
        levels_inline(d, x, ncv, bn, 0, _Z)
    elif kind == PART_SQSUM:
        levels_inline(d, x, ncv, bn, 1, _Z)
    else:
        levels_inline(d, x, ncv, bn, -1, _Z)
