"""The verifier: every Program passes it before any VM runs it.

`verify(program)` checks the structure once per Program object and returns its ProgramLayout.
A kernel's stream checks (sections, operands, constants, instructions) are memoized on every
word of its block but the instance words (BM, BN, sizes, operand offsets and strides, constant
values) and on the arguments' roles and dtypes (Stream): a kernel at a new size pays only the
header, size, single-tile, store-stride and bounds checks. `check_buffers(layout, buffers)` checks, before every execution, that the buffers match the
argument table and that every element the program can touch lies inside its buffer.
Violations raise VerifyError(rule, message, index, kernel). Rules (stable ids):

  header, version, length, args, kernel_table, domain, sections, opcode, section_kind,
  unused_field, register, register_class, read_before_write, loop_carried, dst_alias,
  operand, operand_table, constant, dtype_code, store_target, store_broadcast, single_tile,
  bounds, buffers
"""
from __future__ import annotations

from collections import OrderedDict
from functools import lru_cache
from threading import Lock

import numpy as np

from ..errors import VerifyError
from ..graph.dtypes import DType
from . import isa
from .program import (ARG_IN, ARG_ROLES, ARG_WORDS, CONST_WORDS, HEADER_WORDS,
                      KHEAD_WORDS, KTABLE_WORDS, MAGIC, MAX_DIMS, MAX_REGS, MAX_SWEEPS, MAX_TILE,
                      OPND_ARG, OPND_FIXED_WORDS, OPND_INDEX, SWEEP_WORDS, VERSION, ArgInfo,
                      KernelLayout, Program, ProgramLayout, Sweep)

N_DTYPES = len(DType)
_NP_DTYPES = tuple(DType(c).np_dtype for c in range(N_DTYPES))
# shared ArgInfo objects: a model keeps a layout per segment and size, and the garbage collector
# walks every ArgInfo (a NamedTuple stays tracked); most repeat (inputs have numel 0)
_arg_info = lru_cache(maxsize=4096)(ArgInfo)
_STREAM_CACHE: "OrderedDict[bytes, Stream]" = OrderedDict()
_STREAM_CACHE_SIZE = 4096
_STREAM_LOCK = Lock()


def verify(program: Program) -> ProgramLayout:
    """Check `program` and return its layout (cached on the Program)."""
    if program.layout is None:
        program.layout = _verify_words(program.words)
    return program.layout


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
    n_args, n_kernels = int(w[3]), int(w[4])
    if not 0 <= n_args <= 1024 or not 1 <= n_kernels <= 1024 or int(w[5]) != 0:
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
    kernels, streams = [kl for kl, _ in kernels], [st for _, st in kernels]
    if prev_end != n:
        raise VerifyError("length", f"{n - prev_end} trailing words after the last kernel")
    extents = _extents(args, kernels, streams)
    for a, (info, ext) in enumerate(zip(args, extents)):
        if info.role != ARG_IN and ext is not None and (ext[0] < 0 or ext[1] >= info.numel):
            raise VerifyError("bounds", f"argument {a} ({ARG_ROLES[info.role]}) holds {info.numel} "
                                        f"elements but the program touches [{ext[0]}, {ext[1]}]")
    checks = tuple((_NP_DTYPES[a.dtype], a.role != ARG_IN, ext) for a, ext in zip(args, extents))
    return ProgramLayout(tuple(args), tuple(kernels), tuple(extents), checks)


def _verify_kernel(kw: np.ndarray, args_key: bytes, args: list[ArgInfo], k: int) -> tuple[KernelLayout, "Stream"]:
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
    if any(d < 0 for d in dims):
        raise VerifyError("domain", f"negative size in {dims}", kernel=k)
    stream = _stream(kw, args_key, args, k, (nd, n_sweeps, n_opnd, n_const))
    pos = KHEAD_WORDS + nd + 2 + SWEEP_WORDS * n_sweeps
    opnd = kw[pos:pos + opnd_words * n_opnd].reshape(n_opnd, opnd_words)
    pos += opnd_words * n_opnd
    consts = kw[pos:pos + CONST_WORDS * n_const].reshape(n_const, CONST_WORDS)
    # the instance's own words are views of the (read-only) Program; the rest is the stream's
    layout = KernelLayout(tuple(dims[:nr]), tuple(dims[nr:]), bm, bn, nregs, stream.prologue, stream.sweeps,
                          stream.opnd_kind, stream.opnd_arg, stream.opnd_dtype, opnd[:, 3],
                          np.ascontiguousarray(opnd[:, 4:]), stream.const_bank, consts[:, 1], stream.instrs,
                          stream)
    if stream.single_tile_at >= 0 and layout.cols > bn:
        raise VerifyError("single_tile", f"single-tile instructions need every row in one tile, but "
                                         f"{layout.cols} columns exceed BN={bn}", stream.single_tile_at, k)
    _check_store_strides(layout, stream, k)
    return layout, stream


