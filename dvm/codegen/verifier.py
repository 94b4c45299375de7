"""The verifier: every Program passes it before any VM runs it.

`verify(program)` checks the structure once per Program object and returns its ProgramLayout.
A kernel's stream checks (sections, operands, constants, instructions: verifier_stream) are
memoized on every word of its block but the instance words (BM, BN, sizes, operand offsets and
strides, constant values) and on the arguments' roles and dtypes (Stream): a kernel at a new size
pays only the header, size, tile, single-tile, store-stride and bounds checks.
`check_buffers(layout, buffers)` checks, before every execution, that the buffers match the
argument table and that every element the program can touch lies inside its buffer.
Violations raise VerifyError(rule, message, index, kernel). Rules (stable ids):

  header, version, length, args, kernel_table, domain, sections, opcode, section_kind,
  unused_field, register, register_class, read_before_write, loop_carried, dst_alias,
  operand, operand_table, constant, dtype_code, store_target, store_broadcast, single_tile,
  bounds, buffers, isa, size_limit, tile_shape, store_overlap

What a verified Program guarantees a VM (and what VMs may assume without checking again):
- its words are immutable (codegen.program) and the layout is computed from exactly them;
- every size, stride and offset is within the limits of codegen.limits: each dimension and
  rows x cols <= MAX_ELEMS, each |stride| <= MAX_ELEMS and |offset| + sum (size-1)|stride| <=
  MAX_ELEMS for every operand, each declared numel <= MAX_ELEMS, so no element index, byte
  offset (x 8), stride x tile extent or tile count overflows int64;
- tiles: 1 <= BM <= TILE_SLACK x pow2(rows), 1 <= BN <= TILE_SLACK x pow2(cols) (pow2: the next
  power of two, 1 for 0), BM x BN <= MAX_TILE, so the lanes a kernel computes are < 16 x
  max(rows, 1) x max(cols, 1) per instruction and sweep (`ProgramLayout.work` is the bound, in
  lane-instructions);
- the cost of verifying is linear in the Program's length (closed forms per kernel and
  operand; nothing iterates over tiles, rows or columns).
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from ..errors import VerifyError
from ..graph.dtypes import DType
from . import isa, lru
from .limits import MAX_ELEMS, pow2_at_least
from .program import (ARG_IN, ARG_ROLES, ARG_WORDS, CONST_WORDS, HEADER_WORDS, ISA_HASH_WORD,
                      KHEAD_WORDS, KTABLE_WORDS, MAGIC, MAX_ARGS, MAX_DIMS, MAX_KERNELS, MAX_REGS,
                      MAX_SWEEPS, MAX_TILE,
                      OPND_FIXED_WORDS, SWEEP_WORDS, VERSION, ArgInfo, KernelLayout, Program, ProgramLayout)
from .verifier_stream import CACHES, N_DTYPES, Stream, cached_stream

_NP_DTYPES = tuple(DType(c).np_dtype for c in range(N_DTYPES))
# shared ArgInfo objects: a model keeps a layout per segment and size, and the garbage collector
# walks every ArgInfo (a NamedTuple stays tracked); most repeat (inputs have numel 0). 4096 entries
# of ~100 bytes: bounded by entries alone
_arg_info = lru_cache(maxsize=4096)(ArgInfo)
INSTANCE_INDEX_ENTRIES = 256
# a tile side may be up to twice the next power of two of its extent: the encoder's are at most
# the power of two; VMs are tested with the double (tests/test_cpu_rows.py)
TILE_SLACK = 2
_INSTANCE_INDEX = lru.BoundedDict(CACHES, INSTANCE_INDEX_ENTRIES)


def verify(program: Program) -> ProgramLayout:
    """Check `program` and return its layout (cached on the Program)."""
    layout = program.layout
    if layout is None:
        layout = _verify_words(program.words)
        program.attach_layout(layout)
    return layout


def _verify_words(w: np.ndarray) -> ProgramLayout:
    n = len(w)
    if n < HEADER_WORDS:
        raise VerifyError("header", f"program has {n} words, the header alone needs {HEADER_WORDS}")
    if int(w[0]) != MAGIC:
        raise VerifyError("header", f"bad magic {int(w[0]):#x}")
    if int(w[1]) != VERSION:
        raise VerifyError("version", f"format version {int(w[1])}, this DVM reads version {VERSION}")
    if int(w[2]) != n:
        raise VerifyError("length", f"header says {int(w[2])} words, the array has {n}")
    if int(w[ISA_HASH_WORD]) != isa.ISA_HASH:
        raise VerifyError("isa", f"encoded for the ISA with hash {int(w[ISA_HASH_WORD]):#x}; this DVM's "
                                 f"ISA table has hash {isa.ISA_HASH:#x} (opcodes would mean other instructions)")
    n_args, n_kernels = int(w[3]), int(w[4])
    if not 0 <= n_args <= MAX_ARGS or not 1 <= n_kernels <= MAX_KERNELS:
        raise VerifyError("header", f"bad counts: {n_args} args, {n_kernels} kernels")
    pos = HEADER_WORDS
    end_tables = pos + n_args * ARG_WORDS + n_kernels * KTABLE_WORDS
    if end_tables > n:
        raise VerifyError("length", "argument and kernel tables run past the end")
    head = w[:end_tables].tolist()
    args = []
    for a in range(n_args):
        role, dt, numel = head[pos:pos + ARG_WORDS]
        pos += ARG_WORDS
        if role not in ARG_ROLES or not 0 <= dt < N_DTYPES or numel < 0:
            raise VerifyError("args", f"argument {a}: role {role}, dtype {dt}, numel {numel}")
        if numel > MAX_ELEMS:
            raise VerifyError("size_limit", f"argument {a} declares {numel} elements, over the limit {MAX_ELEMS}")
        args.append(_arg_info(role, dt, numel))
    # what a stream's checks read of the argument table: the count, roles and dtypes (not sizes)
    args_key = n_args.to_bytes(8, "little") + \
        w[HEADER_WORDS:HEADER_WORDS + n_args * ARG_WORDS].reshape(n_args, ARG_WORDS)[:, :2].tobytes()
    kernels, prev_end = [], end_tables
    for k in range(n_kernels):
        off, length = head[pos], head[pos + 1]
        pos += KTABLE_WORDS
        if off != prev_end or length < KHEAD_WORDS or off + length > n:
            raise VerifyError("kernel_table", f"kernel {k} at [{off}, {off + length}) does not follow "
                                              f"the previous block ending at {prev_end} inside {n} words")
        prev_end = off + length
        kernels.append(_verify_kernel(w[off:off + length], args_key, args, k))
    kernels, streams, touched = zip(*kernels)
    if prev_end != n:
        raise VerifyError("length", f"{n - prev_end} trailing words after the last kernel")
    extents = _extents(len(args), kernels, touched)
    for a, (info, ext) in enumerate(zip(args, extents)):
        if info.role != ARG_IN and ext is not None and (ext[0] < 0 or ext[1] >= info.numel):
            raise VerifyError("bounds", f"argument {a} ({ARG_ROLES[info.role]}) holds {info.numel} "
                                        f"elements but the program touches [{ext[0]}, {ext[1]}]")
    checks = tuple((_NP_DTYPES[a.dtype], a.role != ARG_IN, ext) for a, ext in zip(args, extents))
    work = sum(_work(kl, st) for kl, st in zip(kernels, streams))
    return ProgramLayout(tuple(args), tuple(kernels), tuple(extents), checks, w, work)


def _verify_kernel(kw: np.ndarray, args_key: bytes, args: list[ArgInfo], k: int) -> tuple[KernelLayout, Stream, dict]:
    """The kernel block's layout, its stream, and the element range each operand touches."""
    h = kw[:KHEAD_WORDS].tolist()
    nr, nc, bm, bn, n_opnd, n_const, n_instr, n_sweeps = h[:8]
    nregs = tuple(h[8:12])
    nd = nr + nc
    if not (0 <= nr and 0 <= nc and nd <= MAX_DIMS and 1 <= bm and 1 <= bn and bm * bn <= MAX_TILE
            and 0 <= n_opnd <= 4096 and 0 <= n_const <= 4096 and 0 <= n_instr <= 65536
            and 1 <= n_sweeps <= MAX_SWEEPS and all(0 <= r <= MAX_REGS for r in nregs)):
        raise VerifyError("domain", f"bad kernel header {h}", kernel=k)
    opnd_words = OPND_FIXED_WORDS + nd
    need = KHEAD_WORDS + nd + 2 + SWEEP_WORDS * n_sweeps + opnd_words * n_opnd \
        + CONST_WORDS * n_const + isa.WORDS * n_instr
    if need != len(kw):
        raise VerifyError("length", f"kernel block has {len(kw)} words, its header implies {need}", kernel=k)
    dims = kw[KHEAD_WORDS:KHEAD_WORDS + nd].tolist()
    rows, cols = _check_domain(dims, nr, bm, bn, k)
    counts = (nd, n_sweeps, n_opnd, n_const)
    stream = cached_stream(kw, _instance_words(counts), args_key, args, k, counts)
    pos = KHEAD_WORDS + nd + 2 + SWEEP_WORDS * n_sweeps
    opnd = kw[pos:pos + opnd_words * n_opnd].reshape(n_opnd, opnd_words)
    pos += opnd_words * n_opnd
    consts = kw[pos:pos + CONST_WORDS * n_const].reshape(n_const, CONST_WORDS)
    strides = opnd[:, 4:]   # a view of the immutable words, like the offsets and constants
    stride_list = strides.tolist()
    touched = _operand_ranges(dims, nr, rows, cols, opnd[:, 3].tolist(), stride_list, stream, k)
    # the instance's own words are views of the (immutable) Program; the rest is the stream's
    layout = KernelLayout(tuple(dims[:nr]), tuple(dims[nr:]), bm, bn, nregs, stream.prologue, stream.sweeps,
                          stream.opnd_kind, stream.opnd_arg, stream.opnd_dtype, opnd[:, 3],
                          strides, stream.const_bank, consts[:, 1], stream.instrs, stream)
    if stream.single_tile_at >= 0 and cols > bn:
        raise VerifyError("single_tile", f"single-tile instructions need every row in one tile, but "
                                         f"{cols} columns exceed BN={bn}", stream.single_tile_at, k)
    _check_stores(layout, stream, stride_list, touched, k)
    return layout, stream, touched


