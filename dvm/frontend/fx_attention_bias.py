"""Attention on flattened heads whose scores are viewed to [B, H, L, S] for a 4-D mask, with an
additive bias (ALiBi) or none, recognized as one flash attention call (a graph rewrite done once
per ATen graph, after fx_attention's, before fx_sdpa's).

Bloom (and code written like it) computes the scores on [B * H, L, D] operands, as
`baddbmm(bias, q, k^T, beta=1, alpha=c)` (bias: ALiBi, [B * H, 1, S]) or `bmm(q, k^T)`, views
them to [B, H, L, S] to add a [B or 1, 1, L, S] mask, and views the probabilities back:

    view(baddbmm(bias, q, transpose(k, -1, -2), beta=1, alpha=c) or bmm(q, k^T), [B, H, L, S])
    [* or / a number] [+ mask] -> _softmax or _safe_softmax over the last dim -> [clone]
    -> view [B * H, L, S] -> bmm with v [B * H, S, D] -> [view [B, H, L, D]]

Each [B * H, L, S] score is written by the product, read and written by the add and the softmax,
and read by the second bmm. The rewrite views q, k, v and the bias as [B, H, ., .] (splitting the
first dim: always a view) and calls `attention_biased`: PyTorch's CPU flash kernel with
attn_mask = bias + mask. A mask built as `where(keep, 0, fill)` (keep bool, fill -inf or at most
-1e30: the masked weights are exactly 0 in eager's softmax) whose keep is exactly causal at run
time runs as is_causal=True with the bias alone as the kernel's mask: no [B, H, L, S] tensor is
stored at all. The bias is added to the kernel's scaled scores instead of to the product before
the mask: the results agree within rounding.

Conditions: as fx_attention's (one reader per intermediate, numbers or 0-d float inputs as the
scale, beta 1, f32 / f64 CPU tensors of one dtype, a softmax over the last dim), B and H given in
the view (not -1), q, k and v with one head size, the bias [B * H or 1, 1 or L, S], the mask 4-D
broadcast to [B, H, L, S].
The plain softmax gives NaN in a row whose scores are all -inf, the flash kernel 0: those rows are
written NaN, found only where the bias or the mask holds a -inf (checked once per tensor version).
Counted: `torch_attention_as_sdpa`, and `torch_sdpa_causal` per causal call.
"""
from __future__ import annotations

import torch
import torch.fx as fx
from torch._guards import detect_fake_mode
from torch.fx.experimental.symbolic_shapes import statically_known_true

from ..runtime import counters
from .fx_attention import _FLOATS, _VIEWS, Scale, _erase_unread, _masked_rows, _rebind_sizes, _reader, \
    _readers, _scaled, _size_sources, _sole, _times_or_over, _val, softmax_input
from .fx_attention_math import math_attention, needs_math
from .fx_attention_math import remembered as _remembered
from .fx_keep_mask import filled_mask
from .fx_sdpa import _SDPA_CALL, SDPA, is_causal_mask

aten = torch.ops.aten
_PRODUCTS = (aten.baddbmm.default, aten.bmm.default)
_NEGLIGIBLE = -1e30   # a fill at most this: exp(fill + score - row max) is 0 in f32 and f64
REASON = "attention with an additive bias or a 4-D mask on flattened heads: the flash kernel, " \
         "is_causal where the mask is causal at run time"


