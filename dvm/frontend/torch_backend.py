"""`torch.compile(model, backend="dvm", dynamic=True)`: the DVM backend for PyTorch.

Registered as "dvm" on import and through the `torch_dynamo_backends` entry point, so
`torch.compile(..., backend="dvm")` works without importing dvm first. AOTAutograd hands ATen
graphs (inference, forward and backward) to `CompiledFx`, which cuts each graph once into DVM
segments (symbolic sizes) and PyTorch steps. Decompositions: see aten_decomp.DECOMPOSE (backward
composites are decomposed, except three run by PyTorch's kernels, fx_native_backward; forward
composites DVM lowers itself stay whole); `F.interpolate`, which PyTorch decomposes into gathers
whatever the table, is one call of its kernel (fx_interpolate).
"""
from __future__ import annotations

import functools
import math
import operator

import torch
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.backends.registry import _BACKENDS, _COMPILER_FNS, register_backend

from ..runtime import counters
from . import fx_interpolate
from .aten_decomp import decompositions
from .aten_table import register_late_ops
from .torch_runtime import COMPILED, CompiledFx


def _compiler(kind: str):
    def compile_fx(gm: torch.fx.GraphModule, example_inputs):
        register_late_ops()
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
                        inference_compiler=_compiler("inference"), decompositions=decompositions(),
                        keep_inference_input_mutations=True)


def dvm_backend(gm: torch.fx.GraphModule, example_inputs, **kwargs):
    """The Dynamo backend: AOTAutograd with DVM's forward / backward / inference compilers."""
    example_inputs = specialize_untensorifiable_floats(gm, example_inputs)
    fx_interpolate.rewrite(gm)
    compiled = _aot()(gm, example_inputs, **kwargs)   # may raise Dynamo's restart exceptions
    counters.bump("torch_dynamo_graphs")               # graphs actually compiled
    return compiled


# Python-number operators whose SymFloat operand AOTAutograd's tensorify pass turns into a tensor
# operand (torch.fx.passes._tensorify_python_scalars.SUPPORTED_OPS)
_TENSORIFIABLE = frozenset({operator.add, operator.sub, operator.mul, operator.truediv, operator.pow, operator.gt,
                            operator.lt, operator.ge, operator.le, operator.eq, operator.ne})


_MATH_CONSTANTS = frozenset({math.pi, math.e, math.tau})


def _math_constant(node: torch.fx.Node, memo: torch.SymFloat) -> bool:
    """A global's float (not a model's attribute) equal to math.pi, e or tau: `math.sqrt(2 /
    math.pi)` in GPT-2's GELU. Specialized (guarded as the others), the arithmetic on it folds into
    the graph's numbers, where fx_gelu_chain can read them."""
    source = getattr(node.meta.get("grapharg"), "source", None)
    name = getattr(source, "name", "")
    name = name() if callable(name) else name
    hint = getattr(memo.node, "hint", None)
    return isinstance(name, str) and name.startswith("G[") and hint in _MATH_CONSTANTS


def specialize_untensorifiable_floats(gm: torch.fx.GraphModule, example_inputs: list) -> list:
    """Specialize now the float inputs that AOTAutograd's tensorify pass would give up on.

    With dynamic shapes Dynamo passes Python float attributes (an RMSNorm's eps, attention's
    `scaling`) as 0-d tensors read by `.item()`. Where such a float reaches a non-tensor argument
    (sdpa's `scale`, embedding's `norm_type`), the tensorify pass, after the whole AOT trace,
    raises TensorifyScalarRestartAnalysis: Dynamo traces the frame again with the float a
    constant. That second trace was ~45 % of the tiny Llama's first call (5.6 s). Here the
    `.item()` of such an input is replaced by its value under a guard (guard_scalar: a changed
    value recompiles, as after the restart), the float is marked specialized, so the pass has
    nothing left to restart for, and its placeholder is removed (a global equal to math.pi, e or
    tau too, whatever reads it: _math_constant): `gm.graph` is Dynamo's own
    graph, whose placeholders name the arguments its frame code builds for every call after the
    backend returns (a 0-d tensor made per float per call: 16 of them cost a BERT forward
    ~50 us). The same rewrite Dynamo itself does on a restarted trace
    (OutputGraph.remove_tensorify_specialized_graphargs). A float used only by arithmetic stays
    an input. Returns the example inputs of the placeholders left."""
    try:
        from torch._dynamo.symbolic_convert import TensorifyState
        from torch.fx.experimental.symbolic_shapes import guard_scalar
    except ImportError:  # pragma: no cover - torch internals moved: Dynamo's restart does it
        return example_inputs
    dropped = set()
    for position, node in enumerate(gm.graph.find_nodes(op="placeholder")):
        memo = getattr(node.meta.get("example_value"), "item_memo", None)
        if not isinstance(memo, torch.SymFloat) or \
                not all(u.op == "call_method" and u.target == "item" for u in node.users):
            continue
        if all(use.op == "call_function" and use.target in _TENSORIFIABLE for u in node.users for use in u.users) \
                and not (node.users and _math_constant(node, memo)):
            continue   # (an unused input too: nothing to specialize)
        symbol = getattr(memo.node._expr, "name", None)
        if symbol is None:
            continue
        value = guard_scalar(memo)
        TensorifyState.specialize(symbol)
        for u in list(node.users):
            u.replace_all_uses_with(value)
            gm.graph.erase_node(u)
        gm.graph.erase_node(node)
        dropped.add(position)
    if dropped:
        gm.recompile()
        counters.bump("torch_float_inputs_specialized", len(dropped))   # shown by dvm.explain
    return [x for i, x in enumerate(example_inputs) if i not in dropped]


def compile(model=None, **kwargs):  # noqa: A001 (mirrors torch.compile)
    """`dvm.compile(model)`: torch.compile with backend="dvm" and dynamic=True by default."""
    kwargs.setdefault("dynamic", True)
    if model is None:
        return lambda m: torch.compile(m, backend="dvm", **kwargs)
    return torch.compile(model, backend="dvm", **kwargs)


def explain_model(model, *inputs, **kwargs) -> str:
    """Compile `model` with the DVM backend, run it once on `inputs`, and report what fused."""
    before = counters.snapshot()
    compiled = model if hasattr(model, "_torchdynamo_orig_callable") else compile(model)
    out = compiled(*inputs, **kwargs)
    after = counters.snapshot()
    # the graphs this call compiled: counted (COMPILED keeps only the recent ones, so its length
    # stops growing); none (a model compiled before): the last ones
    made = after.get("torch_graphs_compiled", 0) - before.get("torch_graphs_compiled", 0)
    graphs = list(COMPILED)[-made:] if made > 0 else list(COMPILED)[-2:]
    lines = [f"dvm torch backend: {len(graphs)} ATen graph(s) compiled in this call"]
    lines += [g.describe() for g in graphs]
    delta = {k: v - before.get(k, 0) for k, v in after.items()
             if isinstance(v, int) and v != before.get(k, 0) and not k.startswith(("view:", "python:"))}
    lines.append("counters (this call): " + ", ".join(f"{k}={v}" for k, v in sorted(delta.items())))
    del out
    return "\n".join(lines)


# entry-point loading imports this module and then registers the backend itself
if not (_BACKENDS.get("dvm") is not None and "dvm" not in _COMPILER_FNS) and "dvm" not in _COMPILER_FNS:
    register_backend(compiler_fn=dvm_backend, name="dvm")
