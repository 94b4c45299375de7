"""Causal attention masks recognized at run time (a graph rewrite done once per ATen graph).

Under torch.compile (torch < 2.14) Hugging Face models always build their attention mask as a
tensor: a bool `keep` mask of [B, 1, L, S] (causal AND same-packed-sequence AND padding), turned
into an additive float mask by `where(keep, 0.0, -inf)` and passed to
`_scaled_dot_product_flash_attention_for_cpu`. Eager HF passes `is_causal=True` instead, and
PyTorch's flash kernel then skips the masked blocks: at L = 1024 that is 2.9 ms against 4.6 ms
with the float mask, plus the 4 MB mask itself.

The rewrite replaces `sdpa(q, k, v, attn_mask=where(keep, 0.0, -inf))` (the where used by
nothing else, no dropout, not causal already) by `sdpa_keep_mask(q, k, v, keep, ...)`,
which at run time checks whether `keep` is exactly the lower triangle (L == S, every batch): then
it calls the kernel with `is_causal=True` and no mask (the same attention, without the mask's
blocks); otherwise it builds the float mask in PyTorch as the graph did. Which path ran is
counted (`torch_sdpa_causal`, `torch_sdpa_masked`). The check (an exact comparison of the mask
bytes, ~0.13 ms at L = 1024) runs once per mask tensor: the layers of a forward share it.
Training graphs keep the where (its mask is saved for the backward, so it has another user).

A query scaled before attention (`sdpa(q * c, k, v, scale=s)`, OPT's `q_proj(h) * scaling`) runs
as `sdpa(q, k, v, scale=c * s)`: c is a number or a 0-d float graph input, read at run time
(`query_scale`); the product's pass and its launch go (counted: `torch_sdpa_query_scale_folded`).

With a mask, HF also repeats grouped keys and values to the query's head count (`repeat_kv`: an
expand and a copy each) where eager passes them grouped with `enable_gqa`. The flash kernel
groups heads itself (query head i reads key / value head i // r; bitwise the same results), so
`sdpa(q, repeat_kv(k), repeat_kv(v))` becomes `sdpa(q, k, v)` when nothing else reads the
copies and k's and v's last dims are contiguous (counted: `torch_sdpa_grouped_kv`): two fewer
[B, heads, L, head_dim] tensors stored per layer.
"""
from __future__ import annotations

import collections
import ctypes
import math
import struct

import numpy as np
import torch
import torch.fx as fx
from torch.fx.experimental.symbolic_shapes import statically_known_true

from ..runtime import counters
from .aten_table import RESHAPE_OPS
from .fx_attention_math import MATH, SDPA, math_attention, needs_math
from .fx_attention_math import SDPA_CALL as _SDPA_CALL
from .fx_attention_math import remembered as _remembered
from .fx_const_index import erase_dead_chain
from .fx_keep_mask import filled_mask

aten = torch.ops.aten
REASON = "attention mask checked at run time: a causal mask runs as is_causal=True"
_TRIL_CACHE_MAX = 4
# L -> the lower triangle's L*L bytes, as an array and as bytes
_tril: collections.OrderedDict = collections.OrderedDict()
_BYTES_CHECK_MAX = 1 << 18   # masks up to this many bytes are compared as bytes objects


def _scalar(n, value: float) -> bool:
    """n is aten.scalar_tensor(value) (its dtype is checked by the caller)."""
    if not (isinstance(n, fx.Node) and n.target == aten.scalar_tensor.default and n.args):
        return False
    v = n.args[0]
    return isinstance(v, (int, float)) and v == value


