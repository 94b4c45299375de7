"""The CPU VM's per-tile dispatch (part of the core, with jit/entry): decode each instruction,
decide how it meets row-level registers, manage in-place tiles and register states, and call the
piece that does the work through the VM table (jit/frame.call_piece).

Kernel descriptor (host/desc builds it; jit/entry unpacks it into views and the frame):
  instrs  int64 [n_instr, 6]     the program's instructions (opcode + 5 fields)
  dec     int64 [n_opcodes, 6]   per opcode: group, op id, bank, source bank, ew kind, f32 write
  meta    int64 [...]            abi.M_*
  optab   int64 [n_opnd, 4+nd]   kind, arg, dtype, offset, strides
  consts  int64 [n_const]        constant bits
  peep    int64 [n_instr]        operand of the store right after an f32 op that may write in place (host/in_place)
                                 (PEEP_LATER - operand: of a later store)
  fz      int64 [n_instr, 8]     runs of instructions executed in one pass (host/fuse_plan)
  rio     int64 [n_instr, 10]    per field, 1 + the bank of a register it reads / writes

In-place tiles: f32 registers are addressed through fp[reg] (0: the bank row). A load of a full,
contiguous f32 tile only points its register at the buffer (no copy); an elementwise op whose
result is only stored writes straight into the output tile and the store is skipped (a later
store finds its tile already written: the register points there meanwhile). Both only
when no stored argument overlaps another argument, or each overlap is an in-place update the
kernel's stream allows (aok, checked per call: jit/addr.alias_ok), so results are unchanged. In
the latter (ALIASED) an instruction whose result would be written over a tile it reads computes
into its bank row (the store copies it out), except bin_tile's ops, computed over that tile by a
loop that reads it as it writes it (loops.bin_in_place: two views of one address would not
vectorize).

Register states st[bank, reg] (abi.RS_*): full tiles, compact row values, uniform constants, row
vectors (jit/rowlevel); st[ST_CACHE]: the tags of the fused runs' cached row vectors.
"""
from __future__ import annotations

import numpy as np
from numba import carray, njit

from ..abi import (ALIASED, BK_F32, BK_F64, BK_I64, DEC_BANK, DEC_GROUP, DEC_KIND, DEC_OP, DEC_WRITES_F, DT_F32,
                   ERR_UNHANDLED, FK_LOADRED, FK_NONE, FK_ROTARY, FK_ROWNORM, FK_ROWSOFTMAX, FR_AOK, FR_C0, FR_FIN,
                   FR_R0, FUSED_RUN, G_ACC, G_ACCINIT, G_CAST, G_CONST, G_EW, G_INDEX, G_LOAD, G_RFIN, G_ROWRED, G_STORE,
                   G_STOREROW, K_BIN, K_CMP, MEM_COMPACT, MEM_INDEX, MEM_LOAD, MEM_STORE, MEM_STOREROW,
                   MODE_CMP_OUTER, MODE_COMPACT, MODE_CONST, MODE_EXPAND, MODE_FULL, MODE_ROWB, MODE_ROWLOAD,
                   MODE_ROWV, MODE_UNIFORM, M_BM, M_BN, M_COLS, M_ROWS, M_TL, OP_ADD, OP_DIV, OP_MAX, OP_MIN, OP_MUL,
                   OP_SUB, PC_CAST, PC_EW_F32, PC_FUSED_ROTARY, PC_FUSED_ROWS, PC_FUSED_TILE, PC_MEM, PC_MEM_T,
                   PC_REDUCE, PC_ROWLEVEL, PC_ROWTREE, PEEP_LATER, RS_COMPACT, RS_FULL, RS_ROWVEC, RS_UNIFORM, RS_UNIFORM_ALL,
                   R_ARGMAX, R_ARGMIN, WRITES_F_DEST, WRITES_F_RMW)
from .addr import col_uniform, direct_addr, reads_at, row_addrs, tile_row_uniform
from .bits import OPTS, ptr_f32
from .frame import call_piece

ROWB_SWAP, ROWB_ROWS = 1, 2   # PC_ROWLEVEL's flags (jit/rowlevel)
MEM_ONE_ROW_FLAG = 2          # PC_MEM's flag (jit/mem)


@njit(**OPTS)
def _rowb_op(op):
    """The f32 binary ops the row-level forms apply (jit/ops.bin_tile, bin_scalar)."""
    return op == OP_ADD or op == OP_SUB or op == OP_MUL or op == OP_DIV or op == OP_MAX or op == OP_MIN