@lru_cache(maxsize=256)
def _instance_words(nd: int, n_sweeps: int, n_opnd: int, n_const: int) -> np.ndarray:
    """Positions, in a kernel block with these counts, of the words that may differ between
    instances of one stream (BM, BN, sizes, operand offsets and strides, constant values)."""
    opnd_words = OPND_FIXED_WORDS + nd
    at = KHEAD_WORDS + nd + 2 + SWEEP_WORDS * n_sweeps
    idx = [2, 3, *range(KHEAD_WORDS, KHEAD_WORDS + nd)]
    for j in range(n_opnd):
        idx += range(at + j * opnd_words + 3, at + (j + 1) * opnd_words)
    at += opnd_words * n_opnd
    idx += range(at + 1, at + CONST_WORDS * n_const, CONST_WORDS)
    return np.array(idx, np.intp)


def _stream(kw: np.ndarray, args_key: bytes, args: list[ArgInfo], k: int, counts: tuple) -> "Stream":
    """The checked stream of kernel block kw (whose header, length and sizes were checked). Its
    checks read only the block's instance-independent words and the arguments' roles and dtypes,
    so they are memoized on exactly those: a kernel encoded at a new size costs a lookup."""
    masked = kw.copy()
    masked[_instance_words(*counts)] = 0
    key = args_key + masked.tobytes()
    with _STREAM_LOCK:
        stream = _STREAM_CACHE.get(key)
        if stream is not None:
            _STREAM_CACHE.move_to_end(key)
            return stream
    stream = Stream(masked, args, k, counts)
    with _STREAM_LOCK:
        stream = _STREAM_CACHE.setdefault(key, stream)
        _STREAM_CACHE.move_to_end(key)
        if len(_STREAM_CACHE) > _STREAM_CACHE_SIZE:
            _STREAM_CACHE.popitem(last=False)
    return stream


def _check_sections(prologue, sweeps, n_instr, k) -> None:
    ranges = [prologue]
    for sw in sweeps:
        ranges += [sw.init, sw.body, sw.fin]
    expect = 0
    for i, (s, e) in enumerate(ranges):
        if s != expect or e < s:
            name = "prologue" if i == 0 else f"sweep {(i - 1) // 3} {('init', 'body', 'fin')[(i - 1) % 3]}"
            raise VerifyError("sections", f"{name} is [{s}, {e}), expected to start at {expect}", kernel=k)
        expect = e
    if expect != n_instr:
        raise VerifyError("sections", f"sections cover {expect} of {n_instr} instructions", kernel=k)


def _check_operands(opnd: list, args: list[ArgInfo], k: int) -> None:
    for j, (kind, arg, dt) in enumerate(opnd):
        if kind == OPND_INDEX:
            if dt != DType.INT64 or arg != 0:
                raise VerifyError("operand_table", f"index operand {j} must be int64 with arg 0", kernel=k)
        elif kind == OPND_ARG:
            if not 0 <= arg < len(args):
                raise VerifyError("operand_table", f"operand {j} names argument {arg} of {len(args)}", kernel=k)
            if dt != args[arg].dtype:
                raise VerifyError("operand_table", f"operand {j} has dtype {dt}, argument {arg} has "
                                                   f"{args[arg].dtype}", kernel=k)
        else:
            raise VerifyError("operand_table", f"operand {j} has unknown kind {kind}", kernel=k)