def rewrite(gm: fx.GraphModule) -> int:
    """Rewrite the matching sdpa calls of gm in place (grouped keys and values, then the mask);
    returns how many masks."""
    count = 0
    for n in list(gm.graph.nodes):
        if n.op != "call_function" or n.target != SDPA:
            continue
        _ungroup_kv(gm.graph, n)
        _fold_query_scale(gm.graph, n)
        mask = n.kwargs.get("attn_mask")
        dropout = n.args[3] if len(n.args) > 3 else n.kwargs.get("dropout_p", 0.0)
        causal = n.args[4] if len(n.args) > 4 else n.kwargs.get("is_causal", False)
        if not (isinstance(mask, fx.Node) and mask.target == aten.where.self and len(mask.users) == 1
                and dropout == 0.0 and causal is False and len(n.args) == 3
                and set(n.kwargs) <= {"attn_mask", "scale", "dropout_p", "is_causal"}):
            continue
        keep, zero, neg = mask.args
        kv = keep.meta.get("val") if isinstance(keep, fx.Node) else None
        if not (isinstance(kv, torch.Tensor) and kv.dtype == torch.bool and kv.dim() >= 2
                and _scalar(zero, 0.0) and _scalar(neg, -math.inf)):
            continue
        dtype = zero.meta["val"].dtype if isinstance(zero.meta.get("val"), torch.Tensor) else None
        if dtype is None or neg.meta.get("val") is None or neg.meta["val"].dtype != dtype:
            continue
        n.target = sdpa_keep_mask
        n.args = (*n.args[:3], keep)
        n.kwargs = {"mask_dtype": dtype, "scale": n.kwargs.get("scale")}
        if n.meta.get(MATH):
            n.kwargs = {**n.kwargs, "softmax": n.meta[MATH]}
        gm.graph.erase_node(mask)
        for c in (zero, neg):   # (the scalars are rebuilt at run time if the mask is needed)
            if not c.users:
                gm.graph.erase_node(c)
        count += 1
    return count


_FULL_END = 2 ** 63 - 1
_REPEAT_VIEWS = RESHAPE_OPS


def _only_user(n, *targets) -> bool:
    """n is a call of one of `targets` whose value has one reader."""
    return isinstance(n, fx.Node) and n.op == "call_function" and n.target in targets and len(n.users) == 1


def _skip_full_slices(n, chain: list):
    """n's source through `x[:]`-style slices read by nothing else (they are views of all of x);
    the slices are appended to chain."""
    while _only_user(n, aten.slice.Tensor) and len(n.args) >= 2 and \
            tuple(n.args[2:]) in ((), (0,), (0, _FULL_END), (0, _FULL_END, 1), (None, None, 1)):
        chain.append(n)
        n = n.args[0]
    return n


def _repeated_kv(n):
    """(x, rep, the copy's nodes from n down) when n is Hugging Face's repeat_kv(x, rep):
    view(clone(expand(x[:, :, None], [b, h, rep, s, d])), [b, h * rep, s, d]), each step read
    only by the next; else None."""
    if not (isinstance(n, fx.Node) and n.target in _REPEAT_VIEWS and len(n.users) == 1):
        return None
    c = n.args[0]
    if not (_only_user(c, aten.clone.default) and set(c.kwargs) <= {"memory_format"}):
        return None
    chain = [n, c]
    e = _skip_full_slices(c.args[0], chain)
    if not (_only_user(e, aten.expand.default) and len(e.args) == 2):
        return None
    chain.append(e)
    u = _skip_full_slices(e.args[0], chain)
    if not (_only_user(u, aten.unsqueeze.default) and tuple(u.args[1:]) == (2,)):
        return None
    chain.append(u)
    x = _skip_full_slices(u.args[0], chain)
    xv, ev, nv = (getattr(v, "meta", {}).get("val") for v in (x, e, n))
    if not all(isinstance(v, torch.Tensor) for v in (xv, ev, nv)) or (xv.dim(), ev.dim(), nv.dim()) != (4, 5, 4):
        return None
    rep = ev.shape[2]
    b, h, sl, d = xv.shape
    want = ((ev.shape, (b, h, rep, sl, d)), (nv.shape, (b, h * rep, sl, d)))
    if not all(statically_known_true(p == q) for got, w in want for p, q in zip(got, w)):
        return None
    return x, rep, chain


