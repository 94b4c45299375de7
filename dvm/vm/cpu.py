"""The CPU VM: runs verified Programs with a numba interpreter compiled once and cached on disk.

Same contract and semantics as dvm.vm.reference.run. The dispatch is derived from the ISA table
at import time: every opcode is decoded to (group, op, bank, source bank, elementwise kind) in
this module's own numbering (cpu_kernels / cpu_interp / cpu_entry), passed to the compiled code as an array.

Threads: work units are row blocks (each runs all sweeps of its rows, so reductions never cross
threads and results do not depend on the thread count), or, for kernels with one sweep and no
init/fin, single tiles. For a big kernel the caller and DVM_NUM_THREADS - 1 persistent workers
(cpu_threads) claim chunks of units from an atomic counter (the compiled code releases the GIL);
numba's own threading layer is never used.
"""
from __future__ import annotations

import hashlib
from functools import lru_cache
from typing import Callable

import numpy as np

from ..codegen import isa
from ..config import config
from ..codegen.program import ARG_IN, MAX_REGS, KernelLayout, ProgramLayout
from ..graph.dtypes import DType
from .buffers import data_ptr
from . import cpu_entry as ce
from . import cpu_interp as ci
from . import cpu_kernels as ck
from . import (cpu_bits, cpu_compile, cpu_fused, cpu_math, cpu_mem, cpu_moves, cpu_reduce, cpu_rowlevel, cpu_rownorm,
               cpu_rowpart, cpu_sync, cpu_unbin, cpu_vtree)
from .contract import VM
from .cpu_fuse_plan import whole_row_forms, writes_f
from ..codegen.target import Target
from .cpu_fused import FUSE_WIDTH
from .cpu_stream import BANK_CODE as _BANK, StreamPlan, stream_plan
from .cpu_threads import Workers

assert ce.MAX_REGS == MAX_REGS
PARALLEL_MIN_ELEMS = 1 << 16   # below this a kernel runs on the calling thread

_BANK_NAME = {ck.BK_F32: "f32", ck.BK_F64: "f64", ck.BK_I64: "i64", ck.BK_B8: "b8"}
_GROUP = {"load": ck.G_LOAD, "store": ck.G_STORE, "const": ck.G_CONST, "index": ck.G_INDEX,
          "cast": ck.G_CAST, "ew": ck.G_EW, "accinit": ck.G_ACCINIT, "acc": ck.G_ACC, "rfin": ck.G_RFIN,
          "rowred": ck.G_ROWRED, "storerow": ck.G_STOREROW}
_KIND_NAME = {ck.K_UN: "un", ck.K_PRED: "pred", ck.K_BIN: "bin", ck.K_CMP: "cmp", ck.K_WHERE: "where",
              ck.K_CLAMP: "clamp"}
# The Program format fixes the dtype codes; the compiled code uses them directly.
assert [int(d) for d in (DType.BOOL, DType.INT32, DType.INT64, DType.FLOAT16, DType.BFLOAT16,
                         DType.FLOAT32, DType.FLOAT64)] == [ck.DT_BOOL, ck.DT_I32, ck.DT_I64, ck.DT_F16,
                                                            ck.DT_BF16, ck.DT_F32, ck.DT_F64]


def _ew_kind(spec: isa.InstrSpec) -> int:
    if spec.op == "where":
        return ck.K_WHERE
    if spec.op == "clamp":
        return ck.K_CLAMP
    n_in = sum(1 for f in spec.fields if f.role == "s")
    same = spec.fields[0].bank == spec.bank
    if n_in == 1:
        return ck.K_UN if same else ck.K_PRED
    return ck.K_BIN if same else ck.K_CMP


def _decode(spec: isa.InstrSpec) -> tuple[int, int, int, int, int, int]:
    """Decoded row; group -1 (the VM reports 'unhandled' if it meets one) for unknown forms."""
    return _decode5(spec) + (writes_f(spec),)


def _decode5(spec: isa.InstrSpec) -> tuple[int, int, int, int, int]:
    if spec.group not in _GROUP or spec.bank not in _BANK:
        return -1, 0, 0, 0, 0
    bank = _BANK[spec.bank]
    op = src = kind = 0
    if spec.group == "cast":
        src = _BANK[spec.fields[1].bank]
    elif spec.group == "ew":
        if spec.op not in ck.EW_NAMES:
            return -1, 0, 0, 0, 0
        op, kind = ck.EW_NAMES.index(spec.op), _ew_kind(spec)
    elif spec.group in ("accinit", "acc", "rfin", "rowred"):
        if spec.op not in ck.RED_NAMES:
            return -1, 0, 0, 0, 0
        op = ck.RED_NAMES.index(spec.op)
    return _GROUP[spec.group], op, bank, src, kind


