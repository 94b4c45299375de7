"""Launch a CompiledGraph on torch tensors, without NumPy conversions in the steady state.

The first call with a signature (symbol values, the selected VM; each input's dtype, device
(is_cpu), shape, strides and neg bit) takes the NumPy path: the tensors become NumPy views
(PyTorch's own errors for what cannot: CUDA, sparse; autograd is detached), CompiledGraph.launcher
encodes, verifies and checks the real buffers, and the call runs. When that Launch runs on the CPU
VM, it is remembered under the tensor signature; later calls allocate their outputs with
torch.empty and hand the VM the tensors' data pointers directly. Invariant (from
runtime.compiled.Launch): the same signature means the same dtypes and extents relative to the
data pointers, and a torch tensor's strides are never negative, so the buffer of each input
starts at its data pointer (as_buffer's delta is 0). Signatures with an empty tensor always take
the NumPy path (an empty tensor may have no storage).
"""
from __future__ import annotations

import threading
from typing import Sequence

import ml_dtypes
import numpy as np
import torch

from ..config import config
from ..graph.dtypes import DType
from ..runtime import counters
from ..runtime.compiled import CompiledGraph, Launch, remember


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


class _TensorLaunch:
    """A cached Launch on the CPU VM, fed with data pointers (see the module invariant)."""
    __slots__ = ("launch", "outs")

    def __init__(self, launch: Launch):
        self.launch = launch
        self.outs = [(shape, torch_dtype(dt)) for shape, dt in launch.out_specs]

    def __call__(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        for s in self.launch.copy_slots:   # the Program was encoded for a row-major copy of this input
            tensors[s] = tensors[s].contiguous()
            counters.bump("input_copies")
        outs = [torch.empty(shape, dtype=dt) for shape, dt in self.outs]
        self.launch.run_addresses([t.data_ptr() for t in tensors] + [o.data_ptr() for o in outs], True)
        return outs


class TensorLauncher:
    """graph on torch tensors."""

    def __init__(self, graph: CompiledGraph):
        self.graph = graph
        # NumPy views for the first call of a signature (bf16 through int16; ml_dtypes on top)
        self.convert = [to_numpy if n.dtype is DType.BFLOAT16 else _to_numpy_plain for n in graph.inputs]
        self._fast: dict = {}
        self._lock = threading.Lock()

    def __call__(self, env: dict, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        key = signature(env, tensors)
        fast = self._fast.get(key)
        if fast is not None:
            return fast(list(tensors))
        arrays = [c(t) for c, t in zip(self.convert, tensors)]
        launch, hit = self.graph.launcher(env, arrays)
        outs = launch(list(arrays), hit)
        if launch.vm == "cpu" and not any(0 in t.shape for t in tensors) and \
                not any(launch.deltas[:len(tensors)]):
            remember(self._fast, key, _TensorLaunch(launch), self._lock)
        return [from_numpy(o) for o in outs]
