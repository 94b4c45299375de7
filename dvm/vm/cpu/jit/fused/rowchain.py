"""What the row forms (jit/fused/rownorm, jit/fused/rows) share: a norm's chain of compact ops
replayed on each row's scalars, the scale-and-affine of a row, the row vectors read in place, and
which tiles the forms take.
"""
from __future__ import annotations

from numba import njit

from ...abi import (CHAIN_OPS, DEC_KIND, DEC_OP, DT_F32, K_BIN, M_BN, M_COLS, OP_RECIP, OP_RSQRT, OP_SQRT,
                    RS_COMPACT, RS_UNIFORM, RS_UNIFORM_ALL)
from .. import ops
from ..addr import row_addrs, row_uniform
from ..bits import NUMBA_INLINE, OPTS
from ..reduce import is_pow2
from .common import apply_row


@njit(inline=NUMBA_INLINE, **OPTS)   # as apply_row: the narrow-row LayerNorm's loop
def apply_row_c(orow, xr, mv, centered, sv, w, b, n, bias):
    """apply_row of xr - mv when centered (the centering sub recomputed: the same bits)."""
    if not centered:
        apply_row(orow, xr, sv, w, b, n, bias)
    elif bias:
        for k in range(n):
            orow[k] = ops.add(ops.mul(ops.mul(ops.sub(xr[k], mv), sv), w[k]), b[k])
    else:
        for k in range(n):
            orow[k] = ops.mul(ops.mul(ops.sub(xr[k], mv), sv), w[k])


@njit(inline='always', **OPTS)
def center_row(drow, xr, mv, n):
    """drow[:n] = xr[:n] - mv (drow does not overlap xr: the loop vectorizes)."""
    for k in range(n):
        drow[k] = ops.sub(xr[k], mv)


@njit(inline='always', **OPTS)
def _scalar_op(op, a, b):
    """One lane of a chain op (abi.CHAIN_OPS), as jit/ops defines it."""
    if op == OP_SQRT:
        return ops.sqrt(a)
    if op == OP_RSQRT:
        return ops.rsqrt(a)
    if op == OP_RECIP:
        return ops.reciprocal(a)
    return ops.binary(op, a, b)


@njit(inline='always', **OPTS)
def _internal(reg, instrs, r1, r2, q0, q1):
    """reg is written by the run before it is read: r1, r2 (its row sums) or a chain's dest."""
    if reg == r1 or reg == r2:
        return True
    for q in range(q0, q1):
        if instrs[q, 1] == reg:
            return True
    return False


@njit(**OPTS)
def chain_ok(instrs, dec, st, qa0, qa1, qb0, qb1, r1, r2):
    """Every chain op is one _scalar_op does, and every source the run does not write is compact or
    uniform now."""
    for q in range(qa0, qb1):
        if qa1 <= q < qb0:
            continue
        op, kind = dec[instrs[q, 0], DEC_OP], dec[instrs[q, 0], DEC_KIND]
        ok = False
        for c in CHAIN_OPS:
            ok = ok or op == c
        if not ok:
            return False
        for f in range(2 if kind == K_BIN else 1):
            reg = instrs[q, 2 + f]
            if not (_internal(reg, instrs, r1, r2, qa0, qa1) or _internal(reg, instrs, r1, r2, qb0, qb1)):
                s = st[0, reg]
                if s != RS_COMPACT and s != RS_UNIFORM and s != RS_UNIFORM_ALL:
                    return False
    return True


@njit(**OPTS)
def chain_rows(instrs, dec, q0, q1, F, st, r0, r1):
    """The chain's compact ops on rows r0 to r1 (row r's values in lane r; lane 0 of a uniform
    source), an op at a time (decoded once for the rows). A call, not inlined: inlined into the
    row loops it makes LLVM's code for them worse."""
    for q in range(q0, q1):
        op, kind = dec[instrs[q, 0], DEC_OP], dec[instrs[q, 0], DEC_KIND]
        ra = instrs[q, 2]
        rb = instrs[q, 3] if kind == K_BIN else ra
        a, b, y = F[ra], F[rb], F[instrs[q, 1]]
        ca, cb = st[0, ra] == RS_COMPACT, st[0, rb] == RS_COMPACT
        for r in range(r0, r1):
            y[r] = _scalar_op(op, a[r] if ca else a[0], b[r] if cb else b[0])


@njit(inline='always', **OPTS)
def in_place_row(src, optab, dims, meta, addrs, r0, ix):
    """The address of row vector operand src's row when the row forms may read it where it is
    (an f32 operand, row-uniform, unit column stride: only its first ncv lanes are read), else 0.
    Copying it into the scratch cache instead costs a launch as much as the norm of one such row.
    The caller's tile is aok (no output overlaps it)."""
    if src < 0 or optab[src, 2] != DT_F32 or not row_uniform(src, optab, meta):
        return 0
    if not row_addrs(ix[:1], src, optab, dims, meta, addrs, r0, 0, 1):
        return 0
    return ix[0]


ROW_FORM_MIN_BN = 512   # narrower rows run faster through the tile forms (the row form's per-row calls cost more)
# ... or, for the norms, in the narrow row form (_norm_rows_narrow) down to this many lanes (rows of
# 64 ran slower than in the tile form; rows of 512, as many as a 4096x512 norm's, too)
NARROW_MIN_BN = 128
NARROW_BLOCK_LANES = 2048   # the narrow form's block of rows (8 KiB of f32)


@njit(inline='always', **OPTS)
def rows_fit(meta, aok):
    """The tile's rows are whole, BN is a power of two >= NARROW_MIN_BN (the softmax: ROW_FORM_MIN_BN)
    and less than twice the row (fused/rowpart and vtree_pad read rows of BN / 2 + 1 to BN lanes;
    the encoder's BN is the row's next power of two)."""
    bn, cols = meta[M_BN], meta[M_COLS]
    return aok and cols <= bn < 2 * cols and bn >= NARROW_MIN_BN and is_pow2(bn)