def _build_decode_table() -> np.ndarray:
    dec = np.full((isa.MAX_OPCODE + 1, 6), -1, np.int64)
    for spec in isa.ISA:
        dec[spec.code] = _decode(spec)
    return dec


DECODE = _build_decode_table()


def handled(spec: isa.InstrSpec) -> bool:
    """Whether the compiled dispatch implements `spec` (mirrors cpu_interp._exec / cpu_kernels)."""
    g, op, bank, src, kind, _ = _decode(spec)
    if g < 0:
        return False
    if spec.group == "ew":
        return spec.op in ck.HANDLED.get((_KIND_NAME[kind], bank), ())
    if spec.group in ("accinit", "acc", "rfin", "rowred"):
        return spec.op in ck.REDUCTIONS_HANDLED.get(bank, ())
    return True   # load/store/storerow/const/index/cast: every bank (and source bank) is dispatched


def _salt_cache() -> None:
    """Numba's disk cache only checks the entry point's own file; fold the helpers in too (and
    store the entry point lean: cpu_compile.lean_cache)."""
    h = hashlib.sha256()
    for mod in (cpu_bits, cpu_math, ck, cpu_mem, cpu_moves, cpu_reduce, cpu_rowlevel, cpu_rowpart, cpu_rownorm, cpu_fused,
                cpu_sync, cpu_unbin, cpu_vtree, ci, ce):
        with open(mod.__file__, "rb") as f:
            h.update(f.read())
    salt = h.hexdigest()[:16]
    cpu_compile.lean_cache(cpu_sync.tsc_now)   # the default load refreshed numba's registries: 69 ms, lean 5
    for disp in ce.ENTRY_POINTS:
        cpu_compile.lean_cache(disp)
        try:
            cf = disp._cache._cache_file
            if not (isinstance(cf._source_stamp, tuple) and cf._source_stamp[-1:] == (salt,)):
                cf._source_stamp = (cf._source_stamp, salt)
        except AttributeError:  # pragma: no cover - numba internals changed; default invalidation
            pass


_salt_cache()


_WORKERS = Workers(DECODE)


_NO_SCHED = np.zeros(0, np.int64)


def _run_units(d: "_Desc", args: tuple, threads: int | None) -> int:
    """Run one kernel's work units; returns the VM's error code. Big kernels are shared with
    DVM_NUM_THREADS - 1 worker threads: the caller starts at once and workers join when they
    wake up (a sleeping worker's handoff costs 14-60 us on this machine; a spinning one's ~0.1
    us, see cpu_sync), claiming chunks of units from an atomic counter (cpu_entry._exec_units),
    so a late worker costs nothing. numba's threading layer is never started: its spinning
    OpenMP threads slow PyTorch in the same process 10-40x."""
    nthreads = 1
    if d.work >= PARALLEL_MIN_ELEMS:
        nthreads = min(config().threads if threads is None else max(1, int(threads)), d.n_units)
    if nthreads == 1:
        return ce.run_units(0, d.n_units, *args, _NO_SCHED, False)
    _WORKERS.ensure(nthreads - 1)
    return _WORKERS.launch(d, args, nthreads - 1)


def _check(err: int) -> None:
    if err == ck.ERR_ZERODIV:
        raise ZeroDivisionError("integer division or remainder by zero")
    if err != 0:
        raise NotImplementedError(f"CPU VM: unhandled instruction (error {err})")


def _run_kernels(descs, bufs: np.ndarray, threads: int | None) -> None:
    """The kernels in order (sequence stacking: kernel i+1 starts after kernel i finished)."""
    for d in descs:
        if d.n_units:
            _check(_run_units(d, (d.blob, DECODE, bufs), threads))


ROW_MAJOR_MIN_BN = 8   # reducing kernels with narrower tiles use column-major registers (_transposed)


