"""Memory access of the CPU VM: addressing, tile loads and stores with dtype conversion, index
tiles, and the in-place (aliasing) checks. Compiled by numba (inlined into cpu_entry.run_units).

Two register layouts (cpu.py picks one per kernel; results are identical):
  row-major     lane (r, k) at r*BN + k  (_mem, _index)
  column-major  lane (r, k) at k*BM + r  (_mem_t, _index_t): a column of a tile is BM rows
                apart in memory, contiguous when the kept axis is the operand's innermost one.
Edge tiles use clamped indices: lanes outside the domain copy the last valid row / column.
"""
from __future__ import annotations

import numpy as np
from numba import carray, njit

from .cpu_kernels import DT_BF16, DT_BOOL, DT_F16, DT_F32, DT_F64, DT_I32, DT_I64
from .cpu_bits import OPTS, bf2f, f2bf, f2h, h2f, ptr_f32, ptr_f64, ptr_i32, ptr_i64, ptr_u8, ptr_u16
from .cpu_moves import _move_rows, _move_run, _raw_copy, _repeat_row

# meta layout (built by cpu.py)
M_NR, M_NC, M_BM, M_BN, M_ROWS, M_COLS, M_NF, M_ND, M_NI, M_NB, M_NSW, M_PRO_S, M_PRO_E, M_TL, M_SW = range(15)


@njit(**OPTS)
def _addr(j, idx, optab, dims, d0, d1):
    """Address contribution of flat index `idx` over dims[d0:d1] (row-major) for operand j."""
    off = np.int64(0)
    rem = idx
    for d in range(d1 - 1, d0 - 1, -1):
        size = max(dims[d], 1)
        off += (rem % size) * optab[j, 4 + d]
        rem //= size
    return off


@njit(inline='always', **OPTS)
def _row_bases(o, j, optab, dims, r0, n, nr):
    """o[i] = address contribution of rows r0 + i (i < n) over the nr row dims: an odometer on
    the innermost one, with one _addr (divisions) per wrap instead of one per row."""
    zero = r0 * 0
    dl = max(dims[nr - 1], 1)
    sl = optab[j, 4 + nr - 1]
    t = r0 % dl
    b = _addr(j, r0, optab, dims, zero, nr)
    for i in range(n):
        if i > 0:
            t += 1
            if t == dl:
                t = zero
                b = _addr(j, r0 + i, optab, dims, zero, nr)
            else:
                b += sl
        o[i] = b


@njit(**OPTS)
def _direct_addr(j, optab, dims, meta, addrs, r0, c0):
    """Address of operand j's tile when it is one contiguous f32 run of BM*BN elements in the
    register layout (a full tile; row-major: unit column stride, rows back to back; column-major:
    unit row stride, columns back to back), else 0. Such a tile is read in place by a load
    (the register aliases the buffer) or written in place by the op feeding a store."""
    nr, nc, bm, bn = meta[M_NR], meta[M_NC], meta[M_BM], meta[M_BN]
    if meta[M_TL] != 0:   # column-major: contiguous rows, columns exactly BM apart
        if optab[j, 2] != DT_F32 or nc != 1 or nr != 1 or optab[j, 4] != 1:
            return 0
        if r0 + bm > meta[M_ROWS] or c0 + bn > meta[M_COLS] or (bn > 1 and optab[j, 5] != bm):
            return 0
        return addrs[optab[j, 1]] + 4 * (optab[j, 3] + r0 + c0 * optab[j, 5])
    if optab[j, 2] != DT_F32 or nc != 1 or optab[j, 4 + nr] != 1:
        return 0
    if r0 + bm > meta[M_ROWS] or c0 + bn > meta[M_COLS]:
        return 0
    if bm > 1:   # the tile's rows must lie back to back: row strides of a row-major block
        step = bn
        for d in range(nr - 1, -1, -1):
            if dims[d] != 1 and optab[j, 4 + d] != step:
                return 0
            step *= dims[d]
    base = optab[j, 3] + _addr(j, r0, optab, dims, nr - nr, nr) + c0
    return addrs[optab[j, 1]] + 4 * base


@njit(inline='always', **OPTS)
def _row_addrs(o, j, optab, dims, meta, addrs, r0, c0, nrows):
    """o[r] = the address of lane c0 of row r0 + r of operand j (r < nrows), when j is an f32
    operand of row-major tiles with one unit-stride column dim, whatever its row strides; False
    otherwise. For writing rows straight into a buffer where _direct_addr cannot (a partial tile,
    or rows not back to back)."""
    nr = meta[M_NR]
    if meta[M_TL] != 0 or optab[j, 2] != DT_F32 or meta[M_NC] != 1 or optab[j, 4 + nr] != 1:
        return False
    _row_bases(o, j, optab, dims, r0, nrows, nr)
    base = addrs[optab[j, 1]] + 4 * (optab[j, 3] + c0)
    for r in range(nrows):
        o[r] = base + 4 * o[r]
    return True


