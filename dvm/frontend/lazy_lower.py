"""What lazy mode hands the table's handlers (aten_table.LOWERINGS): the symbols of a pending
graph, and the symbolic result shape (`lw.out_shape`) of the ops whose handlers read it.

Sizes are symbolic by value: within one pending graph, every distinct concrete size >= 2 (an
input's dimension or a size argument) is one symbol s<k> (k in order of first appearance; range
>= 2); sizes 0 and 1 stay literal (the broadcast pattern). Two sizes share a symbol exactly when
they are equal, so the structure records which sizes are equal, never the sizes themselves.
A fact that does not follow from that pattern (a slice's end within its axis) is a shape check,
evaluated at every recording of the op (lazy_record): a recording whose sizes fail it runs the
op through PyTorch instead.
"""
from __future__ import annotations

import torch

from ..graph.node import Node
from ..graph.symbolic import SymExpr, evaluate, floordiv, prod, sym, sym_max
from .aten_common import Unsupported

aten = torch.ops.aten
INT64_HUGE = 2 ** 62        # slice ends at or past this are "to the end"
SYMBOL_MIN = 2              # sizes below this stay literal

_SYMS: list = []
_NAMES: list = []


def symbol(k: int) -> SymExpr:
    """The k-th size symbol of a pending graph (range >= SYMBOL_MIN), the same object for a k."""
    while len(_SYMS) <= k:
        _NAMES.append(f"s{len(_SYMS)}")
        _SYMS.append(sym(_NAMES[-1], lo=SYMBOL_MIN))
    return _SYMS[k]


def symbol_name(k: int) -> str:
    return _NAMES[k] if k < len(_NAMES) else symbol(k).as_symbol().name


def dim_of(code):
    """A size code (an int literal >= 0, or -1-k for symbol k) as a DVM dim."""
    return code if code >= 0 else symbol(-1 - code)


def shape_code(shape) -> tuple | None:
    """A DVM shape as size codes (fast concrete evaluation), or None when some dim is an
    expression other than one symbol (evaluated through its SymExpr instead)."""
    out = []
    for d in shape:
        if isinstance(d, int):
            out.append(d)
            continue
        s = d.as_symbol()
        if s is None:
            return None
        out.append(-1 - int(s.name[1:]))
    return tuple(out)


class AtTheseSizes(Unsupported):
    """Not recorded at these sizes; another call with the same structure may be (the trie does
    not remember the failure)."""


class LazyLower:
    """What a table handler sees (the interface of fx_segment_lower._Lower): the shape context, PyTorch's
    result for the op (a meta tensor, or the real view) and its shape as DVM dims."""
    __slots__ = ("ctx", "out", "func", "args", "kwargs", "env")

    def __init__(self, ctx, out, func, args, kwargs, env):
        self.ctx, self.out, self.func, self.args, self.kwargs, self.env = ctx, out, func, args, kwargs, env

    @property
    def out_shape(self) -> tuple:
        derive = _DERIVE.get(self.func)
        if derive is None:
            raise Unsupported(f"{self.func}: result shape not derived in lazy mode")
        a = self.args
        shape = tuple(derive(self, *a, **self.kwargs))
        want = tuple(self.out.shape) if isinstance(self.out, torch.Tensor) else None
        if want is not None and tuple(evaluate(d, self.env) for d in shape) != want:
            raise AtTheseSizes(f"derived shape {shape} is not PyTorch's {want}")
        return shape


def _sizes(lw, x: Node | None, size) -> tuple:
    """A size list (literals and symbols) with PyTorch's -1 resolved against x's element count."""
    size = tuple(size)
    if any(isinstance(d, int) and d == -1 for d in size):
        known = prod(d for d in size if not (isinstance(d, int) and d == -1))
        size = tuple(floordiv(prod(x.shape), known) if isinstance(d, int) and d == -1 else d for d in size)
    return size


def _view(lw, x, size, *rest, **kw):
    return _sizes(lw, x, size)


def _unsqueeze(lw, x, dim):
    dim = dim % (x.ndim + 1)
    return x.shape[:dim] + (1,) + x.shape[dim:]


def _squeeze(lw, x, dims=None):
    if x.ndim == 0:
        return ()
    if dims is None:
        dims = range(x.ndim)
    elif isinstance(dims, int):
        dims = (dims,)
    drop = {d % x.ndim for d in dims}
    return tuple(s for i, s in enumerate(x.shape) if not (i in drop and isinstance(s, int) and s == 1))


