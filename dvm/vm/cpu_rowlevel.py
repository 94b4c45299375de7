"""Row-level (compact) registers of the CPU VM.

A reduction result is constant along the row. The VM keeps it compact: row r's value in lane r,
which is also column 0 of a column-major tile (cpu_reduce's _rowred leaves it so). Row-level
arithmetic then runs on BM lanes only (_row_mode below), a full-tile f32 add/sub/mul/div/
maximum/minimum broadcasts a compact operand on the fly (_bin_rowb), and any other full-tile
reader first expands it in place (_expand). Row vectors (below) and uniform registers (constants,
applied as a scalar by _bins) work the same way. Results are identical to broadcast tiles: the
same f32 operations on the same values.
"""
from __future__ import annotations

from numba import carray, njit

from .cpu_kernels import (BK_F32, BK_F64, BK_I64, G_CAST, G_EW, G_STORE, G_STOREROW, K_BIN, K_CMP, OP_ADD,
                          OP_DIV, OP_EQ, OP_GE, OP_GT, OP_LE, OP_LT, OP_MAX, OP_MIN, OP_MUL, OP_SUB, _fmax, _fmin)
from .cpu_bits import OPTS, ptr_f32
from .cpu_mem import M_BM, M_BN, M_COLS, M_NC, M_NR, M_ROWS, M_TL
from .cpu_moves import _repeat_row
from .cpu_reduce import _bcast_t, _fill


@njit(**OPTS)
def _expand(o, bm, bn, tl):
    """Compact -> broadcast tile, in place."""
    if tl:
        _bcast_t(o, bm, bn)
    else:   # from the last row down: row r's lanes start at r*bn >= r, above every unread lane
        for r in range(bm - 1, -1, -1):
            _fill(o[r * bn:(r + 1) * bn], o[r])


# The lane loops below spell out one loop per (op, operand order): LLVM then vectorizes each.
# A loop over a shared inline `op` chain (`o[i] = lane(op, a[i], v)`) vectorized only in some
# callers: _bins and the swapped forms ran scalar, 13-20x slower (4.5-7.9 us per 4096-lane tile
# against 0.2-0.6 us).
@njit(inline='always', **OPTS)
def _vv(op, o, a, b, swap):
    """o = a . b lane-wise, or b . a when swap, for the f32 add/sub/mul/div/maximum/minimum
    (cpu_kernels._bin_float's lane ops)."""
    n = o.shape[0]
    if op == OP_ADD:
        if swap:
            for i in range(n):
                o[i] = b[i] + a[i]
        else:
            for i in range(n):
                o[i] = a[i] + b[i]
    elif op == OP_MUL:
        if swap:
            for i in range(n):
                o[i] = b[i] * a[i]
        else:
            for i in range(n):
                o[i] = a[i] * b[i]
    elif op == OP_SUB:
        if swap:
            for i in range(n):
                o[i] = b[i] - a[i]
        else:
            for i in range(n):
                o[i] = a[i] - b[i]
    elif op == OP_DIV:
        if swap:
            for i in range(n):
                o[i] = b[i] / a[i]
        else:
            for i in range(n):
                o[i] = a[i] / b[i]
    elif op == OP_MAX:
        if swap:
            for i in range(n):
                o[i] = _fmax(b[i], a[i])
        else:
            for i in range(n):
                o[i] = _fmax(a[i], b[i])
    else:
        if swap:
            for i in range(n):
                o[i] = _fmin(b[i], a[i])
        else:
            for i in range(n):
                o[i] = _fmin(a[i], b[i])


@njit(inline='always', **OPTS)
def _vs(op, o, a, v, swap):
    """o = a . v (v . a when swap) for a scalar v."""
    n = o.shape[0]
    if op == OP_ADD:
        if swap:
            for i in range(n):
                o[i] = v + a[i]
        else:
            for i in range(n):
                o[i] = a[i] + v
    elif op == OP_MUL:
        if swap:
            for i in range(n):
                o[i] = v * a[i]
        else:
            for i in range(n):
                o[i] = a[i] * v
    elif op == OP_SUB:
        if swap:
            for i in range(n):
                o[i] = v - a[i]
        else:
            for i in range(n):
                o[i] = a[i] - v
    elif op == OP_DIV:
        if swap:
            for i in range(n):
                o[i] = v / a[i]
        else:
            for i in range(n):
                o[i] = a[i] / v
    elif op == OP_MAX:
        if swap:
            for i in range(n):
                o[i] = _fmax(v, a[i])
        else:
            for i in range(n):
                o[i] = _fmax(a[i], v)
    else:
        if swap:
            for i in range(n):
                o[i] = _fmin(v, a[i])
        else:
            for i in range(n):
                o[i] = _fmin(a[i], v)


@njit(**OPTS)
def _bins(op, o, a, v, swap):
    """A full tile and a uniform register (v: its value)."""
    _vs(op, o, a, v, swap)


