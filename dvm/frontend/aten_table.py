"""The ONE table from ATen ops to DVM graph builders (dvm.graph.build).

`LOWERINGS[op_overload](lw, *args, **kwargs)` returns a DVM Node (or a tuple of Nodes for ops
with several tensor outputs). Tensor arguments arrive as Nodes, SymInts as `SymExpr`, everything
else as given. A handler raises `Unsupported(reason)` when it cannot express the op exactly;
the op then runs through PyTorch, counted with that reason. `lw.out` is the FX node's fake value
(shape and dtype PyTorch computed), so views take their result shape from it, never from -1s.

Ops not in the table, and ops with dtypes DVM does not have, run through PyTorch as well.
Slices, selects, cat and arange-indexing live in aten_views; whole patterns (RoPE) that no
single op's handler can see are matched in fx_patterns before planning.
`VIEW_OPS` are pure views: on tensors outside the current segment they run through PyTorch
(free, no copy); `CUBE_OPS` are matmuls and convolutions executed by PyTorch (cube kernels through
the platform library, DESIGN.md §4).
"""
from __future__ import annotations

import functools

import torch

from ..graph import build
from ..graph.dtypes import DType
from ..graph.node import Node
from ..graph.symbolic import SymExpr
from . import aten_updates as U
from . import aten_views as V
from .aten_common import Unsupported, dvm_dtype  # (Unsupported is imported from here by the planner)
from .aten_common import EDGE_PADS, scalar

aten = torch.ops.aten
prims = torch.ops.prims


def _scalar(lw, v) -> Node:
    return scalar(v)


def _ew(name):
    def fn(lw, *args, **kwargs):
        if kwargs:
            raise Unsupported(f"keyword arguments {sorted(kwargs)}")
        return build.elementwise(lw.ctx, name, *[_scalar(lw, a) for a in args])
    return fn


def _with_alpha(name):
    def fn(lw, a, b, alpha=1):
        b = _scalar(lw, b)
        if not (isinstance(alpha, (int, float)) and alpha == 1):
            b = build.elementwise(lw.ctx, "mul", b, _scalar(lw, alpha))
        return build.elementwise(lw.ctx, name, _scalar(lw, a), b)
    return fn


def _rsub(lw, a, b, alpha=1):
    return _with_alpha("sub")(lw, b, a, alpha)


def _div_mode(lw, a, b, rounding_mode=None):
    q = build.elementwise(lw.ctx, "div", _scalar(lw, a), _scalar(lw, b))
    if rounding_mode is None:
        return q
    if rounding_mode == "floor":
        return build.elementwise(lw.ctx, "floor_divide", _scalar(lw, a), _scalar(lw, b))
    if not q.dtype.is_float:
        raise Unsupported("integer trunc division")
    return build.elementwise(lw.ctx, "trunc", q)


def _gelu(lw, x, approximate="none"):
    if approximate not in ("none", "tanh"):
        raise Unsupported(f"gelu approximate={approximate!r}")
    return build.elementwise(lw.ctx, "gelu" if approximate == "none" else "gelu_tanh", x)


def _clamp(lw, x, min=None, max=None):  # noqa: A002 (PyTorch's names)
    if min is None and max is None:
        raise Unsupported("clamp without bounds")
    x = _scalar(lw, x)
    if max is None:
        return build.elementwise(lw.ctx, "maximum", x, _scalar(lw, min))
    if min is None:
        return build.elementwise(lw.ctx, "minimum", x, _scalar(lw, max))
    return build.elementwise(lw.ctx, "clamp", x, _scalar(lw, min), _scalar(lw, max))


def _where(lw, cond, a, b):
    return build.elementwise(lw.ctx, "where", cond, _scalar(lw, a), _scalar(lw, b))


def _masked_fill(lw, x, mask, value):
    v = _scalar(lw, value)
    if v.ndim == 0 and v.op == "const":
        v = build.cast(v, x.dtype)
    return build.elementwise(lw.ctx, "where", mask, v, x)


