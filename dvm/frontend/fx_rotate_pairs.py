"""The interleaved rotate of RoPE, of a PyTorch value, computed whole by PyTorch for its segment.

GPT-J's `rotate_every_two` (also CodeGen, Cohere, GLM, Helium, Ernie 4.5, RoFormer) is
`stack((-x[..., 1::2], x[..., ::2]), -1).flatten(-2)`: each pair of x's last axis swapped, one of
the two negated. Planned op by op, a segment computed the neg (and stored it, beside the
`x * cos` it fused with), PyTorch the stack and a second segment the products that apply RoPE.
Here, where x is a PyTorch value (HF: a view of the q / k projection), the run graph computes the
whole rotate as `rotate_pairs(x)` (one new tensor laid out as x, written by two strided copies,
the neg through `out=`), and the segment reading it (`RotatedPairs`, an input like
fx_patterns.Rolled) keeps `x * cos + rotate(x) * sin` one kernel. Not in DVM: the swap is a flip
of an axis of 2, whose rows of 2 elements the VM pays per row (as `stack` on a new last axis,
DECISIONS). The values are the unfused ops' (a neg and copies), so the products are bitwise
those of eager.

Where x is a DVM value of the open segment, the match does not lower and its ops are planned
one by one, as before.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.fx as fx

from .aten_table import RESHAPE_OPS, Unsupported
from .fx_patterns import _BIG_END, Match, _val, close
from .fx_rolled_blocks import _same

aten = torch.ops.aten
KIND = "rotate_pairs"
ENABLED = True       # off: the ops are planned one by one (the tests compare)


@dataclass(frozen=True, eq=False)
class RotatedPairs:
    """A segment input the run graph computes: rotate_pairs(x, negs). Named like Rolled's fields
    (`cat`: the FX node whose value it is, here the flatten of the stack) so the planner treats
    both alike."""
    cat: fx.Node
    x: fx.Node
    negs: tuple   # (the pair's first element negated, its second negated)

    def signs(self):
        return None   # (the signs are applied by rotate_pairs)

    def signed(self, ctx, rotated, signs):
        return rotated


def rotate_pairs(x: torch.Tensor, negs: tuple) -> torch.Tensor:
    """out[..., 2i] = ±x[..., 2i + 1], out[..., 2i + 1] = ±x[..., 2i] (negated where negs says), in
    a new tensor with x's layout where x is dense (torch.empty_like)."""
    out = torch.empty_like(x)
    for dst_start, neg in ((0, negs[0]), (1, negs[1])):
        dst, src = out[..., dst_start::2], x[..., 1 - dst_start::2]
        if neg:
            torch.neg(src, out=dst)
        else:
            dst.copy_(src)
    return out


def _parity_slice(n):
    """(source, start) for slice(src, last axis, start in {0, 1}, to the end, step 2); else None."""
    if not isinstance(n, fx.Node) or n.target is not aten.slice.Tensor or n.kwargs or len(n.args) != 5:
        return None
    src, dim, start, end, step = n.args
    v = _val(src)
    if not isinstance(v, torch.Tensor) or not isinstance(dim, int) or dim % v.ndim != v.ndim - 1 or step != 2 or \
            start not in (0, 1) or not (isinstance(end, int) and end >= _BIG_END or _same(end, v.shape[-1])):
        return None
    return src, start


def _piece(n):
    """(source, start, negated, nodes) for slice / neg(slice) pieces."""
    neg = isinstance(n, fx.Node) and n.target is aten.neg.default
    inner = n.args[0] if neg else n
    s = _parity_slice(inner)
    return None if s is None else (s[0], s[1], neg, [n, inner] if neg else [n])


def _unsupported(lw, x):
    raise Unsupported("interleaved rotate of a DVM value: planned op by op")


def match(n: fx.Node) -> Match | None:
    """n = flatten(-2) of stack((±x[..., 1::2], ±x[..., ::2]), -1) as a Match (kind KIND)."""
    if not ENABLED or n.target not in RESHAPE_OPS:
        return None
    stack = n.args[0]
    if not isinstance(stack, fx.Node) or stack.target is not aten.stack.default or len(stack.args[0]) != 2:
        return None
    dim = stack.args[1] if len(stack.args) > 1 else stack.kwargs.get("dim", 0)
    a, b = _piece(stack.args[0][0]), _piece(stack.args[0][1])
    v, s = _val(n), _val(stack)
    if a is None or b is None or a[0] is not b[0] or (a[1], b[1]) != (1, 0) or not isinstance(v, torch.Tensor) or \
            not isinstance(s, torch.Tensor) or dim % s.ndim != s.ndim - 1 or v.ndim != s.ndim - 1:
        return None
    x = _val(a[0])
    # (the pieces' equal sizes, which stack checked, make x's last axis even: 2 * s.shape[-2])
    if not (_same(v.shape[-1], x.shape[-1]) and _same(s.shape[-2] * 2, x.shape[-1])):
        return None
    nodes = [stack] + a[3] + b[3]
    return Match(KIND, n, (a[0],), _unsupported, nodes, [n] + nodes, RotatedPairs(n, a[0], (a[2], b[2])))


def find(gm: fx.GraphModule) -> dict:
    """root FX node -> Match, for the interleaved rotates in gm (absorbed: the nodes used only
    inside the match)."""
    out: dict = {}
    for n in gm.graph.nodes:
        m = match(n) if n.op == "call_function" else None
        if m is not None:
            close(m)
            out[n] = m
    return out