# Operand shapes that make a load compact (one value per row) or a row vector (one row for all).
@njit(**OPTS)
def _row_uniform(j, optab, meta):
    """Operand j reads the same elements in every row of a row-major tile (all its row strides
    are 0: a weight or bias broadcast over the rows), for the row vectors of cpu_rownorm's row
    forms and FK_APPLY. A tile of one row (BM = 1) qualifies when it holds the whole row (the
    single-tile rows of 8193-65536 columns, whose row forms need it: without it a 16385-column
    LayerNorm ran its tile form, 2.4x slower), not as a column tile of a sweep, whose row vector
    would be loaded again for every tile (slower there than the loads it replaces)."""
    if meta[M_TL] != 0 or (meta[M_BM] < 2 and meta[M_COLS] > meta[M_BN]):
        return False
    for d in range(meta[M_NR]):
        if optab[j, 4 + d] != 0:
            return False
    return True


@njit(**OPTS)
def _tile_row_uniform(j, optab, dims, meta, r0):
    """_row_uniform for the tile at row r0 alone: every row dim along which operand j moves keeps
    one index over the tile's valid rows (an attention mask's per-batch row vector, in a tile
    inside one batch). Row r's index along dim d is (r // inner_d) % size_d with inner_d the
    product of the sizes after d; r // inner_d never decreases with r, so it is one value over
    the rows iff it is at the first and the last."""
    if meta[M_TL] != 0 or meta[M_BM] < 2:
        return False
    last = min(r0 + meta[M_BM], meta[M_ROWS]) - 1
    inner = r0 * 0 + 1
    for d in range(meta[M_NR] - 1, -1, -1):
        size = max(dims[d], 1)
        if optab[j, 4 + d] != 0 and size > 1 and r0 // inner != last // inner:
            return False
        inner *= size
    return True


@njit(**OPTS)
def _col_uniform(j, optab, meta):
    """Operand j reads one element per row (all its column strides are 0: a per-row value
    broadcast along the row, such as a position in an attention mask, or a 0-d tensor such as an
    epsilon that dynamic=True made a tensor input)."""
    nr, nc = meta[M_NR], meta[M_NC]
    first = nr if nc > 0 else 0   # no column dims: only a 0-d value counts (every row the same)
    for d in range(first, nr + nc):
        if optab[j, 4 + d] != 0:
            return False
    return True


ROWB_OPS = (OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_MAX, OP_MIN)


@njit(**OPTS)
def _bin_rowb(op, o, a, b, bm, bn, tl, swap):
    """o = a . b (b . a when swap) for a full tile a and a compact register b."""
    if tl:
        bv = b[:bm]
        for k in range(bn):
            _vv(op, o[k * bm:(k + 1) * bm], a[k * bm:(k + 1) * bm], bv, swap)
    else:
        for r in range(bm):
            _vs(op, o[r * bn:(r + 1) * bn], a[r * bn:(r + 1) * bn], b[r], swap)


@njit(**OPTS)
def _bin_rowb_to_rows(op, ra, a, b, nrows, ncv, bn, swap):
    """_bin_rowb (row-major tiles) straight into a buffer: row r's ncv valid lanes at address
    ra[r] (the store it replaces, for tiles cpu_mem._direct_addr cannot alias)."""
    for r in range(nrows):
        _vs(op, carray(ptr_f32(ra[r]), ncv), a[r * bn:r * bn + ncv], b[r], swap)


# Row vectors: a load whose rows are all the same (a weight or bias broadcast over the rows of a
# row-major tile) fills row 0 only; an f32 binary op applies that row to every row of the other
# operand (_bin_rowv), a comparison with a compact register pairs them (_cmp_outer), any other
# reader expands it first (cpu_moves._repeat_row).
@njit(**OPTS)
def _bin_rowv(op, o, a, b, bm, bn, swap):
    """o = a . b (b . a when swap) for a full tile a and a row vector b (row-major tiles)."""
    bv = b[:bn]
    for r in range(bm):
        _vv(op, o[r * bn:(r + 1) * bn], a[r * bn:(r + 1) * bn], bv, swap)


@njit(inline='always', **OPTS)
def _cmp_row(op, o, x, v):
    """o[k] = x . v[k] for the comparisons (cpu_kernels._cmp's ops), one loop per op (see _vv)."""
    n = o.shape[0]
    if op == OP_EQ:
        for k in range(n):
            o[k] = x == v[k]
    elif op == OP_LT:
        for k in range(n):
            o[k] = x < v[k]
    elif op == OP_LE:
        for k in range(n):
            o[k] = x <= v[k]
    elif op == OP_GT:
        for k in range(n):
            o[k] = x > v[k]
    elif op == OP_GE:
        for k in range(n):
            o[k] = x >= v[k]
    else:
        for k in range(n):
            o[k] = x != v[k]


