"""Attention written out as matmul, softmax, matmul, recognized as one fused attention call (a graph
rewrite done once per ATen graph, before fx_sdpa's).

Hand-written attention (`softmax(q @ k.transpose(-2, -1) * c + mask, -1) @ v`, models run with
attn_implementation="eager") and PyTorch's own math decomposition of
scaled_dot_product_attention (what a trace records when the flash kernel does not take the call,
e.g. multi-query keys expanded to the query's heads: `bmm(q * c, k^T * c)`, `_safe_softmax`,
`bmm`) reach the ATen graph as

    view(bmm(view(expand(q')), view(expand(k^T'))), [B, H, L, S])  [* or / a number]  [+ mask]
    -> _softmax or _safe_softmax over the last dim -> view(expand(.)) -> bmm with view(expand(v))
    -> view [B, H, L, D]

with q' = q or q * c1, k^T' = transpose(k, -2, -1) or that * c2; or, with torch.bmm on
[B * H, L, D] operands (fairseq-style), bmm(q', k^T') [* or / c] [+ 3-D mask] -> softmax -> bmm
with v, run as B = 1. Each [B*H, L, S] score is written, read by the softmax, written again and
read by the second bmm: at L = S = 1024 with 4 heads that is 16 MB a pass. The rewrite replaces the chain by PyTorch's CPU flash kernel
(fx_sdpa.SDPA: one pass over blocks of keys, no scores stored) with attn_mask = the mask and
scale = the product of the numbers, then a contiguous copy of its [B, H, L, D] output (the
kernel's own layout is [B, L, H, D]; what read the chain's output expects the row-major view).
Keys and values with one head while the query has H go in grouped (the kernel reads every query
head from that one), not expanded. fx_sdpa then turns a `where(keep, 0, -inf)` mask into
is_causal where it is one at run time.

Only where every intermediate has one reader of its values (not in training graphs, which save
the scores; a size query of one is moved to q, k or v, whichever has that size), the numbers are
Python numbers or 0-d float graph inputs read at each call (a float attribute such as
`self.scale`, which Dynamo passes as a tensor; a scale computed from a symbolic size is left as
it is), q, k, v and the mask are float32 or float64 CPU tensors of one dtype, the mask has as
many dims as q and the softmax is over the last one. Not in half precision: eager rounds the
scores to bf16 or f16 between its steps where the kernel keeps them in f32, further apart than
assert_close allows. The results agree with the chain's within rounding (the flash kernel sums
in blocks, and its scale multiplies q . k once) on finite inputs; where q, k or v is not finite
the call runs the math as written (fx_attention_math: the kernel's NaN handling differs).
A row whose keys are all masked (-inf) gives 0 from _safe_softmax and from the flash kernel, NaN
from the plain softmax: a chain with the plain softmax and a mask runs as attention_nan_rows,
which writes NaN into those rows (found once per mask tensor and version).
Counted: `torch_attention_as_sdpa`.
"""
from __future__ import annotations

import operator

import torch
import torch.fx as fx
from torch._guards import detect_fake_mode
from torch.fx.experimental.symbolic_shapes import statically_known_true

from ..runtime import counters
from .fx_attention_math import MATH, math_attention, needs_math
from .fx_attention_math import remembered as _remembered
from .fx_sdpa import _SDPA_CALL, SDPA, _scalar_source, query_scale

aten = torch.ops.aten
_VIEWS = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)
_SOFTMAX = (aten._softmax.default, aten._safe_softmax.default)
_SIZE = aten.sym_size.int
_FLOATS = (torch.float32, torch.float64)   # (half types: see the module docstring)
REASON = "attention with the plain softmax and a mask: the flash kernel, rows of masked keys NaN as softmax's"


class _NanRowsSDPA:
    """sdpa(q, k, v, attn_mask=mask, scale=scale)[0] with NaN in the rows whose mask entries are
    all -inf (the plain softmax's result there; the flash kernel gives 0). (An object, so that
    counters and `dvm.explain` name it.)"""
    __name__ = "attention_nan_rows"   # the rewritten ATen graph must still generate code

    def __call__(self, q, k, v, mask, scale):
        if needs_math("plain", q, k, v, mask):
            return math_attention(q, k, v, scale, "plain", mask)
        out = _SDPA_CALL(q, k, v, 0.0, False, attn_mask=mask, scale=scale)[0]
        rows = _remembered(mask, "_dvm_masked_rows", None, lambda: _masked_rows(mask))
        return out if rows is None else out.masked_fill(rows, float("nan"))

    def __repr__(self) -> str:
        return "dvm.attention_nan_rows"


