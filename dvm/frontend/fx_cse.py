"""Repeated values of an ATen graph read from their first computation (a rewrite once per graph).

Hugging Face models repeat work per layer that depends on nothing the layer changes: T5 adds its
position bias to the padding mask in every layer, `where(mask, bias, min)` of [B, heads, L, S]
(at L = 256, 0.4 ms a layer on one thread). AOTAutograd's inference graphs are not deduplicated,
so each copy became a segment of its own. Here a call that repeats an earlier one (the same op,
arguments equal to the earlier call's, the same constants) and whose value is stored whatever the
fusion plan (a reader takes it whole: a product, attention, a call DVM does not lower) is
replaced by the earlier call (counted: `torch_common_subexpressions`). A repeat that segments
fuse stays (recomputing it inside a kernel costs less than storing and loading it), and so do
views (free to take again; the later passes fold a view read once into its reader), though equal
views make their readers equal.

Invariants: only calls whose results are a function of their arguments count: ATen ops without a
mutable argument, not random (nondeterministic_seeded) and not `empty`-like (memory not
initialized); nothing is merged across an op that mutates (the "mutation region" of each node:
nodes separated by an in-place op or a copy_ into an input may read different values through the
same node). Results that share storage with a graph output are kept apart (eager returns distinct
tensors, which the caller may then modify one at a time). Constants are compared with their
types (1, 1.0 and True give different results; so do 0.0 and -0.0).
"""
from __future__ import annotations

import torch
import torch.fx as fx

from ..runtime import counters
from . import aten_table as T
from .aten_common import fake
from .fx_sizeonly import escaping, pure_op

aten = torch.ops.aten
ENABLED = True   # off: every call as the graph has it (the tests compare the two)
# ATen ops whose result is memory not yet written: two calls are two buffers, never one value
_UNINITIALIZED = frozenset({aten.empty.memory_format, aten.empty_strided.default, aten.empty_like.default,
                            aten.new_empty.default, aten.new_empty_strided.default})


def _pure(target) -> bool:
    """An ATen op whose result is a function of its arguments (a view of one among them)."""
    return isinstance(target, torch._ops.OpOverload) and pure_op(target) and target not in _UNINITIALIZED


def _mergeable(target) -> bool:
    """A pure op whose result is a new value. (A view is not merged: one costs nothing to take
    again, and the passes after this one fold a view read once into its reader; equal views
    still make their readers equal.)"""
    return _pure(target) and all(r.alias_info is None for r in target._schema.returns)


def _mutates(n: fx.Node) -> bool:
    """n may write one of its arguments: an ATen op with a mutable argument (an AOTAutograd graph's
    other calls are getitem and size arithmetic; the rewrites before this one add calls that
    compute fresh results only: attention, scales, concatenated weights)."""
    if n.op != "call_function":
        return n.op in ("call_method", "call_module")
    return isinstance(n.target, torch._ops.OpOverload) and n.target._schema.is_mutable


def _key(value, canon: dict):
    """A hashable form of an argument: nodes by the first node equal to them, constants with their
    types."""
    if isinstance(value, fx.Node):
        return ("node", id(canon.get(value, value)))
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_key(v, canon) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple((k, _key(v, canon)) for k, v in value.items()))
    if isinstance(value, float):
        return ("float", repr(value))
    return (type(value).__name__, value)


def _stored(n: fx.Node) -> bool:
    """n's value is stored in memory whatever the fusion plan: a reader takes it whole (a matrix
    product, attention, a call DVM does not lower), so no segment can compute it inside its own
    kernel instead."""
    return any(u.op != "call_function" or u.target not in T.LOWERINGS or u.target in T.CUBE_OPS
               for u in n.users)


def _equals(gm: fx.GraphModule) -> dict:
    """node -> the first node of the graph computing the same tensor (nodes that compute none of
    another's are left out), by the node's op, its arguments' first equals and its constants."""
    returned = escaping(gm)   # (the nodes whose memory a graph output may share)
    seen: dict = {}
    canon: dict = {}
    region = 0
    for n in gm.graph.nodes:
        if n.op != "call_function" or not _pure(n.target):
            region += _mutates(n)
            continue
        if n in returned or not isinstance(fake(n), torch.Tensor):
            continue
        try:
            first = seen.setdefault((region, n.target, _key(n.args, canon), _key(n.kwargs, canon)), n)
        except TypeError:   # a constant that cannot be a key
            continue
        if first is not n:
            canon[n] = first
    return canon


def _erase_unread(graph: fx.Graph, n: fx.Node, erased: set) -> None:
    """Erase n, and then those of its arguments' pure calls that nothing reads any more."""
    stack = [n]
    while stack:
        n = stack.pop()
        if n not in erased and n.op == "call_function" and not n.users and _pure(n.target):
            stack.extend(n.all_input_nodes)
            graph.erase_node(n)
            erased.add(n)


def rewrite(gm: fx.GraphModule) -> int:
    """Read each repeated value that is stored anyway (_stored) from its first computation, in
    place; returns how many calls were replaced. A repeat that every reader fuses stays: its
    segment computes it where it is needed, which costs less than storing and loading it."""
    if not ENABLED:
        return 0
    graph = gm.graph
    replaced, erased = 0, set()
    for n, first in _equals(gm).items():
        if n not in erased and _mergeable(n.target) and _stored(n):
            n.replace_all_uses_with(first)
            _erase_unread(graph, n, erased)
            replaced += 1
    if replaced:
        gm.recompile()
        counters.bump("torch_common_subexpressions", replaced)
    return replaced
