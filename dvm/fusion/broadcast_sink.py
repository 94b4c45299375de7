"""Broadcasts of computed values read by elementwise work dropped, decided once on symbolic shapes.

Elementwise ops broadcast their operands, so f(broadcast_to(a), b) = f(a, b) broadcast to the
same shape. A load expresses a broadcast of an input (stride 0), but not of a computed value: the
partitioner stores the value to a workspace and a later kernel reads it back. A norm's gradient
broadcasts a per-row value computed from a row sum (PyTorch's expand of a keepdim sum) into the
elementwise gradient: with the broadcast, the gradient waited for a second kernel; without it, it
is computed in the kernel of the row sum, from registers.

Work whose operands are all narrower than its shape after the broadcasts are dropped is rebuilt at
its narrower shape (computed once per row, not per element) for its elementwise readers. Any other
reader (a reduction, a view, an output) reads the work at its own shape, as before.

Only broadcasts along trailing axes are dropped (per-row values: a row's own reductions are in its
tile). A value broadcast along a leading axis (a column sum's) keeps its workspace: its readers
would otherwise join the column reduction's kernel as a second sweep over strided rows, which
the VMs run far slower than a kernel of their own (x minus its column mean at 8192x64: 216 us as
two kernels, 4.3 ms as one).
"""
from __future__ import annotations

from typing import Sequence

from ..graph.node import Node, topo_order
from ..graph.symbolic import is_one
from .reshape_push import pushable, rebuilt, remade


def sink_broadcasts(outputs: Sequence[Node]) -> list[Node]:
    """`outputs` with the broadcasts that elementwise work reads dropped: equal values, of the same
    shapes and dtypes."""
    same: dict[int, Node] = {}     # node -> an equal node of its shape
    narrow: dict[int, Node] = {}   # node -> a node of fewer elements that broadcasts to it
    for node in topo_order(outputs):
        inputs = tuple(same[id(i)] for i in node.inputs)
        if node.op == "broadcast_to" and _along_trailing_axes(node):
            narrow[id(node)] = narrow.get(id(node.inputs[0]), inputs[0])
        elif pushable(node) and any(id(i) in narrow for i in node.inputs):
            operands = tuple(narrow.get(id(i), same[id(i)]) for i in node.inputs)
            shape = _broadcast_shape(node.shape, operands)
            work = remade(node, shape, operands)
            if shape == tuple(node.shape):
                same[id(node)] = work
                continue
            narrow[id(node)] = work
        same[id(node)] = rebuilt(node, inputs)
    return [same[id(o)] for o in outputs]


def _along_trailing_axes(b: Node) -> bool:
    """Broadcast b expands only axes after every axis it keeps (its input (n, m, 1) to (n, m, k))."""
    src = (1,) * (b.ndim - b.inputs[0].ndim) + tuple(b.inputs[0].shape)
    k = b.ndim
    while k > 0 and is_one(src[k - 1]):
        k -= 1
    return all(not is_one(src[i]) or is_one(b.shape[i]) for i in range(k))


def _broadcast_shape(full: Sequence, operands: Sequence[Node]) -> tuple:
    """The shape `operands` broadcast to, given that it broadcasts to `full` (right-aligned): each
    axis is full's where an operand is not of size 1 there, else 1."""
    rank = max(a.ndim for a in operands)
    shape = []
    for k in range(len(full) - rank, len(full)):
        wide = any(not is_one(a.shape[k - len(full) + a.ndim]) for a in operands if k - len(full) + a.ndim >= 0)
        shape.append(full[k] if wide else 1)
    return tuple(shape)
