"""The GPU VM's kernel: one compiled Triton kernel interprets every kernel block of every Program.

A program instance (CTA) runs work items pid, pid + grid, ... of one kernel block: a row block
with all its column tiles, or one tile of a kernel whose column tiles are independent (abi.py);
the grid is one instance per item, fewer when registers spill (their scratch is per instance).
It walks the block's sections as a state machine with ONE dispatch site: prologue once, then per
item and sweep: init, body once per column tile, fin. Each step decodes the instruction at pc (three
scalar loads from the device image) and runs its handler on the register file (execute.py).
Every argument is an int64 address, never specialized: sizes, strides, tiles and instructions
are data in the image, so no new shape, dtype or Program ever compiles a kernel.
"""
import triton
import triton.language as tl

from . import abi
from . import execute as x
from .kabi import *  # noqa: F401,F403

assert all(h in ((8,), (2, 0), (4, 0), (4,))[b] for v in abi.VARIANTS.values() for b, h in enumerate(v)), \
    "tiles.py's register pickers hold 8 f32, 2 or 0 f64, 4 or 0 i64 and 4 bool tiles"

PH_PRO = tl.constexpr(0)
PH_INIT = tl.constexpr(1)
PH_BODY = tl.constexpr(2)
PH_FIN = tl.constexpr(3)
ARG_NAMES = list(abi.ARG_NAMES)


@triton.jit
def _step(B, ins, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, ext,
          rows, cols, bm, row0, col0, body, fin, lanes, li, lj, bn, sp_f, sp_d, sp_i, sp_b,
          f0, f1, f2, f3, f4, f5, f6, f7, d0, d1, i0, i1, i2, i3, b0, b1, b2, b3, TILE: tl.constexpr,
          HOT_D: tl.constexpr, HOT_I: tl.constexpr):
    """Decode and run the instruction at `ins` (IW words of the image)."""
    w0 = tl.load(ins)
    w1 = tl.load(ins + 1)
    aux = tl.load(ins + 2)
    kind = w0 & 255
    bank = (w0 >> 8) & 255
    op = (w0 >> 16) & 65535
    obank = (w0 >> 32) & 255
    r1 = w1 & 65535
    r2 = (w1 >> 16) & 65535
    r3 = (w1 >> 32) & 65535
    r4 = (w1 >> 48) & 65535
    if kind < K_CAST:
        f0, f1, f2, f3, f4, f5, f6, f7, d0, d1, i0, i1, i2, i3, b0, b1, b2, b3 = x.exec_memory(
            B, kind, bank, r1, aux, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, ext,
            rows, cols, bm, row0, col0, body, fin, lanes, li, lj, sp_f, sp_d, sp_i, sp_b,
            f0, f1, f2, f3, f4, f5, f6, f7, d0, d1, i0, i1, i2, i3, b0, b1, b2, b3, TILE, HOT_D, HOT_I)
    elif kind == K_CAST:
        f0, f1, f2, f3, f4, f5, f6, f7, d0, d1, i0, i1, i2, i3, b0, b1, b2, b3 = x.exec_cast(
            bank, op, aux, r1, r2, lanes, sp_f, sp_d, sp_i, sp_b,
            f0, f1, f2, f3, f4, f5, f6, f7, d0, d1, i0, i1, i2, i3, b0, b1, b2, b3, TILE, HOT_D, HOT_I)
    elif kind < K_ACCINIT:
        f0, f1, f2, f3, f4, f5, f6, f7, d0, d1, i0, i1, i2, i3, b0, b1, b2, b3 = x.exec_ew(
            kind, bank, op, obank, r1, r2, r3, r4, lanes, sp_f, sp_d, sp_i, sp_b,
            f0, f1, f2, f3, f4, f5, f6, f7, d0, d1, i0, i1, i2, i3, b0, b1, b2, b3, TILE, HOT_D, HOT_I)
    else:
        f0, f1, f2, f3, f4, f5, f6, f7, d0, d1, i0, i1, i2, i3, b0, b1, b2, b3 = x.exec_reduce(
            kind, bank, op, r1, r2, r3, col0, body, cols, lanes, li, lj, bn, sp_f, sp_d, sp_i, sp_b,
            f0, f1, f2, f3, f4, f5, f6, f7, d0, d1, i0, i1, i2, i3, b0, b1, b2, b3, TILE, HOT_D, HOT_I)
    return f0, f1, f2, f3, f4, f5, f6, f7, d0, d1, i0, i1, i2, i3, b0, b1, b2, b3