def _bitwise_not(lw, x):
    if x.dtype is DType.BOOL:
        return build.elementwise(lw.ctx, "logical_not", x)
    return build.elementwise(lw.ctx, "bitwise_xor", x, build.const(-1))


def _addc(name):
    """addcmul / addcdiv: self + value * t1 (* or /) t2 in the operands' common dtype, in ATen's
    CPU kernel's order ((value * t1) op t2; the scalar as the product's second operand)."""
    def fn(lw, x, t1, t2, value=1):
        dt = dvm_dtype(lw.out.dtype)
        x, t1, t2 = build.cast(x, dt), build.cast(t1, dt), build.cast(t2, dt)
        if not (isinstance(value, (int, float)) and value == 1):
            t1 = build.elementwise(lw.ctx, "mul", t1, _scalar(lw, value))
        return build.elementwise(lw.ctx, "add", x, build.elementwise(lw.ctx, name, t1, t2))
    return fn


# -- reductions --------------------------------------------------------------------------------
def _dims(dim, ndim):
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return None if ndim else ()
    return dim


def _reduce(name):
    def fn(lw, x, dim=None, keepdim=False, dtype=None):
        if dtype is not None:
            x = build.cast(x, dvm_dtype(dtype))
        return build.reduce(lw.ctx, name, x, _dims(dim, x.ndim), keepdim)
    return fn


def _full_reduce(name):
    def fn(lw, x, dtype=None):
        if dtype is not None:
            x = build.cast(x, dvm_dtype(dtype))
        return build.reduce(lw.ctx, name, x, None, False)
    return fn


def _arg_reduce(name):
    def fn(lw, x, dim=None, keepdim=False):
        if dim is None:
            raise Unsupported(f"{name} over all dims")
        return build.reduce(lw.ctx, name, x, dim, keepdim)
    return fn


def _max_dim(lw, x, dim, keepdim=False):
    return (build.reduce(lw.ctx, "max", x, dim, keepdim), build.reduce(lw.ctx, "argmax", x, dim, keepdim))


def _min_dim(lw, x, dim, keepdim=False):
    return (build.reduce(lw.ctx, "min", x, dim, keepdim), build.reduce(lw.ctx, "argmin", x, dim, keepdim))


def _opmath(x: Node) -> Node:
    """f16/bf16 composites compute in f32, as PyTorch's CPU kernels do."""
    return build.cast(x, DType.FLOAT32) if x.dtype in (DType.FLOAT16, DType.BFLOAT16) else x


def _softmax(log: bool):
    def fn(lw, x, dim, half_to_float=False):
        if half_to_float:
            raise Unsupported("half_to_float")
        ctx, xf = lw.ctx, _opmath(x)
        m = build.reduce(ctx, "max", xf, dim, True)
        d = build.elementwise(ctx, "sub", xf, m)
        e = build.elementwise(ctx, "exp", d)
        s = build.reduce(ctx, "sum", e, dim, True)
        if log:
            out = build.elementwise(ctx, "sub", d, build.elementwise(ctx, "log", s))
        else:   # times the row's reciprocal, as PyTorch's native CPU kernel: one division per row
            out = build.elementwise(ctx, "mul", e, build.elementwise(ctx, "reciprocal", s))
        return build.cast(out, x.dtype)
    return fn


def _safe_softmax(lw, x, dim, dtype=None):
    """softmax whose rows of -inf only give 0, not NaN (ATen's _safe_softmax: attention with a
    mask that hides a whole row); a row is all -inf exactly when its max is -inf."""
    if dtype is not None:
        x = build.cast(x, dvm_dtype(dtype))
    out = _softmax(False)(lw, x, dim)
    hidden = build.elementwise(lw.ctx, "eq", build.reduce(lw.ctx, "max", _opmath(x), dim, True),
                               build.const(float("-inf")))
    return build.elementwise(lw.ctx, "where", hidden, build.cast(build.const(0.0), out.dtype), out)