def _ungroup_kv(graph: fx.Graph, n: fx.Node) -> None:
    """sdpa(q, repeat_kv(k, r), repeat_kv(v, r)) -> sdpa(q, k, v): the CPU flash kernel reads
    query head i from key / value head i // r itself (bitwise the same results; eager Hugging
    Face passes grouped heads the same way with enable_gqa), so the two copies of r times the
    keys and values go. Only where the copies have no other reader (not in training graphs,
    which save them) and k and v have a unit last stride (_unit_last_stride)."""
    if len(n.args) < 3:
        return
    k, v = _repeated_kv(n.args[1]), _repeated_kv(n.args[2])
    if k is None or v is None or not statically_known_true(k[1] == v[1]) or \
            not (_unit_last_stride(k[0]) and _unit_last_stride(v[0])):
        return
    n.args = (n.args[0], k[0], v[0], *n.args[3:])
    for node in k[2] + v[2]:   # each chain from its top: each node is then unread
        graph.erase_node(node)
    counters.bump("torch_sdpa_grouped_kv")


def _unit_last_stride(x: fx.Node) -> bool:
    """x's last dim is contiguous (stride 1). The CPU flash kernel, called directly, assumes it and
    computes wrong results otherwise (the public sdpa copies such inputs first); repeat_kv's copy
    is what gives it that layout where the grouped value's is another (a convolution's output
    transposed)."""
    xv = x.meta.get("val")
    return isinstance(xv, torch.Tensor) and xv.dim() > 0 and statically_known_true(xv.stride()[-1] == 1)


# views of the scaled query between the product and sdpa (a scalar product commutes with each)
_QUERY_VIEWS = (aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.transpose.int,
                aten.permute.default, aten.unsqueeze.default)
_CONVERTS = (torch.ops.prims.convert_element_type.default, aten._to_copy.default)
_ROUND = {torch.float64: lambda x: x, torch.float32: lambda x: struct.unpack("f", struct.pack("f", x))[0],
          torch.float16: lambda x: struct.unpack("e", struct.pack("e", x))[0],
          torch.bfloat16: lambda x: torch.tensor(x, dtype=torch.bfloat16).item()}


def _scalar_source(s):
    """(graph input, the dtypes it is converted to in order) when s is a 0-d float CPU tensor read
    from a graph input (a float Dynamo passes as a tensor) through dtype conversions only; else None."""
    dtypes: list = []
    while isinstance(s, fx.Node) and s.op == "call_function" and s.target in _CONVERTS:
        dt = s.args[1] if s.target is _CONVERTS[0] and len(s.args) > 1 else s.kwargs.get("dtype")
        if dt not in _ROUND or (s.target is _CONVERTS[1] and set(s.kwargs) - {"dtype"}):
            return None
        dtypes.append(dt)
        s = s.args[0]
    v = getattr(s, "meta", {}).get("val")
    ok = isinstance(s, fx.Node) and s.op == "placeholder" and isinstance(v, torch.Tensor) and v.dim() == 0 \
        and v.dtype in _ROUND and v.device.type == "cpu"    # (read with .item(): no device sync)
    return (s, tuple(reversed(dtypes))) if ok else None


def query_scale(s: torch.Tensor, dtypes: tuple, base: float) -> float:
    """The float sdpa's scale becomes when the query's scalar factor s (converted to dtypes in
    order, each conversion rounding as PyTorch's would) is folded into it."""
    x = s.item()
    for dt in dtypes:
        x = _ROUND[dt](x)
    return x * base


def _fold_query_scale(graph: fx.Graph, n: fx.Node) -> None:
    """sdpa(views(x * c), k, v, scale=s) -> sdpa(views(x), k, v, scale=c * s), c a Python number or a
    0-d float graph input (OPT scales its query projection: `q_proj(h) * scaling`; Dynamo passes
    the float as a tensor): the product's pass over the query goes, and with it a DVM launch per
    layer. The result differs from eager's by the rounding of x * c (c is applied to q k^T in the
    kernel instead). Only where nothing else reads the product or the views, and the default scale
    is known (a static head size)."""
    chain, q = [], n.args[0] if n.args else None
    while _only_user(q, *_QUERY_VIEWS):
        chain.append(q)
        q = q.args[0]
    if not (isinstance(q, fx.Node) and q.op == "call_function" and q.target == aten.mul.Tensor
            and len(q.users) == 1 and len(q.args) == 2 and not q.kwargs):
        return
    qv, head = q.meta.get("val"), n.args[0].meta.get("val")   # (the query as sdpa reads it: its head size)
    base = n.kwargs.get("scale")
    if base is None and isinstance(head, torch.Tensor) and isinstance(head.shape[-1], int) and head.shape[-1] > 0:
        base = 1.0 / math.sqrt(head.shape[-1])
    if not isinstance(base, (int, float)) or isinstance(base, bool) or not isinstance(qv, torch.Tensor):
        return
    for x, c in (q.args, q.args[::-1]):
        xv = getattr(x, "meta", {}).get("val")
        if not (isinstance(xv, torch.Tensor) and xv.dim() > 0 and xv.dtype == qv.dtype and xv.is_floating_point()):
            continue
        if isinstance(c, (int, float)) and not isinstance(c, bool):
            scale = float(c) * base
        else:
            src = _scalar_source(c)
            if src is None:
                continue
            with graph.inserting_before(n):
                scale = graph.call_function(query_scale, (src[0], src[1], float(base)))
        first = chain[-1] if chain else n
        first.args = (x, *first.args[1:])
        n.kwargs = {**n.kwargs, "scale": scale}
        graph.erase_node(q)
        erase_dead_chain(graph, c)   # its conversions
        counters.bump("torch_sdpa_query_scale_folded")
        return


