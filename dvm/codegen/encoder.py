"""Encode a compiled graph for concrete sizes and layouts into a Program, in microseconds.

Per kernel: evaluate the domain, give every operand one stride per domain axis (0 where it
broadcasts), order axes as rows (kept) then cols (reduced), drop unit axes, fold neighbours
that are contiguous for every operand, pick the tile, and write the header. The instruction
stream is copied from the template unchanged.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
from math import prod

from ..graph.dtypes import Bank, DType
from ..graph.symbolic import Dim, SymExpr, evaluate
from ..graph.views import Layout, apply_chain, contiguous_strides
from ..errors import ShapeError
from .column_tiles import (COLUMN_MAJOR_TILE, column_major_rows, is_column_major, strip_rows, strips_pay,
                           whole_rereads)
from .isa import ISA_HASH
from .limits import MAX_ELEMS, checked_numel, pow2_at_least as _pow2_at_least
from .lower import KernelTemplate
from .program import (ARG_IN, ARG_OUT, ARG_WS, HEADER_WORDS, MAGIC, MAX_TILE, OPND_INDEX, VERSION, Program,
                      float_bits)
from .target import GENERIC, Target

TILE_ELEMS = 4096   # elements per tile register (16 KiB of f32): L1/L2 resident
# rows that fit one tile (softmax, norms, row reductions: the single-tile stream) get up to this
# many elements per tile, whatever their width: their instructions mostly touch one row at a time
# (row reductions, fused row runs, compact row values), so a taller tile keeps their working set
# while it divides the per-tile dispatch (~15 instructions) over more rows; smaller elementwise
# kernels keep TILE_ELEMS (larger ones: up to MID_TILE_ELEMS below)
ROW_TILE_ELEMS = 16384
# kernels of at least STREAM_ELEMS lanes (elementwise and single-tile-stream ones) stream their
# operands from memory (4 M f32 lanes and 2-3 operands: past a 32 MiB last-level cache), and the
# VM's per-tile dispatch, whose own tables the stream has evicted, costs most there: their tiles
# get STREAM_TILE_ELEMS lanes (64 or more tiles, still enough for every thread)
STREAM_ELEMS = 1 << 22
STREAM_TILE_ELEMS = 1 << 16
# ... elementwise ones at most as many as keep their register tiles within this many bytes (a
# core's L2 on the machines measured): past it each instruction streams its tiles through the
# last-level cache (an Adam step's 13 registers: 16384-lane tiles 11-17 % faster than 65536;
# the single-tile stream's row forms work a row at a time and keep STREAM_TILE_ELEMS)
STREAM_REGISTER_BYTES = 1 << 20
# larger elementwise kernels (below STREAM_ELEMS) take tiles of up to MID_TILE_ELEMS lanes
# (bounded as the stream's by STREAM_REGISTER_BYTES), as large as leave MID_MIN_TILES tiles: the
# per-tile dispatch of a cheap instruction costs about as much as its pass over a 4096-lane tile,
# a few 64 KiB registers still fit a core's L2, and the threads of a parallel launch share
# enough tiles to stay balanced (an add, a bias + ReLU, an 8-op chain at 128 K-2 M lanes: 5-25 %
# faster than 4096-lane tiles)
MID_TILE_ELEMS = 1 << 14
MID_MIN_TILES = 16
# a kernel that runs on one thread (Target.serial_lanes) needs no MID_MIN_TILES tiles for threads:
# with at most SERIAL_LANE_BYTES of registers a lane, its tiles grow to MID_TILE_ELEMS however few
# remain (an add, SiLU * mul, GELU(x + b) * y at 8-48 K lanes: 3-18 % faster); more registers keep
# MID_MIN_TILES (an 8-op chain's 9 registers in 128-lane rows ran 16-20 % slower in 16 K-lane tiles)
SERIAL_LANE_BYTES = 16
# a parallel one with as few registers keeps LEAN_MIN_TILES on such a VM (serial_lanes > 0: it
# shares larger kernels among its threads): a tile's dispatch outweighs the balance of more tiles
# (an add, a * b * 0.5 + a at 64-192 K lanes on two threads: 1-10 % faster in 16 K-lane tiles than
# in 4-8 K; more threads than tiles gain nothing at these sizes anyway)
LEAN_MIN_TILES = 4
MAX_BN = 4096   # tile width of elementwise kernels and of the multi-sweep stream
# rows with at most this many columns use a kernel's single-tile stream (0: always sweep): one
# row is then one tile of up to 65536 lanes, which the CPU VM's row forms read once from the
# buffer; the sweeps re-read a row per sweep and make a pass per instruction and
# tile (about twice the time at 64x8192). Tests that pin the multi-sweep form set it to 0
SINGLE_TILE_COLS = 1 << 16
# wider rows, up to the verifier's MAX_TILE lanes, take the single-tile stream too when the CPU VM
# runs all of it as row forms (softmax, LayerNorm, RMSNorm of f32 data: its Target.whole_row_forms):
# those never hold the tile in registers, they read each row from its buffer once or twice, where
# the sweeps make a pass per instruction and 4096-lane tile and recompute the row's values per
# sweep. Any other kernel keeps the sweeps there: its tile form over 131072 lanes is 2-3x slower
# (a row sum of exp(x) * y, a log-sum-exp). Off with SINGLE_TILE_COLS = 0
WIDE_ROW_COLS = MAX_TILE
# single-tile rows at most this wide get a tile exactly one row wide (no padding lanes: a 17-column
# softmax would otherwise compute 32 lanes per row); the CPU VM holds such tiles column-major
EXACT_BN_COLS = 64
# wider single-tile rows get a tile of the row's next power of two, or, where the VM's forms for
# that stream do not need one (Target.tight_rows), of the row rounded up to TIGHT_LANES when that
# is at most TIGHT_MOST of the power of two and the row is over TIGHT_MIN_COLS (tight rows: a row
# sum of 513 columns computes 528 lanes a row, not 1024; docs/DECISIONS.md, Tiles)
TIGHT_LANES = 16
TIGHT_MOST = 0.8
TIGHT_MIN_COLS = 256


class NeedsCopy(Exception):
    """An input's layout cannot express a view chain; the caller copies that input and retries."""

    def __init__(self, slot: int):
        self.slot = slot


