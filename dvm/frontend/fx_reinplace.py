"""Scatters written in place in the run graph. Functionalization turns an assignment into a slice
of a tensor into out-of-place scatters, each a copy of its whole base: `out[:, t] = v` in a loop
over time steps (RWKV's CPU scan, caches updated step by step) copies `out` once per step, and a
nested assignment `x[:, :-1, :, a:] = v` (Longformer's sliding-window attention) is a nest,
    b1 = slice(x, 1, 0, -1);  s1 = slice_scatter(b1, v, 3, a);  s2 = slice_scatter(x, s1, 1, 0, -1)
where each scatter's source is the one before and each scatter's base is the region the next
writes (`b1` is `x`'s region `1, 0, -1`; or the base itself where the next writes all of it).
Where x is a graph input the graph overwrites at its end (`copy_(x, ...)`, an input mutation
AOTAutograd keeps in the graph), each such assignment copies x two to four times.

A nest s1..sk whose root is x = sk's base runs as one write: s1 writes v into its base (`b1[..,
a:].copy_(v)`, IN_PLACE), and s2..sk, whose regions then hold their sources already, return
their bases (`updated_base`). That holds the values where:
- x's memory may be written: every value that may share it (`_Aliases`: views, getitems,
  anything not known to return fresh memory) has one origin, which is a functional scatter
  (fresh memory no one else holds) or a graph input whose last reader copies a value into it
  after the nest (`copy_(x, y)`; that copy then skips or first clones a y that is x's memory:
  `overwrite`); none is a view in which two elements share one location (expand), and none is
  opaque (a call not known to alias or not alias its arguments);
- no value that shares x's memory is read after s1 other than by the nest: every one made before
  sk, except s1..sk, is read after s1 only as the base of a nest member, as the input of a nest
  base's view, for its sizes, or as the destination of that final copy_. (Values made after sk
  that share the memory derive from sk, or from one of those, whose readers are checked.)
Then no value anyone reads later changes, and s1's source and indices share no memory with x.
Nests are taken in graph order, each after the last one written.

A scatter the rules above leave out of place, or an index-wise one (scatter, scatter_add,
index_add, index_fill: FRESH_IN_PLACE), is written into its base where that base is memory
nothing else can reach (_fresh_base): an ATen op's fresh result, or a DVM segment's result that
shares no launch output with another, read by that scatter alone (a gather's gradient: zeros of
tokens x vocabulary, then the targets' entries; as a copy, one more pass over all of it).
Counted: torch_scatters_in_place."""
from __future__ import annotations

import operator

import torch
import torch.fx as fx

from ..runtime import counters
from .aten_common import SIZE_QUERIES
from .fx_view_chains import PURE_READERS, VIEW_CALLS
from .torch_calls import _slice
from .torch_segment import SegmentRunner

aten = torch.ops.aten
COPY_ = aten.copy_.default
_FULL_END = 2 ** 62   # a slice end at least this is the whole extent (functionalization writes 2**63 - 1)


def select_into(base: torch.Tensor, src: torch.Tensor, dim: int, index: int) -> torch.Tensor:
    """aten.select_scatter(base, src, dim, index), written into base."""
    base.select(dim, index).copy_(src)
    return base


def slice_into(base: torch.Tensor, src: torch.Tensor, dim: int = 0, start=None, end=None, step: int = 1) -> torch.Tensor:
    """aten.slice_scatter(base, src, dim, start, end, step), written into base."""
    aten.slice.Tensor(base, dim, start, end, step).copy_(src)
    return base


def updated_base(base: torch.Tensor, src: torch.Tensor, *region) -> torch.Tensor:
    """A nest member after its first: its region of base is src's memory, written already."""
    return base


