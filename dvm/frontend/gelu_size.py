"""An exact float32 GELU that PyTorch would run alone: the VM's up to a size, PyTorch's above it.

PyTorch's CPU GELU (exact form, float32, through oneDNN) has a fixed cost of ~4.5 µs a call on
this host (256 elements: 4.7 µs, where a multiply takes 2.1) and then ~0.2 ns an element; the
VM's GELU (accurate to 3.5 ULP; PyTorch's float32 kernel to 49, and NaN at +inf) costs a launch of
~2.5 µs and ~0.55 ns an element. Inside a forward, where PyTorch's GELU code is cold, its fixed
cost is larger (~12 µs a call at 2 K elements in BERT's forward, the VM's ~5). Where a run graph
calls an exact GELU in PyTorch (fx_product_activation's activated products, fx_lone_gelu's lone
GELUs), it calls these functions, which choose by the element count at each call: at most
vm_limit() (64 K elements on one thread, 32 K on two; half that where PyTorch's kernels take
AVX-512) of a CPU float32 tensor (contiguous for a lone GELU) with the CPU VM selected, the
product as F.linear computes it and then the VM's GELU (counted: `torch_gelu_vm_small`);
otherwise PyTorch's kernel, eager's bit for bit. Each shape's launch is
remembered apart (a graph's GELUs alternate between shapes). docs/DECISIONS.md, "An exact GELU
by its size".
"""
from __future__ import annotations

import numpy as np
import torch

from ..config import config
from ..runtime import counters
from .builder import kernel
from .torch_launch import TensorLauncher

# The limit on one thread, divided by PyTorch's thread count (its GELU runs on them all). Measured
# on whole forwards (BERT, GPT-NeoX), the VM's GELU against PyTorch's: 2 K elements 13-15 % less
# time a forward, 16 K 5 %, 32 K 2 %; 64 K 3-4.5 % less on one thread and -6 to +1 % on two;
# 128 K 1.5 % less on one thread.
# Where PyTorch's CPU kernels take AVX-512 (its get_cpu_capability), its GELU costs ~0.5 ns an
# element against the VM's ~1.4 (its erf to 3.5 ULP: an exp and a division a lane; an Intel Xeon
# host): whole forwards (BERT, RoBERTa, GPT-NeoX, Falcon, BART) at 64 K elements took 0.92-0.995
# of the time with PyTorch's, at 32 K 0.99-1.01 on one thread and 0.97-0.99 on two, at 16 K on
# two 1.02-1.05: the limit halves there.
AVX512_VM_GELU_MAX_ELEMENTS = 32768


def _pytorch_avx512() -> bool:
    return torch.backends.cpu.get_cpu_capability().startswith("AVX512")


VM_GELU_MAX_ELEMENTS = AVX512_VM_GELU_MAX_ELEMENTS if _pytorch_avx512() else 65536
_SHAPE_CLASSES_KEPT = 16   # launchers kept (one per rank and placement of sizes 1)
_SHAPES_KEPT = 64          # remembered direct calls (one per shape)
ENABLED = True   # off: PyTorch's GELU at every size (the tests and the A/B compare the two)
ACTIVATION_KWARGS = frozenset({"use_gelu", "beta"})   # _addmm_activation's, as fx_product_activation writes them


@kernel
def _gelu_kernel(k, x):
    return k.store(k.gelu(k.load(x)))


_launchers: dict = {}   # shape class -> (TensorLauncher, per dimension its symbol or None)
_calls: dict = {}       # shape -> (tensor check, direct call) of its launch


def _launcher(shape_class: tuple) -> tuple[TensorLauncher, tuple]:
    """The VM's GELU of a float32 tensor of this shape class (its sizes 0 and 1 as they are, the
    others -1: the builder's classes), and per dimension its size's symbol (None: a fixed size)."""
    got = _launchers.get(shape_class)
    if got is None:
        traced = _gelu_kernel.trace(np.empty(tuple(2 if d < 0 else d for d in shape_class), np.float32))
        names = tuple(None if isinstance(d, int) else d.as_symbol().name for d in traced.arg_dims[0])
        if len(_launchers) >= _SHAPE_CLASSES_KEPT:
            _launchers.clear()
        got = _launchers[shape_class] = (TensorLauncher(traced.graph), names)
    return got


def vm_limit() -> int:
    """The most elements whose GELU the VM computes, with PyTorch's thread count now."""
    return VM_GELU_MAX_ELEMENTS // max(torch.get_num_threads(), 1)


def vm_takes(t: torch.Tensor, n: int) -> bool:
    """The VM computes the GELU of t (n elements) instead of PyTorch. (Not under DVM_VERIFY:
    verification recomputes segments, and this launch is none: PyTorch's GELU runs there.)"""
    if not (ENABLED and 0 < n <= vm_limit() and t.dtype is torch.float32 and t.is_cpu):
        return False
    c = config()
    return c.vm == "cpu" and not c.verify


def vm_gelu(t: torch.Tensor) -> torch.Tensor:
    """The VM's GELU of the float32 CPU tensor t, as a fresh row-major tensor."""
    counters.bump("torch_gelu_vm_small")
    got = _calls.get(t.shape)
    if got is not None and got[0](t):
        return got[1]((t,))[0]
    return _first_call(t)


def _first_call(t: torch.Tensor) -> torch.Tensor:
    """vm_gelu through the shape class's launcher, remembering the launch's direct call for t's
    shape (the call sites of a graph alternate between shapes: one remembered launch would not do)."""
    shape = t.shape
    launch, names = _launcher(tuple([d if d < 2 else -1 for d in shape]))
    env = {name: d for name, d in zip(names, shape) if name is not None}
    out = launch(env, (t,))[0]
    got = launch.direct_for(env, (t,))
    if got is not None:
        if len(_calls) >= _SHAPES_KEPT:
            _calls.clear()
        _calls[shape] = got
    return out


def gelu(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """aten.gelu(x, approximate) as the run graph calls it."""
    if approximate == "none" and x.is_contiguous() and vm_takes(x, x.numel()):
        return vm_gelu(x)
    return torch.nn.functional.gelu(x, approximate=approximate)


def addmm_activation(bias: torch.Tensor, x: torch.Tensor, w: torch.Tensor, **kwargs) -> torch.Tensor:
    """aten._addmm_activation(bias, x, w, **kwargs) as the run graph calls it: with use_gelu and
    a small float32 result, the product (the same addmm, beta as given) then the VM's GELU."""
    if kwargs.get("use_gelu") and set(kwargs) <= ACTIVATION_KWARGS and x.dim() == 2 and w.dim() == 2 and \
            vm_takes(x, x.shape[0] * w.shape[1]):
        return vm_gelu(torch.addmm(bias, x, w, beta=kwargs.get("beta", 1)))
    return torch._addmm_activation(bias, x, w, **kwargs)
