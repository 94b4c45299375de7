"""Reshapes of elementwise work moved onto its operands, decided once on symbolic shapes.

A load expresses a reshape of an input as strides, but not a reshape of a computed value: the
partitioner stores such a value to a workspace and reads it back in a later kernel. For
elementwise work (casts included), reshape(f(a, b)) is f(reshape(a'), reshape(b')), a' and b'
the operands as they broadcast against the value, so the view moves to the loads and the work
stays in registers. A reshape moves only where, for each group of axes it merges or splits,
every operand spans the whole group or is broadcast over all of it, and only onto loads that
can take it: inputs (a row-major copy where their strides cannot), inputs' reshapes, constants,
views of inputs whose reshape a load still expresses as strides (offending_reshape finds none),
and indices whose reshape only adds or drops unit axes. And only where nothing is then computed
twice: no other node reads the work, and none reads the reshape broadcast (the work would run
once per copy). Anywhere else it stays put.

Permutes of outputs move the same way (`push_permutes`): permute(f(a, b)) is f(permute(a'),
permute(b')), computed in the permuted order, through reductions too (their axes renumbered),
where every operand is a load (an input or a view of one: a permute of a strided view is a
strided view), an index (the same index along the axis' new place) or a scalar, and the work
has no other reader. A value stored in another order (PyTorch's memory order of a transposed
value) then takes no kernel of its own.
"""
from __future__ import annotations

from typing import Sequence

from ..graph.build import reshape_node
from ..graph.node import Node, topo_order
from ..graph.ops import MOVEMENTS, OP_TABLE, Kind
from ..graph.symbolic import Dim, is_one, prod
from ..graph.views import split_chain

_PUSHABLE = (Kind.ELEMENTWISE, Kind.CAST)

AxisGroups = list[tuple[list[int], list[int]]]


def renames_axes(old: Sequence[Dim], new: Sequence[Dim]) -> bool:
    """True when reshaping `old` to `new` only adds or drops unit axes (strides always exist)."""
    return [d for d in old if not is_one(d)] == [d for d in new if not is_one(d)]


def splits_only(old: Sequence[Dim], new: Sequence[Dim]) -> bool:
    """True when reshaping `old` to `new` only splits axes (and adds or drops unit axes): strides
    exist whatever `old`'s strides are (an axis of stride s splits into (.., b*s, s))."""
    if renames_axes(old, new):
        return True
    groups = axis_groups(old, new)
    return groups is not None and all(len(old_axes) <= 1 for old_axes, _ in groups)


def offending_reshape(chain: list[Node], start: int) -> int:
    """Index of the first reshape in chain[start:] that follows a permute, broadcast or slice
    and merges axes, or that follows a permute moving the last axis, or -1: strides may not
    express it. A reshape that only splits axes has strides after any view (an axis of stride s
    splits into (.., b*s, s)), but a view whose last axis was permuted away is copied: read in
    another order, it would be strided. A reshape that only adds or drops unit axes is never one:
    its strides always exist, and the copy would read in the same order the load does."""
    moved = last_moved = False
    for i in range(start, len(chain)):
        v = chain[i]
        if v.op == "reshape" and not renames_axes(v.inputs[0].shape, v.shape) and \
                (last_moved or (moved and not splits_only(v.inputs[0].shape, v.shape))):
            return i
        moved |= v.op != "reshape"
        last_moved |= v.op == "permute" and v.attr("dims")[-1] != v.ndim - 1
    return -1


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
    pad = (1,) * (len(old) - len(shape)) + tuple(shape)
    out: list[Dim] = [1] * len(new)
    for old_axes, new_axes in groups:
        if all(is_one(pad[i]) for i in old_axes):
            continue
        if any(pad[i] != old[i] for i in old_axes):
            return None
        for j in new_axes:
            out[j] = new[j]
    return tuple(out)