@njit(**OPTS)
def _cmp_outer(op, o, c, v, bm, bn, swap):
    """o[r, k] = c[r] . v[k] (v[k] . c[r] when swap) for a compact c and a row vector v. A swapped
    order comparison is the mirrored one (v < x is x > v, for NaN too: both false)."""
    if swap:
        op = OP_GT if op == OP_LT else OP_GE if op == OP_LE else OP_LT if op == OP_GT else \
            OP_LE if op == OP_GE else op
    vr = v[:bn]
    for r in range(bm):
        _cmp_row(op, o[r * bn:(r + 1) * bn], c[r], vr)


# Register states (cpu_interp._exec keeps them in st[bank, reg]): 0 a full tile, 1 compact,
# 2 uniform (a constant) in lanes [0, BM) only, 3 a row vector, 4 uniform in every lane (filled
# when a full-tile reader first needs it: a row tile of 16384 lanes costs ~0.7 us to fill, and
# most constants are only read as scalars or on BM lanes). These two decide how an instruction
# meets them.
@njit(inline='always', **OPTS)
def _row_mode(pc, g, op, bank, kind, fin, instrs, rio, st):
    """How instruction pc meets compact sources: 0 full (compact sources are expanded first),
    1 compact (every register source is compact or uniform: computed on BM lanes; or a finalize
    store / storerow of a compact register), 2 a supported f32 binary op of one full and one
    compact source, 4 a supported f32 binary op of one full and one uniform source (a constant:
    read as a scalar, not as a tile stream), 5 the same with a row-vector source (its row 0 is
    applied to every row), 7 a comparison of a compact register and a row vector (every pair:
    an attention mask's `pos[r] <= pos[c]`). Also returns the field of the compact (uniform,
    row-vector) source."""
    ncomp = 0
    nfull = 0
    nuni = 0
    nrow = 0
    cf = 0
    uf = 0
    rf = 0
    for f in range(5):
        b = rio[pc, f]
        if b > 0:
            sv = st[b - 1, instrs[pc, 1 + f]]
            if sv == 1:
                ncomp += 1
                cf = f
            elif sv == 0:
                nfull += 1
            elif sv == 2 or sv == 4:
                nuni += 1
                uf = f
            else:
                nrow += 1
                rf = f
    if ncomp == 0 and nuni == 0 and nrow == 0:   # the common case: full tiles only
        return 0, cf
    bin_f32 = False
    if g == G_EW and kind == K_BIN and bank == BK_F32:
        for o in ROWB_OPS:
            if o == op:
                bin_f32 = True
    if nrow > 0:   # a row vector meets a full tile, or is expanded (with any compact source)
        if nrow == 1 and nfull == 1 and ncomp == 0 and nuni == 0 and bin_f32:
            return 5, rf
        if nrow == 1 and ncomp == 1 and nfull == 0 and nuni == 0 and g == G_EW and kind == K_CMP:
            return 7, cf
        return 0, cf
    if ncomp == 0:
        if nuni == 1 and nfull == 1 and bin_f32:
            return 4, uf
        return 0, cf
    if g == G_EW or g == G_CAST:
        if nfull == 0:
            return 1, cf
        if ncomp == 1 and nfull == 1 and bin_f32:
            return 2, cf
        return 0, cf
    if (g == G_STORE and fin) or g == G_STOREROW:
        return 1, cf
    return 0, cf


@njit(inline='always', **OPTS)
def _expand_sources(pc, instrs, rio, st, F, D, I, B, bm, bn, tl):
    """Broadcast every compact register, row vector and constant instruction pc reads (none is
    ever aliased to a buffer: fp is 0 for them)."""
    for f in range(5):
        b = rio[pc, f] - 1
        if b >= 0:
            r = instrs[pc, 1 + f]
            if st[b, r] == 1:
                if b == BK_F32:
                    _expand(F[r], bm, bn, tl)
                elif b == BK_F64:
                    _expand(D[r], bm, bn, tl)
                elif b == BK_I64:
                    _expand(I[r], bm, bn, tl)
                else:
                    _expand(B[r], bm, bn, tl)
                st[b, r] = 0
            elif st[b, r] == 2:   # a constant in lanes [0, BM): into every lane
                if b == BK_F32:
                    F[r][:] = F[r][0]
                elif b == BK_F64:
                    D[r][:] = D[r][0]
                elif b == BK_I64:
                    I[r][:] = I[r][0]
                else:
                    B[r][:] = B[r][0]
                st[b, r] = 4
            elif st[b, r] == 3:   # a row vector (row-major tiles)
                if b == BK_F32:
                    _repeat_row(F[r], 0, bm, bn)
                elif b == BK_F64:
                    _repeat_row(D[r], 0, bm, bn)
                elif b == BK_I64:
                    _repeat_row(I[r], 0, bm, bn)
                else:
                    _repeat_row(B[r], 0, bm, bn)
                st[b, r] = 0