def _masked_rows(mask: torch.Tensor):
    """[..., L, 1] True where every key of the row is masked with -inf, or None if no row is."""
    rows = torch.isneginf(mask).all(-1, keepdim=True)
    return rows if bool(rows.any()) else None


attention_nan_rows = _NanRowsSDPA()


def _val(n):
    return n.meta.get("val") if isinstance(n, fx.Node) else None


def _readers(n: fx.Node) -> list:
    """The nodes reading n's values (a size query reads none: _rebind_sizes moves it)."""
    return [u for u in n.users if u.target is not _SIZE]


def _sole(n, targets) -> bool:
    """n is a call of one of targets whose value has one reader."""
    return isinstance(n, fx.Node) and n.op == "call_function" and n.target in targets and len(_readers(n)) == 1


def _reader(n: fx.Node) -> fx.Node:
    return _readers(n)[0]


def _same(a, b) -> bool:
    return len(a) == len(b) and all(statically_known_true(x == y) for x, y in zip(a, b))


def _heads_expanded(e, x) -> bool:
    """expand node e's shape is x's, or x's with 1 head made more."""
    xv, ev = _val(x), _val(e)
    return (isinstance(xv, torch.Tensor) and isinstance(ev, torch.Tensor) and xv.dim() == ev.dim() == 4
            and _same(xv.shape[::2], ev.shape[::2]) and _same(xv.shape[3:], ev.shape[3:])
            and (statically_known_true(xv.shape[1] == 1) or statically_known_true(xv.shape[1] == ev.shape[1])))


def _unexpanded(x, chain: list):
    """x's source when x expands it over the heads (multi-query keys made H heads), else x."""
    if _sole(x, (aten.expand.default,)) and len(x.args) == 2 and _heads_expanded(x, x.args[0]):
        chain.append(x)
        return x.args[0]
    return x


def _batched(n, chain: list):
    """x when n = view(expand(x, [B, H, A, C]), [B * H, A, C]) (or _unsafe_view of a contiguous
    clone of the expand: a matmul operand that cannot be viewed), each read once, x 4-D with the
    expand's dims or 1 on the heads' dim; else None."""
    if not _sole(n, _VIEWS):
        return None
    e, copy = n.args[0], []
    if _sole(e, (aten.clone.default,)) and set(e.kwargs) <= {"memory_format"}:
        copy, e = [e], e.args[0]
    if not (_sole(e, (aten.expand.default,)) and len(e.args) == 2 and _heads_expanded(e, e.args[0])):
        return None
    chain += [n, *copy, e]
    return e.args[0]


class Scale:
    """A product of Python numbers and 0-d float graph inputs, the latter read at run time (a
    float attribute or argument such as `self.scale`, which Dynamo passes as a tensor): inputs
    holds (graph input, the dtypes it is converted to, divided by it)."""
    __slots__ = ("number", "inputs")

    def __init__(self, number: float = 1.0, inputs: tuple = ()):
        self.number, self.inputs = number, inputs

    def __mul__(self, other: "Scale") -> "Scale":
        return Scale(self.number * other.number, self.inputs + other.inputs)

    def inverse(self) -> "Scale | None":
        if self.number == 0.0:
            return None
        return Scale(1.0 / self.number, tuple((s, d, not div) for s, d, div in self.inputs))

    def emit(self, graph: fx.Graph):
        """The scale as a number, or a node computing it (inserted where the graph inserts now)."""
        value = self.number
        for src, dtypes, divide in self.inputs:
            value = graph.call_function(run_time_scale, (src, dtypes, value, divide))
        return value


def run_time_scale(s: torch.Tensor, dtypes: tuple, base: float, divide: bool) -> float:
    """base times (or divided by) the 0-d tensor s converted through dtypes as PyTorch would."""
    x = query_scale(s, dtypes, 1.0)
    return base / x if divide else base * x


def _scaled(n, target, chain: list):
    """(x, Scale) when n = target(x, c) read once with c a Python number or a 0-d float graph
    input (through dtype conversions), else (n, Scale())."""
    if not (_sole(n, (target,)) and len(n.args) == 2 and not n.kwargs):
        return n, Scale()
    c = n.args[1]
    if isinstance(c, (int, float)) and not isinstance(c, bool):
        chain.append(n)
        return n.args[0], Scale(float(c))
    src = _scalar_source(c) if target in (aten.mul.Tensor, aten.div.Tensor) else None
    if src is None:
        return n, Scale()
    conversions = []
    while c is not src[0]:
        conversions.append(c)
        c = c.args[0]
    chain += [n, *conversions]
    return n.args[0], Scale(1.0, ((src[0], src[1], False),))