class ReshapePusher:
    """`pushed(node, shape)`: a node equal to reshape(node, shape) with the reshape moved onto
    loads, or None; memoized per (node, shape), so shared work is rebuilt once. `twins`: the
    values whose reshape push_reshapes replaced, each with what replaced it."""

    def __init__(self):
        self._memo: dict[tuple[Node, tuple], Node | None] = {}
        self.twins: dict[Node, Node] = {}

    def pushed(self, node: Node, shape: tuple) -> Node | None:
        if tuple(node.shape) == shape:
            return node
        key = (node, shape)
        if key not in self._memo:
            self._memo[key] = self._push(node, shape)
        return self._memo[key]

    def _push(self, node: Node, shape: tuple) -> Node | None:
        if node.op == "input" or (node.op == "reshape" and node.inputs[0].op == "input"):
            return reshape_node(node, shape)
        if node.op == "iota" or node.op in MOVEMENTS:
            return reshape_node(node, shape) if renames_axes(node.shape, shape) or _strided(node, shape) else None
        if not pushable(node):
            return None
        groups = axis_groups(node.shape, shape)
        if groups is None:
            return None
        inputs = []
        for a in node.inputs:
            if a.ndim == 0:
                inputs.append(a)
                continue
            target = operand_shape(a.shape, node.shape, shape, groups)
            moved = None if target is None else self.pushed(a, target)
            if moved is None:
                return None
            inputs.append(moved)
        return remade(node, shape, inputs)


def _strided(view: Node, shape: tuple) -> bool:
    """A chain of views of an input that a load still expresses as strides once reshaped to `shape`."""
    base, chain = split_chain(reshape_node(view, shape))
    return base.op == "input" and offending_reshape(chain, 0) < 0


def remade(node: Node, shape: Sequence[Dim], inputs: Sequence[Node]) -> Node:
    """node's op, dtype and attributes over other inputs, at `shape`."""
    return Node.make(node.op, node.dtype, shape, inputs, **dict(node.attrs))


def users_of(outputs: Sequence[Node]) -> dict[int, list[Node]]:
    users: dict[int, list[Node]] = {}
    for node in topo_order(outputs):
        for i in dict.fromkeys(node.inputs):
            users.setdefault(id(i), []).append(node)
    return users


def _broadcast(view: Node, users: dict[int, list[Node]]) -> bool:
    """True when some computation reads `view` broadcast (through further views too): the work
    moved under the view would then be redone for every copy."""
    for u in users.get(id(view), ()):
        if u.op == "broadcast_to" or (u.op in MOVEMENTS and _broadcast(u, users)):
            return True
        if u.op not in MOVEMENTS and OP_TABLE[u.op].kind is not Kind.REDUCE and tuple(u.shape) != tuple(view.shape):
            return True
    return False


def push_reshapes(outputs: Sequence[Node], pusher: ReshapePusher) -> list[Node]:
    """`outputs` with reshapes of elementwise work moved onto its loads, where that does not
    compute anything more: the reshape is the work's only reader (being an output aside) and
    nothing reads the reshape broadcast."""
    users = users_of(outputs)
    new: dict[int, Node] = {}
    for node in topo_order(outputs):
        inputs = tuple(new[id(i)] for i in node.inputs)
        if node.op == "reshape" and pushable(inputs[0]) and users[id(node.inputs[0])] == [node] \
                and not _broadcast(node, users):
            moved = pusher.pushed(inputs[0], tuple(node.shape))
            if moved is not None:
                new[id(node)] = pusher.twins[inputs[0]] = moved
                continue
        new[id(node)] = rebuilt(node, inputs)
    return [new[id(o)] for o in outputs]


def rebuilt(node: Node, inputs: tuple) -> Node:
    """node over `inputs` (node itself where they are its own)."""
    return node if all(a is b for a, b in zip(inputs, node.inputs)) else remade(node, node.shape, inputs)


def _loads(node: Node) -> bool:
    """node is an input or a chain of views of one: any permute of it is a strided load."""
    base, _ = split_chain(node)
    return base.op == "input"


