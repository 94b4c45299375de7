"""Reshapes of elementwise work that cannot move onto the loads, moved toward the outputs.

push_reshapes moves a reshape of work down onto its loads; where a load cannot take it (an index
of the unreshaped shape, a flipped or sliced view that the merge would make strided), the work
would be stored to a workspace for the reshape to read. When the reshape's only reader is more
elementwise work, f(reshape(w), b) is reshape(f(w, reshape(b'))), b' the other operands as they
broadcast, their reshape moved onto their loads: the reshape rises past f. Risen to an output, the
value is stored through the view (a row-major reshape writes the same elements) and the work,
computed in its own shape, takes no workspace; stopped anywhere else, the risen work is what the
workspace holds instead, in as many kernels as before. (RoPE's gradient: the rotate_half backward
computed over [.., 2, h] and added to the cos term there.)
"""
from __future__ import annotations

from typing import Sequence

from ..graph.build import reshape_node
from ..graph.node import Node, topo_order
from .reshape_push import ReshapePusher, axis_groups, operand_shape, pushable, rebuilt, remade, users_of


def hoist_reshapes(outputs: Sequence[Node], pusher: ReshapePusher) -> list[Node]:
    """`outputs` with each reshape of elementwise work whose only reader is elementwise work of
    its shape moved past that reader, as long as the reader's other operands can take the reshape
    (ReshapePusher) and each is read by the reader alone or is a load: equal values, of the same
    shapes and dtypes."""
    users = users_of(outputs)
    new: dict[int, Node] = {}
    risen: set = set()         # ids of the original nodes now computed as a reshape of work
    for node in topo_order(outputs):
        inputs = tuple(new[id(i)] for i in node.inputs)
        moved = _risen(node, inputs, users, risen, pusher) if pushable(node) else None
        if moved is not None:
            risen.add(id(node))
            new[id(node)] = moved
        else:
            new[id(node)] = rebuilt(node, inputs)
    return [new[id(o)] for o in outputs]


def _risen(node: Node, inputs: tuple, users: dict, risen: set, pusher: ReshapePusher) -> Node | None:
    """reshape(node computed in the shape of an operand's reshaped work), or None."""
    for k, (orig, r) in enumerate(zip(node.inputs, inputs)):
        if r.op != "reshape" or not pushable(r.inputs[0]) or tuple(r.shape) != tuple(node.shape) \
                or users[id(orig)] != [node] or not (id(orig) in risen or users[id(orig.inputs[0])] == [orig]):
            continue
        operands = _operands(node, inputs, k, users, pusher)
        if operands is not None:
            work = r.inputs[0]
            return reshape_node(remade(node, work.shape, operands), tuple(node.shape))
    return None


def _operands(node: Node, inputs: tuple, k: int, users: dict, pusher: ReshapePusher) -> list | None:
    """node's operands as node computed in the shape of operand k's reshaped work reads them: that
    work, scalars, and the others reshaped onto their loads; None where one cannot be (or is work
    that another node reads too: it would be computed in both shapes)."""
    r = inputs[k]
    work = r.inputs[0]
    groups = axis_groups(node.shape, work.shape)
    if groups is None:
        return None
    operands = []
    for orig, a in zip(node.inputs, inputs):
        if a is r:
            operands.append(work)
        elif a.ndim == 0:
            operands.append(a)
        else:
            target = operand_shape(a.shape, node.shape, work.shape, groups)
            moved = None if target is None or (pushable(a) and users[id(orig)] != [node]) \
                else pusher.pushed(a, target)
            if moved is None:
                return None
            operands.append(moved)
    return operands
