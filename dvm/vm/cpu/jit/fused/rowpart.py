"""The first three tree levels of a partial row, read where it is (no padded copy).

A single-tile reduction pads a row of ncv valid lanes to its power-of-two width bn with the
reduction's identity, then runs the pairwise-halving tree (rowtree.tree_p2; the spec's
order). Its first pass (_lvl3) combines lanes k + j*q, j < 8, q = bn / 8, into lane k. Lane
k + j*q is valid exactly when j < nv(k): nv = J + 1 for k < ncv - J*q, else J (J = ncv // q).
The functions here compute that pass from the valid lanes alone, with the identity written in
place of the others: the same operations in the same order, so the same bits (an added +0.0
still turns -0.0 into +0.0, as the padded lane does). They save the padded copy and the reads
of padding: a 3072-column row in a 4096-lane tile is read once, 3072 lanes, instead of a
4096-lane padded copy and its reads.

bn / 2 < ncv (a single-tile row: bn is the next power of two), so J >= 4 and nv is 4 to 8. Each
(kind, nv) gets its own loop, made at import time (the kind's lane term and combine, jit/ops):
a loop whose terms or lane count are decided per lane does not vectorize.

Those eight interleaved reads of a row (lanes k + j*q) are also what the hardware prefetcher sees
of a row that comes from memory: eight short streams a row, which it does not follow. Rows of a
domain too large for the last-level cache are first touched (touch_row: one load a cache line,
in address order), so the prefetcher streams them; in cache the touch only costs time.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import carray, njit, types
from numba.extending import intrinsic

from ...abi import M_COLS, M_ROWS
from .. import ops
from ..bits import OPTS, f32_bits, ptr_f32

PART_MIN_BN = 2048   # narrower rows keep the padded copy (two short segments a row cost more)
_Z = np.float32(0.0)         # the sum's identity
_NINF = np.float32(-np.inf)  # the max's identity
LINE_F32 = 16          # f32 lanes a 64-byte cache line holds
# rows are touched first (rows_from_memory) where the row-sized operands a run reads and writes
# hold at least this many bytes: past the last-level cache of the machines measured (32 MiB). A
# softmax or RMSNorm of 4096x1024 (and its output), a row sum or max of 4096x4096: 0.66-0.93 of
# the time untouched; a row sum of 4096x1024 alone, which stays in the L3: 1.2-1.4x slower touched
STREAM_BYTES = 1 << 25


@njit(**OPTS)
def _x(v, m):
    return v


@njit(**OPTS)
def _sq(v, m):
    return ops.mul(v, v)


@njit(**OPTS)
def _csq(v, m):
    c = ops.sub(v, m)
    return ops.mul(c, c)


def _level_loop(term, combine, ident, nv):
    """d[k] = the first tree pass over lanes k + j*q: combine over term(lane j) for j < nv, the
    identity for the padded lanes j >= nv (lanes 0-3 are always valid: nv >= 4). The views x_j
    are of lanes k + j*q, indexed by k alone (k + j*q indices kept numba's negative-index
    wraparound: gathers); a view of padding is never read."""
    @njit(**OPTS)
    def loop(d, base, q, m):
        n = d.shape[0]
        x0, x1, x2, x3 = (carray(ptr_f32(base), n), carray(ptr_f32(base + 4 * q), n),
                          carray(ptr_f32(base + 8 * q), n), carray(ptr_f32(base + 12 * q), n))
        x4, x5, x6, x7 = (carray(ptr_f32(base + 16 * q), n), carray(ptr_f32(base + 20 * q), n),
                          carray(ptr_f32(base + 24 * q), n), carray(ptr_f32(base + 28 * q), n))
        for k in range(n):
            t4 = term(x4[k], m) if 4 < nv else ident
            t5 = term(x5[k], m) if 5 < nv else ident
            t6 = term(x6[k], m) if 6 < nv else ident
            t7 = term(x7[k], m) if 7 < nv else ident
            d[k] = combine(combine(combine(term(x0[k], m), t4), combine(term(x2[k], m), t6)),
                           combine(combine(term(x1[k], m), t5), combine(term(x3[k], m), t7)))
    return loop


def _levels_of(term, combine, ident):
    """The first tree pass of one kind over a row: its two segments' two segments (nv + 1 valid
    lanes below rem, nv above)."""
    l4, l5, l6, l7, l8 = (_level_loop(term, combine, ident, nv) for nv in (4, 5, 6, 7, 8))

    @njit(inline='always', **OPTS)
    def segment(d, base, q, nv, m):
        if nv == 8:
            l8(d, base, q, m)
        elif nv == 7:
            l7(d, base, q, m)
        elif nv == 6:
            l6(d, base, q, m)
        elif nv == 5:
            l5(d, base, q, m)
        else:
            l4(d, base, q, m)

    @njit(inline='always', **OPTS)
    def levels(d, x, ncv, bn, m):
        q = bn // 8
        j = ncv // q
        rem = ncv - j * q
        base, dbase = x.ctypes.data, d.ctypes.data
        if rem > 0:
            segment(carray(ptr_f32(dbase), rem), base, q, j + 1, m)
        if q > rem:
            segment(carray(ptr_f32(dbase + 4 * rem), q - rem), base + 4 * rem, q, j, m)
    return levels


levels_sum = _levels_of(_x, ops.add, _Z)
levels_sqsum = _levels_of(_sq, ops.add, _Z)
levels_csqsum = _levels_of(_csq, ops.add, _Z)
levels_max = _levels_of(_x, ops.maximum, _NINF)


@intrinsic
def _keep(typingctx, v):
    """An empty volatile asm statement that takes v: the loads that made v are not dead code."""
    if not isinstance(v, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [args[0].type]), "", "r", side_effect=True)
        builder.call(asm, [args[0]])
        return context.get_dummy_value()
    return types.void(v), codegen


@njit(inline='always', **OPTS)
def touch_row(x, n):
    """Load one lane of every cache line of x[:n], in address order, so that the hardware
    prefetcher streams the row before the trees' interleaved passes read it. The loads are
    summed in order (a float sum without reassociation stays scalar: a vectorized one gathers)."""
    acc = np.float32(0.0)
    for k in range(0, n, LINE_F32):
        acc += x[k]
    _keep(f32_bits(acc))


@njit(inline='always', **OPTS)
def rows_from_memory(meta, operands):
    """Whether a run's rows come from memory, where touch_row pays: `operands` f32 operands of the
    launch's domain (its input, and its output where that is as large) hold STREAM_BYTES."""
    return 4 * operands * meta[M_ROWS] * meta[M_COLS] >= STREAM_BYTES


@njit(**OPTS)
def part_fits(ncv, bn):
    """The partial-row pass applies: bn a power of two >= PART_MIN_BN and bn / 2 < ncv < bn."""
    return bn >= PART_MIN_BN and 2 * ncv > bn and ncv < bn
