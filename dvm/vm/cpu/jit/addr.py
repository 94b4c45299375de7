"""Operand addressing of the CPU VM (compiled code shared by the core and the pieces): element
addresses over folded dims, the tiles that may be read or written in place, the rows of a tile in
a buffer, and what an operand's strides say about its rows (uniform along a row, the same for
every row). optab row j: kind, arg, dtype, offset, then one stride per dim (rows, then columns).
"""
from __future__ import annotations

import numpy as np
from numba import carray, njit

from ..abi import (ALIASED, BK_F32, DEC_GROUP, DT_BF16, DT_F16, DT_F32, G_ACC, G_ACCINIT, G_LOAD, G_RFIN, G_ROWRED,
                   G_STORE, G_STOREROW, M_BM, M_BN, M_COLS, M_NC, M_NR, M_NSW, M_ROWS, M_SW, M_TL, OPND_ARG,
                   OPTAB_FIXED)
from .bits import OPTS, ptr_f32

_S = OPTAB_FIXED   # optab column of operand j's stride along dim 0


@njit(**OPTS)
def elem_offset(j, idx, optab, dims, d0, d1):
    """Element offset of flat index `idx` over dims[d0:d1] (row-major) for operand j."""
    off = np.int64(0)
    rem = idx
    for d in range(d1 - 1, d0 - 1, -1):
        size = max(dims[d], 1)
        off += (rem % size) * optab[j, _S + d]
        rem //= size
    return off


