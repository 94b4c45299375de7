"""Patterns recognized in an ATen FX graph before it is cut into segments (once per graph).

rotate_half: HF's `cat((-x[..., h:], x[..., :h]), -1)` on an axis of size 2h, and its gradient
`slice_backward(-g[..., :h], h:) + slice_backward(g[..., h:], :h)`. Viewing x as [..., 2, h],
the halves are the two rows of the size-2 axis: swapping them is a FLIP of that axis (a view
with a negative stride and an offset, no copy) and the minus signs are where(row == r, -v, v).
So the whole cat is one elementwise expression over [..., 2, h], reshaped back to [..., 2h].

rope: `x * cos + rotate_half(x) * sin` (either operand order) is computed entirely over
[..., 2, h] (cos and sin viewed the same way) and reshaped once, so it is ONE vector kernel and
never a fallback; the halves' signs are a constant input row (HalfSigns: x * -1 is -x exactly)
rather than a per-lane select. The value is the same expression as the unfused ops (same ops,
same operand order): the rewrite only changes the shape the elementwise work is done in. This
holds where x is a PyTorch value too (HF: a view of the q/k projection): the flip is a view of
it, and a segment storing q and k in PyTorch's order computes them in that order
(fusion/reshape_push: permutes move under the reshape), so no call is added for the rotation.

A rotate_half of a PyTorch value outside a rope (or a rope the segment cannot take) reads
`roll(x, h)` computed by PyTorch (one call; `Rolled`), or, where x's views keep the heads of
their base whole, `roll_blocks` of that base for q and k at once (fx_rolled_blocks), with the
halves' signs applied in the segment.

A match names the FX nodes it absorbs (each used only inside the match). The planner skips
absorbed nodes and lowers the match at its root; if that fails, it plans them one by one.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.fx as fx

from ..graph import build
from ..graph.node import Node
from .aten_table import Unsupported

aten = torch.ops.aten
_BIG_END = 2 ** 62       # slice ends at or past this run to the end of the axis
ENABLED = True           # off: every node is lowered on its own (tests compare the two)
ROPE_OF_TORCH_VALUES = True   # off: a rope of a PyTorch value reads PyTorch's roll (the tests compare)


@dataclass
class Match:
    kind: str                      # "rope", "rotate_half", "rotate_half_backward"
    root: fx.Node
    args: tuple                    # FX nodes (and constants) handed to `lower`, in order
    lower: Callable                # lower(lw, *dvm_args) -> Node
    absorbed: list = field(default_factory=list)   # FX nodes computed only by the match
    rotate: list = field(default_factory=list)     # the rotate_half nodes (slices, neg, cat)
    in_torch: object = None        # what a segment reads for root's value PyTorch computes (fx_rotate_pairs)


def _val(n):
    return n.meta.get("val") if isinstance(n, fx.Node) else None


def _int(d) -> int | None:
    """A concrete size (head dims are concrete in practice); None for a symbolic one."""
    if isinstance(d, int):
        return d
    try:
        return int(d) if d.node.expr.is_Integer else None
    except AttributeError:
        return None


def _half_slice(n):
    """(source, 'lo' | 'hi', axis) when n is slice(src, axis, 0, h) or slice(src, axis, h, end) of
    an axis of concrete size 2h; None otherwise."""
    if not isinstance(n, fx.Node) or n.target is not aten.slice.Tensor or n.kwargs:
        return None
    src, dim, start, end, step = (list(n.args) + [0, None, None, 1][len(n.args) - 1:])[:5]
    v = _val(src)
    if not isinstance(v, torch.Tensor) or step != 1 or not isinstance(dim, int):
        return None
    axis = dim % v.ndim
    size = _int(v.shape[axis])
    if size is None or size % 2 or size < 2:
        return None
    h = size // 2
    start = 0 if start is None else start
    end = size if end is None or (isinstance(end, int) and end >= _BIG_END) else end
    if not (isinstance(start, int) and isinstance(end, int)):
        return None              # (never compare SymInts here: that would add guards)
    if (start, end) == (0, h):
        return src, "lo", axis
    if (start, end) == (h, size):
        return src, "hi", axis
    return None


def _piece(n):
    """(source, half, negated, nodes) for slice / neg(slice) pieces."""
    neg = isinstance(n, fx.Node) and n.target is aten.neg.default
    inner = n.args[0] if neg else n
    s = _half_slice(inner)
    if s is None:
        return None
    return s[0], s[1], s[2], neg, ([n, inner] if neg else [n])


def _halves(p_lo, p_hi):
    """The two pieces placed at rows 0 and 1 of [..., 2, h]: (source, axis, flip, negs, nodes)."""
    a, b = _piece(p_lo), _piece(p_hi)
    if a is None or b is None or a[0] is not b[0] or a[2] != b[2] or {a[1], b[1]} != {"lo", "hi"}:
        return None
    return a[0], a[2], a[1] == "hi", (a[3], b[3]), a[4] + b[4]


def _rows(lw_ctx, x: Node, axis: int) -> Node:
    """x viewed as [..., 2, h, ...] at `axis`."""
    h = x.shape[axis] // 2
    return build.reshape(lw_ctx, x, x.shape[:axis] + (2, h) + x.shape[axis + 1:])


def halves_node(ctx, x: Node, axis: int, flip: bool, negs: tuple) -> Node:
    """Over [..., 2, h]: row r holds (flip ? the other row : row r) of x, negated where negs[r]."""
    x2 = _rows(ctx, x, axis)
    if flip:
        x2 = build.slice_view(ctx, x2, axis, 1, 2, -1)
    if negs == (False, False):
        return x2
    neg = build.elementwise(ctx, "neg", x2)
    if negs == (True, True):
        return neg
    is_row0 = build.elementwise(ctx, "eq", build.iota(x2.shape, axis), build.const(0))
    return build.elementwise(ctx, "where", is_row0, *((neg, x2) if negs[0] else (x2, neg)))


@dataclass(frozen=True)
class HalfSigns:
    """A constant segment input: -1 on the negated half of the axis, 1 on the other, shaped
    (2h, 1, ...) to broadcast against the axis (`trailing` dims after it). x * -1 is -x exactly
    (NaNs aside, whose sign bit may differ); an iota-based select instead cost the VM a
    per-lane index computation (about 8x the segment's time)."""
    h: int
    trailing: int
    dtype: torch.dtype
    first_negated: bool
    device: str = "cpu"


def signs_of(v, axis: int, negs: tuple) -> HalfSigns | None:
    """The HalfSigns input that signs the halves of `axis` of v (a fake tensor) as `negs` says;
    None where no half, or both, is negated, or the axis's size is symbolic."""
    size = _int(v.shape[axis])
    if negs[0] == negs[1] or size is None:
        return None
    return HalfSigns(size // 2, v.ndim - 1 - axis, v.dtype, negs[0], str(v.device))


@dataclass(frozen=True, eq=False)
class Rolled:
    """rotate_half(x) as `roll(x, h, axis)` (PyTorch: one call, where two slices, a neg and a cat
    were four) with the signs of its two halves applied in the segment (`signed`): the same
    values, so the products stay bitwise those of the unfused ops."""
    cat: fx.Node                   # the rotate_half's cat (its value when PyTorch computes it)
    x: fx.Node                     # the value whose halves it swaps
    h: int
    axis: int                      # of the cat, counted from 0
    negs: tuple                    # (first half negated, second half negated)

    def signs(self) -> HalfSigns | None:
        """The sign input `signed` needs (None: no half, or both, is negated)."""
        return signs_of(_val(self.cat), self.axis, self.negs)

    def signed(self, ctx, rolled: Node, signs: Node | None) -> Node:
        """rotate_half's value from roll(x, h, axis) (and the signs() input, when there is one)."""
        if signs is not None:
            return build.elementwise(ctx, "mul", rolled, signs)
        return build.elementwise(ctx, "neg", rolled) if self.negs[0] else rolled


def half_signs(s: HalfSigns) -> torch.Tensor:
    """The tensor for a HalfSigns input (one per distinct value, created once, never written)."""
    t = _SIGNS.get(s)
    if t is None:
        t = torch.ones((2 * s.h,) + (1,) * s.trailing, dtype=s.dtype, device=s.device)
        (t[:s.h] if s.first_negated else t[s.h:]).fill_(-1)
        _SIGNS[s] = t
    return t


_SIGNS: dict = {}   # HalfSigns -> tensor: a handful of values (head size, rank, dtype)


def rolled(cat: fx.Node) -> Rolled | None:
    """cat as a Rolled when it swaps the halves of one value (HF's `cat((-x[h:], x[:h]))`)."""
    if cat.target is not aten.cat.default or len(cat.args[0]) != 2:
        return None
    hv = _halves(*cat.args[0])
    v = _val(cat)
    if hv is None or not hv[2] or not isinstance(v, torch.Tensor):
        return None
    src, axis, _, negs, _ = hv
    return Rolled(cat, src, _int(v.shape[axis]) // 2, axis, negs)


def _lower_halves(axis: int, flip: bool, negs: tuple):
    def lower(lw, x):
        return build.reshape(lw.ctx, halves_node(lw.ctx, x, axis, flip, negs), lw.out_shape)
    return lower


def _cat_match(n: fx.Node) -> Match | None:
    if n.target is not aten.cat.default or len(n.args[0]) != 2:
        return None
    dim = n.args[1] if len(n.args) > 1 else n.kwargs.get("dim", 0)
    hv = _halves(*n.args[0])
    if hv is None or hv[1] != dim % _val(n).ndim:
        return None
    src, axis, flip, negs, nodes = hv
    return Match("rotate_half", n, (src,), _lower_halves(axis, flip, negs), nodes, [n] + nodes)


def _slice_backward_piece(n):
    """(value, half) for slice_backward(v, sizes, axis, 0, h) / (v, sizes, axis, h, end)."""
    if not isinstance(n, fx.Node) or n.target is not aten.slice_backward.default:
        return None
    v, sizes, dim, start, end, step = n.args
    size = _int(sizes[dim])
    if not all(isinstance(i, int) for i in (dim, start, end, step)) or step != 1 or size is None or size % 2:
        return None
    h = size // 2
    end = size if end >= _BIG_END else end
    half = "lo" if (start, end) == (0, h) else "hi" if (start, end) == (h, size) else None
    return (v, half, dim % len(sizes)) if half else None


def _backward_match(n: fx.Node) -> Match | None:
    """add(slice_backward(p, hi), slice_backward(q, lo)) = cat([q, p]) on the axis."""
    if n.target is not aten.add.Tensor or len(n.args) != 2 or n.kwargs:
        return None
    a, b = _slice_backward_piece(n.args[0]), _slice_backward_piece(n.args[1])
    if a is None or b is None or a[2] != b[2] or {a[1], b[1]} != {"lo", "hi"}:
        return None
    lo, hi = (a, b) if a[1] == "lo" else (b, a)
    hv = _halves(lo[0], hi[0])
    if hv is None or hv[1] != a[2]:
        return None
    src, axis, flip, negs, nodes = hv
    return Match("rotate_half_backward", n, (src,), _lower_halves(axis, flip, negs),
                 [n.args[0], n.args[1]] + nodes)


def _rope_match(n: fx.Node, cats: dict) -> Match | None:
    """add(mul(x, cos), mul(rotate_half(x), sin)), operands in any order."""
    if n.target is not aten.add.Tensor or len(n.args) != 2 or n.kwargs:
        return None
    for plain, rot in (n.args, n.args[::-1]):
        if not all(isinstance(m, fx.Node) and m.target is aten.mul.Tensor for m in (plain, rot)):
            continue
        for ri in (0, 1):
            cat = rot.args[ri]
            m = cats.get(cat)
            if m is None or m.kind != "rotate_half":
                continue
            x = m.args[0]
            if x not in plain.args[:2]:
                continue
            pi = plain.args.index(x)
            cos, sin = plain.args[1 - pi], rot.args[1 - ri]
            _, ax, flip, negs, _ = _halves(*cat.args[0])
            lower = _lower_rope(ax - _val(x).ndim, flip, negs, pi, ri, n.args[0] is plain)
            signs = signs_of(_val(cat), ax, negs)
            args = (x, cos, sin) if signs is None else (x, cos, sin, signs)
            return Match("rope", n, args, lower, [plain, rot, cat] + m.absorbed, [cat] + m.rotate)
    return None


def _as_rows(ctx, t: Node, axis: int) -> Node:
    """A cos / sin operand (broadcasting against x, `axis` counted from the end) over [..., 2, h]."""
    if t.ndim < -axis:
        t = build.reshape(ctx, t, (1,) * (-axis - t.ndim) + t.shape)
    a = t.ndim + axis
    if build.decide_eq(t.shape[a], 1) is True:
        return build.reshape(ctx, t, t.shape[:a] + (1, 1) + t.shape[a + 1:])
    return _rows(ctx, t, a)


def _lower_rope(axis: int, flip: bool, negs: tuple, x_pos: int, rot_pos: int, plain_first: bool):
    def lower(lw, x, cos, sin, signs=None):
        ctx = lw.ctx
        if not isinstance(cos, Node) or not isinstance(sin, Node):
            raise Unsupported("rope with scalar cos / sin")
        a = x.ndim + axis
        x2 = _rows(ctx, x, a)
        if signs is None:
            rot = halves_node(ctx, x, a, flip, negs)
        else:   # the halves' signs as a constant input: no per-lane select
            h = x.shape[a] // 2
            rows = build.reshape(ctx, signs, (2, h) + signs.shape[1:])
            rot = build.elementwise(ctx, "mul", halves_node(ctx, x, a, flip, (False, False)), rows)
        c2, s2 = _as_rows(ctx, cos, axis), _as_rows(ctx, sin, axis)
        plain = build.elementwise(ctx, "mul", *((x2, c2) if x_pos == 0 else (c2, x2)))
        rotated = build.elementwise(ctx, "mul", *((rot, s2) if rot_pos == 0 else (s2, rot)))
        out = build.elementwise(ctx, "add", *((plain, rotated) if plain_first else (rotated, plain)))
        return build.reshape(ctx, out, lw.out_shape)
    return lower


def find(gm: fx.GraphModule) -> dict:
    """root FX node -> Match, for matches whose absorbed nodes are used only inside the match."""
    cats: dict = {}
    out: dict = {}
    if not ENABLED:
        return out
    for n in gm.graph.nodes:
        if n.op != "call_function":
            continue
        m = _cat_match(n)
        if m is not None:
            cats[n] = m
        m = _rope_match(n, cats) or _backward_match(n) or m
        if m is not None:
            close(m)
            out[n] = m
            for a in m.absorbed:     # a rotate_half absorbed by a rope is not a root of its own
                out.pop(a, None)
    return out


def close(m: Match) -> None:
    """Keep only absorbed nodes whose users are all inside the match (to a fixed point)."""
    absorbed = list(dict.fromkeys(m.absorbed))
    while True:
        inside = set(absorbed) | {m.root}
        keep = [a for a in absorbed if all(u in inside for u in a.users)]
        if len(keep) == len(absorbed):
            m.absorbed = keep
            return
        absorbed = keep
