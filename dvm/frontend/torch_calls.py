"""The callables the run graph uses for the ATen ops that PyTorch executes (views, matmuls,
fallbacks).

A small graph spends most of its time calling PyTorch ops: the tiny Llama's forward makes ~120
such calls (views, transposes, matmuls) around its 11 DVM launches. `OpOverload.__call__` costs
~1 us more per call than the op's Tensor method or torch function, which PyTorch binds in C++:
where they take the same positional arguments, the run graph calls those instead (same ATen op,
same result). Ops with keyword arguments, and every other op, keep the OpOverload.

A linear layer reaches the ATen graph as four ops: `t(w)`, a view of x to 2-D, `mm` (`addmm`
with a bias), and a view back. Where all four run in PyTorch and nothing else reads the middle
values, the run graph calls `torch.nn.functional.linear(x, w[, b])` once instead (the same BLAS
call on the same operands: at::linear flattens x the same way; bitwise equal).
"""
from __future__ import annotations

from typing import Callable

import torch
from torch.fx.experimental.symbolic_shapes import statically_known_true

from ..runtime import counters

aten = torch.ops.aten

# OpOverload -> a C++-bound callable taking the same positional arguments (the same ATen op).
_SAME_OP: dict = {
    aten.t.default: torch.Tensor.t,
    aten.unsqueeze.default: torch.Tensor.unsqueeze,
    aten.squeeze.dim: torch.Tensor.squeeze,
    aten.transpose.int: torch.Tensor.transpose,
    aten.permute.default: torch.Tensor.permute,
    aten.expand.default: torch.Tensor.expand,
    aten.select.int: torch.Tensor.select,
    aten.mm.default: torch.mm,
    aten.bmm.default: torch.bmm,
    aten.addmm.default: torch.addmm,
    aten.neg.default: torch.neg,
    aten.cat.default: torch.cat,
}

# DVM outputs are row-major; PyTorch's may follow an input's memory order. A view PyTorch could
# take on its layout but not on ours is taken as a reshape (a counted copy).
_RESHAPE_INSTEAD = (aten.view.default, aten._unsafe_view.default)


def _view_or_reshape(x: torch.Tensor, size) -> torch.Tensor:
    """`x.view(size)` where x's strides allow it, else a reshape (a counted copy)."""
    if x.is_contiguous():
        return x.view(size)
    out = x.reshape(size)
    if out.data_ptr() != x.data_ptr():
        counters.bump("torch_view_copies")
    return out


def _slice(x: torch.Tensor, dim: int = 0, start=None, end=None, step: int = 1) -> torch.Tensor:
    """aten.slice.Tensor as basic indexing (the same view; out-of-range bounds clamp alike)."""
    return x[(slice(None),) * (dim % x.dim()) + (slice(start, end, step),)]


def linear_folds(nodes, in_torch: set, val: Callable) -> tuple[dict, set]:
    """{node of the view back: (x, w) or (x, w, b)} for each `view(mm(view(x, [n, k]), t(w)),
    x.shape[:-1] + [m])` (or `addmm(b, ...)` with a 1-D bias b) whose four ops are all in
    `in_torch` and whose inner values have no other reader, and the set of inner nodes (t, the
    flattening view, mm) the run graph then skips. val: FX node -> its fake value (symbolic
    sizes)."""
    folds, skip = {}, set()
    for n in nodes:
        if n.target not in (aten.mm.default, aten.addmm.default) or len(n.users) != 1 or n.kwargs:
            continue
        bias = n.args[0] if n.target is aten.addmm.default else None
        flat, tw = n.args[-2:]
        if bias is not None and (len(n.args) != 3 or not isinstance(bias, torch.fx.Node)):
            continue
        (back,) = n.users
        if not all(isinstance(v, torch.fx.Node) for v in (flat, tw)) or \
                flat.target not in _RESHAPE_INSTEAD or tw.target is not aten.t.default or \
                back.target not in _RESHAPE_INSTEAD or len(flat.users) != 1 or len(tw.users) != 1:
            continue
        if not {n, flat, tw, back} <= in_torch:
            continue
        x, w, out = val(flat.args[0]), val(tw.args[0]), val(back)
        # 2-D and more: at::linear's mm / addmm (a 1-D x would be a matrix-vector product)
        if not all(isinstance(v, torch.Tensor) for v in (x, w, out)) or w.ndim != 2 or x.ndim < 2:
            continue
        bv = val(bias) if bias is not None else None
        if bias is not None and not (isinstance(bv, torch.Tensor) and bv.ndim == 1
                                     and statically_known_true(bv.shape[0] == w.shape[0])):
            continue
        want = tuple(x.shape[:-1]) + (w.shape[0],)
        same = [statically_known_true(a == b) for a, b in zip(want, out.shape)]
        if len(want) != out.ndim or not all(same) or not statically_known_true(x.shape[-1] == w.shape[1]):
            continue
        folds[back] = (flat.args[0], tw.args[0]) + ((bias,) if bias is not None else ())
        skip |= {n, flat, tw}
    return folds, skip


def fast_call(target, n_args: int, has_kwargs: bool, row_major: bool = False) -> Callable:
    """The callable the run graph uses for `target` called with n_args positional arguments.
    row_major: the first argument is row-major at run time whatever its traced strides (a DVM
    output stored row-major, F.linear's output, a view of either), so a view is a plain view."""
    if has_kwargs:
        return _named(target)
    if target in _SAME_OP:
        return _SAME_OP[target]
    if target in _RESHAPE_INSTEAD and n_args == 2:
        return torch.Tensor.view if row_major else _view_or_reshape
    if target is aten.slice.Tensor:
        return _slice
    if _GROUPED_MM is not None and isinstance(target, torch._ops.OpOverload) and \
            target.name() == "transformers::grouped_mm_fallback" and n_args == 3:
        return _grouped_mm_call(target)
    return _named(target)


_GROUPED_MM = getattr(torch, "_grouped_mm", None)


def _grouped_mm_call(fallback) -> Callable:
    """transformers' grouped_mm_fallback (a Python loop of one torch.mm per expert, which HF uses
    under torch.compile for float32; eager HF calls PyTorch's grouped mm) as `torch._grouped_mm`
    where that computes the same: float32 on the CPU, int32 offsets that ascend from >= 0 to
    the row count (the fallback leaves rows past the last offset zero, the kernel does not write
    them), layouts the kernel takes (it raises on others: then the fallback runs). Bitwise equal
    (the same mm per group); at 16 rows, 4 experts, 128x128: 14 against 24 us."""
    def grouped_mm_fallback(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
        if x.dtype == w.dtype == torch.float32 and x.is_cpu and offs.dtype == torch.int32 and offs.dim() == 1:
            ends = offs.tolist()
            if ends and ends[0] >= 0 and ends[-1] == x.shape[0] and all(a <= b for a, b in zip(ends, ends[1:])):
                try:
                    out = _GROUPED_MM(x, w, offs=offs)
                except RuntimeError as e:   # a layout it does not take (strides, alignment)
                    counters.bump(f"torch_grouped_mm_fallback_calls:{str(e)[:60]}")
                else:
                    counters.bump("torch_grouped_mm_native")
                    return out
        return fallback(x, w, offs)
    return grouped_mm_fallback


def _named(target):
    """A callable FX's code generator can name (it needs __name__; e.g. fx_sdpa's object)."""
    if hasattr(target, "__name__"):
        return target

    def call(*args, **kwargs):
        return target(*args, **kwargs)
    call.__name__ = "call_" + type(target).__name__.lstrip("_")
    return call
