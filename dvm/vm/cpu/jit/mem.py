"""Memory access of the CPU VM: tile loads and stores with dtype conversion, loads of row-level
values, index tiles; the PC_MEM piece.

Two register layouts (host/desc picks one per kernel; results are identical):
  row-major     lane (r, k) at r*BN + k  (_mem, _index)
  column-major  lane (r, k) at k*BM + r  (_mem_t, _index_t): a column of a tile is BM rows
                apart in memory, contiguous when the kept axis is the operand's innermost one.
Edge tiles use clamped indices: lanes outside the domain copy the last valid row / column.
"""
from __future__ import annotations

from numba import carray, njit, types
from numba.extending import overload

from ..abi import (DT_BF16, DT_BOOL, DT_F16, DT_F32, DT_F64, DT_I32, DT_I64, ERR_UNHANDLED, FR_C0, FR_FIN, FR_R0,
                   MEM_COMPACT, MEM_INDEX, MEM_LOAD, MEM_STOREROW, M_BM, M_BN, M_COLS, M_NC, M_NR, M_ROWS,
                   OPTAB_FIXED)
from . import frame as fm
from .addr import dim_offsets, freg, row_bases
from .bits import (CONVERT_BLOCK, CPU_HALVES, OPTS, bf2f, bf2f_run, f2bf, f2bf_run, f2h, f2h_run, h2f, h2f_run,
                   ptr_f32, ptr_f64, ptr_i32, ptr_i64, ptr_u16, ptr_u8)
from .moves import BLOCK_T, move_rows, move_run, move_transposed, raw_copy, repeat_row, run_end

_S = OPTAB_FIXED


def load_row(o, buf, cv, start, stride, n, ix, general):
    """o[:n] = buf[start + k*stride] (or buf[ix[k]] when general), converted from the stored dtype
    cv. numba only: one implementation per buffer type (_load_plain, _load_half), so a
    specialisation compiles the conversions its buffers can hold and no others."""
    raise NotImplementedError


def store_row(buf, x, cv, start, stride, n, ix, general):
    """buf[start + k*stride] (or buf[ix[k]] when general) = x[:n], converted to cv. numba only."""
    raise NotImplementedError


@overload(load_row)
def _load_row_impl(o, buf, cv, start, stride, n, ix, general):
    return _load_half if buf.dtype == types.uint16 else _load_plain


@overload(store_row)
def _store_row_impl(buf, x, cv, start, stride, n, ix, general):
    return _store_half if buf.dtype == types.uint16 else _store_plain


def _load_plain(o, buf, cv, start, stride, n, ix, general):
    if not general and stride == 1:
        src = buf[start:start + n]
        for k in range(n):
            o[k] = src[k]
    elif not general and stride == 0:
        o[:n] = buf[start]
    elif not general:   # strided: index directly (vectorizes as a gather)
        for k in range(n):
            o[k] = buf[start + k * stride]
    else:
        for k in range(n):
            o[k] = buf[ix[k]]


@njit(inline='always', **OPTS)
def convert_run(is_store, r, b, cv, n):
    """b[:n] = r[:n] converted to cv (float16 or bfloat16 bits in uint16 lanes) when is_store, else
    r[:n] = b[:n] converted from cv: loops LLVM vectorizes (runs of CONVERT_BLOCK lanes or more may
    take bits' block runs instead)."""
    if is_store and cv == DT_F16:
        for j in range(n):
            b[j] = f2h(r[j])
    elif is_store:
        for j in range(n):
            b[j] = f2bf(r[j])
    elif cv == DT_F16:
        for j in range(n):
            r[j] = h2f(b[j])
    else:
        for j in range(n):
            r[j] = bf2f(b[j])


def _load_half(o, buf, cv, start, stride, n, ix, general):
    """f16 or bf16 (cv) stored as uint16 bits."""
    if not general and stride == 1:
        convert_run(False, o, buf[start:start + n], cv, n)
        return
    if not general and stride == 0:
        o[:n] = h2f(buf[start]) if cv == DT_F16 else bf2f(buf[start])
        return
    if not general:
        for k in range(n):
            ix[k] = start + k * stride
    if cv == DT_F16:
        for k in range(n):
            o[k] = h2f(buf[ix[k]])
    else:
        for k in range(n):
            o[k] = bf2f(buf[ix[k]])


def convert_rows(is_store, reg, buf, cv, at, rb, nrv, bn):
    """reg[i*bn:(i+1)*bn] = buf[at + rb[i]:][:bn] converted from cv (or back, converted to cv,
    when storing) for the rows i < nrv of a tile whose operand has unit column stride: one call
    a tile (a call a row passed three arrays' fields, ~60 ns a row), rows back to back in the
    buffer as one run. numba only, like load_row: one implementation per buffer type."""
    raise NotImplementedError