def _transposed(kl: KernelLayout, plan: StreamPlan) -> bool:
    """Column-major registers (lane (r, k) at k*BM + r) for a reducing kernel whose rows are
    very narrow (a tree level is then one loop over BM rows instead of a short loop per row) or
    whose operands are contiguous along the kept axis (a column of the tile is then a contiguous
    run). The layout is invisible: every lane holds the same value and the tree pairs the same
    lanes. Argmax/argmin keep the row-major form."""
    if kl.bm == 1 or kl.bn == 1 or not kl.row_sizes or not kl.col_sizes or not plan.reduces:
        return False
    nr = len(kl.row_sizes)
    strides = np.asarray(kl.opnd_strides).reshape(len(kl.opnd_kind), -1)
    if any(int(st[nr - 1]) == 1 and int(st[-1]) not in (0, 1) for st in strides):
        return True   # contiguous along the kept axis (a sum over axis 0): whatever the width
    # A column-major tile of row-major data is loaded by strided reads (~0.5 ns an element), so
    # from 8 lanes whole rows reduce faster in row-major tiles, in registers (cpu_vtree.vtree_n
    # for any width). 70 K elements, one thread, column- against row-major (us): 17 columns:
    # sum 30 / 12, softmax 76 / 56, LayerNorm 90 / 49, RMSNorm 75 / 27; 63 columns: sum 44 / 7.5,
    # LayerNorm 145 / 36; 8: sum 28 / 16, softmax 69 / 77, LayerNorm 81 / 70; 4: sum 27 / 27,
    # softmax 67 / 147, LayerNorm 81 / 138 (/tmp/w/narrow.py in the notes of issue 3).
    return kl.bn < ROW_MAJOR_MIN_BN


