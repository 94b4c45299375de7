"""rotate_half of views of one PyTorch value, swapped for all heads in one call.

HF's attention computes `q = proj(h).view(b, l, -1, d).transpose(1, 2)` (with sibling linears,
`proj(h)` is a slice of one wide product that holds q, k and v), then `rotate_half(q)`. Where
the segment applying RoPE reads rotate_half of such a PyTorch value (fx_patterns.Rolled), the run
graph had PyTorch take the views and `roll(x, d / 2, -1)`, for q and for k: four calls each.

Rolling each block of d elements of the last axis by h commutes with slicing that axis at
multiples of d, splitting it into (heads, d) and moving other axes. So the run graph makes
`roll_blocks(p, h, d, lo, hi, moves)` once: the span [lo, hi) of the product p that the rolled
views read (q and k, not v: `spans`, over every rotate_half of the graph), split into heads,
moved as the views move them and rolled, so laid out with heads before positions as the segment
reads them (a roll per view gave the same layout; another one costs the VM a transposing pass).
q and k share one key, one segment input; each is a slice of its heads in the segment (a DVM
view, no PyTorch call). Values are the roll's: the products applying RoPE stay bitwise those of
the unfused ops.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.fx as fx
from torch.fx.experimental.symbolic_shapes import statically_known_true

from .aten_table import RESHAPE_OPS


aten = torch.ops.aten
ENABLED = True   # off: each Rolled takes its own views and roll in PyTorch (the tests compare)
_MOVES = (aten.transpose.int, aten.permute.default)


@dataclass(frozen=True)
class RolledBlocks:
    """roll_blocks(x, h, block, lo, hi, moves), a segment input the run graph computes (x: an FX
    node)."""
    x: fx.Node
    h: int
    block: int
    lo: int      # the span of x's last axis taken (multiples of block)
    hi: int
    moves: tuple  # ("transpose", a, b) / ("permute", dims) after the split, in order


def roll_blocks(x: torch.Tensor, h: int, block: int, lo: int, hi: int, moves: tuple) -> torch.Tensor:
    """x[..., lo:hi] split into (heads, block), moved, each block rolled by h: a new tensor, laid
    out in the moved order (heads before positions, as the segment reads them)."""
    y = x.narrow(-1, lo, hi - lo).unflatten(-1, (-1, block))
    for m in moves:
        y = y.transpose(m[1], m[2]) if m[0] == "transpose" else y.permute(m[1])
    return torch.roll(y, h, -1)


def _val(n):
    return n.meta.get("val") if isinstance(n, fx.Node) else None


def _same(a, b) -> bool:
    return statically_known_true(a == b)


def _last_slice(n: fx.Node, d: int) -> int | None:
    """The start of slice view n of its input's last axis, where it takes whole blocks of d (step
    1); else None."""
    src, out = _val(n.args[0]), _val(n)
    args = list(n.args[1:])
    dim, start, _, step = args + [0, 0, None, 1][len(args):]
    start = 0 if start is None else start
    if n.kwargs or not isinstance(dim, int) or dim % src.ndim != src.ndim - 1 or step != 1 or \
            not isinstance(start, int) or start < 0 or start % d or not isinstance(out.shape[-1], int) or \
            out.shape[-1] % d:
        return None
    return start


def _splits(n: fx.Node, d: int) -> bool:
    """Reshape n splits its input's last axis into (heads, d), the leading axes as they were."""
    src, out = _val(n.args[0]), _val(n)
    return n.target in RESHAPE_OPS and out.ndim == src.ndim + 1 and _same(out.shape[-1], d) and \
        _same(out.shape[-2] * d, src.shape[-1]) and all(_same(a, b) for a, b in zip(out.shape[:-2], src.shape[:-1]))


def _move(n: fx.Node, ndim: int) -> tuple | None:
    """Transpose / permute n as a hashable move that keeps the last axis last; else None."""
    if n.target is aten.transpose.int and not n.kwargs:
        a, b = (x % ndim for x in n.args[1:3])
        return ("transpose", a, b) if ndim - 1 not in (a, b) else None
    dims = tuple(x % ndim for x in n.args[1])
    return ("permute", dims) if dims[-1] == ndim - 1 and not n.kwargs else None


def _walk(rolled) -> tuple[fx.Node, tuple[int, int], tuple, int] | None:
    """For x = rolled.x as HF takes it of a product p: `[slice(p, -1, a, b)] -> view(..., heads, d)
    -> transposes`, (p, [a, b) (the span of p's last axis x reads), the moves, the heads axis
    after them); None for any other views."""
    v, d = _val(rolled.cat), 2 * rolled.h
    if not ENABLED or not isinstance(v, torch.Tensor) or rolled.axis != v.ndim - 1 or d <= 0:
        return None
    moves, n = [], rolled.x
    while isinstance(n, fx.Node) and n.target in _MOVES:
        moves.append(n)
        n = n.args[0]
    if not (isinstance(n, fx.Node) and n.target in RESHAPE_OPS and isinstance(_val(n), torch.Tensor) and _splits(n, d)):
        return None
    ndim, n = _val(n).ndim, n.args[0]
    lo = _last_slice(n, d) if isinstance(n, fx.Node) and n.target is aten.slice.Tensor else None
    width = _val(n).shape[-1] if isinstance(_val(n), torch.Tensor) else None
    if lo is not None:
        n = n.args[0]
    base = _val(n)
    if not isinstance(base, torch.Tensor) or not isinstance(base.shape[-1], int) or base.shape[-1] % d or \
            base.dtype != v.dtype or not isinstance(width, int):
        return None
    heads, made = ndim - 2, []
    for m in reversed(moves):
        move = _move(m, ndim)
        if move is None:
            return None
        made.append(move)
        heads = {move[1]: move[2], move[2]: move[1]}.get(heads, heads) if move[0] == "transpose" else \
            move[1].index(heads)
    lo = lo or 0
    return n, (lo, lo + width), tuple(made), heads


def spans(rolleds) -> dict:
    """(base FX node, block, moves) -> the union [lo, hi) of the spans that those Rolled values read
    of the base: the part roll_blocks copies (q and k of a q / k / v product, not v)."""
    out: dict = {}
    for r in rolleds:
        walked = _walk(r)
        if walked is not None:
            base, (lo, hi), moves, _ = walked
            key = (base, 2 * r.h, moves)
            old = out.get(key, (lo, hi))
            out[key] = (min(old[0], lo), max(old[1], hi))
    return out


def blocks_of(rolled, span_of: dict) -> tuple[RolledBlocks, int, int, int] | None:
    """(the RolledBlocks input, its heads axis, and the heads [start, end) of it that are rolled's
    value) where rolled's views allow it; else None. span_of: spans()."""
    walked = _walk(rolled)
    if walked is None:
        return None
    base, (a, b), moves, heads = walked
    d = 2 * rolled.h
    lo, hi = span_of.get((base, d, moves), (a, b))
    return RolledBlocks(base, rolled.h, d, lo, hi, moves), heads, (a - lo) // d, (b - lo) // d