class _BiasedSDPA:
    """sdpa(q, k, v, attn_mask=bias + mask)[0] (either may be None); the mask given as
    where(keep, 0, fill) by `keep` where it was one in the graph, then is_causal=True with the
    bias alone when keep is causal. nan_rows: the chain's softmax was the plain one (rows of -inf
    scores NaN). (An object, so that counters and `dvm.explain` name it.)"""
    __name__ = "attention_biased"   # the rewritten ATen graph must still generate code

    def __call__(self, q, k, v, bias, mask, scale, keep=None, fill=None, nan_rows=False):
        softmax = "plain" if nan_rows else "safe"
        if needs_math(softmax, q, k, v, bias, mask):   # (the keep mask is bool: no NaN)
            filled = None if keep is None else filled_mask(keep, fill, q.dtype)
            return math_attention(q, k, v, scale, softmax, bias, mask, filled)
        if keep is not None:
            if fill <= _NEGLIGIBLE and is_causal_mask(keep, q.shape[-2], k.shape[-2]) and \
                    not (nan_rows and bias is not None and _holds_neg_inf(bias)):
                counters.bump("torch_sdpa_causal")
                return _SDPA_CALL(q, k, v, 0.0, True, attn_mask=bias, scale=scale)[0]
            mask = filled_mask(keep, fill, q.dtype)
        attn = mask if bias is None else bias if mask is None else bias + mask
        out = _SDPA_CALL(q, k, v, 0.0, False, attn_mask=attn, scale=scale)[0]
        if not nan_rows or not any(_holds_neg_inf(t) for t in (bias, mask) if t is not None):
            return out
        rows = _masked_rows(attn)
        return out if rows is None else out.masked_fill(rows, float("nan"))

    def __repr__(self) -> str:
        return "dvm.attention_biased"


attention_biased = _BiasedSDPA()


def _holds_neg_inf(t: torch.Tensor) -> bool:
    return _remembered(t, "_dvm_neg_inf", None, lambda: bool(torch.isneginf(t).any()))


def _number(n):
    """The value of a 0-d constant node (scalar_tensor(x), full([], x) or zeros([])), else None."""
    if not isinstance(n, fx.Node) or n.op != "call_function" or not n.args:
        return None
    if n.target == aten.scalar_tensor.default and isinstance(n.args[0], (int, float)):
        return float(n.args[0])
    if n.target == aten.full.default and list(n.args[0]) == [] and len(n.args) > 1 \
            and isinstance(n.args[1], (int, float)):
        return float(n.args[1])
    if n.target == aten.zeros.default and list(n.args[0]) == []:
        return 0.0
    return None


def _keep_fill(mask):
    """(keep, fill, the where's nodes) when mask = where(keep, 0, fill) with keep a bool tensor,
    else None."""
    if not (isinstance(mask, fx.Node) and mask.target == aten.where.self and len(mask.args) == 3):
        return None
    keep, zero, neg = mask.args
    kv, fill = _val(keep), _number(neg)
    if not (isinstance(kv, torch.Tensor) and kv.dtype == torch.bool and _number(zero) == 0.0 and fill is not None):
        return None
    return keep, fill, [mask, zero, neg]


def _product(y, chain: list):
    """(q, k, bias or None, scale) when y = [mul / div by a number of] the view to 4-D of [a number
    times] baddbmm(bias, q, transpose(k), beta=1, alpha=c) or bmm(q, transpose(k)), else None."""
    y, c1 = _times_or_over(y, chain)
    if c1 is None or not (_sole(y, _VIEWS) and _val(y) is not None and _val(y).dim() == 4):
        return None
    chain.append(y)
    p, c2 = _scaled(y.args[0], aten.mul.Tensor, chain)
    if not _sole(p, _PRODUCTS):
        return None
    chain.append(p)
    if p.target == aten.bmm.default:
        bias, (q, kt), alpha = None, p.args, 1.0
    else:
        bias, q, kt = p.args
        alpha, beta = p.kwargs.get("alpha", 1), p.kwargs.get("beta", 1)
        if set(p.kwargs) - {"alpha", "beta"} or beta != 1 or not isinstance(alpha, (int, float)) \
                or isinstance(alpha, bool):
            return None
    if not (_sole(kt, (aten.transpose.int,)) and len(kt.args) == 3 and {a % 3 for a in kt.args[1:]} == {1, 2}):
        return None
    chain.append(kt)
    return q, kt.args[0], bias, c1 * c2 * Scale(float(alpha))