class _Desc:
    __slots__ = ("instrs", "meta", "dims", "optab", "consts", "tile_par", "n_units", "work", "peep", "argst",
                 "blob", "transposed", "rio", "fuse")

    def __init__(self, kl: KernelLayout, n_args: int):
        nr, nc = len(kl.row_sizes), len(kl.col_sizes)
        rows, cols = kl.rows, kl.cols
        plan = stream_plan(kl, n_args)
        self.instrs, self.rio, self.peep, self.fuse, self.argst = plan[:5]
        self.transposed = _transposed(kl, plan)
        meta = [nr, nc, kl.bm, kl.bn, rows, cols, *kl.nregs, len(kl.sweeps), *kl.prologue, int(self.transposed)]
        assert len(meta) == cpu_mem.M_SW
        for sw in kl.sweeps:
            meta += [*sw.init, *sw.body, *sw.fin]
        self.meta = np.array(meta, np.int64)
        self.dims = np.array(list(kl.row_sizes) + list(kl.col_sizes) + [0], np.int64)
        n_opnd = len(kl.opnd_kind)
        optab = np.zeros((n_opnd, 4 + nr + nc), np.int64)
        if n_opnd:
            optab[:, 0], optab[:, 1], optab[:, 2] = kl.opnd_kind, kl.opnd_arg, kl.opnd_dtype
            optab[:, 3] = kl.opnd_offset
            optab[:, 4:] = kl.opnd_strides.reshape(n_opnd, nr + nc)
        self.optab = optab
        self.consts = np.array(kl.const_bits, np.int64).reshape(-1).copy()
        sw0 = kl.sweeps[0]
        self.tile_par = (len(kl.sweeps) == 1 and sw0.init[0] == sw0.init[1] and sw0.fin[0] == sw0.fin[1])
        n_rb = -(-rows // kl.bm)
        n_ct = -(-cols // kl.bn)
        self.n_units = n_rb * n_ct if self.tile_par else n_rb
        self.work = rows * max(cols, 1) * len(kl.sweeps)
        self.blob = None   # set by _prog (needs the program's element sizes)


def _desc(kl: KernelLayout, n_args: int) -> _Desc:
    d = kl.__dict__.get("_cpu_desc")
    if d is None:
        d = _Desc(kl, n_args)
        object.__setattr__(kl, "_cpu_desc", d)   # cache on the (immutable) layout
    return d


def _pack(d: _Desc, argsz: np.ndarray) -> np.ndarray:
    """The descriptor as one int64 array (layout: cpu_entry.P_*)."""
    segs = [d.instrs, d.peep, d.meta, d.dims, d.optab, d.consts, argsz, d.argst, d.rio, d.fuse]
    assert len(segs) == ce.N_SEGS and d.instrs.shape[1] == 6 and d.rio.shape[1] == ce.RIO_WIDTH
    assert d.fuse.shape[1] == FUSE_WIDTH
    head = np.zeros(ce.P_HEADER, np.int64)
    head[0] = d.tile_par
    head[-1] = d.optab.shape[1]
    head[ce.H_UNITS] = d.n_units
    at = ce.P_HEADER
    for k, seg in enumerate(segs):
        head[1 + 2 * k], head[2 + 2 * k] = at, seg.size
        at += seg.size
    head[ce.H_LEN] = at
    return np.concatenate([head] + [np.ascontiguousarray(seg, np.int64).reshape(-1) for seg in segs])


_INSTANCE_SEGS = (2, 3, 4, 5)   # _pack's segments that differ between instances of one stream


def _blob(d: _Desc, kl: KernelLayout, argsz: np.ndarray) -> np.ndarray:
    """_pack(d, argsz), from a template packed once per verified stream: the instance's
    segments (meta, dims, operand table, constants) and work-unit count are written into a copy.
    Every other word follows from the stream's key (codegen.verifier: instructions, sections,
    operand arguments and dtypes, argument dtypes, the dims per operand), so it is the same."""
    derived = kl.stream.derived
    template = derived.get("cpu_blob")
    if template is None:
        blob = _pack(d, argsz)
        derived["cpu_blob"] = template = blob.copy()
        template.flags.writeable = False
        return blob
    blob = template.copy()
    for k, seg in zip(_INSTANCE_SEGS, (d.meta, d.dims, d.optab, d.consts)):
        at, size = int(blob[1 + 2 * k]), int(blob[2 + 2 * k])
        if seg.size != size:   # cannot happen for one stream key; never patch a wrong layout
            raise AssertionError(f"CPU VM descriptor segment {k}: {seg.size} words, the template has {size}")
        blob[at:at + size] = seg.reshape(-1)
    blob[ce.H_UNITS] = d.n_units
    return blob


def _chain(descs) -> np.ndarray | None:
    """The packed kernels back to back when every one is below the threading threshold: the
    whole launch is then one call of the compiled code (cpu_entry.run_units with u1 < 0)."""
    if descs and all(d.work < PARALLEL_MIN_ELEMS for d in descs):
        return np.concatenate([d.blob for d in descs])
    return None


def _prog(layout: ProgramLayout) -> tuple:
    pd = layout.__dict__.get("_cpu_prog")
    if pd is None:
        n_args = len(layout.args)
        argsz = np.array([DType(a.dtype).np_dtype.itemsize for a in layout.args], np.int64)
        descs = tuple(_desc(kl, n_args) for kl in layout.kernels)
        for d, kl in zip(descs, layout.kernels):
            if d.blob is None:
                d.blob = _blob(d, kl, argsz)
        outs = tuple(a for a, info in enumerate(layout.args) if info.role != ARG_IN)
        pd = (argsz, descs, outs, _chain(descs))
        object.__setattr__(layout, "_cpu_prog", pd)
    return pd


def run(layout: ProgramLayout, buffers: list[np.ndarray], threads: int | None = None) -> None:
    """Execute a verified program (see codegen.verifier.verify / check_buffers)."""
    outs = _prog(layout)[2]
    bufs = buffers
    copied = ()
    for b in buffers:
        if not b.flags.c_contiguous:
            bufs = [np.ascontiguousarray(x) for x in buffers]
            copied = [a for a in outs if not buffers[a].flags.c_contiguous]
            break
    try:
        run_addrs(layout, np.array([data_ptr(b) for b in bufs] + [b.shape[0] for b in bufs], np.int64), threads)
    finally:
        for a in copied:
            buffers[a][...] = bufs[a]
    _ = bufs  # keep the (possibly copied) buffers alive until the VM has finished


def compile_vm() -> None:
    """Compile the VM, or load it from numba's disk cache, once per process; processes that start
    together on a cold cache compile it once (cpu_compile)."""
    cpu_compile.ensure(ce.run_units, _EXAMPLE_ARGS)


_EXAMPLE_ARGS = (0, -1, _NO_SCHED, DECODE, _NO_SCHED, _NO_SCHED, False)


def run_addrs(layout: ProgramLayout, bufs: np.ndarray, threads: int | None = None) -> None:
    """Execute a verified program on buffers given by base address and element count (`bufs`: the
    n addresses, then the n counts, int64). The caller keeps the buffers alive and guarantees
    they passed check_buffers (or have the same dtypes and extents as buffers that did)."""
    if not cpu_compile.done:   # a module attribute: ~15 ns a launch (a call was ~75)
        compile_vm()
    pd = _prog(layout)
    if pd[3] is not None:   # small kernels only: one call runs them all, in order
        _check(ce.run_units(0, -1, pd[3], DECODE, bufs, _NO_SCHED, False))
    else:
        _run_kernels(pd[1], bufs, threads)


class CpuVM(VM):
    """The numba CPU VM under the VM contract."""
    name = "cpu"

    @property
    def target(self) -> Target:
        return _TARGET

    def warm_up(self) -> None:
        compile_vm()

    def handles(self, spec: isa.InstrSpec) -> bool:
        return handled(spec)

    def run(self, layout: ProgramLayout, buffers: list[np.ndarray], threads: int | None = None) -> None:
        run(layout, buffers, threads)

    def bind(self, layout: ProgramLayout, numels) -> Callable[[list[int]], None]:
        from .cpu_launch import bound_runner
        return bound_runner(layout, list(numels))


_TARGET = Target("cpu", whole_row_forms=whole_row_forms)
VM_INSTANCE = CpuVM()