class Stream:
    """A kernel's checked instruction stream with what does not change between its instances:
    sections, operand kinds, arguments and dtypes, constant banks, instructions (read-only arrays
    shared by every KernelLayout of the stream), and the facts later checks need: which operands
    the body and finalize sections load or store (instruction index of each; 'B' whole domain,
    'F' column 0 of every row: finalize loads/stores and storerow) and the first single-tile
    instruction, if any. `derived`: what a VM derives from the stream alone, cached by the VM."""
    __slots__ = ("nregs", "prologue", "sweeps", "opnd_kind", "opnd_arg", "opnd_dtype", "const_bank", "instrs",
                 "used", "stores", "single_tile_at", "derived")

    def __init__(self, masked: np.ndarray, args: list[ArgInfo], k: int, counts: tuple):
        nd, n_sweeps, n_opnd, n_const = counts
        lst = masked.tolist()
        self.nregs = tuple(lst[8:12])
        pos = KHEAD_WORDS + nd
        self.prologue = (lst[pos], lst[pos + 1])
        pos += 2
        sweeps = []
        for _ in range(n_sweeps):
            s = lst[pos:pos + SWEEP_WORDS]
            sweeps.append(Sweep((s[0], s[1]), (s[2], s[3]), (s[4], s[5])))
            pos += SWEEP_WORDS
        self.sweeps = tuple(sweeps)
        n_instr = lst[6]
        _check_sections(self.prologue, sweeps, n_instr, k)
        opnd_words = OPND_FIXED_WORDS + nd
        opnd = masked[pos:pos + opnd_words * n_opnd].reshape(n_opnd, opnd_words)
        _check_operands([lst[pos + j * opnd_words:pos + j * opnd_words + 3] for j in range(n_opnd)], args, k)
        pos += opnd_words * n_opnd
        const_bank = masked[pos:pos + CONST_WORDS * n_const:CONST_WORDS]
        if n_const and (const_bank.min() < 0 or const_bank.max() >= len(isa.BANKS)):
            raise VerifyError("constant", "constant with an unknown bank", kernel=k)
        pos += CONST_WORDS * n_const
        self.opnd_kind, self.opnd_arg, self.opnd_dtype = (opnd[:, c].copy() for c in range(3))
        self.const_bank = const_bank.copy()
        self.instrs = masked[pos:].reshape(n_instr, isa.WORDS).copy()
        for a in (self.opnd_kind, self.opnd_arg, self.opnd_dtype, self.const_bank, self.instrs):
            a.flags.writeable = False
        self.derived: dict = {}
        _check_stream(self, args, k)
        self._find_accesses()

    def _find_accesses(self) -> None:
        self.used: dict[int, str] = {}
        self.stores: list[tuple[int, int, str]] = []  # (instruction, operand, section)
        self.single_tile_at = -1
        for sec, rngs in (("B", [sw.body for sw in self.sweeps]), ("F", [sw.fin for sw in self.sweeps])):
            for s, e in rngs:
                for i in range(s, e):
                    spec = isa.BY_CODE[int(self.instrs[i, 0])]
                    if spec.group in ("rowred", "storerow") and self.single_tile_at < 0:
                        self.single_tile_at = i
                    if spec.group in ("load", "store", "storerow"):
                        j = int(self.instrs[i, 2])
                        access = "F" if spec.group == "storerow" else sec
                        self.used[j] = self.used.get(j, "") + access
                        if spec.group != "load":
                            self.stores.append((i, j, access))