def _layer_norm(lw, x, normalized_shape, weight, bias, eps):
    ctx, xf = lw.ctx, _opmath(x)
    axes = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    mean = build.reduce(ctx, "mean", xf, axes, True)
    d = build.elementwise(ctx, "sub", xf, mean)
    var = build.reduce(ctx, "mean", build.elementwise(ctx, "mul", d, d), axes, True)
    rstd = build.elementwise(ctx, "rsqrt", build.elementwise(ctx, "add", var, _scalar(lw, eps)))
    out = build.elementwise(ctx, "mul", d, rstd)
    if weight is not None:
        out = build.elementwise(ctx, "mul", out, weight)
    if bias is not None:
        out = build.elementwise(ctx, "add", out, bias)
    dt = [dvm_dtype(v.dtype) for v in lw.out]
    return build.cast(out, dt[0]), build.cast(mean, dt[1]), build.cast(rstd, dt[2])


# -- casts, views, constants -------------------------------------------------------------------
def _convert(lw, x, dtype):
    return build.cast(x, dvm_dtype(dtype))


def _to_copy(lw, x, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False,
             memory_format=None):
    if device is not None and torch.device(device).type != "cpu":
        raise Unsupported(f"copy to device {device}")
    if layout not in (None, torch.strided):
        raise Unsupported(f"layout {layout}")
    if dtype is None:
        return _identity(lw, x)
    return build.cast(x, dvm_dtype(dtype))


def _identity(lw, x, *args, **kwargs):
    if kwargs.get("memory_format") not in (None, torch.contiguous_format, torch.preserve_format):
        raise Unsupported(f"memory_format {kwargs['memory_format']}")
    return x


def _view_as_out(lw, x, *args, **kwargs):
    return build.reshape(lw.ctx, x, lw.out_shape)


def _permute(lw, x, dims):
    return build.permute(lw.ctx, x, dims)


def _transpose(lw, x, d0, d1):
    if x.ndim < 2:
        return x
    dims = list(range(x.ndim))
    d0, d1 = d0 % x.ndim, d1 % x.ndim
    dims[d0], dims[d1] = dims[d1], dims[d0]
    return build.permute(lw.ctx, x, dims)


def _t(lw, x):
    return _transpose(lw, x, 0, 1)


def _expand(lw, x, *args, **kwargs):
    if x.ndim == len(lw.out_shape):
        return build.broadcast_to(lw.ctx, x, lw.out_shape)
    return build.broadcast_to(lw.ctx, build.reshape(lw.ctx, x, (1,) * (len(lw.out_shape) - x.ndim) + x.shape),
                              lw.out_shape)


def _tensor_of(lw, value) -> Node:
    """value as a 0-d tensor of the result's dtype. Never a weak constant: a tensor promotes by its
    dtype, a Python number by its kind only (where(c, full([], 0., dtype=bf16), -inf) is bf16)."""
    v = build.cast(_scalar(lw, value), dvm_dtype(lw.out.dtype))
    return build.const(v.attr("value"), v.dtype) if v.op == "const" and v.attr("weak") else v


def _full(lw, size, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None):
    if device is not None and torch.device(device).type != lw.out.device.type:
        raise Unsupported(f"device {device}")
    return build.broadcast_view(lw.ctx, _tensor_of(lw, fill_value), lw.out_shape)


def _full_like(lw, x, fill_value, **kwargs):
    return _full(lw, None, fill_value)


def _const_like(value):
    def fn(lw, x, **kwargs):
        return _full(lw, None, value)
    return fn


def _scalar_tensor(lw, value, **kwargs):
    return _tensor_of(lw, value)


def _new_full(value):
    def fn(lw, x, size, *, dtype=None, layout=None, device=None, pin_memory=None):
        return _full(lw, size, value, device=device)
    return fn