@njit(inline='always', **OPTS)
def _fv(F, fp, k):
    """F register k: its bank row, or the buffer slice it aliases (fp[k] = address, 0 = none)."""
    p = fp[k]
    if p == 0:
        return F[k]
    return carray(ptr_f32(p), F.shape[1])


@njit(**OPTS)
def _alias_ok(addrs, numels, argsz, argst):
    """In-place tiles only when no stored argument overlaps any other argument."""
    n = addrs.shape[0]
    for a in range(n):
        if argst[a] == 2:
            return False
        if argst[a] == 0:
            continue
        lo, hi = addrs[a], addrs[a] + numels[a] * argsz[a]
        for b in range(n):
            if b != a and hi > lo and numels[b] > 0:
                if addrs[b] < hi and lo < addrs[b] + numels[b] * argsz[b]:
                    return False
    return True


@njit(inline='always', **OPTS)
def _load_row(o, buf, cv, start, stride, n, ix, general):
    """o[:n] = buf[start + k*stride] (or buf[ix[k]] when general), converted."""
    plain = cv != DT_F16 and cv != DT_BF16
    if not general and stride == 1:
        src = buf[start:start + n]
        if plain:
            for k in range(n):
                o[k] = src[k]
        elif cv == DT_F16:
            for k in range(n):
                o[k] = h2f(src[k])
        else:
            for k in range(n):
                o[k] = bf2f(src[k])
        return
    if not general and stride == 0:
        if plain:
            o[:n] = buf[start]
        elif cv == DT_F16:
            o[:n] = h2f(buf[start])
        else:
            o[:n] = bf2f(buf[start])
        return
    if not general and plain:   # strided: index directly (vectorizes as a gather)
        for k in range(n):
            o[k] = buf[start + k * stride]
        return
    if not general:
        for k in range(n):
            ix[k] = start + k * stride
    if plain:
        for k in range(n):
            o[k] = buf[ix[k]]
    elif cv == DT_F16:
        for k in range(n):
            o[k] = h2f(buf[ix[k]])
    else:
        for k in range(n):
            o[k] = bf2f(buf[ix[k]])


@njit(inline='always', **OPTS)
def _store_row(buf, x, cv, start, stride, n, ix, general):
    if not general and stride == 1:
        dst = buf[start:start + n]
        if (cv != DT_F16 and cv != DT_BF16):
            for k in range(n):
                dst[k] = x[k]
        elif cv == DT_F16:
            for k in range(n):
                dst[k] = f2h(x[k])
        else:
            for k in range(n):
                dst[k] = f2bf(x[k])
        return
    if not general and cv != DT_F16 and cv != DT_BF16:
        for k in range(n):
            buf[start + k * stride] = x[k]
        return
    if not general:
        for k in range(n):
            ix[k] = start + k * stride
    if (cv != DT_F16 and cv != DT_BF16):
        for k in range(n):
            buf[ix[k]] = x[k]
    elif cv == DT_F16:
        for k in range(n):
            buf[ix[k]] = f2h(x[k])
    else:
        for k in range(n):
            buf[ix[k]] = f2bf(x[k])


@njit(**OPTS)
def _mem(is_store, reg, buf, cv, j, optab, dims, meta, r0, c0, fin, ix, one_row):
    """Load a tile into `reg` (clamped indices) or store `reg`'s valid lanes, for operand j.
    one_row: load row 0 only (an operand whose rows are all the same in this tile: see
    cpu_rowlevel._tile_row_uniform)."""
    nr, nc, bm, bn = meta[M_NR], meta[M_NC], meta[M_BM], meta[M_BN]
    rows, cols = meta[M_ROWS], meta[M_COLS]
    nrv = 1 if one_row else min(bm, rows - r0)
    ncv = 1 if fin else min(bn, cols - c0)
    off = optab[j, 3]
    zero = off * 0
    # column addressing for this tile: a single column dim is start + k*stride, else general
    general = (not fin) and nc > 1
    stride = 0 if (fin or nc == 0) else optab[j, 4 + nr]
    if general:
        for k in range(ncv):
            ix[k] = _addr(j, c0 + k, optab, dims, nr, nr + nc)
    rb = ix[2 * bn:2 * bn + nrv]   # row bases (ix[:2*bn] holds the general column indices)
    if nr > 0:
        _row_bases(rb, j, optab, dims, r0, nrv, nr)
    else:
        rb[:] = zero
    raw = _raw_copy(reg, buf, cv, stride, general)
    if raw and ncv == bn:
        _move_rows(is_store, reg, buf, off + c0, rb, nrv, bn)
        nrv_loop = 0
    else:
        nrv_loop = nrv
    for i in range(nrv_loop):
        base = off + rb[i]
        if raw:
            _move_run(is_store, reg, buf, i * bn, base + c0, ncv)
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
                _store_row(buf, reg[i * bn:(i + 1) * bn], cv, start, stride, ncv, ixs, general)
            else:
                _load_row(reg[i * bn:(i + 1) * bn], buf, cv, start, stride, ncv, ixs, general)
        if not is_store and ncv < bn:   # clamped columns copy the last valid column
            v = reg[i * bn + ncv - 1]
            tail = reg[i * bn + ncv:(i + 1) * bn]   # (indexed from 0: the loop vectorizes)
            for k in range(bn - ncv):
                tail[k] = v
    if not is_store and not one_row:   # clamped rows copy the last valid row
        _repeat_row(reg, nrv - 1, bm, bn)