def _times_or_over(y, chain: list):
    """(x, Scale) when y = x * c or x / c (as _scaled), (y, Scale()) when neither; (y, None) when
    c is the number 0 in a division."""
    if not _sole(y, (aten.div.Tensor,)):
        return _scaled(y, aten.mul.Tensor, chain)
    x, c = _scaled(y, aten.div.Tensor, chain)
    return x, c.inverse()


def _scores(y, chain: list):
    """(q, k, scale) when y = view(bmm(view(expand(q')), view(expand(k^T'))), 4-D) [* or / c]."""
    y, scale = _times_or_over(y, chain)
    if scale is None:
        return None
    if _sole(y, (aten.bmm.default,)):   # torch.bmm on [B * H, L, D] operands
        chain.append(y)
        q, kt, rank = y.args[0], y.args[1], 3
    elif _sole(y, _VIEWS) and _sole(y.args[0], (aten.bmm.default,)):
        chain += [y, y.args[0]]
        q, kt, rank = _batched(y.args[0].args[0], chain), _batched(y.args[0].args[1], chain), 4
        if q is None or kt is None:
            return None
    else:
        return None
    q, c1 = _scaled(q, aten.mul.Scalar, chain)
    kt, c2 = _scaled(kt, aten.mul.Scalar, chain)
    if not (_sole(kt, (aten.transpose.int,)) and len(kt.args) == 3
            and {a % rank for a in kt.args[1:]} == {rank - 2, rank - 1}):
        return None
    chain.append(kt)
    return q, _unexpanded(kt.args[0], chain), scale * c1 * c2


def softmax_input(sm: fx.Node, dims: tuple, match):
    """(match's result, the mask or None, the chain) when softmax node sm, read once, is over the
    last dim of a tensor with one of `dims` dims and its input is y [+ mask] with match(y, chain)
    not None (match appends what it takes to chain); else None."""
    sv = _val(sm)
    if len(sm.args) < 2 or not isinstance(sv, torch.Tensor) or sv.dim() not in dims or \
            sm.args[1] not in (-1, sv.dim() - 1) or sm.kwargs or len(_readers(sm)) != 1 or \
            (sm.target == _SOFTMAX[0] and sm.args[2] is not False):
        return None
    z = sm.args[0]
    if not (_sole(z, (aten.add.Tensor,)) and not z.kwargs and len(z.args) == 2):
        chain = [sm]
        found = match(z, chain)
        return None if found is None else (found, None, chain)
    for y, mask in (z.args, z.args[::-1]):
        chain = [sm, z]
        found = match(y, chain)
        if found is not None:
            return found, mask, chain
    return None


def _attention(sm: fx.Node):
    """(q, k, v, mask or None, scale, the output node, the chain's nodes) for the chain around
    softmax node sm, or None."""
    got = softmax_input(sm, (3, 4), _scores)
    if got is None:
        return None
    (q, k, scale), mask, chain = got
    sv = _val(sm)
    p = _reader(sm)
    if sv.dim() == 3:   # bmm(softmax, v), v [B * H, S, D]
        if not (_sole(p, (aten.bmm.default,)) and p.args[0] is sm):
            return None
        return q, k, p.args[1], mask, scale, p, chain
    if not (_sole(p, (aten.expand.default,)) and _sole(_reader(p), _VIEWS)):
        return None
    pv = _reader(p)
    mm = _reader(pv)
    if not (_sole(mm, (aten.bmm.default,)) and mm.args[0] is pv and _sole(_reader(mm), _VIEWS)):
        return None
    chain += [p, pv, mm]
    v = _batched(mm.args[1], chain)
    out = _reader(mm)
    return (q, k, _unexpanded(v, chain), mask, scale, out, chain) if v is not None else None


def _fits(q, k, v, mask, out) -> bool:
    """Shapes and dtypes the rewrite takes: q [B, H, L, D], k and v [B, Hk, S, D] (Hk 1 or H), a
    4-D mask broadcast to [B, H, L, S] (or all of them without B: torch.bmm's operands, then run as
    B = 1), one dtype of _FLOATS, CPU tensors; the chain's output q's shape."""
    vals = [_val(t) for t in (q, k, v, out)]
    if not all(isinstance(t, torch.Tensor) for t in vals):
        return False
    rank = vals[0].dim()
    qv, kv, vv, ov = (t.shape if rank == 4 else (1, *t.shape) for t in vals)
    if rank not in (3, 4) or any(t.dim() != rank for t in vals):
        return False
    if vals[0].dtype not in _FLOATS or any(t.dtype != vals[0].dtype for t in vals) or vals[0].device.type != "cpu":
        return False   # (SDPA is the CPU kernel)
    if not (_same(kv, vv) and _same(ov, qv) and _same(qv[::3], kv[::3])):
        return False
    if not (statically_known_true(kv[1] == 1) or statically_known_true(kv[1] == qv[1])):
        return False
    if mask is None:
        return True
    mv = _val(mask)
    if not (isinstance(mv, torch.Tensor) and mv.dim() == rank and mv.dtype == vals[0].dtype):
        return False
    full = (qv[0], qv[1], qv[2], kv[2])
    return all(statically_known_true(m == 1) or statically_known_true(m == f)
               for m, f in zip(mv.shape if rank == 4 else (1, *mv.shape), full))