def _permuted(node: Node, dims: tuple, users: dict[int, list[Node]], outputs: set, memo: dict) -> Node | None:
    """A node equal to permute(node, dims) with the permute moved onto loads, or None. Views of
    work move too: a permute of it composes with dims (none left where they cancel), a slice
    that keeps its axis takes that axis' new place, and a reshape that keeps the first k axes
    reshapes the work permuted there (dims moving none of the others). memo: (node, dims) -> the
    result; whether work is then computed twice is push_permutes' check (_computed_once)."""
    key = (node, dims)
    if key not in memo:
        memo[key] = None
        if _loads(node):
            memo[key] = Node.make("permute", node.dtype, tuple(node.shape[d] for d in dims), (node,), dims=dims)
        elif id(node) in outputs:
            pass
        elif node.op == "iota":       # an index along an axis: the same index along its new place
            memo[key] = Node.make("iota", node.dtype, tuple(node.shape[d] for d in dims), (),
                                  **{**dict(node.attrs), "axis": dims.index(node.attr("axis"))})
        elif node.op == "permute":
            src, inner = node.inputs[0], tuple(node.attr("dims")[d] for d in dims)
            memo[key] = src if inner == tuple(range(src.ndim)) else _permuted(src, inner, users, outputs, memo)
        elif node.op == "slice" and node.attr("keep"):
            src = _permuted(node.inputs[0], dims, users, outputs, memo)
            if src is not None:
                memo[key] = Node.make("slice", node.dtype, tuple(node.shape[d] for d in dims), (src,),
                                      **{**dict(node.attrs), "axis": dims.index(node.attr("axis"))})
        elif node.op == "reshape":
            memo[key] = _permuted_reshape(node, dims, users, outputs, memo)
        elif _permutable(node):
            inputs = []
            for a in node.inputs:
                moved = _permuted_operand(a, dims, node.ndim, users, outputs, memo)
                if moved is None:
                    return None
                inputs.append(moved)
            attrs = dict(node.attrs)
            if OP_TABLE[node.op].kind is Kind.REDUCE:   # (keeps its rank) the reduced axes' new places
                attrs["axes"] = tuple(j for j, d in enumerate(dims) if d in node.attr("axes"))
            memo[key] = Node.make(node.op, node.dtype, tuple(node.shape[d] for d in dims), inputs, **attrs)
    return memo[key]


def _permuted_operand(a: Node, dims: tuple, ndim: int, users: dict[int, list[Node]], outputs: set,
                      memo: dict) -> Node | None:
    """An operand `a` of elementwise work of rank `ndim`, as the work permuted by dims reads it
    (broadcast from the left where a has a lower rank), or None. A load of lower rank takes its
    unit axes first; work of lower rank is read as it is where its own axes stay the trailing
    ones (a mask of the last two axes under heads moved in front of them), permuted among
    themselves as dims moves them."""
    if a.ndim == 0:
        return a
    if a.ndim == ndim:
        return _permuted(a, dims, users, outputs, memo)
    lead = ndim - a.ndim
    if _loads(a):
        return _permuted(reshape_node(a, (1,) * lead + tuple(a.shape)), dims, users, outputs, memo)
    own = tuple(d - lead for d in dims[lead:])
    if any(d < 0 for d in own):
        return None
    return a if own == tuple(range(a.ndim)) else _permuted(a, own, users, outputs, memo)


def _computed_once(memo: dict, users: dict[int, list[Node]], top: Node) -> bool:
    """Every node remade in the permuted order (work, or a view of work) is remade once and read
    only by nodes remade too, or by `top` (the permute being replaced): the work it stood for is
    then not also computed in another order for another reader. (A permute that cancelled is no
    new work: the value it read is computed once, read by both.)"""
    remade = [id(n) for (n, _), m in memo.items() if m is not None and not _loads(n) and not _cancelled(n, m)]
    ids = set(remade)
    return len(ids) == len(remade) and all(id(u) in ids or u is top for i in ids for u in users.get(i, ()))


def _cancelled(node: Node, moved: Node) -> bool:
    """node is a permute that _permuted replaced by the value it permutes."""
    return node.op == "permute" and moved is node.inputs[0]