class _KeepMaskSDPA:
    """`sdpa(q, k, v, attn_mask=where(keep, 0.0, -inf), scale=scale)` (the mask in mask_dtype), run
    with is_causal=True and no mask when keep is exactly causal. (An object, so that counters and `dvm.explain` name it.)"""
    __name__ = "sdpa_keep_mask"   # the rewritten ATen graph must still generate code (the fallback runs it)

    def __call__(self, q, k, v, keep, mask_dtype=torch.float32, scale=None, softmax=None):
        if needs_math(softmax, q, k, v):   # a chain fx_attention rewrote, inputs not finite
            return (math_attention(q, k, v, scale, softmax, additive_mask(keep, mask_dtype)),)
        kind = keep_kind(keep, q.shape[-2], k.shape[-2])
        if kind is _CAUSAL:
            counters.bump("torch_sdpa_causal")
            return _SDPA_CALL(q, k, v, 0.0, True, scale=scale)
        if kind is _EVERY_KEY:   # an encoder's padding mask of an unpadded batch: a mask of zeros
            counters.bump("torch_sdpa_unmasked")
            return _SDPA_CALL(q, k, v, 0.0, False, scale=scale)
        counters.bump("torch_sdpa_masked")
        return _SDPA_CALL(q, k, v, attn_mask=additive_mask(keep, mask_dtype), scale=scale)

    def __repr__(self) -> str:
        return "dvm.sdpa_keep_mask"


sdpa_keep_mask = _KeepMaskSDPA()


_CAUSAL, _EVERY_KEY, _MASKED = "causal", "every key", "masked"


def keep_kind(keep: torch.Tensor, L: int, S: int) -> str:
    """_CAUSAL (is_causal_mask), _EVERY_KEY (keeps_every_key) or _MASKED: what attention with the
    bool mask keep of L queries and S keys needs, remembered on keep as one fact (the layers of a
    forward share the mask: each later layer pays one attribute lookup)."""
    memo = getattr(keep, "_dvm_keep_kind", None)
    if memo is not None and memo[0] == keep._version and memo[1] == (L, S):
        return memo[2]
    kind = _fresh_kind(keep, L, S)
    try:
        keep._dvm_keep_kind = (keep._version, (L, S), kind)
    except (AttributeError, RuntimeError):  # pragma: no cover - a tensor subclass without __dict__
        pass
    return kind


def _fresh_kind(keep: torch.Tensor, L: int, S: int) -> str:
    """keep_kind of a mask not seen before (an encoder's is made from the padding mask each
    forward). A CPU mask is read once (_mask_bytes, or through NumPy when it is large or strided):
    where query 0 keeps key 1 it is not causal and one all() decides between every key and masked;
    where it does not, it keeps not every key and only the causal comparison is left."""
    if keep.dtype != torch.bool:
        return _MASKED
    if not keep.is_cpu:
        return _CAUSAL if is_causal_mask(keep, L, S) else _EVERY_KEY if keeps_every_key(keep) else _MASKED
    square = L == S > 1 and tuple(keep.shape[-2:]) == (L, S)
    raw = _mask_bytes(keep)
    if raw is not None:
        if square and not raw[1]:
            return _CAUSAL if _is_tril(raw, L) else _MASKED
        every = b"\x00" not in raw
    else:
        a = keep.detach().numpy()
        if square and not a[(0,) * (a.ndim - 2) + (0, 1)]:
            return _CAUSAL if _equals_tril(keep, L) else _MASKED
        every = bool(a.all())
    if not every:
        return _MASKED
    return _CAUSAL if L == S == 1 and is_causal_mask(keep, L, S) else _EVERY_KEY   # (1 x 1: both)