def _size_sources(chain: list, tensors: list, sizes: tuple = ()):
    """For each size query of a chain node (Dynamo asks a product's size where sizes coincide),
    a (tensor node, dim) of `tensors` with that size, or one of `sizes` (nodes of SymInts
    defined before the chain); None if one has none."""
    found = {}
    for n in chain:
        for u in n.users:
            if u.target is not _SIZE:
                continue
            want = u.meta.get("val")
            src = next(((t, d) for t in tensors for d in range(_val(t).dim())
                        if want is not None and statically_known_true(_val(t).shape[d] == want)), None)
            if src is None:
                src = next((s for s in sizes if isinstance(s, fx.Node) and want is not None
                            and statically_known_true(_val(s) == want)), None)
            if src is None:
                return None
            found[u] = src
    return found


def _rebind_sizes(found: dict, graph: fx.Graph) -> None:
    """Each size query reads its size from what _size_sources found instead."""
    for u, src in found.items():
        if isinstance(src, fx.Node):
            u.replace_all_uses_with(src)
        else:
            with graph.inserting_before(u):
                new = graph.call_function(_SIZE, src)
            new.meta = dict(u.meta)
            u.replace_all_uses_with(new)
        graph.erase_node(u)


def _unsqueezed(graph: fx.Graph, t: fx.Node, fake_mode) -> fx.Node:
    """t with a leading dim of 1 (a node inserted where the graph inserts now)."""
    u = graph.call_function(aten.unsqueeze.default, (t, 0))
    with fake_mode:
        u.meta["val"] = _val(t).unsqueeze(0)
    return u


def _erase_unread(nodes: list, graph: fx.Graph) -> None:
    """Erase the nodes no longer read, readers before what they read."""
    left = list(nodes)
    while left:
        unread = [n for n in left if not n.users]
        if not unread:
            break
        for n in unread:
            graph.erase_node(n)
            left.remove(n)


def rewrite(gm: fx.GraphModule) -> int:
    """Replace each matching attention chain of gm in place; returns how many."""
    graph, count = gm.graph, 0
    for sm in [n for n in graph.nodes if n.op == "call_function" and n.target in _SOFTMAX]:
        found = _attention(sm)
        if found is None or not _fits(*found[:4], found[5]):
            continue
        q, k, v, mask, scale, out, chain = found
        sizes = _size_sources([out, *chain], [q, k, v])
        if sizes is None:
            continue
        _rebind_sizes(sizes, graph)
        fake_mode = detect_fake_mode([_val(q)])
        rank3 = _val(q).dim() == 3
        if rank3:   # as B = 1
            with graph.inserting_before(out):
                q, k, v, mask = (None if t is None else _unsqueezed(graph, t, fake_mode) for t in (q, k, v, mask))
        with fake_mode:
            val = SDPA(_val(q), _val(k), _val(v), attn_mask=_val(mask), scale=scale.number)
        with graph.inserting_before(out):
            scale = scale.emit(graph)
            if mask is not None and sm.target == _SOFTMAX[0]:
                first = graph.call_function(attention_nan_rows, (q, k, v, mask, scale))
            else:
                kwargs = {"scale": scale} if mask is None else {"attn_mask": mask, "scale": scale}
                call = graph.call_function(SDPA, (q, k, v), kwargs)
                call.meta.update({"val": val, MATH: "safe" if sm.target == _SOFTMAX[1] else "plain"})
                first = graph.call_function(operator.getitem, (call, 0))
            first.meta["val"] = val[0]
            if rank3:
                first = graph.call_function(aten.squeeze.dim, (first, 0))
                with fake_mode:
                    first.meta["val"] = val[0].squeeze(0)
            dense = graph.call_function(aten.clone.default, (first,), {"memory_format": torch.contiguous_format})
        dense.meta["val"] = _val(out)
        out.replace_all_uses_with(dense)
        _erase_unread([out, *chain], graph)
        count += 1
    if count:
        graph.lint()
        counters.bump("torch_attention_as_sdpa", count)
    return count