def _check_domain(dims: list[int], nr: int, bm: int, bn: int, k: int) -> tuple[int, int]:
    """Sizes within the limits and a tile not much larger than the domain (each side at most
    TILE_SLACK x the next power of two of its extent): the lanes a kernel computes stay below 16x
    its domain."""
    rows = cols = 1
    for i, d in enumerate(dims):
        if d < 0:
            raise VerifyError("domain", f"negative size in {dims}", kernel=k)
        if d > MAX_ELEMS:
            raise VerifyError("size_limit", f"size {d} over the limit {MAX_ELEMS}", kernel=k)
        if i < nr:
            rows *= d
        else:
            cols *= d
    if rows * cols > MAX_ELEMS:
        raise VerifyError("size_limit", f"domain of {rows} x {cols} elements over the limit {MAX_ELEMS}", kernel=k)
    if bm > TILE_SLACK * pow2_at_least(rows) or bn > TILE_SLACK * pow2_at_least(cols):
        raise VerifyError("tile_shape", f"tile {bm}x{bn} is over {TILE_SLACK}x the domain {rows}x{cols} "
                                        "rounded up to powers of two", kernel=k)
    return rows, cols


def _operand_ranges(dims: list[int], nr: int, rows: int, cols: int, offsets: list[int], strides: list[list[int]],
                    stream: Stream, k: int) -> dict[int, tuple[int, int]]:
    """Every operand within the limits: each |stride| <= MAX_ELEMS and its element indices over
    the whole domain within [-MAX_ELEMS, MAX_ELEMS] (every partial sum offset + sum of
    index x stride then lies in that range too, in any order). Returns, per operand a body or
    finalize section loads or stores, the (lowest, highest) element it touches (the row dims
    only when only finalize sections use it: they address column 0)."""
    out = {}
    used = stream.used
    for j, st in enumerate(strides):
        lo = hi = lo_rows = hi_rows = offsets[j]
        for d, s in enumerate(st):
            if s > MAX_ELEMS or s < -MAX_ELEMS:
                raise VerifyError("size_limit", f"operand {j}: stride {s} over the limit {MAX_ELEMS}", kernel=k)
            if d == nr:
                lo_rows, hi_rows = lo, hi
            n = dims[d]
            if n > 1:
                if s < 0:
                    lo += (n - 1) * s
                else:
                    hi += (n - 1) * s
        if lo < -MAX_ELEMS or hi > MAX_ELEMS:
            raise VerifyError("size_limit", f"operand {j}: offset {offsets[j]} and strides {st} reach [{lo}, {hi}], "
                                            f"beyond the limit {MAX_ELEMS}", kernel=k)
        secs = used.get(j)
        if secs is None or rows == 0 or ("F" not in secs and cols == 0):
            continue
        out[j] = (lo, hi) if ("B" in secs and cols > 0) or nr == len(dims) else (lo_rows, hi_rows)
    return out


