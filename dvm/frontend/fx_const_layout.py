"""Size-only values stored in the order in which their segments read them.

A value computed once per size (fx_sizeonly: the run graph's SizeConsts) is stored row-major, as
the op that made it leaves it; its readers may take it in another order. T5's relative position
bias is an embedding lookup of [L, S, heads], which each layer reads as [1, heads, L, S] (a
permute, then an unsqueeze) into the mask it adds: a strided read of every element of every
mask, each forward (at L = S = 256 that layer's segment took 277 us hot; with the bias stored as
[heads, L, S] 158 us). Here such a value is stored once, when it is computed, as
`x.permute(order).contiguous().permute(inverse)`: the same shape and values, with strides under
which the readers' order is row-major.

Only where every reader of the value is a member of a DVM segment, through chains of permute,
transpose and unsqueeze that agree on one order: a segment's launch takes any strides (they are
part of its signature), while a PyTorch op may lay its result out after its input's strides,
which later steps of the run graph could depend on.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.fx as fx

from ..runtime import counters
from .aten_common import fake
from .fx_segments import SegmentStep

aten = torch.ops.aten
# views that only reorder an input's dims or insert dims of size 1
_ORDER_VIEWS = frozenset({aten.permute.default, aten.transpose.int, aten.unsqueeze.default})
ENABLED = True   # off: every size-only value row-major (the tests compare the two)


def _moved(view: fx.Node, dims: list) -> list | None:
    """dims (per dim of the view's input: the stored value's dim it is, or None for an inserted
    one) as the view's result has them; None for a view that does anything else."""
    args = view.args
    if view.target is aten.permute.default:
        return [dims[p % len(dims)] for p in args[1]]
    if view.target is aten.transpose.int:
        i, j = args[1] % len(dims), args[2] % len(dims)
        out = list(dims)
        out[i], out[j] = out[j], out[i]
        return out
    if view.target is aten.unsqueeze.default:
        out = list(dims)
        out.insert(args[1] % (len(dims) + 1), None)
        return out
    return None


def read_order(value: fx.Node, in_segment: Callable[[fx.Node], bool]) -> tuple | None:
    """The order of value's dims in which all its readers take it, where that is not its own and
    every reader is in a segment; else None."""
    val = fake(value)
    if not ENABLED or not isinstance(val, torch.Tensor) or val.dim() < 2:
        return None
    orders, stack = set(), [(u, value, list(range(val.dim()))) for u in value.users]
    while stack:
        user, src, dims = stack.pop()
        if user.op != "call_function" or not in_segment(user):
            return None
        if user.target in _ORDER_VIEWS and user.args[0] is src and not user.kwargs:
            moved = _moved(user, dims)
            if moved is None:
                return None
            stack.extend((u, user, moved) for u in user.users)
        else:
            orders.add(tuple(d for d in dims if d is not None))
    if len(orders) != 1:
        return None
    order = orders.pop()
    return None if order == tuple(range(val.dim())) else order


def stored_in_order(x: torch.Tensor, order: tuple) -> torch.Tensor:
    """x, with strides under which x.permute(order) is row-major (a copy, made once per size)."""
    counters.bump("torch_size_consts_reordered")
    inverse = [0] * len(order)
    for i, d in enumerate(order):
        inverse[d] = i
    return x.permute(order).contiguous().permute(inverse)


def output_in_read_order(graph: fx.Graph, values: list, remap: dict, steps: list, runners: dict) -> list:
    """Make graph's output the remapped values, each stored in its read order where it has one
    (read_order, over the ATen nodes of the planned steps' compiled segments: runners maps a
    segment step's id to its runner, or to the exception that kept it from compiling); returns
    those orders."""
    compiled = [s.segment for s in steps if isinstance(s, SegmentStep) and not isinstance(runners.get(id(s)), Exception)]
    segmented = {m for seg in compiled for m in (*seg.members, *seg.views)}
    orders = [read_order(a, segmented.__contains__) for a in values]
    graph.output(tuple(remap[a] if order is None else graph.call_function(stored_in_order, (remap[a], order))
                       for a, order in zip(values, orders)))
    return orders
