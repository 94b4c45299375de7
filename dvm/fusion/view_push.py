"""Views of elementwise work moved onto its operands, decided once on symbolic shapes.

A load expresses a view (reshape, permute, slice) of an input as strides, but not a view of a
computed value: the partitioner stores such a value to a workspace and reads it back in a later
kernel. For elementwise work (casts included), view(f(a, b)) is f(view(a'), view(b')), a' and b'
the operands as they broadcast against the value, so the view moves to the loads and the work
stays in registers. A permute or a slice always moves; a reshape only where, for each group of
axes it merges or splits, every operand spans the whole group or is broadcast over all of it.
The views end on inputs (a row-major copy where strides cannot express a reshape), constants,
reductions (stored to a workspace, which every view can read) and views of those; on an index
only when unit axes are added or dropped. Anywhere else the view stays where it was.
"""
from __future__ import annotations

from typing import Sequence

from ..graph.build import reshape_node
from ..graph.node import Node, topo_order
from ..graph.ops import MOVEMENTS, OP_TABLE, Kind
from ..graph.symbolic import Dim, is_one, prod

_PUSHABLE = (Kind.ELEMENTWISE, Kind.CAST)
PUSHED_VIEWS = ("reshape", "permute", "slice")   # broadcast_to would recompute the work per copy

AxisGroups = list[tuple[list[int], list[int]]]
View = tuple   # ("reshape", shape) | ("permute", dims) | ("slice", axis, start, step, keep, length)


def renames_axes(old: Sequence[Dim], new: Sequence[Dim]) -> bool:
    """True when reshaping `old` to `new` only adds or drops unit axes (strides always exist)."""
    return [d for d in old if not is_one(d)] == [d for d in new if not is_one(d)]


def splits_axes(old: Sequence[Dim], new: Sequence[Dim]) -> bool:
    """True when reshaping `old` to `new` only splits axes or renames them (strides always exist)."""
    groups = axis_groups(old, new)
    return groups is not None and all(len(o) == 1 for o, _ in groups)


def pushable(node: Node) -> bool:
    return OP_TABLE[node.op].kind in _PUSHABLE


def axis_groups(old: Sequence[Dim], new: Sequence[Dim]) -> AxisGroups | None:
    """The non-unit axes of `old` and `new` paired into consecutive groups of provably equal
    products (what a reshape merges or splits), or None when they do not pair up."""
    if any(isinstance(d, int) and d == 0 for d in (*old, *new)):
        return None
    o = [i for i, d in enumerate(old) if not is_one(d)]
    n = [j for j, d in enumerate(new) if not is_one(d)]
    cum_new, acc = [], 1
    for j in n:
        acc = acc * new[j]
        cum_new.append(acc)
    groups, i0, j0, acc = [], 0, 0, 1
    for i, axis in enumerate(o):
        acc = acc * old[axis]
        # sizes are >= 2, so running products rise and each boundary matches once
        j = next((j for j in range(j0, len(n)) if cum_new[j] == acc), None)
        if j is not None:
            groups.append((o[i0:i + 1], n[j0:j + 1]))
            i0, j0 = i + 1, j + 1
    if i0 != len(o) or j0 != len(n) or prod(old[i] for i in o) != prod(new[j] for j in n):
        return None
    return groups


def operand_shape(shape: Sequence[Dim], old: Sequence[Dim], new: Sequence[Dim],
                  groups: AxisGroups) -> tuple | None:
    """The shape an operand of `shape` (broadcast against `old`) takes when `old` becomes
    `new`, or None when it is broadcast over part of a group only."""
    pad = _padded(shape, len(old))
    out: list[Dim] = [1] * len(new)
    for old_axes, new_axes in groups:
        if all(is_one(pad[i]) for i in old_axes):
            continue
        if any(pad[i] != old[i] for i in old_axes):
            return None
        for j in new_axes:
            out[j] = new[j]
    return tuple(out)


def _padded(shape: Sequence[Dim], rank: int) -> tuple:
    return (1,) * (rank - len(shape)) + tuple(shape)