def _work(kl: KernelLayout, stream: Stream) -> int:
    """Lane-instructions a VM runs for this kernel at most: per row block of BM rows, the init
    and fin instructions over one tile and the body's over every column tile (the prologue once)."""
    row_blocks, col_tiles = -(-kl.rows // kl.bm), -(-kl.cols // kl.bn)
    lanes = kl.bm * kl.bn
    per_block = stream.per_row_block + col_tiles * stream.per_tile
    return lanes * (row_blocks * per_block + stream.prologue[1] - stream.prologue[0])


def _instance_words(counts: tuple[int, int, int, int]) -> np.ndarray:
    """Positions, in a kernel block with these counts (dims, sweeps, operands, constants), of the
    words that may differ between instances of one stream (BM, BN, sizes, operand offsets and
    strides, constant values)."""
    idx = _INSTANCE_INDEX.get(counts)
    if idx is not None:
        return idx
    nd, n_sweeps, n_opnd, n_const = counts
    opnd_words = OPND_FIXED_WORDS + nd
    at = KHEAD_WORDS + nd + 2 + SWEEP_WORDS * n_sweeps
    pos = [2, 3, *range(KHEAD_WORDS, KHEAD_WORDS + nd)]
    for j in range(n_opnd):
        pos += range(at + j * opnd_words + 3, at + (j + 1) * opnd_words)
    at += opnd_words * n_opnd
    pos += range(at + 1, at + CONST_WORDS * n_const, CONST_WORDS)
    idx = np.array(pos, np.intp)
    return _INSTANCE_INDEX.put(counts, idx, idx.nbytes + 200)


def _check_stores(layout: KernelLayout, stream: Stream, strides: list[list[int]], touched: dict, k: int) -> None:
    """Every store writes each element it touches from one point of the domain (no stride 0 on
    a written dimension, and no two points at one address), and no other operand of the same
    argument touches what a store writes unless it addresses it identically: otherwise the
    result would depend on the order in which a VM visits the domain."""
    sizes = layout.row_sizes + layout.col_sizes
    nr = len(layout.row_sizes)
    for i, j, sec in stream.stores:
        ndims = nr if sec == "F" else len(sizes)
        st = strides[j]
        span = 0   # row-major strides (the encoder's): each exceeds the span of the dims after it
        for d in range(ndims - 1, -1, -1):
            if sizes[d] > 1:
                if st[d] <= span:
                    break
                span += (sizes[d] - 1) * st[d]
        else:
            continue
        _check_store_injective(st, sizes, ndims, i, j, k)
    if not stream.shared:
        return
    offsets = layout.opnd_offset.tolist()
    for i, j, other in stream.shared:
        if offsets[j] == offsets[other] and strides[j] == strides[other]:
            continue
        a, b = touched.get(j), touched.get(other)
        if a is not None and b is not None and a[0] <= b[1] and b[0] <= a[1]:
            raise VerifyError("store_overlap", f"operands {j} (stored) and {other} of argument "
                                               f"{int(layout.opnd_arg[j])} overlap: the result would depend on the "
                                               "order of the VM's tiles", i, k)


def _check_store_injective(st: list[int], sizes: tuple, ndims: int, i: int, j: int, k: int) -> None:
    """Dims sorted by |stride|: each stride exceeds the span of the smaller ones (then no two
    points of the written domain share an address), and none is 0 (store_broadcast)."""
    spread = sorted((abs(st[d]), sizes[d]) for d in range(ndims) if sizes[d] > 1)
    if spread and spread[0][0] == 0:
        raise VerifyError("store_broadcast", "a store operand has stride 0 on a written dimension", i, k)
    span = 0
    for stride, size in spread:
        if stride <= span:
            raise VerifyError("store_overlap", f"store operand {j} writes some element from two points of "
                                               "the domain", i, k)
        span += (size - 1) * stride


def _extents(n_args: int, kernels, touched) -> list[tuple[int, int] | None]:
    """Per argument: the lowest and highest element index any kernel can touch (None: none)."""
    out: list[tuple[int, int] | None] = [None] * n_args
    for kl, ranges in zip(kernels, touched):
        opnd_args = kl.opnd_arg.tolist()
        for j, (lo, hi) in ranges.items():
            a = opnd_args[j]
            prev = out[a]
            out[a] = (lo, hi) if prev is None else (min(lo, prev[0]), max(hi, prev[1]))
    return out


def check_buffers(layout: ProgramLayout, buffers, check_overlap: bool = True) -> None:
    """Run before every execution: buffers match the argument table and hold every touched element."""
    if len(buffers) != len(layout.args):
        raise VerifyError("buffers", f"program takes {len(layout.args)} buffers, got {len(buffers)}")
    for a, (buf, (np_dtype, writable, ext)) in enumerate(zip(buffers, layout.arg_checks)):
        if not isinstance(buf, np.ndarray) or buf.ndim != 1:
            raise VerifyError("buffers", f"buffer {a} must be a 1-D NumPy array")
        if buf.dtype != np_dtype:
            raise VerifyError("buffers", f"buffer {a} has dtype {buf.dtype}, the program expects "
                                         f"{DType(layout.args[a].dtype).short}")
        if writable and not buf.flags.writeable:
            raise VerifyError("buffers", f"buffer {a} ({ARG_ROLES[layout.args[a].role]}) is read-only")
        if ext is not None and (ext[0] < 0 or ext[1] >= len(buf)):
            raise VerifyError("bounds", f"buffer {a} has {len(buf)} elements, the program touches "
                                        f"[{ext[0]}, {ext[1]}]")
    if not check_overlap:
        return
    writable = [a for a, info in enumerate(layout.args) if info.role != ARG_IN]
    for a in writable:
        for b in range(len(buffers)):
            if b != a and layout.extents[b] is not None and np.may_share_memory(buffers[a], buffers[b]):
                raise VerifyError("buffers", f"output buffer {a} overlaps buffer {b}")