def _new_full_value(lw, x, size, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _full(lw, size, fill_value, device=device)


def _new_tensor(value):
    """zeros(size) / ones(size): the value broadcast to the result's shape."""
    def fn(lw, size, *, dtype=None, layout=None, device=None, pin_memory=None):
        return _full(lw, size, value, device=device)
    return fn


def _arange_start(lw, start, end, step=1, *, dtype=None, layout=None, device=None, pin_memory=None):
    """arange(start, end[, step]) in int64 from integer bounds: start + step * index, exact."""
    if lw.out.dtype is not torch.int64 or not isinstance(step, int) or \
            not isinstance(start, (int, SymExpr)) or isinstance(start, bool):
        raise Unsupported("arange(start, end, step) other than int64 from integers")
    index = build.iota(lw.out_shape, 0)
    if step != 1:
        index = build.elementwise(lw.ctx, "mul", index, build.const(step))
    return build.elementwise(lw.ctx, "add", index, build.cast(_scalar(lw, start), DType.INT64))


# arange(n) in these dtypes is the int64 index cast (RNE), as PyTorch computes it, for n <= 2**24
_ARANGE_DTYPES = (torch.int64, torch.int32, torch.float32, torch.float64, torch.bfloat16, torch.float16)


def _arange(lw, *args, dtype=None, layout=None, device=None, pin_memory=None):
    if len(args) != 1 or lw.out.dtype not in _ARANGE_DTYPES:
        raise Unsupported("arange with start/step or a dtype other than int / float")
    n = lw.out_shape[0]
    if lw.out.dtype is not torch.int64:
        if isinstance(n, int):
            if n > 2 ** 24:
                raise Unsupported("float arange past 2**24")
        else:
            lw.ctx.require_eq(build.sym_max(n, 2 ** 24), 2 ** 24, "float arange of at most 2**24 elements")
    return build.cast(build.iota(lw.out_shape, 0), dvm_dtype(lw.out.dtype))


VIEW_OPS = {aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.permute.default,
            aten.t.default, aten.transpose.int, aten.unsqueeze.default, aten.squeeze.dim,
            aten.squeeze.dims, aten.squeeze.default, aten.expand.default, aten.alias.default,
            aten.slice.Tensor, aten.select.int, aten.as_strided.default, aten.unfold.default,
            aten.split.Tensor, aten.split_with_sizes.default, aten.unbind.int, aten.diagonal.default,
            aten.narrow.default, aten.detach.default}
RESHAPE_OPS = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)   # views that only reshape
CUBE_OPS = {aten.mm.default, aten.bmm.default, aten.addmm.default, aten.baddbmm.default, aten.matmul.default,
            aten._addmm_activation.default, aten.convolution.default, aten.convolution_backward.default} | \
    ({aten._grouped_mm.default} if hasattr(aten, "_grouped_mm") else set())

_UNARY = ("neg", "abs", "exp", "exp2", "expm1", "log", "log2", "log1p", "sqrt", "rsqrt", "reciprocal",
          "sin", "cos", "tanh", "sigmoid", "erf", "silu", "relu", "floor", "ceil", "round", "trunc",
          "sign", "logical_not", "isnan", "isinf")
_BINARY = {"mul": "mul", "div": "div", "maximum": "maximum", "minimum": "minimum", "eq": "eq",
           "ne": "ne", "lt": "lt", "le": "le", "gt": "gt", "ge": "ge", "logical_and": "logical_and",
           "logical_or": "logical_or", "logical_xor": "logical_xor", "bitwise_and": "bitwise_and",
           "bitwise_or": "bitwise_or", "bitwise_xor": "bitwise_xor", "remainder": "remainder",
           "floor_divide": "floor_divide", "pow": "pow", "true_divide": "div"}

LOWERINGS: dict = {}
for _n in _UNARY:
    LOWERINGS[getattr(aten, _n).default] = _ew(_n)
LOWERINGS[aten.isfinite.default] = _ew("isfinite")
for _aten, _op in _BINARY.items():
    _packet = getattr(aten, _aten)
    for _ov in ("Tensor", "Scalar", "default", "Tensor_Tensor", "Tensor_Scalar", "Scalar_Tensor"):
        if hasattr(_packet, _ov):
            LOWERINGS[getattr(_packet, _ov)] = _ew(_op)