def view_of(node: Node) -> View:
    """The view a view node applies to its input."""
    if node.op == "reshape":
        return ("reshape", tuple(node.shape))
    if node.op == "permute":
        return ("permute", node.attr("dims"))
    a = node.attr("axis")
    return ("slice", a, node.attr("start"), node.attr("step"), node.attr("keep"),
            node.shape[a] if node.attr("keep") else 1)


def apply_view(x: Node, view: View) -> Node:
    """The view node `view` over x."""
    kind = view[0]
    if kind == "reshape":
        return reshape_node(x, view[1])
    if kind == "permute":
        dims = view[1]
        if tuple(dims) == tuple(range(x.ndim)):
            return x
        return Node.make("permute", x.dtype, tuple(x.shape[d] for d in dims), (x,), dims=dims)
    _, axis, start, step, keep, length = view
    shape = x.shape[:axis] + ((length,) if keep else ()) + x.shape[axis + 1:]
    return Node.make("slice", x.dtype, shape, (x,), axis=axis, start=start, step=step, keep=keep)


def operand_views(shape: Sequence[Dim], old: Sequence[Dim], view: View) -> list[View] | None:
    """The views that take an operand of `shape` (broadcast against `old`) to where `view`
    takes the value, innermost first; None when the operand cannot follow."""
    pad = _padded(shape, len(old))
    views: list[View] = [("reshape", pad)] if len(shape) < len(old) else []
    kind = view[0]
    if kind == "reshape":
        groups = axis_groups(old, view[1])
        target = None if groups is None else operand_shape(shape, old, view[1], groups)
        return None if target is None else [("reshape", target)]
    if kind == "permute":
        return views + [view]
    axis, keep = view[1], view[4]
    if not is_one(pad[axis]):
        return views + [view] if pad[axis] == old[axis] else None
    if keep:
        return views                                   # broadcast along the sliced axis
    return [("reshape", pad[:axis] + pad[axis + 1:])]  # a selected broadcast axis: dropped


class ViewPusher:
    """`pushed(node, view)`: a node equal to `view` applied to node, the view moved onto loads,
    or None; memoized per (node, view), so shared work is rebuilt once."""

    def __init__(self):
        self._memo: dict[tuple[Node, View], Node | None] = {}

    def pushed(self, node: Node, view: View) -> Node | None:
        if view[0] == "reshape" and tuple(node.shape) == tuple(view[1]):
            return node
        key = (node, view)
        if key not in self._memo:
            self._memo[key] = self._push(node, view)
        return self._memo[key]

    def _push(self, node: Node, view: View) -> Node | None:
        kind = OP_TABLE[node.op].kind
        if node.op == "input" or kind is Kind.REDUCE:
            return apply_view(node, view)
        if node.op in MOVEMENTS:
            if view[0] != "reshape" or splits_axes(node.shape, view[1]) or \
                    (node.op == "reshape" and node.inputs[0].op == "input"):
                return apply_view(node, view)
            return None
        if node.op == "iota":
            return apply_view(node, view) if view[0] == "reshape" and renames_axes(node.shape, view[1]) else None
        if not pushable(node) or (view[0] == "reshape" and axis_groups(node.shape, view[1]) is None):
            return None
        new_shape = apply_view(node, view).shape
        inputs = []
        for a in node.inputs:
            if a.ndim == 0:
                inputs.append(a)
                continue
            views = operand_views(a.shape, node.shape, view)
            if views is None:
                return None
            for v in views:
                a = self.pushed(a, v)
                if a is None:
                    return None
            inputs.append(a)
        return Node.make(node.op, node.dtype, new_shape, inputs, **dict(node.attrs))


def push_views(outputs: Sequence[Node], pusher: ViewPusher) -> list[Node]:
    """`outputs` with every view of elementwise work that can move moved onto its loads."""
    new: dict[int, Node] = {}
    for node in topo_order(outputs):
        inputs = tuple(new[id(i)] for i in node.inputs)
        if node.op in PUSHED_VIEWS and pushable(inputs[0]):
            moved = pusher.pushed(inputs[0], view_of(node))
            if moved is not None:
                new[id(node)] = moved
                continue
        same = all(a is b for a, b in zip(inputs, node.inputs))
        new[id(node)] = node if same else Node.make(node.op, node.dtype, node.shape, inputs, **dict(node.attrs))
    return [new[id(o)] for o in outputs]
