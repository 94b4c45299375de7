"""Slices of elementwise work moved onto its operands, decided once on symbolic shapes.

A load expresses a slice of an input (of any chain of views of one) as an offset and strides, but
not a slice of a computed value: the partitioner stores the whole value to a workspace and a later
kernel reads the slice back. For elementwise work (casts included), slice(f(a, b)) is
f(slice(a'), slice(b')), a' and b' the operands as they broadcast against the value: an operand
broadcast along the sliced axis is read as it is. So the slice moves through the work down to its
loads, and the reader computes the work over the slice only, in registers (RoPE's rotate_half of
a computed value: a flip, a slice of step -1; a gated activation's halves of computed work).

Operands that are not elementwise work (inputs, views, indices, reductions, concats) take the
slice as a view: a view of a reduction or a concat reads the value the partitioner stores anyway.
Work that other nodes read too is then also computed over the slice by the slice's reader, as
elementwise work read by two kernels is computed in each (fusion/partition inlines it).
"""
from __future__ import annotations

from typing import Sequence

from ..graph.node import Node, topo_order
from ..graph.symbolic import is_one
from .reshape_push import pushable, rebuilt, remade


def push_slices(outputs: Sequence[Node]) -> list[Node]:
    """`outputs` with every slice of elementwise work that keeps its axis moved onto the loads:
    equal values, of the same shapes and dtypes."""
    new: dict[int, Node] = {}
    for node in topo_order(outputs):
        inputs = tuple(new[id(i)] for i in node.inputs)
        if node.op == "slice" and node.attr("keep") and pushable(inputs[0]):
            new[id(node)] = _sliced(inputs[0], node, node.attr("axis"), {})
        else:
            new[id(node)] = rebuilt(node, inputs)
    return [new[id(o)] for o in outputs]


def _sliced(x: Node, s: Node, axis: int, memo: dict) -> Node:
    """x sliced as the slice node s slices its input, along x's `axis`: elementwise work rebuilt
    over its sliced operands, anything else viewed through the slice. memo: (node, axis) -> the
    result, for the one slice s (shared work is rebuilt once)."""
    key = (x, axis)
    if key not in memo:
        shape = x.shape[:axis] + (s.shape[s.attr("axis")],) + x.shape[axis + 1:]
        if pushable(x):
            inputs = tuple(_sliced_operand(a, x, s, axis, memo) for a in x.inputs)
            memo[key] = remade(x, shape, inputs)
        else:
            memo[key] = Node.make("slice", x.dtype, shape, (x,), **{**dict(s.attrs), "axis": axis})
    return memo[key]


def _sliced_operand(a: Node, work: Node, s: Node, axis: int, memo: dict) -> Node:
    """Operand `a` of `work` (broadcast from the left where its rank is lower) as the work sliced
    along `axis` reads it."""
    own = axis - (work.ndim - a.ndim)
    if own < 0 or is_one(a.shape[own]):
        return a            # broadcast along the axis (a scalar among them): read as it is
    return _sliced(a, s, own, memo)