def overwrite(dst: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """aten.copy_(dst, src) where src may be dst's memory (a nest written into dst): nothing to do
    where every element of src is dst's at the same place; src copied first where they share
    memory otherwise (copy_ rejects or mis-copies overlapping operands)."""
    if src.device == dst.device and src.untyped_storage().data_ptr() == dst.untyped_storage().data_ptr():
        if src.dtype == dst.dtype and src.shape == dst.shape and src.storage_offset() == dst.storage_offset() \
                and all(a == b or n <= 1 for a, b, n in zip(src.stride(), dst.stride(), dst.shape)):
            return dst
        src = src.clone()
    return dst.copy_(src)


# functional scatter -> the same update written into its first argument (same arguments)
IN_PLACE = {
    aten.select_scatter.default: select_into,
    aten.slice_scatter.default: slice_into,
    aten.index_put.default: aten.index_put_.default,
    torch.index_put: torch.Tensor.index_put_,
    aten.index_copy.default: aten.index_copy_.default,
}
# functional scatters written into a fresh base only (_fresh_base; the same arguments)
FRESH_IN_PLACE = {
    aten.scatter.value: aten.scatter_.value,
    aten.scatter.src: aten.scatter_.src,
    aten.scatter.value_reduce: aten.scatter_.value_reduce,
    aten.scatter.reduce: aten.scatter_.reduce,
    aten.scatter_add.default: aten.scatter_add_.default,
    aten.scatter_reduce.two: aten.scatter_reduce_.two,
    aten.index_add.default: aten.index_add_.default,
    aten.index_fill.int_Scalar: aten.index_fill_.int_Scalar,
    aten.index_fill.int_Tensor: aten.index_fill_.int_Tensor,
}
# fresh results whose strides are given (a zero stride: elements sharing a location, which an
# in-place scatter rejects and the functional one, a dense copy first, takes)
_MAY_OVERLAP = frozenset({"empty_strided", "new_empty_strided"})
# scatter -> the views that take the region it writes (their arguments after the tensor are its
# arguments after base and src)
_REGION_VIEWS = {
    aten.select_scatter.default: (torch.Tensor.select, aten.select.int),
    aten.slice_scatter.default: (_slice, aten.slice.Tensor),
}
_SLICE_DEFAULTS = (0, None, None, 1)
# views in which every element has a location of its own (ATen views by name; the run graph's
# own view callables: fx_view_chains.VIEW_CALLS less expand)
_INJECTIVE_ATEN = frozenset({"slice", "select", "view", "_unsafe_view", "reshape", "_reshape_alias", "permute",
                             "transpose", "t", "unsqueeze", "squeeze", "alias", "diagonal", "narrow", "split",
                             "split_with_sizes", "unbind", "detach", "copy_", "contiguous", "flatten", "unflatten",
                             "movedim", "view_as_real", "view_as_complex", "lift_fresh"})


def _region(n: fx.Node) -> tuple | None:
    """The region a select_scatter / slice_scatter n writes ((kind, dim, ...) with defaults), or
    of a select / slice view n takes; None for anything else."""
    if n.op != "call_function" or n.kwargs:
        return None
    t = n.target
    scatter = t in _REGION_VIEWS
    rest = tuple(n.args[2:] if scatter else n.args[1:])
    if t is aten.select_scatter.default or t in _REGION_VIEWS[aten.select_scatter.default]:
        return ("select", *rest) if len(rest) == 2 else None
    if t is aten.slice_scatter.default or t in _REGION_VIEWS[aten.slice_scatter.default]:
        return ("slice", *rest, *_SLICE_DEFAULTS[len(rest):]) if len(rest) <= 4 else None
    return None


def _whole(region: tuple) -> bool:
    """The region is all of its base (a slice from 0 to the end by 1)."""
    if region[0] != "slice":
        return False
    _, _, start, end, step = region
    return start in (None, 0) and step == 1 and (end is None or isinstance(end, int) and end >= _FULL_END)


def _next_in_nest(s: fx.Node) -> fx.Node | None:
    """The scatter that writes s (its only reader, as source) into the region of its own base
    that s's base is; None where there is none."""
    if len(s.users) != 1:
        return None
    u = next(iter(s.users))
    if u.target not in _REGION_VIEWS or len(u.args) < 2 or u.args[1] is not s or u.args[0] is s:
        return None
    region, base = _region(u), s.args[0]
    if region is None:
        return None
    if base is u.args[0]:
        return u if _whole(region) else None
    is_region_view = isinstance(base, fx.Node) and base.target in _REGION_VIEWS[u.target] and base.args \
        and base.args[0] is u.args[0] and _region(base) == region
    return u if is_region_view else None


class _Aliases:
    """Run-graph values that may share memory, as classes (union-find): a view, a getitem, a
    copy_ and anything whose results are not known to be fresh join their arguments' class. Per
    class: its origins (graph inputs and functional scatters in it), whether it holds an
    opaque value or a view whose elements may share a location (then it is never written)."""

    def __init__(self, g: fx.Graph):
        self.parent: dict = {}
        self.members: dict = {}
        self.origins: dict = {}
        self.barred: set = set()
        for n in g.nodes:
            self._add(n)

    def find(self, n: fx.Node) -> fx.Node:
        while self.parent[n] is not n:
            self.parent[n] = n = self.parent[self.parent[n]]
        return n

    def union(self, a: fx.Node, b: fx.Node) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra is rb:
            return
        if len(self.members[ra]) < len(self.members[rb]):
            ra, rb = rb, ra
        self.parent[rb] = ra
        self.members[ra] += self.members.pop(rb)
        self.origins[ra] |= self.origins.pop(rb)
        if rb in self.barred:
            self.barred.add(ra)

    def _add(self, n: fx.Node) -> None:
        self.parent[n], self.members[n], self.origins[n] = n, [n], set()
        if n.op == "placeholder" or n.op == "call_function" and n.target in IN_PLACE:
            self.origins[n].add(n)
            return
        kind = _alias_kind(n)
        if kind == "fresh":
            return
        args = [a for a in n.all_input_nodes if a in self.parent] if kind == "opaque" else [n.args[0]]
        for a in args:
            self.union(n, a)
        if kind != "view":
            self.barred.add(self.find(n))

    def writable(self, x: fx.Node, position: dict, last: int) -> bool:
        """x's memory may be written by a nest ending at position last (see the module docstring;
        a graph input: the last reader of it copies a value into it, after the nest)."""
        root = self.find(x)
        if root in self.barred or len(self.origins[root]) != 1:
            return False
        (origin,) = self.origins[root]
        if origin.op != "placeholder":
            return True
        final = max(origin.users, key=position.__getitem__, default=None)
        return final is not None and final.target is COPY_ and final.args[0] is origin and position[final] > last


def _alias_kind(n: fx.Node) -> str:
    """How n's value relates to its arguments' memory: "view" (an injective view of its first
    argument), "shared" (a view whose elements may share a location), "fresh" (memory of its
    own, or no tensor) or "opaque" (not known)."""
    if n.op == "output":
        return "fresh"
    if n.op != "call_function":
        return "opaque"
    t = n.target
    if t is operator.getitem or t in VIEW_CALLS or getattr(t, "injective", None) is not None:
        if not (n.args and isinstance(n.args[0], fx.Node)):
            return "opaque"
        return "shared" if t is torch.Tensor.expand or getattr(t, "injective", True) is False else "view"
    if t in SIZE_QUERIES or getattr(t, "reads_sizes_only", False):
        return "fresh"
    if isinstance(t, torch._ops.OpOverload):
        schema = t._schema
        if any(r.alias_info is not None for r in schema.returns) or t.overloadpacket.__name__ == "_unsafe_view":
            name = t.overloadpacket.__name__
            return "view" if n.args and isinstance(n.args[0], fx.Node) and name in _INJECTIVE_ATEN else "opaque"
        return "opaque" if schema.is_mutable else "fresh"
    runner = getattr(t, "__self__", None)   # a segment's bound run (an input it passes on: a copy)
    if isinstance(runner, SegmentRunner):
        return "opaque" if runner.writes else "fresh"
    return "fresh" if t in PURE_READERS else "opaque"


def _nest(s: fx.Node) -> list:
    """s and the scatters that write it on up to its nest's root (see the module docstring)."""
    nest = [s]
    while (u := _next_in_nest(nest[-1])) is not None:
        nest.append(u)
    return nest


def _readers_allowed(nest: list, aliases: _Aliases, position: dict) -> bool:
    """No value sharing the nest root's memory is read after the nest's first scatter other than
    by the nest (see the module docstring)."""
    members, first, last = set(nest), position[nest[0]], position[nest[-1]]
    views = {m.args[0] for m in nest[:-1]} - {m.args[0] for m in nest[1:]}   # b1..bk-1 taken as views
    root = aliases.find(nest[-1].args[0])
    # (nests come in graph order: a value read by nothing at or after this one's first never counts again)
    live = aliases.members[root] = [a for a in aliases.members[root] if any(position[u] >= first for u in a.users)]
    for a in live:
        if a in members or position[a] >= last:
            continue
        for u in a.users:
            if position[u] < first or u.target in SIZE_QUERIES or getattr(u.target, "reads_sizes_only", False):
                continue
            as_base = (u in members or u in views) and u.args[0] is a and a not in u.args[1:] \
                and a not in u.kwargs.values()
            as_destination = u.target is COPY_ and u.args[0] is a and a.op == "placeholder" and u.args[1] is not a
            if not (as_base or as_destination):
                return False
    return True


def _fresh_base(n: fx.Node) -> bool:
    """n's base (its first argument) is memory nothing but n can reach: read by n alone, and an
    ATen op's fresh result or a result of a DVM segment that owns its memory."""
    b = n.args[0] if n.args else None
    if not isinstance(b, fx.Node) or len(b.users) != 1 or b.op != "call_function" \
            or b in n.args[1:] or b in n.kwargs.values():
        return False
    if b.target is operator.getitem:
        run, i = b.args
        runner = getattr(run.target, "__self__", None) if isinstance(run, fx.Node) else None
        same = [u for u in run.users if u.target is operator.getitem and u.args[1] == i] if runner else []
        return isinstance(runner, SegmentRunner) and isinstance(i, int) and same == [b] and runner.owns_result(i)
    return isinstance(b.target, torch._ops.OpOverload) and _alias_kind(b) == "fresh" \
        and b.target.overloadpacket.__name__ not in _MAY_OVERLAP


def rewrite(g: fx.Graph) -> int:
    """Write the nests of g whose roots may be written in place; returns how many scatters were."""
    position = {n: i for i, n in enumerate(g.nodes)}
    aliases, done, after = _Aliases(g), 0, -1
    written_inputs: set = set()
    for n in list(g.nodes):
        if n.op != "call_function" or n.target not in IN_PLACE or len(n.args) < 2 or position[n] <= after:
            continue
        nest = _nest(n)
        root = nest[-1].args[0]
        if not (isinstance(root, fx.Node) and isinstance(n.args[0], fx.Node)
                and aliases.writable(root, position, position[nest[-1]]) and _readers_allowed(nest, aliases, position)):
            continue
        (origin,) = aliases.origins[aliases.find(root)]   # (writable: one)
        for m in nest:
            aliases.origins[aliases.find(m)].discard(m)
            aliases.union(m, m.args[0])
        if origin.op == "placeholder":
            written_inputs.add(origin)
        n.target = IN_PLACE[n.target]
        for m in nest[1:]:
            m.target = updated_base
        done, after = done + len(nest), position[nest[-1]]
    for n in g.nodes:
        if n.target is COPY_ and n.args and n.args[0] in written_inputs:
            n.target = overwrite
    for n in g.nodes:
        in_place = n.op == "call_function" and (IN_PLACE.get(n.target) or FRESH_IN_PLACE.get(n.target))
        if in_place and _fresh_base(n):
            n.target = in_place
            done += 1
    if done:
        counters.bump("torch_scatters_in_place", done)
    return done
