"""Launch a CompiledGraph on torch tensors, without NumPy conversions in the steady state.

The first call with a signature (symbol values, the selected VM; each input's dtype, device
(is_cpu), shape, strides and neg bit) takes the NumPy path: the tensors become NumPy views
(PyTorch's own errors for what cannot: CUDA, sparse; autograd is detached), CompiledGraph.launcher
encodes, verifies and checks the real buffers, and the call runs. When that Launch runs on the CPU
VM, it is remembered under the tensor signature; later calls allocate their outputs with
torch.empty (those of hugepages.HUGE_OUTPUT_BYTES and more from runtime/buffer_pool: memory a
dropped output left, whose pages are not faulted in again) and hand the VM the tensors' data
pointers directly. Invariant (from
runtime.compiled.Launch): the same signature means the same dtypes and extents relative to the
data pointers, and a torch tensor's strides are never negative, so the buffer of each input
starts at its data pointer (as_buffer's delta is 0). An empty tensor may have no storage (data
pointer 0): the verified launch reads and writes none of its elements (check_buffers held for an
empty buffer), so its address is never dereferenced and its signature is remembered like any other
(a mixture of experts whose expert got no tokens concatenates an empty piece on every call).

A tensor with a negative or conjugate bit (torch._neg_view, the .imag of a conjugated complex
tensor) has memory that does not hold its values: it is resolved (resolve_neg / resolve_conj, a
copy, counted as torch_neg_conj_resolved) on every call, and its launch remembers which inputs
need that.
"""
from __future__ import annotations

import math
import threading
from functools import partial
from typing import Callable, Sequence

import ml_dtypes
import numpy as np
import torch

from ..config import config
from ..graph.dtypes import DType
from ..runtime import buffer_pool, counters, hugepages
from ..graph.views import contiguous_strides
from ..runtime.compiled import CompiledGraph, Launch, launch_bytes, launch_cache, remember
from .aten_common import TORCH_TO_DVM
from .gpu_arrays import GPU_VM, graph_launcher, vm_for

try:   # Inductor's allocator for its CPU outputs: one C++ call, ~3x cheaper than torch.empty
    from torch._C._dynamo.guards import _empty_strided_cpu
except ImportError:  # pragma: no cover - a PyTorch without it
    def _empty_strided_cpu(size, stride, dtype):
        return torch.empty_strided(size, stride, dtype=dtype)

_data_ptr = torch.Tensor.data_ptr


def _pooled_cpu(size, stride, dtype):
    """_empty_strided_cpu (dense strides) on memory from runtime/buffer_pool: an output of a
    kernel called again and again (every forward) re-uses a block whose pages are mapped, where
    a fresh tensor of that size costs page faults (glibc maps arrays of 32 MiB and more afresh on
    every allocation, and gives smaller freed memory back past its thresholds; a 46 MiB SwiGLU
    output inside a forward: 17-54 ms of faults against ~7 ms of kernel). The tensor holds the
    block (through torch.from_numpy), which the pool hands out again only once nothing does."""
    block = buffer_pool.empty((math.prod(size) * dtype.itemsize,), np.uint8)
    return torch.from_numpy(block).view(dtype).as_strided(size, stride)


def _huge(shape: tuple, dtype: torch.dtype) -> bool:
    """An output of hugepages.HUGE_OUTPUT_BYTES or more (pooled, else given the huge-page advice)."""
    return math.prod(shape) * dtype.itemsize >= hugepages.HUGE_OUTPUT_BYTES


def _allocator(shape: tuple, dtype: torch.dtype) -> Callable:
    """The allocator of an output: _pooled_cpu for a _huge one (unless DVM_POOL_MB=0), else
    _empty_strided_cpu. Smaller torch outputs come from malloc's free lists without faults here,
    and the pool's steps (its lock, from_numpy, the views: ~5 us) made a 512 KiB output's launch
    ~10 % slower; a 46 MiB one took half the time pooled."""
    return _pooled_cpu if config().pool_mb > 0 and _huge(shape, dtype) else _empty_strided_cpu

try:   # Dynamo's C++ check of tensor properties (its TENSOR_MATCH guards)
    from torch._C._dynamo.guards import TensorGuards as _TensorGuards
except ImportError:  # pragma: no cover - a PyTorch without it
    _TensorGuards = None