@njit(inline='always', **OPTS)
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
    register: row-level arithmetic then stays on BM lanes, see cpu_rowlevel). An f32 register
    must be in its bank row (fp[d] == 0: _exec points a written register back)."""
    nr, bm, bn = meta[M_NR], meta[M_BM], meta[M_BN]
    nrv = max(min(bm, meta[M_ROWS] - r0), 1)
    rb = ix[2 * bn:2 * bn + nrv]
    if nr > 0:
        _row_bases(rb, j, optab, dims, r0, nrv, nr)
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
def _index(o, j, optab, dims, meta, r0, c0, fin):
    nr, nc, bm, bn = meta[M_NR], meta[M_NC], meta[M_BM], meta[M_BN]
    rows, cols = meta[M_ROWS], meta[M_COLS]
    for i in range(bm):
        r = min(r0 + i, rows - 1)
        base = optab[j, 3] + _addr(j, r, optab, dims, nr - nr, nr)
        for k in range(bn):
            c = 0 if fin else min(c0 + k, cols - 1)
            o[i * bn + k] = base + _addr(j, c, optab, dims, nr, nr + nc)




@njit(**OPTS)
def _mem_t(is_store, reg, buf, cv, j, optab, dims, meta, r0, c0, fin, ix):
    """_mem for column-major tiles: column k of the tile is reg[k*bm:(k+1)*bm]. ix: 2*(bm+bn) lanes.
    Rows are addressed as start + i*stride when there is one row dim, else through ix[:nrv]."""
    nr, nc, bm, bn = meta[M_NR], meta[M_NC], meta[M_BM], meta[M_BN]
    rows, cols = meta[M_ROWS], meta[M_COLS]
    nrv = min(bm, rows - r0)
    ncv = 1 if fin else min(bn, cols - c0)
    off = optab[j, 3]
    zero = off * 0
    general = nr > 1
    stride = optab[j, 4 + nr - 1] if nr == 1 else zero
    # several row dims, the innermost of unit stride: a column is runs of that dim's length, each
    # run addressed once (run q: lanes ix[q] .. ix[q + 1], its base at ix[bm + 1 + q])
    runs = general and _raw_copy(reg, buf, cv, optab[j, 4 + nr - 1], False)
    dl = max(dims[nr - 1], 1)
    nrun = zero
    if runs:
        i = zero
        while i < nrv:
            ix[bm + 1 + nrun] = _addr(j, r0 + i, optab, dims, zero, nr)
            ix[nrun] = i
            nrun += 1
            i += min(dl - (r0 + i) % dl, nrv - i)
        ix[nrun] = nrv
    elif general:
        _row_bases(ix, j, optab, dims, r0, nrv, nr)
    rbase = zero if general else r0 * stride
    ixs = ix[bm:bm + nrv]
    raw = _raw_copy(reg, buf, cv, stride, general)
    for k in range(ncv):
        col = reg[k * bm:(k + 1) * bm]
        cbase = off + (zero if fin else _addr(j, c0 + k, optab, dims, nr, nr + nc))
        if runs:
            for q in range(nrun):
                _move_run(is_store, reg, buf, k * bm + ix[q], cbase + ix[bm + 1 + q], ix[q + 1] - ix[q])
        else:
            if general:
                for i in range(nrv):
                    ixs[i] = cbase + ix[i]
            if raw:
                _move_run(is_store, reg, buf, k * bm, cbase + rbase, nrv)
            elif is_store:
                _store_row(buf, col, cv, cbase + rbase, stride, nrv, ixs, general)
            else:
                _load_row(col, buf, cv, cbase + rbase, stride, nrv, ixs, general)
        if not is_store and nrv < bm:   # clamped rows copy the last valid row
            v = col[nrv - 1]
            tail = col[nrv:]
            for i in range(bm - nrv):
                tail[i] = v
    if not is_store:   # clamped columns (and a fin load's broadcast) copy the last valid column
        last = reg[(ncv - 1) * bm:ncv * bm]
        for k in range(ncv, bn):
            dst = reg[k * bm:(k + 1) * bm]
            for i in range(bm):
                dst[i] = last[i]


@njit(**OPTS)
def _index_t(o, j, optab, dims, meta, r0, c0, fin):
    nr, nc, bm, bn = meta[M_NR], meta[M_NC], meta[M_BM], meta[M_BN]
    rows, cols = meta[M_ROWS], meta[M_COLS]
    for k in range(bn):
        c = 0 if fin else min(c0 + k, cols - 1)
        cb = optab[j, 3] + _addr(j, c, optab, dims, nr, nr + nc)
        for i in range(bm):
            r = min(r0 + i, rows - 1)
            o[k * bm + i] = cb + _addr(j, r, optab, dims, nr - nr, nr)
