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

Weights: in an inference graph, the parameters and buffers (AOTAutograd's static inputs) count
as inputs of such values too, where the value also reads a size or a size-only value: a learned
position table read at arange(L), RoPE's cos / sin from the `inv_freq` buffer, T5's relative
position bias, BERT's token types gathered from a buffer. Each entry then records, for every
weight it read, the tensor (a weak reference), its version counter and its data pointer, and is
used only while all three still match: an in-place update (`add_`, `copy_`, `load_state_dict`),
a `.data` assignment or another module's tensors make it computed again. A value read from
weights alone (`t(w)`, `1 + w`) is left in the graph: it folds into a linear call or a segment
there. Tensors without a version counter (made under `torch.inference_mode`) are never
remembered: their values are computed at every call. Writes PyTorch does not see (through
`numpy()` or a data pointer) are not detected (DECISIONS.md).
"""
from __future__ import annotations

import threading
import weakref
from typing import Callable

import torch
import torch.fx as fx

from ..runtime import counters
from .aten_common import fake

ENABLED = True              # off: size-only values are computed at every call (tests compare the two)
MAX_ENTRIES = 64            # size tuples remembered per graph
MAX_BYTES = 64 << 20        # bytes of tensors remembered per graph (an entry above it is not kept)


# namespaces of functional ops: ATen's, prims' and DVM's own (fx_interpolate's upsampling call)
PURE_NAMESPACES = ("aten", "prims", "dvm")


def pure_op(target) -> bool:
    if isinstance(target, torch._ops.OpOverload):
        return target.namespace in PURE_NAMESPACES and not target._schema.is_mutable \
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


def escaping(gm: fx.GraphModule) -> set:
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


def size_only(gm: fx.GraphModule, weights: frozenset = frozenset()) -> list[fx.Node]:
    """The size-only call_function nodes of gm, in graph order (see the module docstring); none
    when no tensor is among them (size arithmetic alone is not worth a function of its own).
    weights: placeholders of parameters and buffers, read by such values beside sizes."""
    if not ENABLED:
        return []
    returned = escaping(gm)
    sized = set(size_args(gm))
    weighty: set = set()    # values of weights alone (and constants): taken where a sized value reads them
    found: set = set()
    for n in gm.graph.nodes:
        if n.op != "call_function" or n in returned or not pure_op(n.target):
            continue
        args: list = []
        fx.node.map_arg((n.args, n.kwargs), lambda a: args.append(a) or a)
        if not all(a in sized or a in weights or a in weighty for a in args):
            continue
        if not any(a in sized for a in args) and any(a in weights or a in weighty for a in args):
            weighty.add(n)
            continue
        sized.add(n)
        found.add(n)
        todo = [a for a in args if a in weighty]
        while todo:
            a = todo.pop()
            if a not in found:
                found.add(a)
                fx.node.map_arg((a.args, a.kwargs), lambda b: todo.append(b) if b in weighty else None)
    found = [n for n in gm.graph.nodes if n in found]
    positions = _index_positions(found, set(found))
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
    """fn(env, *sizes, *weights) -> tuple of values, remembered per (env values, sizes) while the
    weights are the same tensors, unchanged (see the module docstring). At most MAX_ENTRIES
    tuples and MAX_BYTES of tensors are kept (the oldest go first); an entry larger than
    MAX_BYTES is computed at every call."""
    __name__ = "size_consts"   # FX names a call_function node after its target

    def __init__(self, fn: Callable, n_steps: int, n_sizes: int, n_weights: int = 0):
        self.fn, self.n_steps, self.n_sizes, self.n_weights = fn, n_steps, n_sizes, n_weights
        self._cache: dict = {}     # key -> (weights' stamps, values)
        self._bytes: dict = {}
        self._total = 0
        self._lock = threading.Lock()

    def __call__(self, env: dict, *args) -> tuple:
        key = (*env.values(), *args[:self.n_sizes])
        weights = args[self.n_sizes:]
        hit = self._cache.get(key)
        if hit is not None and (not weights or _same(hit[0], weights)):
            counters.bump("torch_size_consts_hits")
            return hit[1]
        values = tuple(self.fn(env, *args))
        stamps = _stamps(weights)
        counters.bump("torch_size_consts_computed" if stamps is not None else "torch_size_consts_unversioned")
        size = _tensor_bytes(values)
        if stamps is not None and size <= MAX_BYTES:
            self._keep(key, stamps, values, size)
        return values

    def _keep(self, key, stamps: tuple, values: tuple, size: int) -> None:
        with self._lock:
            if key in self._cache:     # (stale weights: replaced)
                self._total -= self._bytes.pop(key)
                del self._cache[key]
            self._cache[key], self._bytes[key] = (stamps, values), size
            self._total += size
            while len(self._cache) > MAX_ENTRIES or self._total > MAX_BYTES:
                old = next(iter(self._cache))
                del self._cache[old]
                self._total -= self._bytes.pop(old)

    def __repr__(self) -> str:
        return "dvm.size_consts"


def _stamps(weights: tuple) -> tuple | None:
    """(weak reference, version counter, data pointer) per weight; None when one has no version
    counter (an inference tensor): then nothing read from it is remembered."""
    try:
        return tuple((weakref.ref(w), w._version, w.data_ptr()) for w in weights)
    except RuntimeError:
        return None


def _same(stamps: tuple, weights: tuple, stale: str | None = "torch_size_consts_stale") -> bool:
    """The weights are the tensors of stamps, unchanged; else False, counted as `stale` (if any)."""
    for (ref, version, ptr), w in zip(stamps, weights):
        if ref() is not w or w._version != version or w.data_ptr() != ptr:
            if stale:
                counters.bump(stale)
            return False
    return True


__all__ = ["size_args", "size_only", "move_first", "SizeConsts", "MAX_ENTRIES", "MAX_BYTES"]