def tensor_check(tensors: Sequence[torch.Tensor]) -> Callable[..., bool] | None:
    """A function of tensors that is True only when each has the type, dispatch keys (device and
    neg bit among them), dtype, device index, requires_grad (under the grad mode of the call),
    sizes and strides of `tensors`' one: everything signature() keys on, in one C++ call
    (~0.07 us a tensor; signature() takes ~0.25). None where PyTorch has no such check."""
    if _TensorGuards is None:
        return None
    try:
        guards = _TensorGuards(*tensors, dynamic_dims_sizes=[list(t.shape) for t in tensors],
                               dynamic_dims_strides=[list(t.stride()) for t in tensors])
    except (TypeError, RuntimeError, SystemError):  # pragma: no cover - another constructor
        return None
    return guards.check


def to_numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def _to_numpy_plain(t: torch.Tensor) -> np.ndarray:
    """A non-bf16 tensor as NumPy (a tensor that requires grad is detached first)."""
    return (t.detach() if t.requires_grad else t).numpy()


def from_numpy(a: np.ndarray) -> torch.Tensor:
    if a.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def torch_dtype(dt: np.dtype) -> torch.dtype:
    return from_numpy(np.empty(0, dt)).dtype


def signature(env: dict, tensors: Sequence[torch.Tensor]) -> tuple:
    """is_cpu stands for the device: only CPU tensors are ever remembered (the fast path is the
    CPU VM's), so a tensor elsewhere never matches (torch.device objects cost ~1 us per call)."""
    return (*env.values(), config().vm,
            *[(t.dtype, t.is_cpu, t.shape, t.stride(), t.is_neg()) for t in tensors])


def guarded_signature(env: dict, tensors: Sequence[torch.Tensor]) -> tuple:
    """signature() for tensors whose devices and neg bits are fixed by the caller's guards: the
    values inside one Dynamo graph, whose guards check each graph input's device and dispatch
    keys (the neg bit among them), from which every value's device and neg bit follow. is_cpu and
    is_neg() cost ~0.55 us a tensor of the ~0.9 us signature() takes."""
    return (*env.values(), config().vm, *[(t.dtype, t.shape, t.stride()) for t in tensors])


def input_spans(tensors: Sequence) -> list[tuple[int, int, int]]:
    """(index, lo, hi) per non-empty tensor among `tensors`: the bytes [lo, hi) its elements
    span (PyTorch strides are never negative)."""
    out = []
    for j, t in enumerate(tensors):
        if isinstance(t, torch.Tensor) and t.numel():
            lo = t.data_ptr()
            n = t.nbytes if t.is_contiguous() else \
                (1 + sum((d - 1) * st for d, st in zip(t.shape, t.stride()))) * t.element_size()
            out.append((j, lo, lo + n))
    return out


def writable_over(graph: CompiledGraph, k: int, dst: torch.Tensor, spans: list, slot: int | None) -> bool:
    """Whether a launch of `graph` may write output k into dst (a tensor updated in place)
    instead of a new tensor: dst is row-major of the output's dtype, overlaps no input (`spans`:
    input_spans of the launch's inputs) except input `slot` (dst itself, or None), and the graph
    reads that input only where it writes it (CompiledGraph.overwrites)."""
    if not dst.is_contiguous() or not dst.numel() or TORCH_TO_DVM.get(dst.dtype) is not graph.outputs[k].dtype:
        return False
    lo = dst.data_ptr()
    hi = lo + dst.nbytes
    for j, a, b in spans:
        if a < hi and lo < b and j != slot:
            return False
    return slot is None or graph.overwrites(k, slot)


def neg_or_conj(tensors: Sequence[torch.Tensor]) -> tuple[int, ...]:
    """The positions of tensors whose negative or conjugate bit is set."""
    return tuple(i for i, t in enumerate(tensors) if t.is_neg() or t.is_conj())


def resolved(tensors: Sequence[torch.Tensor], slots: tuple[int, ...]) -> list[torch.Tensor]:
    """`tensors` with those at `slots` materialized without their negative / conjugate bit."""
    tensors = list(tensors)
    n = 0
    for s in slots:
        t = tensors[s]
        if t.is_neg() or t.is_conj():
            tensors[s] = t.resolve_neg().resolve_conj()
            n += 1
    if n:
        counters.bump("torch_neg_conj_resolved", n)
    return tensors


def _untracked_key(key: tuple) -> tuple:
    """An equal key (torch.Size is a tuple: same hash, equal) of plain tuples, which the garbage
    collector stops tracking; a model keeps one per segment and size."""
    return tuple(tuple(tuple(x) if isinstance(x, torch.Size) else x for x in k) if isinstance(k, tuple) else k
                 for k in key)