@overload(convert_rows)
def _convert_rows_impl(is_store, reg, buf, cv, at, rb, nrv, bn):
    return _rows_half if buf.dtype == types.uint16 else _rows_plain


@njit(inline='always', **OPTS)
def copy_run(is_store, r, b, n):
    """b[:n] = r[:n] when is_store, else r[:n] = b[:n] (convert_run's lanes of one dtype)."""
    if is_store:
        for j in range(n):
            b[j] = r[j]
    else:
        for j in range(n):
            r[j] = b[j]


def _rows_plain(is_store, reg, buf, cv, at, rb, nrv, bn):
    i = 0
    while i < nrv:
        k = run_end(rb, i, nrv, bn)
        n = (k - i) * bn
        copy_run(is_store, reg[i * bn:i * bn + n], buf[at + rb[i]:at + rb[i] + n], n)
        i = k


# runs of 16-bit lanes from CONVERT_BLOCK to under this many lanes are converted by blocks (a loop
# over a head-wide run, 8-128 lanes, cost ~30 ns in trip-count and alias checks, blocks 10-20);
# longer ones by loops LLVM vectorizes
SHORT_CONVERT = 256


def _rows_half(is_store, reg, buf, cv, at, rb, nrv, bn):
    by_blocks = reg.itemsize == 4 and (CPU_HALVES or cv != DT_F16)   # float32 registers
    r_at, b_at = reg.ctypes.data, buf.ctypes.data + at * buf.itemsize
    i = 0
    while i < nrv:
        k = run_end(rb, i, nrv, bn)
        n = (k - i) * bn
        if by_blocks and CONVERT_BLOCK <= n < SHORT_CONVERT:
            r, b = r_at + i * bn * reg.itemsize, b_at + rb[i] * buf.itemsize
            if is_store and cv == DT_F16:
                f2h_run(r, b, n)
            elif is_store:
                f2bf_run(r, b, n)
            elif cv == DT_F16:
                h2f_run(b, r, n)
            else:
                bf2f_run(b, r, n)
            i = k
            continue
        convert_run(is_store, reg[i * bn:i * bn + n], buf[at + rb[i]:at + rb[i] + n], cv, n)
        i = k


def _store_plain(buf, x, cv, start, stride, n, ix, general):
    if not general and stride == 1:
        dst = buf[start:start + n]
        for k in range(n):
            dst[k] = x[k]
    elif not general:
        for k in range(n):
            buf[start + k * stride] = x[k]
    else:
        for k in range(n):
            buf[ix[k]] = x[k]


def _store_half(buf, x, cv, start, stride, n, ix, general):
    if not general and stride == 1:
        convert_run(True, x, buf[start:start + n], cv, n)
        return
    if not general:
        for k in range(n):
            ix[k] = start + k * stride
    if cv == DT_F16:
        for k in range(n):
            buf[ix[k]] = f2h(x[k])
    else:
        for k in range(n):
            buf[ix[k]] = f2bf(x[k])


@njit(**OPTS)
def _transposed_rows(rb, nrv):
    """The tile's rows are runs of consecutive elements of the operand (rb[i + 1] == rb[i] + 1)
    of BLOCK_T rows or more on average: moves.move_transposed pays."""
    runs, i = 0, 0
    while i < nrv:
        i = run_end(rb, i, nrv, 1)
        runs += 1
    return nrv >= BLOCK_T * runs