def _permutable(node: Node) -> bool:
    """Elementwise work, or a reduction (whose result keeps its input's rank)."""
    return pushable(node) or OP_TABLE[node.op].kind is Kind.REDUCE


def push_permutes(outputs: Sequence[Node]) -> list[Node]:
    """`outputs` with each permute of elementwise work (reductions among it) computed in the
    permuted order instead, where its operands are loads or scalars and nothing else reads the
    work (an interior node read by anything outside the moved work would be computed twice): one
    kernel fewer than storing the work and reading it back permuted. The results are equal
    values, of the same shapes."""
    users = users_of(outputs)
    out_ids = {id(o) for o in outputs}
    new = []
    for o in outputs:
        moved = None
        if o.op == "permute" and users[id(o.inputs[0])] == [o] and id(o.inputs[0]) not in out_ids:
            memo: dict = {}
            moved = _permuted(o.inputs[0], tuple(o.attr("dims")), users, out_ids, memo)
            if moved is not None and not _computed_once(memo, users, o):
                moved = None
        new.append(o if moved is None else moved)
    return new


def push_inner_permutes(outputs: Sequence[Node]) -> list[Node]:
    """`outputs` with each permute of elementwise work that further work reads (not an output)
    computed in the permuted order instead, as push_permutes moves the permutes of outputs: the
    reader then takes the work in registers, where the partitioner would store it to a workspace
    and read it back permuted (a kernel more, and a transposing one). Only elementwise work moves
    (a reduction among it would change which groups its readers fall in), and only where nothing
    else reads it; each move leaves one permute of work fewer. A permute that did not move is not
    tried again (nodes are immutable: one whose work changed is another node)."""
    outputs, stuck = list(outputs), set()
    while True:
        users, out_ids = users_of(outputs), {id(o) for o in outputs}
        moved = None
        for node in topo_order(outputs):
            if node.op == "permute" and node not in stuck:
                moved = _inner_move(node, users, out_ids)
                if moved is not None:
                    break
                stuck.add(node)
        if moved is None:
            return outputs
        outputs = _substituted(outputs, *moved)


def _inner_move(node: Node, users: dict[int, list[Node]], outputs: set) -> tuple[Node, Node] | None:
    """(node, its replacement) for a permute of elementwise work push_inner_permutes moves, else None."""
    if node.op != "permute" or id(node) in outputs:
        return None
    work = node.inputs[0]
    if _loads(work) or id(work) in outputs or users[id(work)] != [node]:
        return None
    memo: dict = {}
    moved = _permuted(work, tuple(node.attr("dims")), users, outputs, memo)
    if moved is None or not _computed_once(memo, users, node) or \
            any(OP_TABLE[n.op].kind is Kind.REDUCE for (n, _), m in memo.items() if m is not None and not _loads(n)):
        return None
    return node, moved


def _substituted(outputs: Sequence[Node], old: Node, new_node: Node) -> list[Node]:
    """`outputs` with every read of `old` reading `new_node` (an equal value of the same shape)."""
    new: dict[int, Node] = {id(old): new_node}
    for node in topo_order(outputs):
        if id(node) not in new:
            new[id(node)] = rebuilt(node, tuple(new[id(i)] for i in node.inputs))
    return [new[id(o)] for o in outputs]


def _permuted_reshape(r: Node, dims: tuple, users: dict[int, list[Node]], outputs: set, memo: dict) -> Node | None:
    """permute(r, dims) for a reshape r of work that keeps r's first k axes and a permute that
    keeps the others in place (RoPE's [.., 2, h] halves as [.., d] or back, heads and positions
    swapped): the reshape of the work computed in the permuted order; else None."""
    x = r.inputs[0]
    k = 0
    while k < min(x.ndim, r.ndim) and x.shape[k] == r.shape[k]:
        k += 1
    if any(dims[i] != i for i in range(k, r.ndim)):
        return None
    moved = _permuted(x, dims[:k] + tuple(range(k, x.ndim)), users, outputs, memo)
    return None if moved is None else reshape_node(moved, tuple(r.shape[d] for d in dims))