def _direct(outs: tuple, allocs: tuple, run: Callable, workspaces: tuple = ()) -> Callable | None:
    """tensors -> the outputs, freshly allocated (allocs: each one's allocator), of `run` on their
    addresses: a launch with no input to resolve or copy and no huge output, as one function (see
    _TensorLaunch.direct); None for a launch with workspaces whose VM has no one-function form."""
    if hasattr(run, "caller"):   # the VM's own one-function form (VM.bind), workspaces its own
        return run.caller(tuple((alloc, *spec) for alloc, spec in zip(allocs, outs)), counters.bump_cached_launch,
                          _data_ptr, workspaces=workspaces)
    if workspaces:
        return None

    def call(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        made = [alloc(shape, strides, dt) for alloc, (shape, strides, dt) in zip(allocs, outs)]
        run([*map(_data_ptr, tensors), *map(_data_ptr, made)])
        counters.bump_cached_launch()
        return made
    return call


class _TensorLaunch:
    """A cached Launch on a VM that binds launches (the CPU VM), fed with data pointers (see the module
    invariant). `same`: tensor_check of the tensors it was made for; `resolve`: the inputs whose
    negative or conjugate bit is resolved first; `direct`: the whole cached call as one function
    where nothing but the addresses is needed (else None)."""
    __slots__ = ("launch", "outs", "allocs", "same", "run", "resolve", "huge", "direct", "_permuted")

    def __init__(self, launch: Launch, tensors: Sequence[torch.Tensor], resolve: tuple[int, ...] = ()):
        self.launch, self.resolve = launch, resolve
        self.same = tensor_check(tensors)
        self.outs = tuple((shape, contiguous_strides(shape), torch_dtype(dt)) for shape, dt in launch.out_specs)
        self.allocs = tuple(_allocator(shape, dt) for shape, _, dt in self.outs)
        self.huge = tuple(i for i, (shape, _, dt) in enumerate(self.outs)   # runtime/hugepages, unpooled
                          if _huge(shape, dt) and self.allocs[i] is _empty_strided_cpu)
        # the VM on the buffers' addresses, when nothing else is needed (Launch.plain_runner)
        self.run = None if launch.copy_slots else launch.plain_runner()
        parts = launch.direct_parts()   # (bound VM, workspaces): the whole call as one function
        self.direct = _direct(self.outs, self.allocs, *parts) if parts is not None and not resolve and not self.huge \
            else None
        self._permuted = None   # (perms, direct_permuted(perms)) of the last perms asked for

    def direct_permuted(self, perms: tuple) -> Callable | None:
        """direct, with output k allocated as the view `out.permute(perms[k])` of its row-major
        self (None: as stored): the same bytes at the same address, which the VM writes as
        stored, without a permute call per output afterwards."""
        if self.direct is None or all(p is None for p in perms):
            return self.direct
        if self._permuted is None or self._permuted[0] != perms:
            specs = tuple(spec if p is None else (tuple(spec[0][j] for j in p), tuple(spec[1][j] for j in p), spec[2])
                          for spec, p in zip(self.outs, perms))
            self._permuted = (perms, _direct(specs, self.allocs, *self.launch.direct_parts()))
        return self._permuted[1]

    def __call__(self, tensors: Sequence[torch.Tensor], cached: bool = True, into=None) -> list[torch.Tensor]:
        """cached: counted as a program cache hit (the first call of a new launch is not). into:
        tensors to write the outputs into (None entries are allocated), each row-major of its
        output's shape and dtype and overlapping no input (the caller's invariant)."""
        if self.direct is not None and cached and into is None:
            return self.direct(tensors)
        if self.resolve:
            tensors = resolved(tensors, self.resolve)
        if self.launch.copy_slots:
            tensors = list(tensors)
            for s in self.launch.copy_slots:   # the Program was encoded for a row-major copy of this input
                tensors[s] = tensors[s].contiguous()
                counters.bump("input_copies")
        outs = [alloc(shape, strides, dt) for alloc, (shape, strides, dt) in zip(self.allocs, self.outs)] \
            if into is None else [alloc(shape, strides, dt) if t is None else t
                                  for alloc, t, (shape, strides, dt) in zip(self.allocs, into, self.outs)]
        for i in self.huge:   # before the VM's first touch
            hugepages.advise(_data_ptr(outs[i]), outs[i].nbytes)
        addrs = [*map(_data_ptr, tensors), *map(_data_ptr, outs)]
        if self.run is not None:
            counters.bump_launch(cached)
            self.run(addrs)
        else:
            self.launch.run_addresses(addrs, cached)
        return outs


class TensorLauncher:
    """graph on torch tensors."""

    def __init__(self, graph: CompiledGraph, guarded: bool = False):
        """guarded: the tensors' devices and neg bits are fixed by the caller (guarded_signature)."""
        self.graph = graph
        self.signature = guarded_signature if guarded else signature
        # NumPy views for the first call of a signature (bf16 through int16; ml_dtypes on top)
        self.convert = [to_numpy if n.dtype is DType.BFLOAT16 else _to_numpy_plain for n in graph.inputs]
        self._fast = launch_cache()
        self._lock = threading.Lock()
        # (env values, VM, _TensorLaunch) of the last call through _fast: a call with the same
        # sizes, VM and tensors that pass its check needs no signature (~1-2 us a call)
        self._last: tuple | None = None

    def direct_for(self, env: dict, tensors: Sequence[torch.Tensor], perms: tuple = ()) -> tuple | None:
        """(tensor check, direct call) of the remembered launch for exactly this env and these
        tensors, where it has a direct form (_TensorLaunch.direct); else None. perms: the
        permutation (or None) each output is returned viewed by (_TensorLaunch.direct_permuted)."""
        fast = self._fast.get(self.signature(env, tensors))
        if fast is None or fast.same is None or fast.direct is None:
            return None
        return fast.same, fast.direct_permuted(perms) if perms else fast.direct

    def addresses_for(self, env: dict, tensors: Sequence[torch.Tensor]) -> Callable[[list], None] | None:
        """The remembered launch for exactly this env and these tensors as a function of the
        buffers' addresses (the inputs', then the outputs'; workspaces its own), counting the
        launch, where it needs nothing else (no input resolved or copied first); else None."""
        fast = self._fast.get(self.signature(env, tensors))
        if fast is None or fast.resolve or fast.launch.copy_slots:
            return None
        run = fast.run
        if run is None:   # workspaces or shifted buffers: the launch adds them
            return partial(fast.launch.run_addresses, cached=True)

        def call(addrs: list) -> None:
            run(addrs)
            counters.bump_cached_launch()
        return call

    def _on_device(self, env: dict, tensors, into, vm: str, device: torch.device | None = None) -> list:
        outs = graph_launcher(self.graph)(env, tensors, vm, device)
        return outs if into is None else [o if t is None else t.copy_(o) for t, o in zip(into, outs)]

    def __call__(self, env: dict, tensors: Sequence[torch.Tensor], into=None,
                 device: torch.device | None = None) -> list[torch.Tensor]:
        """into: optional tensors to write the outputs into (see _TensorLaunch; lazy mode's
        placeholders). device: where the outputs belong when that is not the host and the
        tensors may not say so (no inputs, or 0-d host scalars only): the device VM runs there."""
        if device is not None:
            return self._on_device(env, tensors, into, GPU_VM, device)
        last = self._last
        if last is not None and last[2].same(*tensors) and last[0] == tuple(env.values()) and \
                last[1] == config().vm:
            return last[2](tensors, True, into)
        key = self.signature(env, tensors)
        fast = self._fast.get(key)
        if fast is not None:
            if fast.same is not None:
                self._last = (tuple(env.values()), key[len(env)], fast)
            return fast(tensors, True, into)
        device_vm = vm_for(tensors)
        if device_vm is not None:   # CUDA tensors (or a device VM selected): frontend/gpu_arrays
            return self._on_device(env, tensors, into, device_vm)
        flagged = neg_or_conj(tensors)
        plain = resolved(tensors, flagged) if flagged else tensors
        arrays = [c(t) for c, t in zip(self.convert, plain)]
        launch, hit = self.graph.launcher(env, arrays)
        if launch.bound and not any(launch.deltas[:len(tensors)]):
            fast = _TensorLaunch(launch, tensors, flagged)
            remember(self._fast, _untracked_key(key), fast, self._lock, launch_bytes(launch))
            return fast(plain, hit, into)
        outs = [from_numpy(o) for o in launch(list(arrays), hit)]
        if into is None:
            return outs
        return [o if t is None else t.copy_(o) for t, o in zip(into, outs)]
