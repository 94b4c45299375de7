"""The callables the run graph uses for the ATen ops that PyTorch executes (views, matmuls,
fallbacks).

A small graph spends most of its time calling PyTorch ops: the tiny Llama's forward makes ~120
such calls (views, transposes, matmuls) around its 11 DVM launches. `OpOverload.__call__` costs
~1 us more per call than the op's Tensor method or torch function, which PyTorch binds in C++:
where they take the same positional arguments, the run graph calls those instead (same ATen op,
same result). Ops with keyword arguments (but those of `_SAME_KWARGS`), and every other op, keep
the OpOverload.

A linear layer reaches the ATen graph as four ops: `t(w)` (or `permute(w, [1, 0])`), a view of
x to 2-D, `mm` (`addmm` with a bias), and a view back. Where all four run in PyTorch and nothing
else reads the middle values, the run graph calls `torch.nn.functional.linear(x, w[, b])` once
instead (the same BLAS call on the same operands: at::linear flattens x the same way; bitwise
equal). A weight stored (in, out) (GPT-2's Conv1D: `addmm(b, view(x), w)`) folds the same way,
as `linear_kxm(x, w, b)`, which is `linear(x, w.t(), b)`: at::linear's own `t()` gives back w.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import torch
from torch.fx.experimental.symbolic_shapes import statically_known_true

from ..runtime import counters
from .fx_attention_math import SDPA, SDPA_CALL
from .gelu_size import ACTIVATION_KWARGS, addmm_activation, gelu, vm_gelu, vm_takes

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
    aten.embedding.default: torch.embedding,
    aten.neg.default: torch.neg,
    aten.cat.default: torch.cat,
    aten._addmm_activation.default: addmm_activation,   # (an exact GELU by its size: gelu_size)
    aten.gelu.default: gelu,
    aten.cumsum.default: torch.cumsum,
    aten.gather.default: torch.gather,
    aten.index_select.default: torch.index_select,
    aten.where.self: torch.where,
    aten.add.Tensor: torch.add,
    aten.sub.Tensor: torch.sub,
    aten.mul.Tensor: torch.mul,
    aten.div.Tensor: torch.div,
    aten.split_with_sizes.default: torch.Tensor.split_with_sizes,   # (a tuple of the views, not a list)
    # an MoE's routing (an OpOverload's Python call costs 0.1-1.3 us more)
    aten.sort.default: torch.sort,
    aten.topk.default: torch.topk,
    aten.histc.default: torch.histc,
    aten.index_put.default: torch.index_put,
    aten.floor_divide.default: torch.floor_divide,
    aten.empty_like.default: torch.empty_like,
    aten.clone.default: torch.clone,
    SDPA: SDPA_CALL,   # the model's own flash calls (unit last strides made where missing)
}
# Those of _SAME_OP whose callable also takes the op's keyword arguments by the same names.
_SAME_KWARGS = frozenset({aten.addmm.default, aten._addmm_activation.default, aten.gelu.default, aten.cumsum.default,
                          aten.empty_like.default, aten.clone.default, SDPA})


def linear_kxm(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear of a weight w stored (in, out) (GPT-2's Conv1D; LinearFold.stored_kxm), as one
    call of the run graph: at::linear's own t() gives back w."""
    return torch._C._nn.linear(x, w.t(), bias)


