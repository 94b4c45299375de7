"""Scatter chains written in place in the run graph. Functionalization turns an assignment into a
slice of a tensor (`out[:, t] = v` in a loop over time steps: RWKV's and RecurrentGemma's CPU
scans, caches updated step by step) into an out-of-place scatter: `select_scatter(out_t, v, 1, t)
-> out_{t+1}`, each a copy of the whole tensor, so T steps copy it T times.

A scatter (select_scatter, slice_scatter, index_put, index_copy) run by PyTorch writes into its
base instead (`base.select(1, t).copy_(v)`, returning base) where:
- the base is the result of another such scatter: a functional scatter returns a fresh tensor,
  and one written in place returns its own base, which by induction no one else holds;
- every other reader of the base runs before it and returns no alias of it (no view, no segment
  that passes an input through, no callable whose results are not known to be fresh), and the
  graph does not return the base.
Then no value anyone reads later shares the base's memory, and the write changes no result. The
first scatter of a chain stays out of place: its base may be a graph input, a view, or one launch
output shared by two values (torch_segment), which this pass does not try to prove unaliased.
Counted: torch_scatters_in_place."""
from __future__ import annotations

import torch
import torch.fx as fx

from ..runtime import counters
from .fx_view_chains import PURE_READERS
from .torch_segment import SegmentRunner

aten = torch.ops.aten


def select_into(base: torch.Tensor, src: torch.Tensor, dim: int, index: int) -> torch.Tensor:
    """aten.select_scatter(base, src, dim, index), written into base."""
    base.select(dim, index).copy_(src)
    return base


def slice_into(base: torch.Tensor, src: torch.Tensor, dim: int = 0, start=None, end=None, step: int = 1) -> torch.Tensor:
    """aten.slice_scatter(base, src, dim, start, end, step), written into base."""
    aten.slice.Tensor(base, dim, start, end, step).copy_(src)
    return base


# functional scatter -> the same update written into its first argument (same arguments)
IN_PLACE = {
    aten.select_scatter.default: select_into,
    aten.slice_scatter.default: slice_into,
    aten.index_put.default: aten.index_put_.default,
    aten.index_copy.default: aten.index_copy_.default,
}


def _fresh_result(u: fx.Node) -> bool:
    """u's results never share memory with its arguments: an ATen op whose schema declares no
    alias of an argument and mutates none, a reader into fresh results (fx_view_chains'
    PURE_READERS: products, attention), or a DVM segment that returns no input of its own."""
    target = u.target
    if isinstance(target, torch._ops.OpOverload):
        schema = target._schema
        return not schema.is_mutable and all(r.alias_info is None for r in schema.returns)
    runner = getattr(target, "__self__", None)   # a segment's bound run
    if isinstance(runner, SegmentRunner):
        return not any(is_input for is_input, _, _ in runner.results)
    return target in PURE_READERS


def _writable(base: fx.Node, scatter: fx.Node, position: dict, written: set) -> bool:
    """scatter may write into base (see the module docstring; written: the scatters this pass
    made write in place)."""
    if base.op != "call_function" or base.target not in IN_PLACE and base not in written:
        return False
    return all(u is scatter or (u.op == "call_function" and position[u] < position[scatter] and _fresh_result(u))
               for u in base.users)


def rewrite(g: fx.Graph) -> int:
    """Make the scatters of g that may write into their bases do so; returns how many."""
    position = {n: i for i, n in enumerate(g.nodes)}
    written: set = set()
    for n in g.nodes:
        if n.op != "call_function" or n.target not in IN_PLACE or not n.args:
            continue
        if isinstance(n.args[0], fx.Node) and _writable(n.args[0], n, position, written):
            n.target = IN_PLACE[n.target]
            written.add(n)
    if written:
        counters.bump("torch_scatters_in_place", len(written))
    return len(written)
