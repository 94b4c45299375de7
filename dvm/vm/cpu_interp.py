"""The CPU VM interpreter: memory access per tile and the per-instruction dispatch of a tile
(`_exec`), inlined into the compiled entry point (cpu_entry.run_units, cached on disk), which
loops over the tiles and work units.

Kernel descriptor (built by cpu.py, passed packed into one array: see cpu_entry):
  instrs  int64 [n_instr, 6]     the program's instructions (opcode + 5 fields)
  dec     int64 [n_opcodes, 5]   per opcode: group, op id, bank, source bank, ew kind
  meta    int64 [...]            see cpu.py (_M_* offsets)
  optab   int64 [n_opnd, 4+nd]   kind, arg, dtype, offset, strides
  consts  int64 [n_const]        constant bits
  addrs, numels  int64 [n_args]  buffer addresses and sizes
  peep    int64 [n_instr]        operand of the store right after an f32 op that may write in place
  argsz, argst   int64 [n_args]  element size; 1 stored by the kernel, 2 stored and loaded
  fuse    int64 [n_instr, 8]     runs of instructions executed in one pass (cpu_fuse_plan, cpu_fused)

In-place tiles: f32 registers are addressed through fp[reg] (0: the bank row). A load of a full,
contiguous f32 tile only points its register at the buffer (no copy); an elementwise op whose
result is only stored writes straight into the output tile and the store is skipped. Both only
when no stored argument overlaps another argument (checked per call), so results are unchanged.

Register layout: row-major, or column-major for the kernels cpu._transposed picks (meta[M_TL]);
see cpu_mem / cpu_reduce. Row-level values (reduction results, loads of 0-d operands, arithmetic
on them) are kept compact, one lane per row, and broadcast lazily (cpu_rowlevel; per-register state
in `st`).
"""
from __future__ import annotations

import numpy as np
from numba import carray, njit

from .cpu_kernels import (BK_B8, BK_F32, BK_F64, BK_I64, DT_BF16, DT_BOOL, DT_F16, DT_F32, DT_F64,
                          DT_I32, DT_I64, ERR_UNHANDLED, G_ACC, G_ACCINIT, G_CAST, G_CONST,
                          G_EW, G_INDEX, G_LOAD, G_RFIN, G_ROWRED, G_STORE, G_STOREROW, K_BIN, K_CLAMP,
                          K_CMP, K_PRED, K_UN, K_WHERE, R_ARGMAX, R_ARGMIN, _bin_b8,
                          _bin_float, _bin_i64, _cast_to_b8, _cast_to_f32, _cast_to_f64, _cast_to_int,
                          _clamp, _cmp, _pred, _un_b8, _un_f32, _un_f64, _un_i64, _where)
from .cpu_bits import OPTS, ptr_f32, ptr_f64, ptr_i32, ptr_i64, ptr_u8, ptr_u16
from .cpu_mem import (M_BM, M_BN, M_COLS, M_ROWS, M_TL, _direct_addr, _fv, _index, _index_t, _load_compact, _mem,
                      _mem_t, _row_addrs)
from .cpu_reduce import (_acc, _acc_arg, _acc_t, _accinit, _rfin_arg, _rfin_t, _rowred, _rowred_arg,
                         _rowred_t)
from .cpu_fused import _run_fused
from .cpu_rowlevel import (_bin_rowb, _bin_rowb_to_rows, _bin_rowv, _bins, _cmp_outer, _col_uniform, _expand_sources,
                           _row_mode, _tile_row_uniform)


@njit(inline='always', **OPTS)
def _mem_any(is_store, reg, buf, dt, j, optab, dims, meta, r0, c0, fin, ix, compact, one_row):
    """compact: a finalize store of a compact register (row r at lane r: column 0 of a
    column-major tile, whatever the kernel's layout). one_row: a row-vector load (row 0 only)."""
    if meta[M_TL] != 0 or compact:
        _mem_t(is_store, reg, buf, dt, j, optab, dims, meta, r0, c0, fin, ix)
    else:
        _mem(is_store, reg, buf, dt, j, optab, dims, meta, r0, c0, fin, ix, one_row)


