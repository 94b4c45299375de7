"""The CPU VM's kernel descriptors: what the compiled code gets for a kernel of a verified Program,
built once per layout (instance) from parts computed once per instruction stream (host/stream),
packed into one int64 array per kernel (abi.P_*) so that a launch passes a few arrays to the
compiled code instead of thirteen (numba's per-argument dispatch cost dominates small launches).
"""
from __future__ import annotations

import numpy as np

from ....codegen.program import ARG_IN, KernelLayout, ProgramLayout
from ....graph.dtypes import DType
from .. import abi
from .stack import PARALLEL_MIN_ELEMS, Stack
from .fuse_plan import has_row_forms
from .stream import StreamPlan, stream_plan


ROW_MAJOR_MIN_BN = 8   # reducing kernels with narrower tiles use column-major registers (_transposed)
# a stream that reads its rows again after reducing them (a norm, a softmax) over operands
# contiguous along the kept axis takes column-major registers for tiles at most REREAD_NARROW_BN
# wide, or at most REREAD_ALIASED_BN where the strided axis steps a multiple of ALIAS_BYTES (then
# the row-major tiles' 8x8 transposing loads read 8 rows that alias in the L1); no operand may
# vary along the columns only (a weight). Measured on a softmax and on x minus its sum over the
# first axis: 7-32 columns of 1-64 K contiguous rows 1.2-6x faster column-major, 48-512 columns of
# 1, 2 or 4 K rows 1.1-2x; 48-384 columns of 1,000-5,000 rows, 256 of 256 or 512, 1,024 columns
# or more, a LayerNorm's weight and bias: 1.1-2x slower
REREAD_NARROW_BN = 32
REREAD_ALIASED_BN = 512
ALIAS_BYTES = 4096


def _transposed(kl: KernelLayout, plan: StreamPlan) -> bool:
    """Column-major registers (lane (r, k) at k*BM + r) for a reducing kernel whose rows are
    very narrow (a tree level is then one loop over BM rows instead of a short loop per row) or
    whose operands are contiguous along the kept axis (a column of the tile is then a contiguous
    run; for a stream that reads its rows again after reducing them, Target.rereads_rows, only
    narrow or aliased tiles with no weight-like operand: _rereads_column_major). The layout is
    invisible: every lane holds the same value and the tree pairs the same lanes. Argmax/argmin
    keep the row-major form."""
    if kl.bm == 1 or kl.bn == 1 or not kl.row_sizes or not kl.col_sizes or not plan.reduces:
        return False
    nr = len(kl.row_sizes)
    strides = np.asarray(kl.opnd_strides).reshape(len(kl.opnd_kind), -1)
    kept_runs = [i for i, st in enumerate(strides) if int(st[nr - 1]) == 1 and int(st[-1]) not in (0, 1)]
    if kept_runs:   # contiguous along the kept axis (a sum over axis 0)
        return not plan.rereads or _rereads_column_major(kl, plan, strides, nr, kept_runs)
    # A column-major tile of row-major data is loaded by strided reads, so from 8 lanes whole rows
    # reduce faster in row-major tiles, in registers (jit/vtree.vtree_n for any width).
    return kl.bn < ROW_MAJOR_MIN_BN


def _rereads_column_major(kl: KernelLayout, plan: StreamPlan, strides: np.ndarray, nr: int,
                          kept_runs: list[int]) -> bool:
    """Column-major registers for a stream that reads its rows again: tiles up to REREAD_NARROW_BN
    wide, or up to REREAD_ALIASED_BN over a strided axis stepping a multiple of ALIAS_BYTES, or
    holding every kept row where no row form is planned (codegen.column_tiles.whole_rereads: the
    tile is then one contiguous run, read and written in place); and no operand varying along the
    columns only (a norm's weight: row-major registers apply it on the fly, column-major ones
    expand it)."""
    if any(not st[:nr].any() and st[nr:].any() for st in strides):
        return False
    if kl.bn <= REREAD_NARROW_BN or (kl.bm >= kl.rows and not has_row_forms(plan.fuse)):
        return True
    return kl.bn <= REREAD_ALIASED_BN and any(
        int(strides[i][-1]) * DType(int(kl.opnd_dtype[i])).itemsize % ALIAS_BYTES == 0 for i in kept_runs)