def _attention(sm: fx.Node):
    """(q, k, v, bias, mask, scale, the 4-D scores' view, the output node, the chain) around
    softmax node sm, or None."""
    got = softmax_input(sm, (4,), _product)
    if got is None:
        return None
    found, mask, chain = got
    p = _reader(sm)
    if _sole(p, (aten.clone.default,)) and set(p.kwargs) <= {"memory_format"}:
        chain.append(p)
        p = _reader(p)
    if not (_sole(p, _VIEWS) and isinstance(_val(p), torch.Tensor) and _val(p).dim() == 3):
        return None
    mm = _reader(p)
    if not (_sole(mm, (aten.bmm.default,)) and mm.args[0] is p):
        return None
    chain += [p, mm]
    out = _reader(mm) if len(_readers(mm)) == 1 else None
    if not (_sole(out, _VIEWS) and isinstance(_val(out), torch.Tensor) and _val(out).dim() == 4):
        return None
    q, k, bias, scale = found
    view4 = next(n for n in chain if n.target in _VIEWS)
    return q, k, mm.args[1], bias, mask, scale, view4, out, chain


def _fits(q, k, v, bias, mask, view4, out) -> bool:
    """q [BH, L, D], k and v [BH, S, D], the view's [B, H, L, S] with B and H given and B * H = BH,
    the bias [BH or 1, 1 or L, S] and the mask [B or 1, H or 1, L or 1, S or 1]; one float dtype,
    CPU; the output [B, H, L, D]."""
    vals = [_val(t) for t in (q, k, v, view4, out)]
    if not all(isinstance(t, torch.Tensor) for t in vals):
        return False
    (qv, kv, vv, sv, ov), dtype = (t.shape for t in vals), vals[0].dtype
    if [t.dim() for t in vals] != [3, 3, 3, 4, 4] or dtype not in _FLOATS or vals[0].device.type != "cpu" \
            or any(t.dtype != dtype for t in vals):
        return False
    sizes = view4.args[1] if len(view4.args) > 1 else None
    if not (isinstance(sizes, (list, tuple)) and len(sizes) == 4 and not any(_unknown(s) for s in sizes[:2])):
        return False
    same = lambda a, b: statically_known_true(a == b)   # noqa: E731
    if not (same(sv[0] * sv[1], qv[0]) and same(kv[0], qv[0]) and same(vv[0], qv[0]) and same(kv[1], vv[1])
            and same(kv[2], qv[2]) and same(vv[2], qv[2]) and same(sv[2], qv[1]) and same(sv[3], kv[1])
            and all(same(a, b) for a, b in zip(ov, (sv[0], sv[1], qv[1], qv[2])))):
        return False
    for t, want in ((bias, ((qv[0],), (1, sv[2]), (sv[3],))), (mask, tuple((1, f) for f in sv))):
        if t is None:
            continue
        tv = _val(t)
        if not (isinstance(tv, torch.Tensor) and tv.dim() == len(want) and tv.dtype == dtype):
            return False
        if not all(any(same(d, w) for w in ws + (1,)) for d, ws in zip(tv.shape, want)):
            return False
    return True


def _unknown(s) -> bool:
    """A view size given as -1 (inferred)."""
    return isinstance(s, int) and s == -1


def _bias_rest(bias, sizes) -> list | None:
    """The last two sizes of the bias viewed as [B, H, ., S] (one of them -1), or None."""
    if bias is None or statically_known_true(_val(bias).shape[1] == 1):
        return [1, -1]
    length, keys = sizes[2:4]
    return [length, -1] if not _unknown(length) else [-1, keys] if not _unknown(keys) else None


def _dim(graph: fx.Graph, t: fx.Node, d: int):
    """t's size d: an int, or a size query node inserted where the graph inserts now."""
    size = _val(t).shape[d]
    if isinstance(size, int):
        return size
    n = graph.call_function(aten.sym_size.int, (t, d))
    n.meta["val"] = size
    return n