@njit(**OPTS)
def mem_tile(is_store, reg, buf, cv, j, optab, dims, meta, r0, c0, fin, ix, one_row):
    """Load a tile into `reg` (clamped indices) or store `reg`'s valid lanes, for operand j.
    one_row: load row 0 only (an operand whose rows are all the same in this tile: see
    addr.tile_row_uniform)."""
    nr, nc, bm, bn = meta[M_NR], meta[M_NC], meta[M_BM], meta[M_BN]
    rows, cols = meta[M_ROWS], meta[M_COLS]
    nrv = 1 if one_row else min(bm, rows - r0)
    ncv = 1 if fin else min(bn, cols - c0)
    off = optab[j, 3]
    zero = off * 0
    # column addressing for this tile: a single column dim is start + k*stride, else general
    general = (not fin) and nc > 1
    stride = 0 if (fin or nc == 0) else optab[j, _S + nr]
    if general:
        dim_offsets(ix, j, optab, dims, c0, ncv, nr, nr + nc)
    rb = ix[2 * bn:2 * bn + nrv]   # row bases (ix[:2*bn] holds the general column indices)
    if nr > 0:
        row_bases(rb, j, optab, dims, r0, nrv, nr)
    else:
        rb[:] = zero
    raw = raw_copy(reg, buf, cv, stride, general)
    nrv_loop = 0
    if raw and ncv == bn:
        move_rows(is_store, reg, buf, off + c0, rb, nrv, bn)
    elif ncv == bn and stride == 1 and not general:   # whole rows converted, one call a tile
        convert_rows(is_store, reg, buf, cv, off + c0, rb, nrv, bn)
    elif stride > 1 and not general and _transposed_rows(rb, nrv) and \
            move_transposed(is_store, reg, buf, off + c0 * stride, rb, stride, nrv, ncv, bn):
        pass   # (moved in 8x8 blocks)
    else:
        nrv_loop = nrv
    for i in range(nrv_loop):
        base = off + rb[i]
        if raw:
            move_run(is_store, reg, buf, i * bn, base + c0, ncv)
        else:
            if general:
                for k in range(ncv):
                    ix[ncv + k] = base + ix[k]
                start = zero
                ixs = ix[ncv:]
            else:
                start = base + c0 * stride
                ixs = ix[:ncv]
            if is_store:
                store_row(buf, reg[i * bn:(i + 1) * bn], cv, start, stride, ncv, ixs, general)
            else:
                load_row(reg[i * bn:(i + 1) * bn], buf, cv, start, stride, ncv, ixs, general)
    if not is_store and ncv < bn:   # clamped columns copy the last valid column
        for i in range(nrv):
            v = reg[i * bn + ncv - 1]
            tail = reg[i * bn + ncv:(i + 1) * bn]   # (indexed from 0: the loop vectorizes)
            for k in range(bn - ncv):
                tail[k] = v
    if not is_store and not one_row:   # clamped rows copy the last valid row
        repeat_row(reg, nrv - 1, bm, bn)


@njit(**OPTS)
def _rows_into(o, buf, cv, at, rb, nrv, bm):
    """o[i] = buf[at + rb[i]] (converted) for the valid rows; later lanes repeat the last one."""
    if cv == DT_F16:
        for i in range(nrv):
            o[i] = h2f(buf[at + rb[i]])
    elif cv == DT_BF16:
        for i in range(nrv):
            o[i] = bf2f(buf[at + rb[i]])
    else:
        for i in range(nrv):
            o[i] = buf[at + rb[i]]
    v = o[nrv - 1]
    tail = o[nrv:bm]
    for i in range(bm - nrv):
        tail[i] = v


@njit(**OPTS)
def _load_compact(d, j, optab, dims, meta, addrs, numels, F, D, I, B, r0, ix):
    """Row r's element of a column-uniform operand j into lane r of register d (a compact
    register: row-level arithmetic then stays on BM lanes, see jit/rowlevel). An f32 register
    must be in its bank row (fp[d] == 0: _exec points a written register back)."""
    nr, bm, bn = meta[M_NR], meta[M_BM], meta[M_BN]
    nrv = max(min(bm, meta[M_ROWS] - r0), 1)
    rb = ix[2 * bn:2 * bn + nrv]
    if nr > 0:
        row_bases(rb, j, optab, dims, r0, nrv, nr)
    else:
        rb[:] = 0
    a, n, at, dt = addrs[optab[j, 1]], numels[optab[j, 1]], optab[j, 3], optab[j, 2]
    if dt == DT_F32:
        _rows_into(F[d], carray(ptr_f32(a), n), dt, at, rb, nrv, bm)
    elif dt == DT_F16 or dt == DT_BF16:
        _rows_into(F[d], carray(ptr_u16(a), n), dt, at, rb, nrv, bm)
    elif dt == DT_F64:
        _rows_into(D[d], carray(ptr_f64(a), n), dt, at, rb, nrv, bm)
    elif dt == DT_I64:
        _rows_into(I[d], carray(ptr_i64(a), n), dt, at, rb, nrv, bm)
    elif dt == DT_I32:
        _rows_into(I[d], carray(ptr_i32(a), n), dt, at, rb, nrv, bm)
    elif dt == DT_BOOL:
        _rows_into(B[d], carray(ptr_u8(a), n), dt, at, rb, nrv, bm)
    else:
        return False
    return True


