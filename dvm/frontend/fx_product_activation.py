"""A ReLU or exact GELU of a linear's result as one PyTorch call (a graph rewrite done once per
ATen graph, before planning).

`relu(addmm(b, x, w))`, or `gelu(addmm(b, x, w))` with approximate "none", with views between
them that only reshape the product, becomes `_addmm_activation(b, x, w[, use_gelu=True])` and the
same views; `mm(x, w)` (no bias) becomes `_addmm_activation(zero, x, w, beta=0)`, which computes
what mm computes (ATen's mm is addmm_impl_cpu_ with beta 0 too). PyTorch's CPU kernel applies
relu_ / gelu_ to its fresh result in place while it is in cache, so the values are eager's bit
for bit, with one call, one output tensor and one pass over it fewer; where the activation was a
DVM segment of its own (OPT's fc1 and ReLU; the fc1 and GELU of BERT, GPT-NeoX and BART), a
launch fewer too. A GELU's product of at most gelu_size.vm_limit() float32 elements (32-64 K)
takes the VM's GELU after the product instead (decided per call: gelu_size). An activation fused
with later elementwise ops leaves them a segment that reads the activated product. The planner runs `_addmm_activation` as a cube op (aten_table.CUBE_OPS).

Only where the product, its operands and the views are CPU tensors: CUDA's kernel takes its
GELU from cuBLASLt's epilogue, the tanh approximation. Only where nothing else reads the product
or the views (a training graph that saves the GELU's input for its backward keeps both ops).
Counted as `torch_product_activation_folded`.
"""
from __future__ import annotations

import contextlib

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import unset_fake_temporarily

from ..runtime import counters
from .aten_table import RESHAPE_OPS

aten = torch.ops.aten
ENABLED = True   # off: the activation stays an op of its own (the tests and the A/B compare the two)
_PRODUCTS = {aten.addmm.default: 3, aten.mm.default: 2}   # -> their positional arguments


def _is_exact_gelu(n: fx.Node) -> bool:
    approximate = n.kwargs.get("approximate", n.args[1] if len(n.args) > 1 else "none")
    return n.target is aten.gelu.default and approximate == "none" and set(n.kwargs) <= {"approximate"}


def _cpu_float(n) -> bool:
    v = n.meta.get("val") if isinstance(n, fx.Node) else None
    return isinstance(v, torch.Tensor) and v.device.type == "cpu" and v.is_floating_point()


def _product_under(act: fx.Node) -> tuple[fx.Node, list] | None:
    """(the product, the reshapes from it to act's input, in graph order) where each is read only
    by the next and the product is a plain mm or addmm (1-D bias, beta = alpha = 1) of CPU tensors."""
    chain, src = [], act.args[0]
    while isinstance(src, fx.Node) and src.target in RESHAPE_OPS and len(src.users) == 1:
        chain.append(src)
        src = src.args[0]
    if not (isinstance(src, fx.Node) and src.target in _PRODUCTS and len(src.users) == 1
            and len(src.args) == _PRODUCTS[src.target] and not src.kwargs):
        return None
    if not all(_cpu_float(a) for a in (src, *src.args)) or \
            (src.target is aten.addmm.default and src.args[0].meta["val"].dim() != 1):
        return None
    return src, chain[::-1]


def _zero(gm: fx.GraphModule, like: fx.Node) -> fx.Node:
    """A get_attr node of a 0-d zero of like's dtype (a buffer of gm, one per dtype): the bias
    operand `_addmm_activation` needs for a product without one, ignored with beta = 0."""
    dtype = like.meta["val"].dtype
    name = "_dvm_zero_" + str(dtype).rsplit(".", 1)[-1]
    if not hasattr(gm, name):
        with unset_fake_temporarily():   # (a backend may be called under the graph's fake mode)
            gm.register_buffer(name, torch.zeros((), dtype=dtype))
    node = gm.graph.get_attr(name)
    mode = getattr(like.meta["val"], "fake_mode", None)
    with mode if mode is not None else contextlib.nullcontext():
        node.meta["val"] = torch.zeros((), dtype=dtype)
    return node


def rewrite(gm: fx.GraphModule) -> int:
    """Fold each matching activation into its product, in place; returns how many."""
    if not ENABLED:
        return 0
    graph, count = gm.graph, 0
    for act in list(graph.nodes):
        if act.op != "call_function" or not (act.target is aten.relu.default and len(act.args) == 1
                                             and not act.kwargs or _is_exact_gelu(act)):
            continue
        found = _product_under(act)
        if found is None or not _cpu_float(act) or act.meta["val"].dtype != found[0].meta["val"].dtype:
            continue
        product, views = found
        kwargs = {"use_gelu": True} if act.target is aten.gelu.default else {}
        with graph.inserting_before(product):
            if product.target is aten.mm.default:
                args, kwargs = (_zero(gm, product), *product.args), {"beta": 0, **kwargs}
            else:
                args = product.args
            fused = graph.call_function(aten._addmm_activation.default, args, kwargs)
        fused.meta = dict(product.meta)
        product.replace_all_uses_with(fused)
        graph.erase_node(product)
        act.replace_all_uses_with(views[-1] if views else fused)
        graph.erase_node(act)
        count += 1
    if count:
        counters.bump("torch_product_activation_folded", count)
    return count