for _ov in ("Tensor", "Scalar"):
    LOWERINGS[getattr(aten.add, _ov)] = _with_alpha("add")
    LOWERINGS[getattr(aten.sub, _ov)] = _with_alpha("sub")
    LOWERINGS[getattr(aten.rsub, _ov)] = _rsub
LOWERINGS.update({
    aten.div.Tensor_mode: _div_mode, aten.div.Scalar_mode: _div_mode,
    aten.gelu.default: _gelu, aten.bitwise_not.default: _bitwise_not,
    aten.clamp.default: _clamp, aten.clamp.Tensor: _clamp,
    aten.clamp_min.default: lambda lw, x, v: _clamp(lw, x, min=v),
    aten.clamp_max.default: lambda lw, x, v: _clamp(lw, x, max=v),
    aten.clamp_min.Tensor: lambda lw, x, v: _clamp(lw, x, min=v),
    aten.clamp_max.Tensor: lambda lw, x, v: _clamp(lw, x, max=v),
    aten.where.self: _where, aten.where.ScalarSelf: _where, aten.where.ScalarOther: _where,
    aten.where.Scalar: _where,
    aten.masked_fill.Scalar: _masked_fill, aten.masked_fill.Tensor: _masked_fill,
    aten.addcmul.default: _addc("mul"), aten.addcdiv.default: _addc("div"),
    aten.sum.dim_IntList: _reduce("sum"), aten.sum.default: _full_reduce("sum"),
    aten.mean.dim: _reduce("mean"), aten.mean.default: _full_reduce("mean"),
    aten.prod.dim_int: _reduce("prod"), aten.prod.default: _full_reduce("prod"),
    aten.amax.default: _reduce("max"), aten.amin.default: _reduce("min"),
    aten.max.dim: _max_dim, aten.min.dim: _min_dim,
    aten.max.default: _full_reduce("max"), aten.min.default: _full_reduce("min"),
    aten.argmax.default: _arg_reduce("argmax"), aten.argmin.default: _arg_reduce("argmin"),
    aten._softmax.default: _softmax(False), aten._log_softmax.default: _softmax(True),
    aten._safe_softmax.default: _safe_softmax, aten.native_layer_norm.default: _layer_norm,
    prims.convert_element_type.default: _convert, aten._to_copy.default: _to_copy,
    aten.clone.default: _identity, aten.alias.default: _identity, aten.detach.default: _identity,
    aten.view.default: _view_as_out, aten._unsafe_view.default: _view_as_out,
    aten.reshape.default: _view_as_out, aten.unsqueeze.default: _view_as_out,
    aten.squeeze.dim: _view_as_out, aten.squeeze.dims: _view_as_out, aten.squeeze.default: _view_as_out,
    aten.permute.default: _permute, aten.transpose.int: _transpose, aten.t.default: _t,
    aten.expand.default: _expand, aten.full.default: _full, aten.full_like.default: _full_like,
    aten.zeros_like.default: _const_like(0), aten.ones_like.default: _const_like(1),
    aten.scalar_tensor.default: _scalar_tensor, aten.arange.default: _arange,
    aten.slice.Tensor: V.slice_, aten.select.int: V.select, aten.slice_backward.default: V.slice_backward,
    aten.cat.default: V.cat, aten.index.Tensor: V.index, aten.flip.default: V.flip, aten.roll.default: V.roll,
    aten.constant_pad_nd.default: V.constant_pad_nd, aten.stack.default: V.stack,
    **{op: V.edge_pad(reflect) for op, reflect in EDGE_PADS.items()},
    aten.new_ones.default: _new_full(1), aten.new_zeros.default: _new_full(0), aten.new_full.default: _new_full_value,
    aten.zeros.default: _new_tensor(0), aten.ones.default: _new_tensor(1), aten.lift_fresh_copy.default: _identity,
    aten.arange.start: _arange_start, aten.arange.start_step: _arange_start, **U.UPDATE_LOWERINGS,
})
FOREACH_OPS = U.add_foreach(LOWERINGS)   # (not recorded by lazy mode: lists of results)
register_late_ops = functools.partial(U.register_late_ops, LOWERINGS)