@triton.jit
def _item(item, nct, par):
    """(row block, first column tile, end column tile) of work item `item`."""
    if par != 0:
        rb = item // nct
        lo = item - rb * nct
        hi = lo + 1
    else:
        rb = item
        lo = item * 0
        hi = lo + nct
    return rb, lo, hi


@triton.jit(do_not_specialize=ARG_NAMES)
def vm_kernel(blk: tl.int64, a0: tl.int64, a1: tl.int64, a2: tl.int64, a3: tl.int64, a4: tl.int64,
              a5: tl.int64, a6: tl.int64, a7: tl.int64, a8: tl.int64, a9: tl.int64, a10: tl.int64,
              a11: tl.int64, a12: tl.int64, a13: tl.int64, a14: tl.int64, a15: tl.int64, ext: tl.int64,
              scratch: tl.int64, TILE: tl.constexpr, HOT_D: tl.constexpr, HOT_I: tl.constexpr):
    B = blk.to(tl.pointer_type(tl.int64))
    rows = tl.load(B + H_ROWS)
    cols = tl.load(B + H_COLS)
    bm = tl.load(B + H_BM).to(tl.int32)
    bn = tl.load(B + H_BN).to(tl.int32)
    nct = tl.load(B + H_NCT)
    nsw = tl.load(B + H_NSW)
    par = tl.load(B + H_PAR)
    items = tl.load(B + H_ITEMS)
    sweeps = B + tl.load(B + H_SWEEPS)
    instrs = B + tl.load(B + H_INSTRS)
    pid = tl.program_id(0).to(tl.int64)
    grid = tl.num_programs(0).to(tl.int64)
    cta = scratch + pid * tl.load(B + H_CTA_WORDS) * 8
    sp_f = cta + tl.load(B + H_SPILL_F) * 8
    sp_d = cta + tl.load(B + H_SPILL_D) * 8
    sp_i = cta + tl.load(B + H_SPILL_I) * 8
    sp_b = cta + tl.load(B + H_SPILL_B) * 8
    lanes = tl.arange(0, TILE)
    li = lanes // bn
    lj = lanes - li * bn
    f0 = tl.full([TILE], 0, tl.float32)
    f1, f2, f3, f4, f5, f6, f7 = f0, f0, f0, f0, f0, f0, f0
    d0 = tl.full([TILE], 0, tl.float64)
    d1 = d0
    i0 = tl.full([TILE], 0, tl.int64)
    i1, i2, i3 = i0, i0, i0
    b0 = lanes < 0
    b1, b2, b3 = b0, b0, b0
    # the state: work item (row block rb, column tiles [lo, hi)), sweep s, column tile ct, phase,
    # and the section [pc, end) being run
    item = pid
    rb, lo, hi = _item(item, nct, par)
    row0 = rb * bm          # first row and column of the tile (tiles.lane_rows, lane_cols)
    col0 = pid * 0
    body = pid * 0          # 1 in a body, 0 elsewhere
    fin = pid * 0           # 1 in a finalize
    s = pid * 0
    ct = pid * 0
    phase = pid * 0 + PH_PRO
    pc = tl.load(B + H_PRO_S)
    end = tl.load(B + H_PRO_E)
    running = item < items
    while running:
        if pc < end:
            f0, f1, f2, f3, f4, f5, f6, f7, d0, d1, i0, i1, i2, i3, b0, b1, b2, b3 = _step(
                B, instrs + pc * IW, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, ext,
                rows, cols, bm, row0, col0, body, fin, lanes, li, lj, bn, sp_f, sp_d, sp_i, sp_b,
                f0, f1, f2, f3, f4, f5, f6, f7, d0, d1, i0, i1, i2, i3, b0, b1, b2, b3, TILE, HOT_D, HOT_I)
            pc += 1
        else:
            # the next section: prologue -> init -> body per column tile -> fin -> next sweep / item
            if phase == PH_PRO:
                phase = phase * 0 + PH_INIT
            elif phase == PH_INIT:
                ct = lo
                if ct < hi:
                    phase = phase * 0 + PH_BODY
                else:
                    phase = phase * 0 + PH_FIN
            elif phase == PH_BODY:
                ct += 1
                if ct >= hi:
                    phase = phase * 0 + PH_FIN
            else:
                s += 1
                if s >= nsw:
                    s = s * 0
                    item += grid
                    running = item < items
                    rb, lo, hi = _item(item, nct, par)
                    row0 = rb * bm
                phase = phase * 0 + PH_INIT
            at = sweeps + s * SWEEP_W + 2 * (phase - 1)
            pc = tl.load(at)
            end = tl.load(at + 1)
            body = (phase == PH_BODY).to(tl.int64)
            fin = (phase == PH_FIN).to(tl.int64)
            col0 = ct * bn * body