def _check_stream(stream: "Stream", args: list[ArgInfo], k: int) -> None:
    UNDEF, KEEP, LOCAL = 0, 1, 2
    state = [[UNDEF] * n for n in stream.nregs]
    section_of = {}
    ranges = [("P", stream.prologue)]
    for sw in stream.sweeps:
        ranges += [("I", sw.init), ("B", sw.body), ("F", sw.fin)]
    n_opnd, n_const = len(stream.opnd_kind), len(stream.const_bank)
    from_prologue: set = set()   # registers still holding the value the prologue wrote
    rowloop_reads: set = set()   # ... of which the row-block loop has read
    for sec, (s, e) in ranges:
        outer_reads: set = set()
        for i in range(s, e):
            section_of[i] = sec
            row = stream.instrs[i]
            spec = isa.BY_CODE.get(int(row[0]))
            if spec is None:
                raise VerifyError("opcode", f"unknown opcode {int(row[0])}", i, k)
            if sec not in spec.sections:
                raise VerifyError("section_kind", f"{spec.name} may not appear in section {sec}", i, k)
            for f in range(len(spec.fields), isa.MAX_FIELDS):
                if int(row[1 + f]) != 0:
                    raise VerifyError("unused_field", f"{spec.name} field {f} must be 0", i, k)
            regs = []
            for f, fld in enumerate(spec.fields):
                v = int(row[1 + f])
                if fld.is_reg:
                    if not 0 <= v < stream.nregs[fld.bank]:
                        raise VerifyError("register", f"{spec.name}: register {fld.bank.short}:{v} out of "
                                                      f"range ({stream.nregs[fld.bank]})", i, k)
                    regs.append((fld.role, fld.bank, v))
                elif fld.role == "o":
                    _check_operand_use(spec, v, stream, args, n_opnd, i, k)
                elif fld.role == "k":
                    if not 0 <= v < n_const:
                        raise VerifyError("constant", f"constant {v} of {n_const}", i, k)
                    if int(stream.const_bank[v]) != spec.bank:
                        raise VerifyError("register_class", f"{spec.name} reads a {isa.BANKS[int(stream.const_bank[v])].short} "
                                                            "constant", i, k)
                elif fld.role == "t":
                    if not 0 <= v < N_DTYPES or DType(v).bank != spec.bank:
                        raise VerifyError("dtype_code", f"{spec.name}: target dtype code {v}", i, k)
            writes = [(b, r) for role, b, r in regs if role in "dm"]
            reads = [(b, r) for role, b, r in regs if role in "sm"]
            plain_reads = [(b, r) for role, b, r in regs if role == "s"]
            if len(set(writes)) != len(writes) or set(writes) & set(plain_reads) or \
                    len(set(plain_reads) & set(writes)):
                raise VerifyError("dst_alias", f"{spec.name}: a destination register is also a source", i, k)
            for b, r in reads:
                if state[b][r] == UNDEF:
                    raise VerifyError("read_before_write", f"{spec.name} reads {b.short}:{r} before any "
                                                           "write that reaches it", i, k)
                if sec == "B" and state[b][r] == KEEP:
                    outer_reads.add((b, r))
                if sec != "P" and (b, r) in from_prologue:
                    rowloop_reads.add((b, r))
            for role, b, r in regs:
                if role == "m" and (sec != "B" or state[b][r] != KEEP):
                    raise VerifyError("read_before_write", f"{spec.name}: accumulator {b.short}:{r} is not "
                                                           "initialized in this sweep", i, k)
                if role == "d":
                    if sec == "B" and (b, r) in outer_reads:
                        raise VerifyError("loop_carried", f"{spec.name} overwrites {b.short}:{r}, which this "
                                                          "body read earlier (a value carried across tiles)", i, k)
                    if sec != "P" and (b, r) in rowloop_reads:
                        raise VerifyError("loop_carried", f"{spec.name} overwrites {b.short}:{r}, a prologue "
                                                          "value the next row block reads again", i, k)
                    state[b][r] = LOCAL if sec == "B" else KEEP
                    (from_prologue.add if sec == "P" else from_prologue.discard)((b, r))
        if sec == "B":
            for bank_state in state:
                for r, st in enumerate(bank_state):
                    if st == LOCAL:
                        bank_state[r] = UNDEF


def _check_operand_use(spec, v, stream, args, n_opnd, i, k) -> None:
    if not 0 <= v < n_opnd:
        raise VerifyError("operand", f"{spec.name}: operand {v} of {n_opnd}", i, k)
    kind = int(stream.opnd_kind[v])
    if (spec.group == "index") != (kind == OPND_INDEX):
        raise VerifyError("operand", f"{spec.name} cannot use operand {v} of kind {kind}", i, k)
    if spec.group in ("load", "store", "storerow") and DType(int(stream.opnd_dtype[v])).bank != spec.bank:
        raise VerifyError("register_class", f"{spec.name} on operand {v} of dtype "
                                            f"{DType(int(stream.opnd_dtype[v])).short}", i, k)
    if spec.group in ("store", "storerow") and args[int(stream.opnd_arg[v])].role == ARG_IN:
        raise VerifyError("store_target", f"{spec.name} writes input argument {int(stream.opnd_arg[v])}", i, k)


def _check_store_strides(layout: KernelLayout, stream: "Stream", k: int) -> None:
    nr = len(layout.row_sizes)
    for i, j, sec in stream.stores:
        strides, sizes = layout.opnd_strides[j], layout.row_sizes + layout.col_sizes
        for d in range(nr if sec == "F" else len(sizes)):
            if strides[d] == 0 and sizes[d] > 1:
                raise VerifyError("store_broadcast", "a store operand has stride 0 on a written "
                                                     "dimension", i, k)


def _extents(args: list[ArgInfo], kernels: list[KernelLayout], streams: list[Stream]):
    out: list[tuple[int, int] | None] = [None] * len(args)
    for kl, stream in zip(kernels, streams):
        nr = len(kl.row_sizes)
        sizes = kl.row_sizes + kl.col_sizes
        offsets, strides, opnd_args = kl.opnd_offset.tolist(), kl.opnd_strides.tolist(), kl.opnd_arg.tolist()
        for j, secs in stream.used.items():
            if kl.rows == 0 or ("F" not in secs and kl.cols == 0):
                continue
            ndims = len(sizes) if "B" in secs and kl.cols > 0 else nr
            lo = hi = offsets[j]
            for size, stride in zip(sizes[:ndims], strides[j]):
                reach = (size - 1) * stride
                if reach < 0:
                    lo += reach
                else:
                    hi += reach
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