@njit(inline='always', **OPTS)
def _memop(is_store, d, j, optab, dims, meta, addrs, numels, F, D, I, B, fp, aok, r0, c0, fin, ix, compact,
           one_row):
    """one_row: a load of row 0 only (the caller marks the register a row vector)."""
    arg, dt = optab[j, 1], optab[j, 2]
    a, n = addrs[arg], numels[arg]
    if dt == DT_F32:
        if aok and not is_store and not fin:
            p = _direct_addr(j, optab, dims, meta, addrs, r0, c0)
            if p != 0:
                fp[d] = p
                return 0
        _mem_any(is_store, _fv(F, fp, d), carray(ptr_f32(a), n), dt, j, optab, dims, meta, r0, c0, fin, ix,
                 compact, one_row)
    elif dt == DT_F16:
        _mem_any(is_store, _fv(F, fp, d), carray(ptr_u16(a), n), dt, j, optab, dims, meta, r0, c0, fin, ix,
                 compact, one_row)
    elif dt == DT_BF16:
        _mem_any(is_store, _fv(F, fp, d), carray(ptr_u16(a), n), dt, j, optab, dims, meta, r0, c0, fin, ix,
                 compact, one_row)
    elif dt == DT_F64:
        _mem_any(is_store, D[d], carray(ptr_f64(a), n), dt, j, optab, dims, meta, r0, c0, fin, ix, compact,
                 one_row)
    elif dt == DT_I64:
        _mem_any(is_store, I[d], carray(ptr_i64(a), n), dt, j, optab, dims, meta, r0, c0, fin, ix, compact,
                 one_row)
    elif dt == DT_I32:
        _mem_any(is_store, I[d], carray(ptr_i32(a), n), dt, j, optab, dims, meta, r0, c0, fin, ix, compact,
                 one_row)
    elif dt == DT_BOOL:
        _mem_any(is_store, B[d], carray(ptr_u8(a), n), dt, j, optab, dims, meta, r0, c0, fin, ix, compact,
                 one_row)
    else:
        return ERR_UNHANDLED
    return 0


@njit(inline='always', **OPTS)
def _ew(kind, op, bank, f1, f2, f3, f4, F, D, I, B, fp, n):
    """On the first n lanes of each register (all of them, or BM for compact registers)."""
    if kind == K_UN:
        if bank == BK_F32:
            return 0 if _un_f32(op, _fv(F, fp, f1)[:n], _fv(F, fp, f2)[:n]) else ERR_UNHANDLED
        if bank == BK_F64:
            return 0 if _un_f64(op, D[f1][:n], D[f2][:n]) else ERR_UNHANDLED
        if bank == BK_I64:
            return 0 if _un_i64(op, I[f1][:n], I[f2][:n]) else ERR_UNHANDLED
        return 0 if _un_b8(op, B[f1][:n], B[f2][:n]) else ERR_UNHANDLED
    if kind == K_PRED:
        if bank == BK_F32:
            return 0 if _pred(op, B[f1][:n], _fv(F, fp, f2)[:n]) else ERR_UNHANDLED
        if bank == BK_F64:
            return 0 if _pred(op, B[f1][:n], D[f2][:n]) else ERR_UNHANDLED
        return ERR_UNHANDLED
    if kind == K_BIN:
        if bank == BK_F32:
            return 0 if _bin_float(op, _fv(F, fp, f1)[:n], _fv(F, fp, f2)[:n], _fv(F, fp, f3)[:n]) else ERR_UNHANDLED
        if bank == BK_F64:
            return 0 if _bin_float(op, D[f1][:n], D[f2][:n], D[f3][:n]) else ERR_UNHANDLED
        if bank == BK_I64:
            return _bin_i64(op, I[f1][:n], I[f2][:n], I[f3][:n])
        return 0 if _bin_b8(op, B[f1][:n], B[f2][:n], B[f3][:n]) else ERR_UNHANDLED
    if kind == K_CMP:
        if bank == BK_F32:
            return 0 if _cmp(op, B[f1][:n], _fv(F, fp, f2)[:n], _fv(F, fp, f3)[:n]) else ERR_UNHANDLED
        if bank == BK_F64:
            return 0 if _cmp(op, B[f1][:n], D[f2][:n], D[f3][:n]) else ERR_UNHANDLED
        if bank == BK_I64:
            return 0 if _cmp(op, B[f1][:n], I[f2][:n], I[f3][:n]) else ERR_UNHANDLED
        return ERR_UNHANDLED
    if kind == K_WHERE:
        if bank == BK_F32:
            _where(_fv(F, fp, f1)[:n], B[f2][:n], _fv(F, fp, f3)[:n], _fv(F, fp, f4)[:n])
        elif bank == BK_F64:
            _where(D[f1][:n], B[f2][:n], D[f3][:n], D[f4][:n])
        elif bank == BK_I64:
            _where(I[f1][:n], B[f2][:n], I[f3][:n], I[f4][:n])
        else:
            _where(B[f1][:n], B[f2][:n], B[f3][:n], B[f4][:n])
        return 0
    if kind == K_CLAMP:
        if bank == BK_F32:
            _clamp(_fv(F, fp, f1)[:n], _fv(F, fp, f2)[:n], _fv(F, fp, f3)[:n], _fv(F, fp, f4)[:n])
        elif bank == BK_F64:
            _clamp(D[f1][:n], D[f2][:n], D[f3][:n], D[f4][:n])
        elif bank == BK_I64:
            _clamp(I[f1][:n], I[f2][:n], I[f3][:n], I[f4][:n])
        else:
            return ERR_UNHANDLED
        return 0
    return ERR_UNHANDLED