def linear_activation(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor, kxm: bool = False, **kwargs):
    """`view(_addmm_activation(bias, view(x, [n, k]), t(w), **kwargs), [..., m])` (the activated
    product of fx_product_activation, between its views) as one call of the run graph (w stored
    (in, out) where kxm). For a row-major x of two or more dimensions (or a small GELU's: the
    VM's GELU follows, gelu_size), at::linear's product on the same operands (it flattens x as
    the view did: addmm with the bias, mm with beta 0, which is addmm_impl_cpu_ with beta 0 as
    _addmm_activation's is), then the activation in place on the fresh result, as
    _addmm_activation's CPU kernel applies relu_ / gelu_: the same values, without two Python
    views around the call (~5 us a call at 8 rows). Otherwise x is copied where its strides do
    not allow the view (as the run graph's view would) and _addmm_activation runs."""
    gelu_on = kwargs.get("use_gelu", False)
    small_gelu = gelu_on and vm_takes(x, x.numel() // max(x.shape[-1], 1) * w.shape[1 if kxm else 0])
    if small_gelu or (x.dim() >= 2 and x.is_contiguous()):
        out = torch._C._nn.linear(x, w.t() if kxm else w, None if kwargs.get("beta", 1) == 0 else bias)
        if not gelu_on:
            return out.relu_()
        return vm_gelu(out) if small_gelu else torch._C._nn.gelu_(out)
    out = torch._addmm_activation(bias, _view_or_reshape(x, (-1, x.shape[-1])), w if kxm else w.t(), **kwargs)
    return out.view(x.shape[:-1] + out.shape[-1:])


# Run-graph callables whose result is a new row-major tensor, whatever their operands' layouts.
ROW_MAJOR_RESULTS = frozenset({torch.mm, torch.addmm, torch.bmm, torch.nn.functional.linear, addmm_activation,
                               linear_kxm, linear_activation})

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


# (a slice to its input's own sizes starts at 0: the same elements, whatever its step)
_SAME_SHAPE_IS_IDENTITY = (aten.expand.default, aten.view.default, aten._unsafe_view.default, aten.reshape.default,
                           aten.slice.Tensor)


def identity_of(n, val: Callable):
    """The node n only renames: a view, reshape, expand or slice of its input to the input's own shape
    (the same sizes and strides), read by no graph output (an output keeps its own tensor). None
    otherwise. val: FX node -> its fake value."""
    if n.target not in _SAME_SHAPE_IS_IDENTITY or not isinstance(n.args[0], torch.fx.Node) or \
            any(u.op == "output" for u in n.users):
        return None
    x, out = val(n.args[0]), val(n)
    if not (isinstance(x, torch.Tensor) and isinstance(out, torch.Tensor)) or x.ndim != out.ndim:
        return None
    return n.args[0] if all(statically_known_true(a == b) for a, b in zip(x.shape, out.shape)) else None


def _slice(x: torch.Tensor, dim: int = 0, start=None, end=None, step: int = 1) -> torch.Tensor:
    """aten.slice.Tensor as basic indexing (the same view; out-of-range bounds clamp alike)."""
    return x[(slice(None),) * (dim % x.dim()) + (slice(start, end, step),)]


_ROW_INDEX_DTYPES = (torch.int64, torch.int32)


def index_rows(x: torch.Tensor, indices) -> torch.Tensor:
    """aten.index.Tensor(x, indices) as the run graph calls it. One integer index tensor on the
    first dim of a row-major CPU x (an MoE's token gather) is `index_select` (the same rows copied
    into the same layout; 3.4 against 14.8 us for 128 rows of 128, 27 against 175 for 2048), with
    the index flattened and the result viewed to its shape; an index that is negative (which
    index_select refuses and index wraps), out of range, or into an empty dim takes aten.index,
    as does any other form."""
    if len(indices) == 1 and x.dim() >= 1 and x.is_cpu and x.is_contiguous() and not x.requires_grad:
        i = indices[0]
        if isinstance(i, torch.Tensor) and i.dim() >= 1 and i.dtype in _ROW_INDEX_DTYPES and i.is_cpu:
            try:
                if i.dim() == 1:
                    return torch.index_select(x, 0, i)
                return torch.index_select(x, 0, i.reshape(-1)).view(*i.shape, *x.shape[1:])
            except (IndexError, RuntimeError):   # (aten.index says what is wrong, or wraps)
                pass
    return aten.index.Tensor(x, indices)


class LinearFold(NamedTuple):
    """`view(mm(view(x, [n, k]), w'), [..., m])` as one F.linear: w' is t(w) of an (m, k) weight w,
    or (stored_kxm) the (k, m) weight itself, passed to F.linear as w.t(). activation: None, or
    the keyword arguments of an `_addmm_activation` product (then one linear_activation call)."""
    x: torch.fx.Node
    w: torch.fx.Node
    bias: torch.fx.Node | None
    stored_kxm: bool
    activation: dict | None = None

    def reads(self) -> list:
        return [self.x, self.w] + ([self.bias] if self.bias is not None else [])


def _transposed_weight(tw) -> torch.fx.Node | None:
    """w where tw is a transposition of a 2-D w (t, permute [1, 0], transpose 0 1), else None."""
    if tw.target is aten.t.default:
        return tw.args[0]
    if tw.target is aten.permute.default and [d % 2 for d in tw.args[1]] == [1, 0]:
        return tw.args[0]
    if tw.target is aten.transpose.int and sorted(d % 2 for d in tw.args[1:3]) == [0, 1]:
        return tw.args[0]
    return None


def _bias_fits(bv, m) -> bool:
    """bv (a bias's fake value) is 1-D of the product's m columns: F.linear's bias."""
    return isinstance(bv, torch.Tensor) and bv.ndim == 1 and statically_known_true(bv.shape[0] == m)


def _fold(n, in_torch: set, val: Callable) -> tuple[LinearFold, set] | None:
    """The fold of mm / addmm / _addmm_activation node n and the inner nodes it skips, or None."""
    activation = dict(n.kwargs) if n.target is aten._addmm_activation.default else None
    bias = n.args[0] if n.target is not aten.mm.default else None
    flat, tw = n.args[-2:]
    if bias is not None and (len(n.args) != 3 or not isinstance(bias, torch.fx.Node)):
        return None
    (back,) = n.users
    if not all(isinstance(v, torch.fx.Node) for v in (flat, tw)) or flat.target not in _RESHAPE_INSTEAD or \
            back.target not in _RESHAPE_INSTEAD or len(flat.users) != 1:
        return None
    w = _transposed_weight(tw) if tw.op == "call_function" and len(tw.users) == 1 else None
    inner = {n, flat} | ({tw} if w is not None else set())
    if not inner | {back} <= in_torch:
        return None
    stored_kxm = w is None
    w = tw if stored_kxm else w
    xv, wv, out = val(flat.args[0]), val(w), val(back)
    # 2-D and more: at::linear's mm / addmm (a 1-D x would be a matrix-vector product)
    if not all(isinstance(v, torch.Tensor) for v in (xv, wv, out)) or wv.ndim != 2 or xv.ndim < 2:
        return None
    k, m = (wv.shape[0], wv.shape[1]) if stored_kxm else (wv.shape[1], wv.shape[0])
    bv = val(bias) if bias is not None else None
    ignored = activation is not None and activation.get("beta", 1) == 0   # (a zero the op ignores)
    if bias is not None and not ignored and not _bias_fits(bv, m):
        return None
    want = tuple(xv.shape[:-1]) + (m,)
    same = [statically_known_true(a == b) for a, b in zip(want, out.shape)]
    if len(want) != out.ndim or not all(same) or not statically_known_true(xv.shape[-1] == k):
        return None
    return LinearFold(flat.args[0], w, bias, stored_kxm, activation), inner


def _fold_flat(n, in_torch: set, val: Callable) -> tuple[LinearFold, set] | None:
    """The fold of `mm(x, t(w))` / `addmm(b, x, t(w))` node n of a 2-D x with no views around it
    (an MoE router: its flattened x has other readers) and the transposition it skips, or None:
    F.linear of a 2-D x is that same mm / addmm of w.t()."""
    bias = n.args[0] if n.target is aten.addmm.default else None
    x, tw = n.args[-2:]
    if not all(isinstance(v, torch.fx.Node) for v in (x, tw)) or tw.op != "call_function" or len(tw.users) != 1:
        return None
    w = _transposed_weight(tw)
    if w is None or not {n, tw} <= in_torch or (bias is not None and not isinstance(bias, torch.fx.Node)):
        return None
    xv, wv, bv = val(x), val(w), val(bias) if bias is not None else None
    if not all(isinstance(v, torch.Tensor) for v in (xv, wv)) or xv.ndim != 2 or wv.ndim != 2:
        return None
    if bias is not None and not _bias_fits(bv, wv.shape[0]):
        return None
    return LinearFold(x, w, bias, False), {tw}


def linear_folds(nodes, in_torch: set, val: Callable) -> tuple[dict, set]:
    """{node of the view back: LinearFold} for each `view(mm(view(x, [n, k]), t(w)),
    x.shape[:-1] + [m])` (or `addmm(b, ...)` with a 1-D bias b; or an untransposed (k, m) w)
    whose ops are all in `in_torch` and whose inner values have no other reader, and the set of
    inner nodes (the transposition, the flattening view, mm) the run graph then skips; where
    there are no views, {mm node: LinearFold} of a 2-D x's `mm(x, t(w))` (_fold_flat). val: FX
    node -> its fake value (symbolic sizes)."""
    folds, skip = {}, set()
    for n in nodes:
        product = n.target in (aten.mm.default, aten.addmm.default) and not n.kwargs
        activated = n.target is aten._addmm_activation.default and set(n.kwargs) <= ACTIVATION_KWARGS
        if not (product or activated):
            continue
        got = _fold(n, in_torch, val) if len(n.users) == 1 else None
        if got is not None:
            (back,) = n.users
            folds[back], inner = got
            skip |= inner
            continue
        got = _fold_flat(n, in_torch, val) if product else None
        if got is not None:
            folds[n], inner = got
            skip |= inner
    return folds, skip


def fast_call(target, args: tuple, has_kwargs: bool, row_major: bool = False) -> Callable:
    """The callable the run graph uses for `target` called with positional arguments `args` (its
    FX arguments). row_major: the first argument is row-major at run time whatever its traced
    strides (a DVM output stored row-major, F.linear's output, a view of either), so a view is a
    plain view."""
    n_args = len(args)
    if has_kwargs and target not in _SAME_KWARGS:
        return _named(target)
    if target is aten.index_put.default and n_args > 1 and any(i is None for i in args[1]):
        return _named(target)   # (torch.index_put takes no None among its indices; the op does)
    if target in _SAME_OP:
        return _SAME_OP[target]
    if target in _RESHAPE_INSTEAD and n_args == 2:
        return torch.Tensor.view if row_major else _view_or_reshape
    if target is aten.slice.Tensor:
        return _slice
    if target is aten.index.Tensor and n_args == 2:
        return index_rows
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
