"""Values of an ATen FX graph that depend on sizes only, computed once per size tuple.

Hugging Face models build part of every forward from the sequence length alone: the cache
positions (`arange`), the packed-sequence test (`diff`, `!= 1`, `cumsum`) and the bool causal
mask of [B, 1, L, L]. Under `dynamic=True` these are graph nodes whose inputs are SymInt
placeholders and constants, recomputed at every call (the tiny Llama: two DVM segments, a cat,
a cumsum and a mask kernel per forward), and the mask is a new tensor each time, so the causal
check (fx_sdpa) runs every forward too.

`size_only(gm)` finds them: call_function nodes whose FX arguments are SymInt placeholders or
size-only nodes, and whose op is deterministic and functional (an ATen / prims OpOverload
without a mutable schema or the `nondeterministic_seeded` tag, or Python's `operator`
functions). A value that may alias a graph output (the output itself, or what it is a view of,
through view ops and getitem) is excluded: the caller could write into it. `move_first` puts them
right after the placeholders (each reads only placeholders and earlier size-only nodes, so the
graph stays in topological order) so that the planner can keep them in segments of their own.

The run graph computes them in a separate function (torch_runtime) whose results are remembered
per tuple of size values (`SizeConsts`: bounded by entries and bytes). Invariant: an entry is
read, never written: every later op of a functional ATen graph makes new tensors or views, and
no graph output aliases an entry.
"""
from __future__ import annotations

import threading
from typing import Callable

import torch
import torch.fx as fx

from ..runtime import counters
from .fx_segments import fake

ENABLED = True              # off: size-only values are computed at every call (tests compare the two)
MAX_ENTRIES = 64            # size tuples remembered per graph
MAX_BYTES = 64 << 20        # bytes of tensors remembered per graph (an entry above it is not kept)


def _pure_op(target) -> bool:
    if isinstance(target, torch._ops.OpOverload):
        return target.namespace in ("aten", "prims") and not target._schema.is_mutable \
            and torch.Tag.nondeterministic_seeded not in target.tags
    return getattr(target, "__module__", None) in ("_operator", "operator")


def _aliases(n: fx.Node) -> bool:
    """n's value may share memory with one of its arguments: a view op, getitem, or a callable
    that is not an ATen / prims overload (unknown: assumed to)."""
    t = n.target
    return not isinstance(t, torch._ops.OpOverload) or t.is_view


def _may_hold_tensor(n) -> bool:
    v = fake(n)
    return v is None or isinstance(v, (torch.Tensor, list, tuple))


def _escaping(gm: fx.GraphModule) -> set:
    """The nodes whose tensors a graph output may share memory with (sizes cannot)."""
    out = next(n for n in gm.graph.nodes if n.op == "output")
    todo: list = []
    fx.node.map_arg(out.args, lambda a: todo.append(a) or a)
    seen: set = set()
    while todo:
        n = todo.pop()
        if n in seen or not _may_hold_tensor(n):
            continue
        seen.add(n)
        if n.op == "call_function" and _aliases(n):
            fx.node.map_arg((n.args, n.kwargs), lambda a: todo.append(a) or a)
    return seen


def size_args(gm: fx.GraphModule) -> list[fx.Node]:
    """gm's placeholders that are sizes (SymInt or int arguments): what size-only values read."""
    return [n for n in gm.graph.nodes if n.op == "placeholder"
            and isinstance(fake(n), (torch.SymInt, int)) and not isinstance(fake(n), bool)]


def size_only(gm: fx.GraphModule) -> list[fx.Node]:
    """The size-only call_function nodes of gm, in graph order (see the module docstring); none
    when no tensor is among them (size arithmetic alone is not worth a function of its own)."""
    if not ENABLED:
        return []
    escaping = _escaping(gm)
    found: list = []
    ok = set(size_args(gm))
    for n in gm.graph.nodes:
        if n.op != "call_function" or n in escaping or not _pure_op(n.target):
            continue
        args: list = []
        fx.node.map_arg((n.args, n.kwargs), lambda a: args.append(a) or a)
        if all(a in ok for a in args):
            ok.add(n)
            found.append(n)
    positions = _index_positions(found, ok)
    found = [n for n in found if n not in positions]
    return found if any(isinstance(fake(n), torch.Tensor) for n in found) else []


def _index_positions(found: list, size_only_set: set) -> set:
    """The size-only nodes that only feed the index tensors of `aten.index.Tensor` nodes that are
    not size-only themselves (directly or through other such nodes): the positions of an indexing
    like mask[batch_arange[:, None], kv_arange]. Left in the graph, the aranges stay visible to
    the indexing, which a segment then takes as a view (aten_views.index), not a gather."""
    positions: set = set()
    for n in reversed(found):
        if not isinstance(fake(n), torch.Tensor) or not n.users:
            continue
        if all(u in positions or (u.target is torch.ops.aten.index.Tensor and u not in size_only_set
                                  and u.args[0] is not n) for u in n.users):
            positions.add(n)
    return positions


def move_first(gm: fx.GraphModule, nodes: list[fx.Node]) -> None:
    """Put nodes (in their order) right after the last placeholder."""
    anchor = None
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            anchor = n
    for n in nodes:
        if anchor is None:     # a graph without placeholders
            head = next(iter(gm.graph.nodes))
            if head is not n:
                head.prepend(n)
        else:
            anchor.append(n)
        anchor = n


def _tensor_bytes(values) -> int:
    seen, total = set(), 0
    for v in values:
        if isinstance(v, torch.Tensor):
            s = v.untyped_storage()
            if s.data_ptr() not in seen:
                seen.add(s.data_ptr())
                total += s.nbytes()
    return total


class SizeConsts:
    """fn(env, *sizes) -> tuple of values, remembered per (env values, sizes). At most
    MAX_ENTRIES tuples and MAX_BYTES of tensors are kept (the oldest go first); an entry larger
    than MAX_BYTES is computed at every call."""
    __name__ = "size_consts"   # FX names a call_function node after its target

    def __init__(self, fn: Callable, n_steps: int):
        self.fn, self.n_steps = fn, n_steps
        self._cache: dict = {}
        self._bytes: dict = {}
        self._total = 0
        self._lock = threading.Lock()

    def __call__(self, env: dict, *sizes) -> tuple:
        key = (*env.values(), *sizes)
        hit = self._cache.get(key)
        if hit is not None:
            counters.bump("torch_size_consts_hits")
            return hit
        values = tuple(self.fn(env, *sizes))
        counters.bump("torch_size_consts_computed")
        size = _tensor_bytes(values)
        if size <= MAX_BYTES:
            with self._lock:
                if key not in self._cache:
                    self._cache[key], self._bytes[key] = values, size
                    self._total += size
                while len(self._cache) > MAX_ENTRIES or self._total > MAX_BYTES:
                    old = next(iter(self._cache))
                    del self._cache[old]
                    self._total -= self._bytes.pop(old)
        return values

    def __repr__(self) -> str:
        return "dvm.size_consts"


__all__ = ["size_args", "size_only", "move_first", "SizeConsts", "MAX_ENTRIES", "MAX_BYTES"]