@njit(**OPTS)
def dim_offsets(o, j, optab, dims, start, n, d0, d1):
    """o[i] = element offset of flat index start + i (i < n) over dims[d0:d1] (row-major) for
    operand j: an odometer on the two innermost dims, with one elem_offset (divisions) per wrap of
    the second instead of one per index (a short innermost dim, as the halves of a rotary
    embedding's rows, wraps every few indices). No dims: zeros."""
    zero = start * 0
    if d1 <= d0:
        for i in range(n):
            o[i] = zero
        return
    dl = max(dims[d1 - 1], 1)
    sl = optab[j, _S + d1 - 1]
    d2 = max(dims[d1 - 2], 1) if d1 - d0 > 1 else 1
    s2 = optab[j, _S + d1 - 2] if d1 - d0 > 1 else zero
    t = start % dl
    t2 = (start // dl) % d2
    b = elem_offset(j, start, optab, dims, d0, d1)
    for i in range(n):
        if i > 0:
            t += 1
            if t == dl:
                t = zero
                t2 += 1
                if t2 == d2:
                    t2 = zero
                    b = elem_offset(j, start + i, optab, dims, d0, d1)
                else:
                    b += s2 - (dl - 1) * sl
            else:
                b += sl
        o[i] = b


@njit(inline='always', **OPTS)
def row_bases(o, j, optab, dims, r0, n, nr):
    """o[i] = element offset of rows r0 + i (i < n) over the nr row dims (dim_offsets)."""
    dim_offsets(o, j, optab, dims, r0, n, r0 * 0, nr)


@njit(**OPTS)
def direct_addr(j, optab, dims, meta, addrs, r0, c0):
    """Address of operand j's tile when it is one contiguous f32 run of BM*BN elements in the
    register layout (a full tile; row-major: unit column stride, rows back to back; column-major:
    unit row stride, columns back to back), else 0. Such a tile is read in place by a load
    (the register aliases the buffer) or written in place by the op feeding a store."""
    nr, nc, bm, bn = meta[M_NR], meta[M_NC], meta[M_BM], meta[M_BN]
    if meta[M_TL] != 0:   # column-major: contiguous rows, columns exactly BM apart
        if optab[j, 2] != DT_F32 or nc != 1 or nr != 1 or optab[j, _S] != 1:
            return 0
        if r0 + bm > meta[M_ROWS] or c0 + bn > meta[M_COLS] or (bn > 1 and optab[j, _S + 1] != bm):
            return 0
        return addrs[optab[j, 1]] + 4 * (optab[j, 3] + r0 + c0 * optab[j, _S + 1])
    if optab[j, 2] != DT_F32 or nc != 1 or optab[j, _S + nr] != 1:
        return 0
    if r0 + bm > meta[M_ROWS] or c0 + bn > meta[M_COLS]:
        return 0
    if bm > 1:   # the tile's rows must lie back to back: inside one block of the innermost row dims
        step = bn  # whose strides are a row-major block's (all of them: any tile; else a tile that
        block = 1  # does not cross the block, as a per-head tile of an operand broadcast over heads)
        for d in range(nr - 1, -1, -1):
            if dims[d] != 1 and optab[j, _S + d] != step:
                break
            step *= dims[d]
            block *= dims[d]
        if r0 % block + bm > block:
            return 0
    base = optab[j, 3] + elem_offset(j, r0, optab, dims, nr - nr, nr) + c0
    return addrs[optab[j, 1]] + 4 * base


@njit(inline='always', **OPTS)   # per tile in the fused runs: a call passes every view's fields
def row_addrs(o, j, optab, dims, meta, addrs, r0, c0, nrows):
    """o[r] = the address of lane c0 of row r0 + r of operand j (r < nrows), when j is an f32
    operand of row-major tiles with one unit-stride column dim, whatever its row strides; False
    otherwise. For writing rows straight into a buffer where direct_addr cannot (a partial tile,
    or rows not back to back)."""
    return optab[j, 2] == DT_F32 and row_addrs_sized(o, j, optab, dims, meta, addrs, r0, c0, nrows) != 0


@njit(inline='always', **OPTS)
def lane_bytes(dt):
    """An f32, f16 or bf16 lane's size in bytes, 0 for the other dtypes."""
    return 4 if dt == DT_F32 else (2 if dt == DT_F16 or dt == DT_BF16 else 0)


@njit(inline='always', **OPTS)
def row_addrs_sized(o, j, optab, dims, meta, addrs, r0, c0, nrows):
    """row_addrs for an f32, f16 or bf16 operand: its lane size in bytes (4 or 2), 0 where the
    rows cannot be addressed so."""
    nr, size = meta[M_NR], lane_bytes(optab[j, 2])
    if size == 0 or meta[M_TL] != 0 or meta[M_NC] != 1 or optab[j, _S + nr] != 1:
        return 0
    row_bases(o, j, optab, dims, r0, nrows, nr)
    base = addrs[optab[j, 1]] + size * (optab[j, 3] + c0)
    for r in range(nrows):
        o[r] = base + size * o[r]
    return size


@njit(inline='always', **OPTS)   # a view, per instruction
def freg(F, fp, k):
    """F register k: its bank row, or the buffer slice it aliases (fp[k] = address, 0 = none)."""
    p = fp[k]
    if p == 0:
        return F[k]
    return carray(ptr_f32(p), F.shape[1])


@njit(**OPTS)
def alias_ok(addrs, numels, argsz, argst, instrs, dec, rio, optab, meta, dims):
    """In-place tiles (registers pointing into buffers, results written straight into outputs):
    0 where a stored argument overlaps another argument other than by an in-place update the
    kernel allows (in_place_pair), 1 where no stored argument overlaps any other, ALIASED where
    every overlap is such an update."""
    n = addrs.shape[0]
    ok = 1
    for a in range(n):
        if argst[a] == 2:
            return 0
        if argst[a] == 0:
            continue
        lo, hi = addrs[a], addrs[a] + numels[a] * argsz[a]
        for b in range(n):
            if b != a and hi > lo and numels[b] > 0:
                if addrs[b] < hi and lo < addrs[b] + numels[b] * argsz[b]:
                    if not in_place_pair(a, b, addrs, numels, argsz, argst, instrs, dec, rio, optab, meta, dims):
                        return 0
                    ok = ALIASED
    return ok


@njit(**OPTS)
def in_place_pair(a, b, addrs, numels, argsz, argst, instrs, dec, rio, optab, meta, dims):
    """Stored argument a may occupy exactly the memory of argument b with in-place tiles (an update
    `b.add_(...)`, runtime/in_place): b is not stored; both are the same elements at the same
    addresses, each read through one operand of the same dense row-major layout over the domain;
    the kernel is one sweep without reductions (no element is read again after a store); and in
    its stream every read of a register loaded from b comes no later than the instruction
    computing the one value stored to a (which reads them element by element). Then every
    element is read before it is overwritten, and never after."""
    if argst[b] != 0 or addrs[a] != addrs[b] or numels[a] != numels[b] or argsz[a] != argsz[b]:
        return False
    sw = M_SW
    if meta[M_NSW] != 1 or meta[sw] != meta[sw + 1] or meta[sw + 4] != meta[sw + 5]:
        return False
    ja = _sole_operand(a, optab)
    jb = _sole_operand(b, optab)
    return ja >= 0 and jb >= 0 and _same_dense(ja, jb, optab, dims, meta[M_NR] + meta[M_NC]) and \
        _reads_precede_store(jb, ja, instrs, dec, rio)


@njit(**OPTS)
def _sole_operand(arg, optab):
    """The one operand reading or writing argument arg, or -1 (none, several, or an index)."""
    j = -1
    for k in range(optab.shape[0]):
        if optab[k, 1] == arg:
            if j >= 0 or optab[k, 0] != OPND_ARG:
                return -1
            j = k
    return j


@njit(**OPTS)
def _same_dense(ja, jb, optab, dims, nd):
    """Operands ja and jb address the same elements of one dense row-major layout of the domain."""
    if optab[ja, 2] != optab[jb, 2] or optab[ja, 3] != optab[jb, 3]:
        return False
    step = 1
    for d in range(nd - 1, -1, -1):
        if optab[ja, _S + d] != optab[jb, _S + d]:
            return False
        if dims[d] > 1:
            if optab[ja, _S + d] != step:
                return False
            step *= dims[d]
    return True


@njit(**OPTS)
def _reads_precede_store(jb, ja, instrs, dec, rio):
    """One store to operand ja, and every read of a register loaded from operand jb no later than
    the instruction that last wrote the stored register; no reductions (runtime/in_place's rule).
    Scans the stream without tables: a few hundred ns where arguments overlap, nothing elsewhere."""
    n = instrs.shape[0]
    store = -1
    for pc in range(n):
        g = dec[instrs[pc, 0], DEC_GROUP]
        if g == G_ACCINIT or g == G_ACC or g == G_RFIN or g == G_ROWRED or g == G_STOREROW:
            return False
        if g == G_STORE and instrs[pc, 2] == ja:
            if store >= 0 or rio[pc, 0] == 0:
                return False
            store = pc
    if store < 0:
        return False
    produced = _last_write(rio[store, 0], instrs[store, 1], store, instrs, rio)
    for pc in range(n):   # each load of jb: its register's reads until it is written again
        if dec[instrs[pc, 0], DEC_GROUP] == G_LOAD and instrs[pc, 2] == jb and rio[pc, 5] > 0:
            if _last_read(rio[pc, 5], instrs[pc, 1], pc + 1, instrs, rio) > produced:
                return False
    return produced >= 0


@njit(**OPTS)
def _last_write(bk, reg, before, instrs, rio):
    """The last instruction before `before` writing register reg of bank code bk - 1, or -1."""
    for pc in range(before - 1, -1, -1):
        for f in range(5):
            if rio[pc, 5 + f] == bk and instrs[pc, 1 + f] == reg:
                return pc
    return -1


@njit(**OPTS)
def _last_read(bk, reg, start, instrs, rio):
    """The last instruction from `start` on reading register reg (bank code bk - 1) before an
    instruction writes it again, or -1."""
    last = -1
    for pc in range(start, instrs.shape[0]):
        for f in range(5):
            if rio[pc, f] == bk and instrs[pc, 1 + f] == reg:
                last = pc
        for f in range(5):
            if rio[pc, 5 + f] == bk and instrs[pc, 1 + f] == reg:
                return last
    return last


@njit(inline='always', **OPTS)   # per instruction of a tile, where tiles alias (alias_ok: ALIASED)
def reads_at(p, pc, instrs, rio, fp):
    """Instruction pc reads an f32 register that points at address p."""
    for f in range(5):
        if rio[pc, f] == 1 + BK_F32 and fp[instrs[pc, 1 + f]] == p:
            return True
    return False


@njit(**OPTS)
def row_uniform(j, optab, meta):
    """Operand j reads the same elements in every row of a row-major tile (all its row strides
    are 0: a weight or bias broadcast over the rows), for the row vectors of the row forms and
    FK_APPLY. A tile of one row (BM = 1) qualifies when it holds the whole row (the single-tile
    rows of 8193-65536 columns, whose row forms need it), not as a column tile of a sweep, whose
    row vector would be loaded again for every tile (slower there than the loads it replaces)."""
    if meta[M_TL] != 0 or (meta[M_BM] < 2 and meta[M_COLS] > meta[M_BN]):
        return False
    for d in range(meta[M_NR]):
        if optab[j, _S + d] != 0:
            return False
    return True


@njit(**OPTS)
def tile_row_uniform(j, optab, dims, meta, r0):
    """row_uniform for the tile at row r0 alone: every row dim along which operand j moves keeps
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
        if optab[j, _S + d] != 0 and size > 1 and r0 // inner != last // inner:
            return False
        inner *= size
    return True


@njit(**OPTS)
def col_uniform(j, optab, meta):
    """Operand j reads one element per row (all its column strides are 0: a per-row value
    broadcast along the row, such as a position in an attention mask, or a 0-d tensor such as an
    epsilon that dynamic=True made a tensor input)."""
    nr, nc = meta[M_NR], meta[M_NC]
    first = nr if nc > 0 else 0   # no column dims: only a 0-d value counts (every row the same)
    for d in range(first, nr + nc):
        if optab[j, _S + d] != 0:
            return False
    return True