@njit(**OPTS)
def _row_mode(pc, g, op, bank, kind, fin, instrs, rio, st):
    """How instruction pc meets row-level sources (abi.MODE_*), and the field of the compact
    (uniform, row-vector) source: MODE_FULL (row-level sources expanded first), MODE_COMPACT
    (every register source compact or uniform: computed on BM lanes; or a finalize store /
    storerow of a compact register), MODE_ROWB / MODE_UNIFORM / MODE_ROWV (a supported f32 binary
    op of one full source and one compact / uniform / row-vector source), MODE_CMP_OUTER (a
    comparison of a compact register and a row vector: an attention mask's `pos[r] <= pos[c]`)."""
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
            if sv == RS_COMPACT:
                ncomp += 1
                cf = f
            elif sv == RS_FULL:
                nfull += 1
            elif sv == RS_UNIFORM or sv == RS_UNIFORM_ALL:
                nuni += 1
                uf = f
            else:
                nrow += 1
                rf = f
    if ncomp == 0 and nuni == 0 and nrow == 0:   # the common case: full tiles only
        return MODE_FULL, cf
    bin_f32 = g == G_EW and kind == K_BIN and bank == BK_F32 and _rowb_op(op)
    if nrow > 0:   # a row vector meets a full tile, or is expanded (with any compact source)
        if nrow == 1 and nfull == 1 and ncomp == 0 and nuni == 0 and bin_f32:
            return MODE_ROWV, rf
        if nrow == 1 and ncomp == 1 and nfull == 0 and nuni == 0 and g == G_EW and kind == K_CMP:
            return MODE_CMP_OUTER, cf
        return MODE_FULL, cf
    if ncomp == 0:
        if nuni == 1 and nfull == 1 and bin_f32:
            return MODE_UNIFORM, uf
        return MODE_FULL, cf
    if g == G_EW or g == G_CAST:
        if nfull == 0:
            return MODE_COMPACT, cf
        if ncomp == 1 and nfull == 1 and bin_f32:
            return MODE_ROWB, cf
        return MODE_FULL, cf
    if (g == G_STORE and fin) or g == G_STOREROW:
        return MODE_COMPACT, cf
    return MODE_FULL, cf


@njit(**OPTS)
def _needs_expand(pc, instrs, rio, st):
    """Instruction pc reads a register that is not a full tile (nor uniform in every lane)."""
    for f in range(5):
        b = rio[pc, f]
        if b > 0:
            s = st[b - 1, instrs[pc, 1 + f]]
            if s != RS_FULL and s != RS_UNIFORM_ALL:
                return True
    return False


@njit(**OPTS)
def _fused_slot(kind):
    if kind == FK_LOADRED:
        return PC_ROWTREE
    if kind == FK_ROWNORM or kind == FK_ROWSOFTMAX:
        return PC_FUSED_ROWS
    if kind == FK_ROTARY:
        return PC_FUSED_ROTARY
    return PC_FUSED_TILE


@njit(**OPTS)
def _const(g_bank, f1, f2, consts, F, D, I, B, bm):
    """A constant into lanes [0, BM): what compact and scalar readers use (RS_UNIFORM)."""
    bits = consts[f2]
    if g_bank == BK_F32:
        F[f1][:bm] = np.float32(consts.view(np.float64)[f2])
    elif g_bank == BK_F64:
        D[f1][:bm] = consts.view(np.float64)[f2]
    elif g_bank == BK_I64:
        I[f1][:bm] = bits
    else:
        B[f1][:bm] = 1 if bits != 0 else 0