@njit(inline='always', **OPTS)
def _cast_dispatch(src, dst, t, d, s, F, D, I, B, fp, n):
    if dst == BK_F32:
        o = _fv(F, fp, d)[:n]
        if src == BK_F32:
            _cast_to_f32(o, _fv(F, fp, s)[:n], t, src)
        elif src == BK_F64:
            _cast_to_f32(o, D[s][:n], t, src)
        elif src == BK_I64:
            _cast_to_f32(o, I[s][:n], t, src)
        else:
            _cast_to_f32(o, B[s][:n], t, src)
    elif dst == BK_I64:
        o = I[d][:n]
        if src == BK_F32:
            _cast_to_int(o, _fv(F, fp, s)[:n], t, src == BK_F32)
        elif src == BK_F64:
            _cast_to_int(o, D[s][:n], t, src == BK_F64)
        elif src == BK_I64:
            _cast_to_int(o, I[s][:n], t, src != BK_I64)
        else:
            _cast_to_int(o, B[s][:n], t, src != BK_B8)
    elif dst == BK_F64:
        o = D[d][:n]
        if src == BK_F32:
            _cast_to_f64(o, _fv(F, fp, s)[:n])
        elif src == BK_F64:
            _cast_to_f64(o, D[s][:n])
        elif src == BK_I64:
            _cast_to_f64(o, I[s][:n])
        else:
            _cast_to_f64(o, B[s][:n])
    else:
        o = B[d][:n]
        if src == BK_F32:
            _cast_to_b8(o, _fv(F, fp, s)[:n])
        elif src == BK_F64:
            _cast_to_b8(o, D[s][:n])
        elif src == BK_I64:
            _cast_to_b8(o, I[s][:n])
        else:
            _cast_to_b8(o, B[s][:n])


@njit(inline='always', **OPTS)
def _red(g, op, bank, f1, f2, f3, F, D, I, B, fp, bm, bn, ncv, c0, sf, sd, si, si2, tl):
    """tl: column-major tiles (never for arg reductions, see cpu._transposed)."""
    is_arg = op == R_ARGMAX or op == R_ARGMIN
    if g == G_ACCINIT:
        if bank == BK_F32:
            _accinit(op, _fv(F, fp, f1), bank == BK_F32)
        elif bank == BK_F64:
            _accinit(op, D[f1], bank == BK_F64)
        else:
            _accinit(op, I[f1], bank != BK_I64)
        if is_arg:
            I[f2][:] = 0
    elif g == G_ACC:
        if is_arg:
            if bank == BK_F32:
                _acc_arg(op, _fv(F, fp, f1), I[f2], _fv(F, fp, f3), bm, bn, ncv, c0)
            elif bank == BK_F64:
                _acc_arg(op, D[f1], I[f2], D[f3], bm, bn, ncv, c0)
            else:
                _acc_arg(op, I[f1], I[f2], I[f3], bm, bn, ncv, c0)
        elif tl:
            if bank == BK_F32:
                _acc_t(op, _fv(F, fp, f1), _fv(F, fp, f2), bm, ncv)
            elif bank == BK_F64:
                _acc_t(op, D[f1], D[f2], bm, ncv)
            else:
                _acc_t(op, I[f1], I[f2], bm, ncv)
        elif bank == BK_F32:
            _acc(op, _fv(F, fp, f1), _fv(F, fp, f2), bm, bn, ncv)
        elif bank == BK_F64:
            _acc(op, D[f1], D[f2], bm, bn, ncv)
        else:
            _acc(op, I[f1], I[f2], bm, bn, ncv)
    elif is_arg and g == G_ROWRED:
        if bank == BK_F32:
            _rowred_arg(op, I[f1], _fv(F, fp, f2), bm, bn, ncv, c0, sf, si2, bank == BK_F32)
        elif bank == BK_F64:
            _rowred_arg(op, I[f1], D[f2], bm, bn, ncv, c0, sd, si2, bank == BK_F64)
        else:
            _rowred_arg(op, I[f1], I[f2], bm, bn, ncv, c0, si, si2, bank != BK_I64)
    elif is_arg:   # G_RFIN
        if bank == BK_F32:
            _rfin_arg(op, I[f1], _fv(F, fp, f2), I[f3], bm, bn, sf, si2)
        elif bank == BK_F64:
            _rfin_arg(op, I[f1], D[f2], I[f3], bm, bn, sd, si2)
        else:
            _rfin_arg(op, I[f1], I[f2], I[f3], bm, bn, si, si2)
    elif tl and g == G_ROWRED:
        if bank == BK_F32:
            _rowred_t(op, _fv(F, fp, f1), _fv(F, fp, f2), bm, bn, ncv, bank == BK_F32)
        elif bank == BK_F64:
            _rowred_t(op, D[f1], D[f2], bm, bn, ncv, bank == BK_F64)
        else:
            _rowred_t(op, I[f1], I[f2], bm, bn, ncv, bank != BK_I64)
    elif tl:   # G_RFIN
        if bank == BK_F32:
            _rfin_t(op, _fv(F, fp, f1), _fv(F, fp, f2), bm, bn)
        elif bank == BK_F64:
            _rfin_t(op, D[f1], D[f2], bm, bn)
        else:
            _rfin_t(op, I[f1], I[f2], bm, bn)
    else:   # the row trees: a tile's ncv valid lanes (G_ROWRED), an accumulator's whole rows (G_RFIN)
        n = ncv if g == G_ROWRED else bn
        if bank == BK_F32:
            _rowred(op, _fv(F, fp, f1), _fv(F, fp, f2), bm, bn, n, sf, bank == BK_F32)
        elif bank == BK_F64:
            _rowred(op, D[f1], D[f2], bm, bn, n, sd, bank == BK_F64)
        else:
            _rowred(op, I[f1], I[f2], bm, bn, n, si, bank != BK_I64)