@dataclass
class ArgSpec:
    role: int
    dtype: DType
    shape: tuple[Dim, ...] | None  # outputs and workspaces (contiguous); None for inputs


def _even_bn(cols: int, max_bn: int = MAX_BN) -> int:
    """Tile width of an elementwise kernel: its columns in equal tiles of at most MAX_BN, no
    padding lanes (every instruction computes every lane of a tile: a 17-column bias-add with
    power-of-two tiles computed 32 lanes a row; 65537 columns take 17 tiles of 3856, not 16 of
    4096 and one of 1). Several tiles a row are a multiple of 16 wide (each starts 64-byte
    aligned where the row does). Reductions keep power-of-two widths (their trees pair lanes)."""
    cols = max(cols, 1)
    if cols <= max_bn:
        return cols
    n_tiles = -(-cols // max_bn)
    return min(max_bn, -(-cols // (16 * n_tiles)) * 16)


def _mid_tile(lanes: int, most: int, min_tiles: int = MID_MIN_TILES) -> int:
    """Lanes per tile of an elementwise kernel below STREAM_ELEMS: TILE_ELEMS, doubled up to `most`
    while at least `min_tiles` tiles remain."""
    tile = TILE_ELEMS
    while tile < most and 2 * tile * min_tiles <= lanes:
        tile *= 2
    return tile


def _dim_getter(d: Dim):
    """A fast evaluator for one size: a constant, one symbol, or a general expression."""
    if isinstance(d, int):
        return lambda env, v=d: v
    sym = d.as_symbol()
    if sym is not None:
        name = sym.name
        return lambda env: env[name]
    return lambda env: evaluate(d, env)


class _Compiled:
    """Per-template data precomputed once so that encoding an instance is straight-line code."""

    def __init__(self, t: KernelTemplate):
        self.dom = [_dim_getter(d) for d in t.shape]
        n = len(t.shape)
        if t.axes:
            self.row_axes = [i for i in range(n) if i not in t.axes]
            self.col_axes = [i for i in range(n) if i in t.axes]
        else:
            self.row_axes, self.col_axes = list(range(n)), []
        self.opnds = []
        for spec in t.operands:
            base = None if spec.base_shape is None else [_dim_getter(d) for d in spec.base_shape]
            self.opnds.append((spec, base))
        self.answers: dict[tuple[str, str], bool] = {}   # (Target hook, target) -> its answer, once asked
        self.fixed = [len(t.operands), len(t.consts), len(t.instrs), len(t.sweeps), *t.nregs]
        lane_bytes = sum(n * b.np_dtype.itemsize for b, n in zip(Bank, t.nregs))
        self.lane_bytes, self.n_sweeps = lane_bytes, max(len(t.sweeps), 1)
        self.opnd_bytes = max((DType(spec.dtype).itemsize for spec in t.operands), default=1)
        fits = STREAM_REGISTER_BYTES // max(lane_bytes, 1)
        self.stream_tile = max(MAX_BN, min(STREAM_TILE_ELEMS, 1 << (fits.bit_length() - 1)))
        self.mid_tile = min(MID_TILE_ELEMS, self.stream_tile)
        self.tail = [*t.prologue] + [w for sw in t.sweeps for w in sw]
        self.consts = [(int(bank), bank in (Bank.F32, Bank.F64), _dim_getter(value) if isinstance(value, SymExpr) else None,
                        None if isinstance(value, SymExpr) else
                        (float_bits(value) if bank in (Bank.F32, Bank.F64) else int(value)))
                       for bank, value in t.consts]
        self.instrs = t.instrs.reshape(-1)
        self.instr_list = self.instrs.tolist()


def _operand_strides(spec, base, n: int, env, inputs: Sequence[Layout]) -> tuple[list[int], int]:
    if base is None:
        layout = inputs[spec.slot]
    else:
        shape = tuple(g(env) for g in base)
        if spec.unit_axis is not None:
            strides = tuple(1 if (i == spec.unit_axis and d != 1) else 0 for i, d in enumerate(shape))
        else:
            strides = contiguous_strides(shape)
        layout = (shape, strides, 0)
    if spec.chain:
        layout = apply_chain(layout, spec.chain, env)
        if layout is None:
            raise NeedsCopy(spec.slot)
    shape, strides, offset = layout
    out = [0] * (n - len(shape))
    out += [0 if d == 1 else st for d, st in zip(shape, strides)]
    return out, offset


def _compiled(t: KernelTemplate) -> _Compiled:
    c = t.__dict__.get("_compiled")
    if c is None:
        c = t.__dict__["_compiled"] = _Compiled(t)
    return c


def _takes_single(t: KernelTemplate, cols: int, target: Target) -> bool:
    if t.single is None or cols <= 0:
        return False
    if cols <= min(SINGLE_TILE_COLS, target.max_tile):
        return True
    if SINGLE_TILE_COLS <= 0 or cols > min(WIDE_ROW_COLS, target.max_tile):
        return False
    return _asked(t.single, "whole_row_forms", target)   # (when a row first exceeds SINGLE_TILE_COLS)


def _single_bn(cols: int, t: KernelTemplate, target: Target) -> int:
    """The tile width of single-tile stream t's rows of cols columns (EXACT_BN_COLS, TIGHT_LANES)."""
    if cols <= EXACT_BN_COLS:
        return cols
    p2 = _pow2_at_least(cols)
    tight = -(-cols // TIGHT_LANES) * TIGHT_LANES
    if cols <= TIGHT_MIN_COLS or tight > TIGHT_MOST * p2:
        return p2
    return tight if _asked(t, "tight_rows", target) else p2


def _asked(t: KernelTemplate, hook: str, target: Target) -> bool:
    """The answer of the target's hook (a RowFormsHook: Target.whole_row_forms, tight_rows,
    rereads_rows) for stream t, given its instructions, sections and operands' dtypes; asked once
    per target. False where the target has no such hook."""
    if getattr(target, hook) is None:
        return False
    answers, key = _compiled(t).answers, (hook, target.name)
    if key not in answers:
        sections = [tuple(t.prologue)] + [(sw[i], sw[i + 1]) for sw in t.sweeps for i in (0, 2, 4)]
        answers[key] = getattr(target, hook)(t.instrs, sections, [int(spec.dtype) for spec in t.operands])
    return answers[key]


def encode_kernel(t: KernelTemplate, env: Mapping[str, int], inputs: Sequence[Layout],
                  target: Target = GENERIC) -> tuple[list[int], _Compiled]:
    """The kernel block's words before its instructions, and the stream chosen (whose
    instructions follow): the single-tile stream when every row fits one tile, unless the
    reduced axis is strided while the kept axis is contiguous (then short, tall tiles; for a
    stream re-reading its rows only where column_tiles.whole_rereads or strips_pay)."""
    c = _compiled(t)
    dom = [g(env) for g in c.dom]
    single_stream = rereading = whole = False
    # (an empty row still needs the sweep form: its fin writes the reduction identities)
    if _takes_single(t, prod(dom[i] for i in c.col_axes), target):
        single = _compiled(t.single)
        folded = _folded(single, dom, env, inputs)
        column_major = is_column_major(folded[2], folded[4])
        if column_major and _asked(t.single, "rereads_rows", target):
            # (tight_rows: the stream computes on its rows and has no row form)
            R, C = prod(folded[1]), prod(folded[3])
            whole = _asked(t.single, "tight_rows", target) and whole_rereads(R, C, ROW_TILE_ELEMS, folded[2], folded[4])
            rereading = column_major = whole or strips_pay(R, C, c.opnd_bytes, ROW_TILE_ELEMS)
        if column_major:
            folded = _folded(c, dom, env, inputs)
        else:
            c, single_stream = single, True
    else:
        folded = _folded(c, dom, env, inputs)
        column_major = bool(c.col_axes) and is_column_major(folded[2], folded[4])
    per_opnd, row_sizes, row_strides, col_sizes, col_strides = folded
    R, C = prod(row_sizes), prod(col_sizes)
    if R * C > MAX_ELEMS:
        checked_numel(dom, "a kernel's domain")   # raises ShapeError naming the sizes
    cap = target.max_tile   # (a power of two: every choice below stays within it)
    if column_major:
        if whole:
            bm, tile = R, COLUMN_MAJOR_TILE
        elif rereading:
            bm, tile = strip_rows(R, C, c.opnd_bytes, STREAM_REGISTER_BYTES)
        else:
            bm, tile = column_major_rows(R, C, TILE_ELEMS)
        bm, tile = min(bm, cap), min(tile, cap)
        bn = max(1, min(_pow2_at_least(max(C, 1)), tile // bm))
    else:
        streaming = R * C >= STREAM_ELEMS and (single_stream or not c.col_axes)   # (not the sweeps)
        lean = c.lane_bytes <= SERIAL_LANE_BYTES and target.serial_lanes > 0
        serial = lean and R * C * c.n_sweeps < target.serial_lanes
        ew_tile = _mid_tile(R * C, c.mid_tile, 1 if serial else LEAN_MIN_TILES if lean else MID_MIN_TILES) \
            if not (c.col_axes or streaming) else TILE_ELEMS
        if not c.col_axes:
            bn = _even_bn(C, min(c.stream_tile if streaming else ew_tile, cap))
        elif single_stream:   # 0 < C <= min(WIDE_ROW_COLS, cap) (powers of two)
            bn = _single_bn(C, t.single, target)
        else:
            bn = min(_pow2_at_least(max(C, 1)), MAX_BN, cap)
        tile = (STREAM_TILE_ELEMS if single_stream else c.stream_tile) if streaming else \
            (ROW_TILE_ELEMS if single_stream else ew_tile)
        tile = min(tile, cap)
        bm = max(1, min(tile // bn, _pow2_at_least(max(R, 1))))
    words = [len(row_sizes), len(col_sizes), bm, bn, *c.fixed, *row_sizes, *col_sizes, *c.tail]
    for (spec, _), (_, offset), rs, cs in zip(c.opnds, per_opnd, row_strides, col_strides):
        words += [spec.kind, spec.slot, int(spec.dtype), offset, *rs, *cs]
    for bank, is_float, sym_value, bits in c.consts:
        if sym_value is not None:  # a precompiled getter for a symbolic constant (e.g. a mean's count)
            v = sym_value(env)
            bits = float_bits(v) if is_float else int(v)
        words += [bank, bits]
    return words, c


def _folded(c: _Compiled, dom: list[int], env, inputs):
    n = len(dom)
    per_opnd = [_operand_strides(spec, base, n, env, inputs) for spec, base in c.opnds]
    ra, ca = c.row_axes, c.col_axes
    row_sizes, row_strides = _fold(dom, ra, per_opnd)
    col_sizes, col_strides = _fold(dom, ca, per_opnd)
    if not ca and row_sizes:  # elementwise: the innermost folded dim becomes the column dim
        col_sizes, col_strides = [row_sizes.pop()], [[st.pop()] for st in row_strides]
    return per_opnd, row_sizes, row_strides, col_sizes, col_strides


def _fold(dom: list[int], axes: list[int], per_opnd: list) -> tuple[list[int], list[list[int]]]:
    """Over `axes` of the domain: drop unit dims and merge neighbours (i, j) whose strides satisfy
    stride[i] == stride[j] * size[j] for every operand. Returns (sizes, per-operand strides)."""
    full = [st for st, _ in per_opnd]
    out_sizes: list[int] = []
    out_strides: list[list[int]] = [[] for _ in full]
    for i in axes:
        d = dom[i]
        if d == 1:
            continue
        if out_sizes:
            for st, f in zip(out_strides, full):
                if st[-1] != f[i] * d:
                    break
            else:  # every operand is contiguous across the two dims: merge
                out_sizes[-1] *= d
                for st, f in zip(out_strides, full):
                    st[-1] = f[i]
                continue
        out_sizes.append(d)
        for st, f in zip(out_strides, full):
            st.append(f[i])
    return out_sizes, out_strides


def encode_program(templates: Sequence[KernelTemplate], args: Sequence[ArgSpec], env: Mapping[str, int],
                   inputs: Sequence[Layout], target: Target = GENERIC) -> Program:
    """The Program of these templates for concrete sizes and input layouts, with the choices the
    ISA leaves open (tiles, streams) made for `target` (the VM that will run it)."""
    blocks = [encode_kernel(t, env, inputs, target) for t in templates]
    arg_words: list[int] = []
    for a in args:
        numel = 0
        if a.role != ARG_IN:
            getters = a.__dict__.get("_getters")
            if getters is None:
                getters = a.__dict__["_getters"] = [_dim_getter(d) for d in a.shape]
            numel = 1
            for g in getters:
                numel *= g(env)
            if numel > MAX_ELEMS:
                raise ShapeError(f"an output or workspace of {numel} elements: DVM's limit is {MAX_ELEMS} (2**44)")
        arg_words += [a.role, int(a.dtype), numel]
    start = HEADER_WORDS + len(arg_words) + 2 * len(blocks)
    table: list[int] = []
    for b, c in blocks:
        size = len(b) + len(c.instrs)
        table += [start, size]
        start += size
    flat = [MAGIC, VERSION, start, len(args), len(blocks), ISA_HASH, *arg_words, *table]
    for b, c in blocks:
        flat += b
        flat += c.instr_list
    # one conversion of a Python list (cheaper than slice fills), then into immutable bytes: the
    # Program owns them without another copy
    try:
        data = np.array(flat, np.int64).tobytes()
    except OverflowError:   # a size, stride or offset beyond int64: the limits reject it first
        raise ShapeError("a size, stride or offset of this kernel instance does not fit in 64 bits") from None
    return Program(np.frombuffer(data, np.int64))


__all__ = ["ArgSpec", "NeedsCopy", "encode_program", "encode_kernel", "ARG_IN", "ARG_OUT", "ARG_WS",
           "OPND_INDEX"]