def _mask_bytes(keep: torch.Tensor) -> bytes | None:
    """The bytes of a contiguous CPU bool mask of at most _BYTES_CHECK_MAX entries, copied
    straight from its memory (a bool is one byte, nonzero when True); None for any other mask.
    Inside a forward, NumPy's conversion and all() of a 64 x 64 mask took ~18 us (their code
    cold), this copy and a byte search ~2."""
    n = keep.numel()
    if n == 0 or n > _BYTES_CHECK_MAX or not keep.is_contiguous():
        return None
    return ctypes.string_at(keep.data_ptr(), n)


def is_causal_mask(keep: torch.Tensor, L: int, S: int) -> bool:
    """keep[..., i, j] == (j <= i) for every leading index, with L == S (remembered on keep)."""
    if keep.dtype != torch.bool or keep.dim() < 2 or L != S or L == 0 or tuple(keep.shape[-2:]) != (L, S):
        return False
    return _remembered(keep, "_dvm_causal", None, lambda: _equals_tril(keep, L))


def keeps_every_key(keep: torch.Tensor) -> bool:
    """Every entry of the bool mask is True (remembered on keep): the additive mask would be all
    zeros, which adds nothing to any score."""
    def check() -> bool:   # NumPy's all() on a CPU mask: ~12 us for 1 M entries, torch.all ~180
        return bool(keep.detach().numpy().all()) if keep.is_cpu else bool(keep.all())
    return keep.dtype == torch.bool and _remembered(keep, "_dvm_all", None, check)


def additive_mask(keep: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """where(keep, 0, -inf) in `dtype`, made once a forward (fx_keep_mask)."""
    return filled_mask(keep, -math.inf, dtype)


def _tril_entry(L: int) -> tuple:
    """(the lower triangle's L*L bytes as an array, as bytes), cached for the last few L."""
    entry = _tril.get(L)
    if entry is None:
        tri = np.tril(np.ones((L, L), np.bool_)).reshape(-1)
        entry = _tril[L] = (tri, tri.tobytes())
        while len(_tril) > _TRIL_CACHE_MAX:
            _tril.popitem(last=False)
    else:
        _tril.move_to_end(L)
    return entry


def _is_tril(raw: bytes, L: int) -> bool:
    """raw (a mask's bytes, len a multiple of L*L) is the lower triangle, once per L*L block."""
    return raw == _tril_entry(L)[1] * (len(raw) // (L * L))


def _equals_tril(keep: torch.Tensor, L: int) -> bool:
    if not keep.is_cpu:   # (a device mask: compared there; one synchronizing read of the answer)
        tri = torch.ones((L, L), dtype=torch.bool, device=keep.device).tril_()
        return bool(torch.equal(keep.reshape(-1, L, L), tri.expand(keep.numel() // (L * L), L, L)))
    keep = keep.contiguous()
    raw = _mask_bytes(keep)
    if raw is not None:   # small masks: one memcmp beats the row loop
        return _is_tril(raw, L)
    rows = keep.reshape(-1, L * L).numpy()   # (a view of the contiguous mask)
    tri = _tril_entry(L)[0]
    if L > 1 and rows[:, 1].any():   # query 0 keeps key 1 (an encoder's mask): not causal, no row loop
        return False
    n8 = (L * L) // 8 * 8
    t64 = tri[:n8].view(np.uint64)
    for row in rows:   # 8 mask bytes per comparison, no copy
        if not (np.array_equal(row[:n8].view(np.uint64), t64) and np.array_equal(row[n8:], tri[n8:])):
            return False
    return True
