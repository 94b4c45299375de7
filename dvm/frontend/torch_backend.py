"""`torch.compile(model, backend="dvm", dynamic=True)`: the DVM backend for PyTorch.

Registered as "dvm" on import and through the `torch_dynamo_backends` entry point, so
`torch.compile(..., backend="dvm")` works without importing dvm first. AOTAutograd hands ATen
graphs (inference, forward and backward) to `CompiledFx`, which cuts each graph once into DVM
segments (symbolic sizes) and PyTorch steps. Decompositions: see aten_table.DECOMPOSE (backward
composites are decomposed; forward composites DVM lowers itself stay whole).
"""
from __future__ import annotations

import functools

import torch
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.backends.registry import _BACKENDS, _COMPILER_FNS, register_backend

from ..runtime import counters
from .aten_table import decompositions
from .torch_runtime import COMPILED, CompiledFx


def _compiler(kind: str):
    def compile_fx(gm: torch.fx.GraphModule, example_inputs):
        try:
            return CompiledFx(gm, example_inputs, kind)
        except Exception as e:  # never a wrong result: the graph runs through PyTorch
            counters.bump(f"fallback:graph:{type(e).__name__}: {e}")
            return gm
    compile_fx.__name__ = f"dvm_{kind}_compiler"
    return compile_fx


@functools.lru_cache(maxsize=1)
def _aot():
    return aot_autograd(fw_compiler=_compiler("forward"), bw_compiler=_compiler("backward"),
                        inference_compiler=_compiler("inference"), decompositions=decompositions())


def dvm_backend(gm: torch.fx.GraphModule, example_inputs, **kwargs):
    """The Dynamo backend: AOTAutograd with DVM's forward / backward / inference compilers."""
    compiled = _aot()(gm, example_inputs, **kwargs)   # may raise Dynamo's restart exceptions
    counters.bump("torch_dynamo_graphs")               # graphs actually compiled
    return compiled


def compile(model=None, **kwargs):  # noqa: A001 (mirrors torch.compile)
    """`dvm.compile(model)`: torch.compile with backend="dvm" and dynamic=True by default."""
    kwargs.setdefault("dynamic", True)
    if model is None:
        return lambda m: torch.compile(m, backend="dvm", **kwargs)
    return torch.compile(model, backend="dvm", **kwargs)


def explain_model(model, *inputs, **kwargs) -> str:
    """Compile `model` with the DVM backend, run it once on `inputs`, and report what fused."""
    start = len(COMPILED)
    before = counters.snapshot()
    compiled = model if hasattr(model, "_torchdynamo_orig_callable") else compile(model)
    out = compiled(*inputs, **kwargs)
    graphs = list(COMPILED)[start:] if len(COMPILED) > start else list(COMPILED)[-2:]
    lines = [f"dvm torch backend: {len(graphs)} ATen graph(s) compiled in this call"]
    lines += [g.describe() for g in graphs]
    after = counters.snapshot()
    delta = {k: v - before.get(k, 0) for k, v in after.items()
             if isinstance(v, int) and v != before.get(k, 0) and not k.startswith(("view:", "python:"))}
    lines.append("counters (this call): " + ", ".join(f"{k}={v}" for k, v in sorted(delta.items())))
    del out
    return "\n".join(lines)


# entry-point loading imports this module and then registers the backend itself
if not (_BACKENDS.get("dvm") is not None and "dvm" not in _COMPILER_FNS) and "dvm" not in _COMPILER_FNS:
    register_backend(compiler_fn=dvm_backend, name="dvm")
