"""Partition a graph into vector-kernel groups, decided once on symbolic shapes.

A group has one domain: a shape S and a set A of reduced axes. Elementwise work is inlined
(recomputed) into every group that needs it; reductions and stored values are group roots.
Values crossing groups go through workspace buffers. Invariant: group indices are a
topological order — a group reads workspaces only of groups with a smaller index, and reads
reductions of its own group from registers. A concat is never inlined: each piece is stored into
its slice of the concat's buffer (an output's, else a workspace), by a group that stores nothing
else there, and readers load the buffer.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..graph.build import concat_slices
from ..graph.node import Node, topo_order
from ..graph.ops import MOVEMENTS, OP_TABLE, Kind
from ..graph.symbolic import Dim, is_one
from ..graph.views import split_chain
from .broadcast_sink import sink_broadcasts
from .reshape_push import (ReshapePusher, offending_reshape, push_inner_permutes, push_permutes, pushable,
                           push_reshapes)
from .reshape_hoist import hoist_reshapes
from .slice_push import push_slices

VIEW_OPS = MOVEMENTS   # reshape, permute, broadcast_to, slice
LEAF_OPS = ("input", "iota")


def is_reduce(node: Node) -> bool:
    return OP_TABLE[node.op].kind is Kind.REDUCE


@dataclass
class Store:
    value: Node          # computed (or loaded) in the group
    slot: int            # argument slot written
    view: Node | None    # the output node when it is a reshape of `value` (stored through a view),
                         # or the slice of a concat's buffer that `value` fills

    @property
    def fills_slice(self) -> bool:
        return self.view is not None and self.view.op == "slice"


@dataclass
class Group:
    index: int
    shape: tuple[Dim, ...]
    axes: frozenset[int]
    reductions: list[Node] = field(default_factory=list)
    stores: list[Store] = field(default_factory=list)

    def describe(self) -> str:
        red = ", ".join(f"{r.op}{sorted(r.attr('axes'))}" for r in self.reductions) or "none"
        sliced = sum(s.fills_slice for s in self.stores)
        return f"group {self.index}: domain {self.shape} reduce {sorted(self.axes)}; " \
               f"reductions {red}; {len(self.stores)} store(s)" + (f", {sliced} into a cat's slice" if sliced else "")


@dataclass
class Plan:
    """Groups in execution order. Argument slots: inputs, then outputs, then workspaces."""
    groups: list[Group]
    n_inputs: int
    outputs: list[Node]
    workspaces: list[Node]
    slot_of: dict[Node, int]        # materialized node -> workspace slot
    group_of: dict[Node, int]       # reduction / materialized node -> producing group
    sweep_of: dict[Node, int]       # reduction -> sweep in its group

    @property
    def n_slots(self) -> int:
        return self.n_inputs + len(self.outputs) + len(self.workspaces)


def fits(shape: tuple, dom: tuple, axes: frozenset) -> str | None:
    """'full' / 'row' when a value of `shape` lives in domain (dom, axes), else None.
    'row' values are constant along every reduced axis (only when there are reduced axes)."""
    if len(shape) != len(dom):
        return None
    varies_on_reduced = broadcast_on_reduced = False
    for i, (d, s) in enumerate(zip(shape, dom)):
        if d == s:
            varies_on_reduced |= i in axes and not is_one(s)
        elif not is_one(d) or i not in axes:
            return None
        else:
            broadcast_on_reduced = True
    if not (axes and not varies_on_reduced):
        # a 'full' value is stored in the body, over every axis: a unit dim where the domain
        # has a reduced axis would be a broadcast store (two writers per element)
        return None if broadcast_on_reduced else "full"
    return "row"


# Ops a VM applies to a one-element operand on the fly (the CPU VM's uniform registers, DECISIONS);
# any other op on a one-element value is computed over every lane of a tile
ON_THE_FLY_OPS = frozenset({"add", "sub", "mul", "div", "maximum", "minimum"})


def scalar_work(outputs: list[Node]) -> list[Node]:
    """Computed one-element values that larger values read and that involve an op other than
    casts and ON_THE_FLY_OPS (an optimizer's bias corrections from its step count): each is
    computed once, in a kernel of its own domain, and read broadcast; inlined, it would be
    recomputed for every element. Innermost first."""
    order = topo_order(outputs)
    larger_reader: set = set()
    for n in reversed(order):           # readers first
        if not _one_element(n):
            larger_reader.update(n.inputs)
        elif n.op in VIEW_OPS:          # a one-element view read by larger values reads its base
            if n in larger_reader:
                larger_reader.update(n.inputs)
    costly: dict = {}
    for n in order:
        computed = _one_element(n) and OP_TABLE[n.op].kind in (Kind.ELEMENTWISE, Kind.CAST)
        costly[n] = computed and (n.op not in ON_THE_FLY_OPS and OP_TABLE[n.op].kind is not Kind.CAST
                                  or any(costly.get(i, False) for i in n.inputs))
    return [n for n in order if costly[n] and n in larger_reader]


def _one_element(n: Node) -> bool:
    return all(is_one(d) for d in n.shape)


class Partitioner:
    def __init__(self, n_inputs: int, outputs: list[Node]):
        self.n_inputs, self.outputs = n_inputs, outputs
        self.uniform: set = set()       # scalar_work, materialized: read through their workspaces
        self.groups: list[Group] = []
        self.group_of: dict[Node, int] = {}
        self.sweep_of: dict[Node, int] = {}
        self.workspaces: list[Node] = []
        self.slot_of: dict[Node, int] = {}
        self._memo: dict[Node, frozenset] = {}
        self.pusher = ReshapePusher()

    # -- what inlining a node reads: (root, through_workspace) pairs ----------------------------
    def deps(self, node: Node) -> frozenset:
        if node in self.uniform:
            return frozenset({(node, True)})
        memo = self._memo.get(node)
        if memo is None:
            if is_reduce(node):
                self.place_reduction(node)
                memo = frozenset({(node, False)})
            else:
                memo = self.inline_deps(node)
            self._memo[node] = memo
        return memo

    def inline_deps(self, node: Node) -> frozenset:
        if node.op == "concat":
            self.materialize(node)
            return frozenset({(node, True)})
        if node.op in VIEW_OPS:
            base, _ = self.resolve_view(node)
            return frozenset({(base, True)}) if base in self.slot_of else frozenset()
        return frozenset().union(*(self.deps(i) for i in node.inputs))

    def resolve_view(self, v: Node) -> tuple[Node, list[Node]]:
        """(base, chain) a load can express; materializes what must be materialized."""
        base, chain = split_chain(v)
        if base.op not in LEAF_OPS:
            self.materialize(base)
        start = 0
        while (k := offending_reshape(chain, start)) >= 0:
            base, start = chain[k - 1], k
            self.materialize(base)
        return base, chain[start:]

    def lowest_group(self, deps: frozenset) -> int:
        return max((self.group_of[d] + (1 if ws else 0) for d, ws in deps), default=0)

    # -- placement ------------------------------------------------------------------------------
    def place_reduction(self, r: Node) -> None:
        if r in self.group_of:
            return
        src = r.inputs[0]
        deps = self.deps(src)
        lo, axes = self.lowest_group(deps), frozenset(r.attr("axes"))
        g = next((g for g in reversed(self.groups) if g.index >= lo and g.shape == src.shape
                  and g.axes == axes), None) or self.new_group(src.shape, axes)
        inner = [self.sweep_of[d] for d, ws in deps if not ws and self.group_of[d] == g.index]
        self.sweep_of[r] = 1 + max(inner, default=-1)
        g.reductions.append(r)
        self.group_of[r] = g.index

    def place_store(self, value: Node, slot: int, view: Node | None) -> int:
        """view: None, the output node when it is a reshape of value, or a concat's slice that
        value fills. A group stores at most once into a slot."""
        deps = self.inline_deps(value) if not is_reduce(value) else self.deps(value)
        lo = self.lowest_group(deps)
        homes = sorted({self.group_of[d] for d, ws in deps if not ws}, reverse=True)
        order = homes + [g.index for g in reversed(self.groups) if g.index not in homes]
        g = next((self.groups[i] for i in order
                  if i >= lo and fits(value.shape, self.groups[i].shape, self.groups[i].axes)
                  and all(s.slot != slot for s in self.groups[i].stores)), None)
        store = Store(value, slot, view)
        if g is None:
            g, store.value = (None if store.fills_slice else self.reshaped_home(value)) or \
                (self.new_group(value.shape, frozenset()), value)
        g.stores.append(store)
        return g.index

    def place_concat(self, node: Node, slot: int) -> None:
        """Each piece stored into its slice of `slot`; readers of the node load it after the last."""
        self.slot_of[node] = slot
        self.group_of[node] = max(self.place_store(p, slot, v) for p, v in zip(node.inputs, concat_slices(node)))

    def reshaped_home(self, value: Node) -> tuple[Group, Node] | None:
        """(group, value reshaped to its domain) for elementwise work with no group of its shape:
        stored row-major, the reshaped value writes the same elements, in one kernel fewer. A
        value whose reshape was moved (it has a twin) goes only where the twin is computed, so
        that the work is not done twice."""
        if not pushable(value):
            return None
        twin = self.pusher.twins.get(value)
        for g in reversed(self.groups):
            moved = self.pusher.pushed(value, g.shape)
            if moved is not None and fits(moved.shape, g.shape, g.axes) == "full" \
                    and (twin is None or (moved is twin and twin in self.work_of(g))) \
                    and self.lowest_group(self.inline_deps(moved)) <= g.index:
                return g, moved
        return None

    def work_of(self, g: Group) -> set:
        """The nodes group g computes (as far as placed)."""
        roots = [r.inputs[0] for r in g.reductions] + [s.value for s in g.stores]
        return set(topo_order(roots))

    def materialize(self, node: Node) -> None:
        if node in self.slot_of:
            return
        slot = self.n_inputs + len(self.outputs) + len(self.workspaces)
        self.workspaces.append(node)
        self.slot_of[node] = slot
        if is_reduce(node):
            self.place_reduction(node)
            self.groups[self.group_of[node]].stores.append(Store(node, slot, None))
        elif node.op == "concat":
            self.place_concat(node, slot)
        else:
            self.group_of[node] = self.place_store(node, slot, None)

    def new_group(self, shape: tuple, axes: frozenset) -> Group:
        g = Group(len(self.groups), shape, axes)
        self.groups.append(g)
        return g

    def reads_of(self, g: Group) -> frozenset:
        out = frozenset().union(*(self.deps(r.inputs[0]) for r in g.reductions))
        for s in g.stores:
            out |= self.inline_deps(s.value) if not is_reduce(s.value) else frozenset()
        return out

    def run(self) -> Plan:
        work = scalar_work(self.outputs)
        for node in work:          # (inlined into each other: one kernel of one-element domain)
            self.materialize(node)
        self.uniform.update(work)
        placed = set()
        for i, out in enumerate(self.outputs):   # concats fill their outputs: readers load them there
            cat = out if out.op == "concat" else out.inputs[0] if out.op == "reshape" else None
            if cat is not None and cat.op == "concat" and cat not in self.slot_of:
                self.place_concat(cat, self.n_inputs + i)   # (a reshape of a row-major buffer: the same memory)
                placed.add(i)
        for node in topo_order(self.outputs):
            if is_reduce(node):
                self.place_reduction(node)
        for i, out in enumerate(self.outputs):
            if i in placed:
                continue
            slot = self.n_inputs + i
            base, _ = split_chain(out)
            if out.op == "reshape" and out.inputs[0].op not in VIEW_OPS and base.op not in LEAF_OPS:
                self.place_store(out.inputs[0], slot, out)
            else:
                self.place_store(out, slot, None)
        changed = True
        while changed:  # reductions read by other groups go through workspaces
            changed = False
            for g in list(self.groups):
                for d, ws in self.reads_of(g):
                    if not ws and self.group_of[d] != g.index and d not in self.slot_of:
                        self.materialize(d)
                        changed = True
        return Plan(self.groups, self.n_inputs, self.outputs, self.workspaces, self.slot_of,
                    self.group_of, self.sweep_of)


def partition(n_inputs: int, outputs: list[Node]) -> Plan:
    """Plan.outputs are `outputs` with reshapes, slices and permutes of elementwise work moved onto
    their loads, the permutes of outputs' and those inside (fusion/reshape_push, slice_push),
    reshapes that cannot move there moved toward the outputs (fusion/reshape_hoist), and the
    broadcasts elementwise work reads dropped (fusion/broadcast_sink): equal values, of the same
    shapes and dtypes."""
    p = Partitioner(n_inputs, outputs)
    pushed = push_slices(push_reshapes(outputs, p.pusher))
    p.outputs = sink_broadcasts(push_inner_permutes(push_permutes(hoist_reshapes(pushed, p.pusher))))
    return p.run()