@njit(inline='always', **OPTS)   # one call site (jit/entry); a call would pass every view's fields per tile
def exec_tile(s, e, fra, fr, tab, instrs, dec, peep, meta, dims, optab, consts, addrs, F, D, I, B, fp, aok,
              r0, c0, fin, ix, rio, st, fz):
    """Run instructions [s, e) on the tile at (r0, c0) (fin: a finalize section, one column);
    returns an abi.ERR_* code. fra/fr: the frame's address and view; tab: the piece addresses."""
    fr[FR_R0], fr[FR_C0], fr[FR_FIN], fr[FR_AOK] = r0, c0, fin, aok
    bm, bn = meta[M_BM], meta[M_BN]
    tl = meta[M_TL] != 0
    skip = s - 1
    for pc in range(s, e):
        if pc <= skip:   # done by a fused run, or a store written in place by the previous instruction
            continue
        kind_f = fz[pc, 0]
        if kind_f != FK_NONE and not fin:
            piece = tab[_fused_slot(kind_f)]
            if piece != 0:   # not loaded yet: the instructions run one by one (the same results)
                done = call_piece(piece, fra, pc, FUSED_RUN, 0)
                if done > 0:
                    skip = pc + done - 1
                    continue
        opc = instrs[pc, 0]
        g, op, bank, kind, wf = dec[opc, DEC_GROUP], dec[opc, DEC_OP], dec[opc, DEC_BANK], dec[opc, DEC_KIND], \
            dec[opc, DEC_WRITES_F]
        f1 = instrs[pc, 1]
        mode, cf = _row_mode(pc, g, op, bank, kind, fin, instrs, rio, st)
        if mode == MODE_FULL and _needs_expand(pc, instrs, rio, st):
            call_piece(tab[PC_ROWLEVEL], fra, pc, MODE_EXPAND, 0)
        if wf == WRITES_F_RMW and fp[f1] != 0:   # read-modify-write of an aliased register: copy it in
            F[f1][:] = carray(ptr_f32(fp[f1]), F.shape[1])
            fp[f1] = 0
        rows = False   # MODE_ROWB writing its rows straight into the store's buffer (ix: their addresses)
        if wf == WRITES_F_DEST:   # writes F register f1: back to its bank row, or in place
            fp[f1] = 0
            pj = peep[pc]
            if aok and not fin and pj != -1 and mode != MODE_COMPACT:
                p = direct_addr(pj if pj >= 0 else PEEP_LATER - pj, optab, dims, meta, addrs, r0, c0)
                if aok == ALIASED and p != 0 and reads_at(p, pc, instrs, rio, fp) and not (
                        g == G_EW and kind == K_BIN and bank == BK_F32 and _rowb_op(op) and mode == MODE_FULL):
                    pass   # its source is that tile (an in-place update): computed into its bank row
                    # (bin_tile's ops compute over their source: kernels.ew_f32_piece)
                elif p != 0:
                    fp[f1] = p
                    if pj >= 0:
                        skip = pc + 1
                elif mode == MODE_ROWB and pj >= 0:
                    nrows = min(bm, meta[M_ROWS] - r0)
                    rows = row_addrs(ix, peep[pc], optab, dims, meta, addrs, r0, c0, nrows)
                if rows:   # (peep: f1 is read by nothing but the store, which is skipped)
                    skip = pc + 1
        n = bm if mode == MODE_COMPACT else bm * bn
        err = 0
        if g == G_EW:
            if mode == MODE_ROWB or mode == MODE_UNIFORM or mode == MODE_ROWV or mode == MODE_CMP_OUTER:
                flags = (ROWB_SWAP if cf == 1 else 0) | (ROWB_ROWS if rows else 0)
                err = call_piece(tab[PC_ROWLEVEL], fra, pc, mode, flags)
            else:
                err = call_piece(tab[PC_EW_F32 + bank], fra, pc, n, 0)
        elif g == G_LOAD and col_uniform(instrs[pc, 2], optab, meta):   # one value per row: compact
            err = call_piece(tab[PC_MEM], fra, pc, MEM_COMPACT, 0)
            mode = MODE_COMPACT
        elif g == G_LOAD or g == G_STORE or g == G_STOREROW:
            j = instrs[pc, 2]
            one_row = g == G_LOAD and not fin and tile_row_uniform(j, optab, dims, meta, r0)
            p = 0
            if g == G_LOAD and aok and not fin and optab[j, 2] == DT_F32:
                p = direct_addr(j, optab, dims, meta, addrs, r0, c0)
            elif g == G_STORE and bank == BK_F32 and fp[f1] != 0 and mode == MODE_FULL:
                p = direct_addr(j, optab, dims, meta, addrs, r0, c0)
                p = p if p == fp[f1] else 0   # its tile already written there (peep: PEEP_LATER)
            if p != 0:   # a full contiguous f32 tile: the register points at the buffer
                fp[f1] = p
            else:
                what = MEM_LOAD if g == G_LOAD else (MEM_STORE if g == G_STORE else MEM_STOREROW)
                slot = PC_MEM_T if tl or mode == MODE_COMPACT else PC_MEM   # a compact store: column 0
                err = call_piece(tab[slot], fra, pc, what, MEM_ONE_ROW_FLAG if one_row else 0)
            if one_row and (bank != BK_F32 or fp[f1] == 0):
                mode = MODE_ROWLOAD
        elif g == G_CAST:
            err = call_piece(tab[PC_CAST], fra, pc, n, 0)
        elif (g == G_RFIN or g == G_ROWRED) and bank == BK_F32 and not tl and op != R_ARGMAX and \
                op != R_ARGMIN and tab[PC_ROWTREE] != 0:   # f32 row trees in vector registers
            err = call_piece(tab[PC_ROWTREE], fra, pc, (1 if fin else min(bn, meta[M_COLS] - c0))
                             if g == G_ROWRED else bn, 0)
            mode = MODE_COMPACT
        elif g == G_ACCINIT or g == G_ACC or g == G_RFIN or g == G_ROWRED:
            err = call_piece(tab[PC_REDUCE], fra, pc, 0, 0)
            if (g == G_RFIN or g == G_ROWRED) and op != R_ARGMAX and op != R_ARGMIN:
                mode = MODE_COMPACT   # the row trees leave compact results
        elif g == G_INDEX:
            err = call_piece(tab[PC_MEM_T if tl else PC_MEM], fra, pc, MEM_INDEX, 0)
        elif g == G_CONST:
            _const(bank, f1, instrs[pc, 2], consts, F, D, I, B, bm)
            mode = MODE_CONST
        else:
            err = ERR_UNHANDLED
        if err != 0:
            return err
        if g != G_STORE and g != G_STOREROW:
            new = RS_COMPACT if mode == MODE_COMPACT else (RS_UNIFORM if mode == MODE_CONST else (
                RS_ROWVEC if mode == MODE_ROWLOAD else RS_FULL))
            for f in range(5):
                b = rio[pc, 5 + f]
                if b > 0:
                    st[b - 1, instrs[pc, 1 + f]] = new
    return 0
