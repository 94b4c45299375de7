"""Indexing with a constant index list that is a run of evenly spaced positions, as a slice (a
graph rewrite done once per ATen graph).

`x[:, :, [k]]` with a literal list (Falcon splits its fused query / key / value projection so)
reaches the ATen graph as `index.Tensor(x, [None, None, lift_fresh_copy(constant)])`: a gather,
which DVM runs through PyTorch. When the constant is a 1-D integer tensor whose values are
k, k + s, k + 2s, ... (s >= 1; negative values counted from the end of a concrete axis) and in
bounds, the result is exactly `x[:, :, k : k + n*s : s]` (the same shape and values: one
advanced index with every other entry None or absent keeps the indexed axis where it is), so the
node becomes `slice.Tensor`, a view DVM replays in its segments. Counted:
`torch_const_index_as_slice`. Anything else (several index tensors, booleans, repeated or
decreasing positions, out-of-bounds values, which must raise) is left as it is.
"""
from __future__ import annotations

import torch
import torch.fx as fx

from ..runtime import counters

aten = torch.ops.aten
_INT_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


def _constant(gm: fx.GraphModule, n) -> torch.Tensor | None:
    """The tensor of a get_attr node, possibly through lift_fresh_copy / clone; None otherwise."""
    while isinstance(n, fx.Node) and n.op == "call_function" and \
            n.target in (aten.lift_fresh_copy.default, aten.clone.default) and len(n.args) == 1:
        n = n.args[0]
    if not (isinstance(n, fx.Node) and n.op == "get_attr"):
        return None
    v = getattr(gm, n.target, None)
    return v if isinstance(v, torch.Tensor) else None


def _progression(idx: torch.Tensor, size: int) -> tuple[int, int, int] | None:
    """(start, count, step) when the integer positions are start, start + step, ... (step >= 1,
    negative ones counted from the end), all in [0, size); else None."""
    if idx.dtype not in _INT_DTYPES or idx.dim() != 1 or idx.numel() == 0 or idx.device.type == "meta":
        return None
    vals = [int(v) + size if int(v) < 0 else int(v) for v in idx.tolist()]
    if not all(0 <= v < size for v in vals):
        return None
    step = vals[1] - vals[0] if len(vals) > 1 else 1
    if step < 1 or any(b - a != step for a, b in zip(vals, vals[1:])):
        return None
    return vals[0], len(vals), step


def rewrite(gm: fx.GraphModule) -> int:
    """Rewrite the matching index nodes of gm into slices in place; returns how many."""
    count = 0
    for n in list(gm.graph.nodes):
        if n.op != "call_function" or n.target != aten.index.Tensor or len(n.args) != 2:
            continue
        x, indices = n.args
        xv = x.meta.get("val") if isinstance(x, fx.Node) else None
        tensors = [j for j, i in enumerate(indices) if i is not None]
        if not isinstance(xv, torch.Tensor) or len(tensors) != 1 or len(indices) > xv.dim():
            continue
        axis = tensors[0]
        size = xv.shape[axis]
        idx = _constant(gm, indices[axis])
        if not isinstance(size, int) or idx is None:
            continue
        run = _progression(idx, size)
        if run is None:
            continue
        start, k, step = run
        args = (x, axis, start, start + (k - 1) * step + 1, step)
        with gm.graph.inserting_before(n):
            view = gm.graph.call_function(aten.slice.Tensor, args)
        view.meta = {**n.meta, "val": aten.slice.Tensor(xv, *args[1:])}   # a view's strides
        n.replace_all_uses_with(view)
        gm.graph.erase_node(n)
        erase_dead_chain(gm.graph, indices[axis])
        count += 1
    if count:
        counters.bump("torch_const_index_as_slice", count)
    return count


def erase_dead_chain(graph: fx.Graph, n) -> None:
    """n and the nodes it was made from through first arguments (conversions, copies, the
    constant they start from), as far as nothing else reads them; never a placeholder."""
    while isinstance(n, fx.Node) and n.op in ("call_function", "get_attr") and not n.users:
        src = n.args[0] if n.op == "call_function" and n.args else None
        graph.erase_node(n)
        n = src
