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

With a mask, HF also repeats grouped keys and values to the query's head count (`repeat_kv`: an
expand and a copy each) where eager passes them grouped with `enable_gqa`. The flash kernel
groups heads itself (query head i reads key / value head i // r; bitwise the same results), so
`sdpa(q, repeat_kv(k), repeat_kv(v))` becomes `sdpa(q, k, v)` when nothing else reads the
copies (counted: `torch_sdpa_grouped_kv`): two fewer [B, heads, L, head_dim] tensors stored per
layer.
"""
from __future__ import annotations

import collections
import math

import numpy as np
import torch
import torch.fx as fx
from torch.fx.experimental.symbolic_shapes import statically_known_true

from ..runtime import counters

aten = torch.ops.aten
SDPA = aten._scaled_dot_product_flash_attention_for_cpu.default
# the same op through its torch function, bound in C++ (~1 us a call less than the overload)
_SDPA_CALL = getattr(torch, "_scaled_dot_product_flash_attention_for_cpu", SDPA)
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
        gm.graph.erase_node(mask)
        for c in (zero, neg):   # (the scalars are rebuilt at run time if the mask is needed)
            if not c.users:
                gm.graph.erase_node(c)
        count += 1
    return count


_FULL_END = 2 ** 63 - 1
_REPEAT_VIEWS = (aten._unsafe_view.default, aten.view.default, aten.reshape.default)


def _only_user(n, target) -> bool:
    return isinstance(n, fx.Node) and n.op == "call_function" and n.target == target and len(n.users) == 1


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
    which save them)."""
    if len(n.args) < 3:
        return
    k, v = _repeated_kv(n.args[1]), _repeated_kv(n.args[2])
    if k is None or v is None or not statically_known_true(k[1] == v[1]):
        return
    n.args = (n.args[0], k[0], v[0], *n.args[3:])
    for node in k[2] + v[2]:   # each chain from its top: each node is then unread
        graph.erase_node(node)
    counters.bump("torch_sdpa_grouped_kv")


class _KeepMaskSDPA:
    """`sdpa(q, k, v, attn_mask=where(keep, 0.0, -inf), scale=scale)` (the mask in mask_dtype), run
    with is_causal=True and no mask when keep is exactly causal. (An object, so that counters and `dvm.explain` name it.)"""
    __name__ = "sdpa_keep_mask"   # the rewritten ATen graph must still generate code (the fallback runs it)

    def __call__(self, q, k, v, keep, mask_dtype=torch.float32, scale=None):
        if is_causal_mask(keep, q.shape[-2], k.shape[-2]):
            counters.bump("torch_sdpa_causal")
            return _SDPA_CALL(q, k, v, 0.0, True, scale=scale)
        if keeps_every_key(keep):   # an encoder's padding mask of an unpadded batch: a mask of zeros
            counters.bump("torch_sdpa_unmasked")
            return _SDPA_CALL(q, k, v, 0.0, False, scale=scale)
        counters.bump("torch_sdpa_masked")
        return _SDPA_CALL(q, k, v, attn_mask=additive_mask(keep, mask_dtype), scale=scale)

    def __repr__(self) -> str:
        return "dvm.sdpa_keep_mask"


sdpa_keep_mask = _KeepMaskSDPA()


def _remembered(keep: torch.Tensor, attr: str, key, make):
    """make(), remembered on the mask tensor with its version counter and `key`: the layers of one
    forward share the mask, so each fact about it is found once a forward."""
    memo = getattr(keep, attr, None)
    if memo is not None and memo[0] == keep._version and memo[1] == key:
        return memo[2]
    value = make()
    try:
        setattr(keep, attr, (keep._version, key, value))
    except (AttributeError, RuntimeError):  # pragma: no cover - a tensor subclass without __dict__
        pass
    return value


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
    """where(keep, 0, -inf) in `dtype` (remembered on keep: made once a forward, not per layer)."""
    def make():
        zero = torch.zeros((), dtype=dtype, device=keep.device)
        neg = torch.full((), -math.inf, dtype=dtype, device=keep.device)
        return aten.where.self(keep, zero, neg)
    return _remembered(keep, "_dvm_mask", dtype, make)


def _equals_tril(keep: torch.Tensor, L: int) -> bool:
    if not keep.is_cpu:   # (a device mask: compared there; one synchronizing read of the answer)
        tri = torch.ones((L, L), dtype=torch.bool, device=keep.device).tril_()
        return bool(torch.equal(keep.reshape(-1, L, L), tri.expand(keep.numel() // (L * L), L, L)))
    rows = keep.contiguous().reshape(-1, L * L).numpy()   # (a view when keep is contiguous)
    entry = _tril.get(L)
    if entry is None:
        tri = np.tril(np.ones((L, L), np.bool_)).reshape(-1)
        entry = _tril[L] = (tri, tri.tobytes())
        while len(_tril) > _TRIL_CACHE_MAX:
            _tril.popitem(last=False)
    else:
        _tril.move_to_end(L)
    tri, tri_bytes = entry
    if rows.size <= _BYTES_CHECK_MAX:   # small masks: a copy and one memcmp beat the row loop
        return rows.tobytes() == tri_bytes * rows.shape[0]
    n8 = (L * L) // 8 * 8
    t64 = tri[:n8].view(np.uint64)
    for row in rows:   # 8 mask bytes per comparison, no copy
        if not (np.array_equal(row[:n8].view(np.uint64), t64) and np.array_equal(row[n8:], tri[n8:])):
            return False
    return True