def _expand(lw, x, size, implicit=False):
    size = tuple(size)
    lead = len(size) - x.ndim
    return tuple(x.shape[i - lead] if isinstance(d, int) and d == -1 else d for i, d in enumerate(size))


def _like(lw, x, *args, **kwargs):
    return x.shape


def _new(lw, x, size, *args, **kwargs):
    return tuple(size)


def _resolve_end(lw, size, end):
    """The slice end clamped to the axis, as a dim; the case taken is a shape check."""
    if end is None or (isinstance(end, int) and end >= INT64_HUGE):
        return size
    if isinstance(end, int) and end < 0:
        if not isinstance(size, int):
            raise Unsupported("negative slice end on a symbolic size")
        return max(size + end, 0)
    if evaluate(end, lw.env) <= evaluate(size, lw.env):
        lw.ctx.require_eq(sym_max(end, size), size, "slice end within the axis")
        return end
    lw.ctx.require_eq(sym_max(end, size), end, "slice end past the axis")
    return size


def _slice(lw, x, dim=0, start=None, end=None, step=1):
    if not isinstance(step, int) or step < 1:
        raise Unsupported(f"slice step {step}")
    dim %= max(x.ndim, 1)
    size = x.shape[dim]
    stop = _resolve_end(lw, size, end)
    if start is None:
        start = 0
    if isinstance(start, int) and start < 0:
        if stop is not size:
            raise Unsupported("negative slice start with an end")
        if not isinstance(size, int) and evaluate(size, lw.env) + start < 0:
            raise AtTheseSizes("negative slice start past the axis")
        start = size + start if not isinstance(size, int) else max(size + start, 0)
    if evaluate(start, lw.env) > evaluate(stop, lw.env):
        raise AtTheseSizes("empty slice (start past the end)")
    lw.ctx.require_eq(sym_max(start, stop), stop, "slice start within the end")
    length = stop - start if step == 1 else floordiv(stop - start + (step - 1), step)
    return x.shape[:dim] + (length,) + x.shape[dim + 1:]


def _cat(lw, tensors, dim=0):
    pieces = [t for t in tensors if not (t.ndim == 1 and isinstance(t.shape[0], int) and t.shape[0] == 0)]
    if not pieces:
        raise Unsupported("cat of empty tensors")
    dim %= pieces[0].ndim
    total = 0
    for p in pieces:
        total = total + p.shape[dim]
    return pieces[0].shape[:dim] + (total,) + pieces[0].shape[dim + 1:]


_DERIVE = {
    aten.view.default: _view, aten._unsafe_view.default: _view, aten.reshape.default: _view,
    aten.unsqueeze.default: _unsqueeze, aten.squeeze.dim: _squeeze, aten.squeeze.dims: _squeeze,
    aten.squeeze.default: _squeeze, aten.expand.default: _expand,
    aten.full_like.default: _like, aten.zeros_like.default: _like, aten.ones_like.default: _like,
    aten.new_ones.default: _new, aten.new_zeros.default: _new,
    aten.slice.Tensor: _slice, aten.cat.default: _cat,
}


def check_result(r, out, env) -> Node:
    """r (a handler's result) against PyTorch's result `out` (meta or real) at these sizes."""
    from .aten_common import dvm_dtype
    if not isinstance(r, Node):
        raise Unsupported("handler result")
    if r.dtype is not dvm_dtype(out.dtype):
        raise Unsupported(f"dtype rule gives {r.dtype.short}, PyTorch {out.dtype}")
    if r.ndim != out.dim() or tuple(evaluate(d, env) for d in r.shape) != tuple(out.shape):
        raise AtTheseSizes(f"shape rule gives {r.shape}, PyTorch {tuple(out.shape)}")
    return r


def scalar_dtype(partner: Node, half_reads_f32: bool):
    """The dtype of a 0-d input standing for a Python float that meets `partner` in an op: the
    dtype build.elementwise casts such a constant to (f32 for the second operand of mul / div
    with a half-precision partner: PyTorch's CPU scalar at opmath precision)."""
    from ..graph.dtypes import DType
    if half_reads_f32 and partner.dtype in (DType.FLOAT16, DType.BFLOAT16):
        return DType.FLOAT32
    return partner.dtype