def _split_heads(graph: fx.Graph, t: fx.Node, b, h, rest: list, fake_mode) -> fx.Node:
    """t [B * H (or 1), X, Y] viewed as [B, H] + rest (or [1, 1] + rest); rest: [X, Y] with one -1."""
    tv = _val(t)
    lead = [1, 1] if statically_known_true(tv.shape[0] == 1) else [b, h]
    n = graph.call_function(aten.view.default, (t, lead + rest))
    with fake_mode:
        n.meta["val"] = tv.view(*[_size(s) for s in lead + rest])
    return n


def _heads_source(t: fx.Node, b, h, chain: list):
    """x when t = a view of [a contiguous clone of] x [B, H, X, D] with t [B * H, X, D] (heads
    flattened, copied where they could not be viewed), each read once: the kernel reads x's
    strides, so neither the flattening nor its copy is needed; else None."""
    if not _sole(t, _VIEWS):
        return None
    x, seen = t.args[0], [t]
    if _sole(x, (aten.clone.default,)) and set(x.kwargs) <= {"memory_format"}:
        x, seen = x.args[0], [t, x]
    xv, tv = _val(x), _val(t)
    want = (_size(b), _size(h), tv.shape[1], tv.shape[2])
    if not (isinstance(xv, torch.Tensor) and xv.dim() == 4 and all(statically_known_true(a == w)
                                                                    for a, w in zip(xv.shape, want))):
        return None
    chain += seen
    return x


def _size(s):
    return _val(s) if isinstance(s, fx.Node) else s


def rewrite(gm: fx.GraphModule) -> int:
    """Replace each matching chain of gm in place; returns how many."""
    graph, count, wheres = gm.graph, 0, []
    for sm in [n for n in graph.nodes if n.op == "call_function" and n.target in (aten._softmax.default,
                                                                                 aten._safe_softmax.default)]:
        found = _attention(sm)
        if found is None or not _fits(*found[:5], found[6], found[7]):
            continue
        q, k, v, bias, mask, scale, view4, out, chain = found
        b, h = view4.args[1][:2]
        split = [_heads_source(t, b, h, chain) for t in (q, k, v)]
        sources = [t if x is None else x for x, t in zip(split, (q, k, v))]
        sizes, rest = _size_sources([out, *chain], sources, (b, h)), _bias_rest(bias, view4.args[1])
        if sizes is None or rest is None:
            continue
        _rebind_sizes(sizes, graph)
        fake_mode = detect_fake_mode([_val(q)])
        kw = {"nan_rows": sm.target == aten._softmax.default}
        where = _keep_fill(mask)
        if where is not None:
            kw.update(keep=where[0], fill=where[1])
            wheres += where[2]
            mask = None
        with graph.inserting_before(out):
            head = _dim(graph, q, 2) if None in split else None
            q4, k4, v4 = (x if x is not None else _split_heads(graph, t, b, h, [-1, head], fake_mode)
                          for x, t in zip(split, (q, k, v)))
            bias4 = None if bias is None else _split_heads(graph, bias, b, h, rest, fake_mode)
            call = graph.call_function(attention_biased, (q4, k4, v4, bias4, mask, scale.emit(graph)), kw)
            dense = graph.call_function(aten.clone.default, (call,), {"memory_format": torch.contiguous_format})
        with fake_mode:
            call.meta["val"] = SDPA(_val(q4), _val(k4), _val(v4), scale=scale.number)[0]
        dense.meta["val"] = _val(out)
        out.replace_all_uses_with(dense)
        _erase_unread([out, *chain], graph)
        count += 1
    if count:
        _erase_unread(list(dict.fromkeys(wheres)), graph)
        graph.lint()
        counters.bump("torch_attention_as_sdpa", count)
    return count