@njit(inline='always', **OPTS)
def _exec(s, e, instrs, dec, peep, meta, dims, optab, consts, addrs, numels, F, D, I, B, fp, aok,
          r0, c0, fin, ix, sf, sd, si, si2, rio, st, fz):
    """rio[pc]: per field, 1 + the bank of a register it reads (fields 0-4) / writes (5-9), else 0.
    st[bank, reg]: 0 a full tile, 1 compact (row r's value in lane r), 2 uniform (a constant) in
    lanes [0, BM) only, 3 a row vector (row 0 holds the row every row repeats; row-major tiles),
    4 uniform in every lane (a state-2 register a full-tile reader needed). st[ST_CACHE]: the tags
    of cpu_fused's cached row vectors (0: none; reset with the states at every launch)."""
    bm, bn = meta[M_BM], meta[M_BN]
    tl = meta[M_TL] != 0
    ncv = 1 if fin else min(bn, meta[M_COLS] - c0)
    skip = s - 1
    for pc in range(s, e):
        if pc <= skip:   # done by a fused run, or a store written in place by the previous instruction
            continue
        if fz[pc, 0] != 0:
            done = _run_fused(pc, fz, instrs, dec, peep, meta, dims, optab, addrs, numels, F, fp, aok, r0, c0, fin,
                              ix, sf, st)
            if done > 0:
                skip = pc + done - 1
                continue
        opc = instrs[pc, 0]
        g, op, bank, src, kind = dec[opc, 0], dec[opc, 1], dec[opc, 2], dec[opc, 3], dec[opc, 4]
        f1, f2, f3, f4 = instrs[pc, 1], instrs[pc, 2], instrs[pc, 3], instrs[pc, 4]
        wf = dec[opc, 5]
        mode, cf = _row_mode(pc, g, op, bank, kind, fin, instrs, rio, st)
        if mode == 0:
            _expand_sources(pc, instrs, rio, st, F, D, I, B, bm, bn, tl)
        if wf == 2 and fp[f1] != 0:   # read-modify-write of an aliased register: copy it in first
            F[f1][:] = carray(ptr_f32(fp[f1]), F.shape[1])
            fp[f1] = 0
        rows = False   # mode 2 writing its rows straight into the store's buffer (ix: their addresses)
        nrows = bm
        if wf == 1:   # writes F register f1: back to its bank row, or in place
            fp[f1] = 0
            if aok and not fin and peep[pc] >= 0 and mode != 1:
                p = _direct_addr(peep[pc], optab, dims, meta, addrs, r0, c0)
                if p != 0:
                    fp[f1] = p
                    skip = pc + 1
                elif mode == 2:
                    nrows = min(bm, meta[M_ROWS] - r0)
                    rows = _row_addrs(ix, peep[pc], optab, dims, meta, addrs, r0, c0, nrows)
                if rows:   # (peep: f1 is read by nothing but the store, which is skipped)
                    skip = pc + 1
        n = bm if mode == 1 else bm * bn
        err = 0
        if g == G_EW:
            if mode == 2 and rows:
                full, comp = (f3, f2) if cf == 1 else (f2, f3)
                _bin_rowb_to_rows(op, ix, _fv(F, fp, full), _fv(F, fp, comp), nrows, ncv, bn, cf == 1)
            elif mode == 2:   # f32 binary op of a full tile and a compact register, broadcast on the fly
                full, comp = (f3, f2) if cf == 1 else (f2, f3)
                _bin_rowb(op, _fv(F, fp, f1), _fv(F, fp, full), _fv(F, fp, comp), bm, bn, tl, cf == 1)
            elif mode == 4:   # f32 binary op of a full tile and a uniform register: its lane 0
                full, uni = (f3, f2) if cf == 1 else (f2, f3)
                _bins(op, _fv(F, fp, f1)[:n], _fv(F, fp, full)[:n], F[uni][0], cf == 1)
            elif mode == 5:   # f32 binary op of a full tile and a row vector: its row 0, per row
                full, rv = (f3, f2) if cf == 1 else (f2, f3)
                _bin_rowv(op, _fv(F, fp, f1), _fv(F, fp, full), F[rv], bm, bn, cf == 1)
            elif mode == 7:   # a comparison of a compact register and a row vector: every pair
                comp, rv = (f2, f3) if cf == 1 else (f3, f2)
                if bank == BK_F32:
                    _cmp_outer(op, B[f1], F[comp], F[rv], bm, bn, cf != 1)
                elif bank == BK_F64:
                    _cmp_outer(op, B[f1], D[comp], D[rv], bm, bn, cf != 1)
                else:
                    _cmp_outer(op, B[f1], I[comp], I[rv], bm, bn, cf != 1)
            else:
                err = _ew(kind, op, bank, f1, f2, f3, f4, F, D, I, B, fp, n)
        elif g == G_LOAD and _col_uniform(f2, optab, meta):   # one value per row: compact
            err = 0 if _load_compact(f1, f2, optab, dims, meta, addrs, numels, F, D, I, B, r0, ix) else ERR_UNHANDLED
            mode = 1
        elif g == G_LOAD or g == G_STORE or g == G_STOREROW:
            # storerow: column 0 of the valid rows, addressed like a finalize store
            one_row = g == G_LOAD and not fin and _tile_row_uniform(f2, optab, dims, meta, r0)
            err = _memop(g != G_LOAD, f1, f2, optab, dims, meta, addrs, numels, F, D, I, B, fp, aok,
                         r0, c0, fin or g == G_STOREROW, ix, mode == 1, one_row)
            if one_row and (bank != BK_F32 or fp[f1] == 0):
                mode = 6
        elif g == G_CAST:
            _cast_dispatch(src, bank, f3, f1, f2, F, D, I, B, fp, n)
        elif g == G_ACCINIT or g == G_ACC or g == G_RFIN or g == G_ROWRED:
            _red(g, op, bank, f1, f2, f3, F, D, I, B, fp, bm, bn, ncv, c0, sf, sd, si, si2, tl)
            if (g == G_RFIN or g == G_ROWRED) and op != R_ARGMAX and op != R_ARGMIN:
                mode = 1   # _rowred leaves compact results
        elif g == G_INDEX:
            if tl:
                _index_t(I[f1], f2, optab, dims, meta, r0, c0, fin)
            else:
                _index(I[f1], f2, optab, dims, meta, r0, c0, fin)
        elif g == G_CONST:   # lanes [0, BM) only: what compact and scalar readers use (state 2)
            bits = consts[f2]
            if bank == BK_F32:
                F[f1][:bm] = np.float32(consts.view(np.float64)[f2])
            elif bank == BK_F64:
                D[f1][:bm] = consts.view(np.float64)[f2]
            elif bank == BK_I64:
                I[f1][:bm] = bits
            else:
                B[f1][:bm] = 1 if bits != 0 else 0
            mode = 3
        else:
            err = ERR_UNHANDLED
        if err != 0:
            return err
        if g != G_STORE and g != G_STOREROW:
            new = 1 if mode == 1 else (2 if mode == 3 else (3 if mode == 6 else 0))
            for f in range(5):
                b = rio[pc, 5 + f]
                if b > 0:
                    st[b - 1, instrs[pc, 1 + f]] = new
    return 0
