"""Eager's results for attention written out as math when its inputs hold NaN or infinities.

fx_attention and fx_attention_bias run attention written as matmul, softmax, matmul through
PyTorch's CPU flash kernel. On finite inputs the two agree within rounding; on a NaN or an
infinity they do not: the written-out math gives NaN in every row the value reaches (0 times NaN
is NaN in the second matmul, even for a masked key), while the kernel skips masked blocks under
is_causal and, for some shapes, returns 0 for a query row holding a NaN (torch 2.13, measured at
L = S = 2 and 5 x 7 without a mask). The flash calls those rewrites make are marked (node.meta[MATH]:
which softmax the chain had) and check q, k and v at each call (one sum of each: ~3 µs a tensor at
small sizes on this host, under 1 % of the attention at L = 1024); a non-finite sum (an overflowing one too)
runs the math as written instead. Masks and biases are checked for NaN once per tensor version
(a -inf in a mask is expected). Counted: `torch_attention_math_nonfinite`. Flash calls the model
made itself (Hugging Face's sdpa) are not marked: eager runs the same kernel there.
"""
from __future__ import annotations

import math

import torch
import torch.fx as fx

from ..runtime import counters

MATH = "dvm_attention_math"   # node.meta key: "plain" or "safe", the softmax of the chain replaced
REASON = "attention written as math: the flash kernel, the math itself where an input is not finite"
SDPA = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
# the same op through its torch function, bound in C++ (~1 us a call less than the overload)
_FLASH = getattr(torch, "_scaled_dot_product_flash_attention_for_cpu", SDPA)


def SDPA_CALL(q, k, v, *args, **kwargs):   # noqa: N802 (the kernel's call, as a constant)
    """The CPU flash kernel on q, k, v with unit last strides. Called directly, it assumes them
    and computes wrong results otherwise (the public sdpa copies such inputs first); the graphs
    DVM rewrites into it may hand it keys or values transposed in memory (a convolution over
    time's output)."""
    if q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1:
        q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    return _FLASH(q, k, v, *args, **kwargs)


def remembered(t: torch.Tensor, attr: str, key, make):
    """make(), remembered on tensor t with its version counter and `key`: the layers of one
    forward share a mask, so each fact about it is found once a forward."""
    memo = getattr(t, attr, None)
    if memo is not None and memo[0] == t._version and memo[1] == key:
        return memo[2]
    value = make()
    try:
        setattr(t, attr, (t._version, key, value))
    except (AttributeError, RuntimeError):  # pragma: no cover - a tensor subclass without __dict__
        pass
    return value


def _has_nan(t: torch.Tensor) -> bool:
    return remembered(t, "_dvm_has_nan", None, lambda: bool(torch.isnan(t).any()))


def needs_math(softmax, q, k, v, *masks) -> bool:
    """Whether a marked call (softmax not None) must run the math: q, k or v not finite, or a mask
    or bias holding a NaN."""
    if softmax is None:
        return False
    if math.isfinite(float(q.sum()) + float(k.sum()) + float(v.sum())) and \
            not any(_has_nan(m) for m in masks if m is not None):
        return False
    counters.bump("torch_attention_math_nonfinite")
    return True


def math_attention(q, k, v, scale, softmax: str, *masks) -> torch.Tensor:
    """softmax(q k^T * scale + each mask, -1) v as eager computes it written out (k and v with one
    head broadcast over q's)."""
    s = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]) if scale is None else scale)
    for m in masks:
        if m is not None:
            s = s + m
    p = torch.ops.aten._safe_softmax.default(s, -1) if softmax == "safe" else torch.softmax(s, -1)
    return torch.matmul(p, v)


class _GuardedSDPA:
    """The flash call of a rewritten chain (node.meta[MATH] set), with the math where needs_math."""
    __name__ = "attention_guarded"   # the rewritten ATen graph must still generate code

    def __call__(self, q, k, v, attn_mask=None, scale=None, softmax="plain"):
        if needs_math(softmax, q, k, v, attn_mask):
            return (math_attention(q, k, v, scale, softmax, attn_mask),)
        return SDPA_CALL(q, k, v, 0.0, False, attn_mask=attn_mask, scale=scale)

    def __repr__(self) -> str:
        return "dvm.attention_guarded"


attention_guarded = _GuardedSDPA()


def guard(gm: fx.GraphModule) -> int:
    """Retarget the marked flash calls still plain sdpa (fx_sdpa made none of them causal) to
    attention_guarded; returns how many."""
    count = 0
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.target == SDPA and n.meta.get(MATH) and len(n.args) == 3 \
                and set(n.kwargs) <= {"attn_mask", "scale"}:
            n.target = attention_guarded
            n.kwargs = {**n.kwargs, "softmax": n.meta[MATH]}
            count += 1
    return count