class _Desc:
    __slots__ = ("instrs", "meta", "dims", "optab", "consts", "tile_par", "n_units", "work", "peep", "argst",
                 "argld", "blob", "blob_at", "transposed", "rio", "fuse")

    def __init__(self, kl: KernelLayout, n_args: int):
        nr, nc = len(kl.row_sizes), len(kl.col_sizes)
        rows, cols = kl.rows, kl.cols
        plan = stream_plan(kl, n_args)
        self.instrs, self.rio, self.peep, self.fuse, self.argst, self.argld = plan[:6]
        self.transposed = _transposed(kl, plan)
        meta = [nr, nc, kl.bm, kl.bn, rows, cols, *kl.nregs, len(kl.sweeps), *kl.prologue, int(self.transposed)]
        assert len(meta) == abi.M_SW
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
        self.blob_at = 0   # and its address


def _desc(kl: KernelLayout, n_args: int) -> _Desc:
    d = kl.__dict__.get("_cpu_desc")
    if d is None:
        d = _Desc(kl, n_args)
        object.__setattr__(kl, "_cpu_desc", d)   # cache on the (immutable) layout
    return d


def _pack(d: _Desc, argsz: np.ndarray) -> np.ndarray:
    """The descriptor as one int64 array (layout: abi.P_*)."""
    segs = [d.instrs, d.peep, d.meta, d.dims, d.optab, d.consts, argsz, d.argst, d.rio, d.fuse]
    assert len(segs) == abi.N_SEGS and d.instrs.shape[1] == abi.INSTR_WIDTH and d.rio.shape[1] == abi.RIO_WIDTH
    assert d.fuse.shape[1] == abi.FUSE_WIDTH
    head = np.zeros(abi.P_HEADER, np.int64)
    head[0] = d.tile_par
    head[-1] = d.optab.shape[1]
    head[abi.H_UNITS] = d.n_units
    at = abi.P_HEADER
    for k, seg in enumerate(segs):
        head[1 + 2 * k], head[2 + 2 * k] = at, seg.size
        at += seg.size
    head[abi.H_LEN] = at
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
    blob[abi.H_UNITS] = d.n_units
    return blob


def _chain(descs) -> np.ndarray | None:
    """The packed kernels back to back when every one is below the threading threshold: the
    whole launch is then one call of the compiled code (jit/entry.run_units with u1 < 0)."""
    if descs and all(d.work < PARALLEL_MIN_ELEMS for d in descs):
        return np.concatenate([d.blob for d in descs])
    return None


def prog_desc(layout: ProgramLayout) -> tuple:
    """(argument element sizes, kernel descriptors, output arguments, the chained blob of a launch
    of small kernels or None, the launch's host/stack.Stack or None: its kernels run as one
    parallel job where more than one thread runs the launch), once per layout."""
    pd = layout.__dict__.get("_cpu_prog")
    if pd is None:
        n_args = len(layout.args)
        argsz = np.array([DType(a.dtype).np_dtype.itemsize for a in layout.args], np.int64)
        descs = tuple(_desc(kl, n_args) for kl in layout.kernels)
        for d, kl in zip(descs, layout.kernels):
            if d.blob is None:
                d.blob = _blob(d, kl, argsz)
                d.blob_at = d.blob.ctypes.data
        outs = tuple(a for a, info in enumerate(layout.args) if info.role != ARG_IN)
        chain = _chain(descs)
        pd = (argsz, descs, outs, chain, Stack.of(descs, chain))
        object.__setattr__(layout, "_cpu_prog", pd)
    return pd
