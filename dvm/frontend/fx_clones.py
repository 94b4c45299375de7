"""Clones of fresh values that nothing could tell apart from the value (a graph rewrite done once
per ATen graph, before planning).

Dropout in eval mode reaches the ATen graph as `clone(x)` (AOTAutograd's functional graph keeps
the copy). Where x is the fresh result of an op, or a reshape of one (not a graph input, not
another view: x is dense, so the clone keeps its strides), the clone (or a view of it) is not
returned, and no op of the graph writes into x, the clone or a view of either, every reader of
the clone may read x itself: the same values, the same layout. Inside a DVM segment a clone was
already free; of a PyTorch value (BART's `dropout(gelu(fc1(x)))`, the GELU now in the product's
call) it was a segment of its own that copied its input. Counted as `torch_clones_elided`.
"""
from __future__ import annotations

import operator

import torch
import torch.fx as fx

from ..runtime import counters
from . import aten_table as T

aten = torch.ops.aten
ENABLED = True   # off: every clone is kept (the tests compare the two)


def _fresh(x) -> bool:
    """x is a tensor that an ATen op returns new, so dense: its schema aliases no result to an
    argument (not a view, not a graph input; a result of a multi-result op through getitem)."""
    if not (isinstance(x, fx.Node) and x.op == "call_function" and isinstance(x.meta.get("val"), torch.Tensor)):
        return False
    op = x.args[0].target if x.target is operator.getitem and isinstance(x.args[0], fx.Node) else x.target
    schema = getattr(op, "_schema", None)
    return schema is not None and not schema.is_mutable and op not in T.VIEW_OPS and \
        all(r.alias_info is None for r in schema.returns)


def _dense_base(x) -> fx.Node | None:
    """The fresh tensor that x is, or reshapes (a reshape of a dense tensor is dense); else None."""
    while isinstance(x, fx.Node) and x.target in T.RESHAPE_OPS:
        x = x.args[0]
    return x if _fresh(x) else None


def _unwritten(n: fx.Node, returned_ok: bool) -> bool:
    """No reader of n, or of a view of n, writes into it (nor is the graph's output, unless
    returned_ok)."""
    for u in n.users:
        if u.op == "output" and not returned_ok:
            return False
        schema = getattr(u.target, "_schema", None)
        if schema is not None and schema.is_mutable:
            return False
        if u.target in T.VIEW_OPS and not _unwritten(u, returned_ok):
            return False
    return True


def rewrite(gm: fx.GraphModule) -> int:
    """Replace each such clone by its input, in place; returns how many."""
    if not ENABLED:
        return 0
    count = 0
    for n in list(gm.graph.nodes):
        if n.op != "call_function" or n.target is not aten.clone.default or len(n.args) != 1 or \
                n.kwargs.get("memory_format", torch.preserve_format) is not torch.preserve_format or \
                set(n.kwargs) - {"memory_format"}:
            continue
        x = n.args[0]
        base = _dense_base(x)
        if base is not None and _unwritten(base, True) and _unwritten(n, False):
            n.replace_all_uses_with(x)
            gm.graph.erase_node(n)
            count += 1
    if count:
        counters.bump("torch_clones_elided", count)
    return count