@njit(**OPTS)
def _index(o, j, optab, dims, meta, r0, c0, fin, rb):
    """o = the element index of operand j at each lane of the tile: its offset, plus the (clamped)
    row's offset over the row dims, plus the (clamped) column's over the column dims. The columns'
    offsets are found once a tile, in row 0's lanes, the rows' into rb (BM lanes of scratch), both
    by addr.dim_offsets; every other row adds its row's difference."""
    nr, nc, bm, bn = meta[M_NR], meta[M_NC], meta[M_BM], meta[M_BN]
    rows, cols = meta[M_ROWS], meta[M_COLS]
    nrv = max(min(bm, rows - r0), 1)   # rows and columns past the last valid one repeat its offset
    ncv = 1 if fin else max(min(bn, cols - c0), 1)   # (a finalize: column 0)
    dim_offsets(rb, j, optab, dims, min(r0, rows - 1), nrv, nr - nr, nr)
    dim_offsets(o, j, optab, dims, 0 if fin else min(c0, cols - 1), ncv, nr, nr + nc)
    b0 = optab[j, 3] + rb[0]
    for k in range(ncv):
        o[k] += b0
    for k in range(ncv, bn):
        o[k] = o[ncv - 1]
    for i in range(1, bm):
        d = rb[min(i, nrv - 1)] - rb[0]
        for k in range(bn):
            o[i * bn + k] = o[k] + d




def memop_of(tile_fn):
    """memop(is_store, d, j, ...) for one register layout (tile_fn: mem_tile or mem_t.mem_tile_t):
    load operand j into register d of its dtype's bank, or store d into it. The core has already
    tried the in-place load of a contiguous f32 tile (addr.direct_addr)."""
    @njit(inline='always', **OPTS)   # one call site a piece: no call passing the views' fields
    def memop(is_store, d, j, optab, dims, meta, addrs, numels, F, D, I, B, fp, r0, c0, fin, ix, one_row):
        arg, dt = optab[j, 1], optab[j, 2]
        a, n = addrs[arg], numels[arg]
        if dt == DT_F32:
            tile_fn(is_store, freg(F, fp, d), carray(ptr_f32(a), n), dt, j, optab, dims, meta, r0, c0, fin, ix,
                    one_row)
        elif dt == DT_F16 or dt == DT_BF16:
            tile_fn(is_store, freg(F, fp, d), carray(ptr_u16(a), n), dt, j, optab, dims, meta, r0, c0, fin, ix,
                    one_row)
        elif dt == DT_F64:
            tile_fn(is_store, D[d], carray(ptr_f64(a), n), dt, j, optab, dims, meta, r0, c0, fin, ix, one_row)
        elif dt == DT_I64:
            tile_fn(is_store, I[d], carray(ptr_i64(a), n), dt, j, optab, dims, meta, r0, c0, fin, ix, one_row)
        elif dt == DT_I32:
            tile_fn(is_store, I[d], carray(ptr_i32(a), n), dt, j, optab, dims, meta, r0, c0, fin, ix, one_row)
        elif dt == DT_BOOL:
            tile_fn(is_store, B[d], carray(ptr_u8(a), n), dt, j, optab, dims, meta, r0, c0, fin, ix, one_row)
        else:
            return ERR_UNHANDLED
        return 0
    return memop


_memop = memop_of(mem_tile)
MEM_ONE_ROW_FLAG = 2   # PC_MEM's b: bit 1 a load of row 0 only (a row vector)


def mem_piece(fra, pc, what, flags):
    """PC_MEM, row-major tiles: instruction pc's load (MEM_LOAD), store (MEM_STORE, MEM_STOREROW:
    column 0 of the valid rows, addressed like a finalize store), load of a column-uniform operand
    into a compact register (MEM_COMPACT; either layout) or index tile (MEM_INDEX). Returns an
    abi.ERR_* code."""
    fr = fm.frame(fra)
    ins = fm.instrs(fr)
    d, j = ins[pc, 1], ins[pc, 2]
    optab, dims, meta = fm.optab(fr), fm.dims(fr), fm.meta(fr)
    r0, c0, fin = fr[FR_R0], fr[FR_C0], fr[FR_FIN] != 0
    if what == MEM_INDEX:
        _index(fm.bank_i(fr)[d], j, optab, dims, meta, r0, c0, fin, fm.ix(fr)[:meta[M_BM]])
        return 0
    if what == MEM_COMPACT:
        ok = _load_compact(d, j, optab, dims, meta, fm.addrs(fr), fm.numels(fr), fm.bank_f(fr), fm.bank_d(fr),
                           fm.bank_i(fr), fm.bank_b(fr), r0, fm.ix(fr))
        return 0 if ok else ERR_UNHANDLED
    return _memop(what != MEM_LOAD, d, j, optab, dims, meta, fm.addrs(fr), fm.numels(fr), fm.bank_f(fr),
                  fm.bank_d(fr), fm.bank_i(fr), fm.bank_b(fr), fm.fptr(fr), r0, c0, fin or what == MEM_STOREROW,
                  fm.ix(fr), (flags & MEM_ONE_ROW_FLAG) != 0)
