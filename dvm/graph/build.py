"""Shape and dtype rules: the only way graph nodes are built (builder API and torch frontend).

Every function here works on symbolic shapes. A fact that cannot be decided while tracing is
recorded in `ShapeContext.checks` and evaluated when sizes are bound; a fact decided false
raises ShapeError at once. Type promotion is PyTorch's and is made explicit with cast nodes,
so every elementwise node's inputs already have its compute dtype.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from ..errors import DTypeError, ShapeError
from . import fold
from .dtypes import DEFAULT_FLOAT, DType, result_type, round_to_dtype
from .node import Node
from .ops import OP_TABLE, Kind, Promo
from .symbolic import Dim, SymExpr, bounds, decide_eq, floordiv, is_one, prod, render, sym_max


@dataclass
class Check:
    """A run-time fact: `lhs == rhs` (or `lhs != 0` when rhs is None), with the reason."""
    lhs: Dim
    rhs: Dim | None
    why: str


@dataclass
class ShapeContext:
    checks: list[Check] = field(default_factory=list)

    def require_eq(self, a: Dim, b: Dim, why: str) -> None:
        decided = decide_eq(a, b)
        if decided is False:
            raise ShapeError(f"{why}: {a} != {b}")
        if decided is None and not any(c.lhs == a and c.rhs == b for c in self.checks):
            self.checks.append(Check(a, b, why))

    def require_nonzero(self, a: Dim, why: str) -> None:
        if isinstance(a, int):
            if a == 0:
                raise ShapeError(why)
        elif not any(c.lhs == a and c.rhs is None for c in self.checks):
            self.checks.append(Check(a, None, why))


# -- shapes -------------------------------------------------------------------------------------

def broadcast_shapes(ctx: ShapeContext, shapes: Sequence[tuple], what: str) -> tuple:
    rank = max((len(s) for s in shapes), default=0)
    out = []
    for i in range(rank):
        dims = [s[len(s) - rank + i] for s in shapes if len(s) - rank + i >= 0]
        big = [d for d in dims if not is_one(d)]
        if not big:
            out.append(1)
            continue
        first = big[0]
        for d in big[1:]:
            if decide_eq(first, d) is not True:
                ctx.require_eq(first, d, f"{what}: shapes {', '.join(render(s) for s in shapes)} "
                                         f"do not broadcast at dim {i - rank}")
        out.append(first)
    return tuple(out)


def normalize_axes(axis, ndim: int, what: str) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    out = []
    for a in axes:
        if not isinstance(a, int) or not -max(ndim, 1) <= a < max(ndim, 1):
            raise ShapeError(f"{what}: axis {a} is out of range for a tensor of rank {ndim}")
        a = a % ndim if ndim else 0
        if a in out:
            raise ShapeError(f"{what}: axis {a} appears twice in {axis}")
        out.append(a)
    return tuple(sorted(out)) if ndim else ()


# the dtypes a symbolic integer constant is made directly (encoded as a float64, rounded on load)
SYMBOLIC_FLOAT_CONSTS = frozenset({DType.FLOAT32, DType.FLOAT64})

# -- leaves -------------------------------------------------------------------------------------

def const(value, dtype: DType | None = None) -> Node:
    """A scalar constant. Without `dtype` it is weak (a Python scalar in PyTorch's promotion)."""
    if isinstance(value, SymExpr):
        return Node.make("const", dtype or DType.INT64, (), value=value, weak=dtype is None)
    if dtype is None:
        dtype = DType.BOOL if isinstance(value, bool) else DType.INT64 if isinstance(value, int) \
            else DEFAULT_FLOAT
        if not isinstance(value, (bool, int, float)):
            raise DTypeError(f"scalar constant must be bool, int or float, got {type(value).__name__}")
        # a weak float keeps Python's double precision until it meets its compute dtype
        kept = float(value) if dtype.is_float else round_to_dtype(value, dtype)
        return Node.make("const", dtype, (), value=kept, weak=True)
    return Node.make("const", dtype, (), value=round_to_dtype(value, dtype), weak=False)


def iota(shape: tuple, axis: int) -> Node:
    (axis,) = normalize_axes(axis, len(shape), "iota")
    return Node.make("iota", DType.INT64, shape, axis=axis)


def cast(x: Node, dtype: DType) -> Node:
    if x.dtype == dtype:
        return x
    if x.op == "const" and not isinstance(x.attr("value"), SymExpr):
        weak = x.attr("weak") and dtype.category == x.dtype.category
        return Node.make("const", dtype, (), value=round_to_dtype(x.attr("value"), dtype), weak=weak)
    if x.op == "const" and dtype in SYMBOLIC_FLOAT_CONSTS and not x.dtype.is_float:
        # a size made float (a norm's count): a float constant, rounded when it is encoded as
        # the cast would round it, instead of a cast per lane (int64 -> float32 has no vector
        # instruction before AVX-512)
        return Node.make("const", dtype, (), value=x.attr("value"), weak=False)
    return Node.make("cast", dtype, x.shape, (x,))


# -- elementwise --------------------------------------------------------------------------------

def _promoted(args: Sequence[Node]) -> DType:
    dims = [a.dtype for a in args if a.ndim > 0]
    zero = [a.dtype for a in args if a.ndim == 0 and not (a.op == "const" and a.attr("weak"))]
    weak = [a.dtype.category for a in args if a.ndim == 0 and a.op == "const" and a.attr("weak")]
    return result_type(dims, zero, weak)


def elementwise(ctx: ShapeContext, name: str, *args: Node) -> Node:
    op = OP_TABLE[name]
    if op.kind is not Kind.ELEMENTWISE or len(args) != op.arity:
        raise ShapeError(f"{name} takes {op.arity} tensor arguments, got {len(args)}")
    shape = broadcast_shapes(ctx, [a.shape for a in args], name)
    if name == "where":
        cond, data = cast(args[0], DType.BOOL), args[1:]
    else:
        cond, data = None, args
    promoted = _promoted(data)
    if op.promo is Promo.LOGICAL:
        compute, result = DType.BOOL, DType.BOOL
    elif op.promo is Promo.INT_TO_FLOAT and not promoted.is_float:
        compute = result = DEFAULT_FLOAT
    else:
        compute, result = promoted, DType.BOOL if op.promo is Promo.ALWAYS_BOOL else promoted
    if op.reject_bool and (compute is DType.BOOL or (name == "sub" and any(a.dtype is DType.BOOL for a in data))):
        raise DTypeError(op.reject_bool)
    if compute.category not in op.accepts:
        raise DTypeError(f"{name} does not support {compute.short} inputs "
                         f"(accepts {', '.join(sorted(c.name.lower() for c in op.accepts))})")
    if not compute.is_float and (op.identity_for_int or (name == "sign" and compute is DType.BOOL)):
        return broadcast_view(ctx, cast(args[0], result), shape)
    kept = _and_or_identity(name, compute, data)
    if kept is not None:
        return broadcast_view(ctx, kept, shape)
    if name in ("isnan", "isinf", "isfinite") and not compute.is_float:
        return elementwise(ctx, "eq" if name == "isfinite" else "ne", args[0], args[0])
    if name == "pow" and not compute.is_float and _negative_int_scalar(data[1]):
        raise DTypeError("Integers to negative integer powers are not allowed.")   # PyTorch's words
    if name == "pow" and compute.is_float and data[1].op == "const" and data[1].attr("weak"):
        special = _pow_by_scalar(ctx, cast(data[0], compute), data[1].attr("value"))
        if special is not None:
            return special
    if compute.bank not in op.banks:
        if op.bool_via_int and compute is DType.BOOL:
            wide = elementwise(ctx, name, *[cast(a, DType.INT64) for a in args])
            return cast(wide, result)
        raise DTypeError(f"{name} is not implemented for {compute.short}")
    # logical ops see each operand as the promoted dtype first (a bf16 value an f16 result
    # flushes to 0 is False), as PyTorch computes them in the common dtype
    inputs = [cast(cast(a, promoted), compute) if op.promo is Promo.LOGICAL else cast(a, compute) for a in data]
    if name in ("mul", "div", "floor_divide") and compute in (DType.FLOAT16, DType.BFLOAT16) \
            and all(is_one(d) for d in data[1].shape) and data[1].dtype != compute:
        # PyTorch's CPU mul/div/floor_divide kernels read a *second* operand that is one element
        # (0-d, or every dim 1: TensorIterator's "cpu scalar", a broadcast of zero strides) at f32
        # "opmath" precision instead of rounding it to f16/bf16 first (f16 0 // bf16 1e-10 is 0,
        # not NaN; f16 0.7 * int32[-65536] is -45888, not -inf); every other case (remainder
        # included) rounds
        inputs[1] = cast(data[1], DType.FLOAT32)
    done = fold.folded(name, compute, result, inputs, cond)   # (graph/fold)
    if done is not None:
        return broadcast_view(ctx, done, shape)
    if cond is not None:
        inputs = [cond] + inputs
    return Node.make(name, result, shape, inputs)


def _negative_int_scalar(e: Node) -> bool:
    """A Python-scalar exponent (weak constant) that is a negative integer: PyTorch refuses an
    integer tensor to such a power (a tensor exponent gives 0s and the like instead)."""
    if e.op != "const" or not e.attr("weak"):
        return False
    v = e.attr("value")
    return isinstance(v, int) and not isinstance(v, bool) and v < 0


def _and_or_identity(name: str, compute: DType, data: Sequence[Node]) -> Node | None:
    """The bool operand x of `True & x` or `False | x` (either order): the op is the identity
    (HF's attention masks AND a causal mask with an all-True padding mask)."""
    neutral = {"bitwise_and": True, "logical_and": True, "bitwise_or": False, "logical_or": False}.get(name)
    if neutral is None or compute is not DType.BOOL or len(data) != 2:
        return None
    for c, x in (data, data[::-1]):
        if c.op == "const" and c.attr("value") is neutral and x.dtype is DType.BOOL:
            return x
    return None


def _pow_by_scalar(ctx: ShapeContext, x: Node, e) -> Node | None:
    """PyTorch's CPU pow with these scalar exponents is not pow: 2 is x*x (every float dtype); for
    f32 / f64, 3, -1 and -2 are x*x*x, 1/x and 1/(x*x); +-0.5 is sqrt / rsqrt except for f16
    (pow(-inf, 0.5) is +inf). Bitwise eager's (tests/test_ops.py); a product is ~25-100x cheaper
    than the VM's pow (jit/powf). f16 / bf16 x ** 3 is x*x*x too, the bits of the f64 pow it replaces
    (tests/test_half_cube.py): in their f32 registers x*x is exact and x*x*x rounds the exact cube
    once, as the pow's register did (exact: <= 33 bits); their -1 and -2 keep pow. Exponent 1 is
    x and 0 is 1 (NaN too), as PyTorch's pow copies / fills there (a square's gradient is 2 * x ** 1)."""
    if isinstance(e, SymExpr) or e not in (0.5, -0.5, 2, 3, -1, -2, 1, 0):
        return None
    if e in (0, 1):
        return x if e == 1 else broadcast_view(ctx, const(1.0, x.dtype), x.shape)
    if e in (0.5, -0.5):
        return None if x.dtype is DType.FLOAT16 else elementwise(ctx, "sqrt" if e > 0 else "rsqrt", x)
    if e == 2:
        return elementwise(ctx, "mul", x, x)
    if e == 3:
        return elementwise(ctx, "mul", elementwise(ctx, "mul", x, x), x)
    if x.dtype not in (DType.FLOAT32, DType.FLOAT64):
        return None
    return elementwise(ctx, "div", const(1.0), x if e == -1 else elementwise(ctx, "mul", x, x))


def broadcast_view(ctx: ShapeContext, x: Node, shape: tuple) -> Node:
    return x if x.shape == shape else broadcast_to(ctx, x, shape)


# -- reductions ---------------------------------------------------------------------------------

def reduce(ctx: ShapeContext, name: str, x: Node, axis=None, keepdims: bool = False) -> Node:
    op = OP_TABLE[name]
    axes = normalize_axes(axis, x.ndim, name)
    kept = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
    if op.promo is Promo.LONG and x.dtype is DType.BOOL:
        raise DTypeError(f"{name}(): does not support bool input")
    if op.extra.get("nonempty"):
        for a in axes:
            ctx.require_nonzero(x.shape[a], f"{name}: cannot reduce over an empty axis {a} "
                                            f"of a tensor of shape {render(x.shape)}")
    if name == "mean":
        if not x.dtype.is_float:
            raise DTypeError("mean(): could not infer output dtype. Input dtype must be either a "
                             f"floating point or complex dtype. Got: {x.dtype.short}")
        wide = DType.FLOAT64 if x.dtype is DType.FLOAT64 else DType.FLOAT32
        total = reduce(ctx, "sum", cast(x, wide), axes, True)  # accumulate and divide in f32/f64
        count = const(prod(x.shape[a] for a in axes), wide)
        out = cast(elementwise(ctx, "div", total, count), x.dtype)
    else:
        if op.promo is Promo.SUM_LIKE and not x.dtype.is_float:
            src, result = cast(x, DType.INT64), DType.INT64
        elif x.dtype is DType.BOOL:
            src = cast(x, DType.INT64)
            result = DType.BOOL if op.promo is Promo.KEEP else DType.INT64
        else:
            src, result = x, (DType.INT64 if op.promo is Promo.LONG else x.dtype)
        if not axes:
            out = cast(src, result) if op.promo is not Promo.LONG else \
                broadcast_view(ctx, const(0, DType.INT64), x.shape)
        elif (short := _short_axis_sum(ctx, name, src, axes)) is not None:
            out = short
        else:
            out = Node.make(name, DType.INT64 if op.promo is Promo.LONG else src.dtype, kept,
                            (src,), axes=axes)
            out = cast(out, result)
    if keepdims:
        return out
    return reshape(ctx, out, tuple(d for i, d in enumerate(x.shape) if i not in axes))


SHORT_AXIS_MAX = 4   # a float sum over one inner axis at most this long is written as adds


def _short_axis_sum(ctx: ShapeContext, name: str, x: Node, axes: tuple) -> Node | None:
    """sum over one axis of static size 2..SHORT_AXIS_MAX that is not the last: the adds of its
    slices (elementwise over the trailing axes, where the reduction form gathers a strided tile),
    in the reduction tree's order (pairs i, i + n/2 of the zero-padded power-of-two width), then
    + 0 (the tree's zero start turns -0 into +0, as PyTorch's sum does): the same bits. f16 and
    bf16 add in f32 and round once at the end, as their reductions accumulate."""
    half = x.dtype in (DType.FLOAT16, DType.BFLOAT16)
    if name != "sum" or len(axes) != 1 or not (half or x.dtype in (DType.FLOAT32, DType.FLOAT64)):
        return None
    a = axes[0]
    n = x.shape[a]
    if a == x.ndim - 1 or not isinstance(n, int) or not 2 <= n <= SHORT_AXIS_MAX:
        return None
    acc = DType.FLOAT32 if half else x.dtype
    lanes = [cast(slice_view(ctx, x, a, i, 1), acc) for i in range(n)]
    width = 1 << (n - 1).bit_length()
    lanes += [None] * (width - n)
    while len(lanes) > 1:
        h = len(lanes) // 2
        lanes = [p if q is None else elementwise(ctx, "add", p, q) for p, q in zip(lanes[:h], lanes[h:])]
    return cast(elementwise(ctx, "add", lanes[0], const(0.0, acc)), x.dtype)


# -- views --------------------------------------------------------------------------------------

def reshape(ctx: ShapeContext, x: Node, shape: Sequence) -> Node:
    shape = tuple(shape)
    unknown = [i for i, d in enumerate(shape) if isinstance(d, int) and d == -1]
    if len(unknown) > 1:
        raise ShapeError(f"reshape: only one dimension can be -1, got {render(shape)}")
    numel = prod(x.shape)
    if unknown:
        rest = prod(d for i, d in enumerate(shape) if i != unknown[0])
        shape = shape[:unknown[0]] + (floordiv(numel, rest),) + shape[unknown[0] + 1:]
    for d in shape:
        if isinstance(d, int) and d < 0:
            raise ShapeError(f"reshape: invalid size {d} in {render(shape)}")
    ctx.require_eq(numel, prod(shape), f"reshape of {render(x.shape)} to {render(shape)} "
                                       "must keep the number of elements")
    return reshape_node(x, shape)


def reshape_node(x: Node, shape: tuple) -> Node:
    """The reshape view of x as `shape` (same number of elements), a reshape of a reshape
    collapsed."""
    if shape == x.shape:
        return x
    if x.op == "reshape":
        x = x.inputs[0]
        if shape == x.shape:
            return x
    return Node.make("reshape", x.dtype, shape, (x,))


def permute(ctx: ShapeContext, x: Node, dims: Sequence[int]) -> Node:
    dims = tuple(d % x.ndim if isinstance(d, int) and -x.ndim <= d < x.ndim else d for d in dims)
    if sorted(dims) != list(range(x.ndim)):
        raise ShapeError(f"permute: {tuple(dims)} is not a permutation of the {x.ndim} axes")
    if dims == tuple(range(x.ndim)):
        return x
    return Node.make("permute", x.dtype, tuple(x.shape[d] for d in dims), (x,), dims=dims)


def broadcast_to(ctx: ShapeContext, x: Node, shape: Sequence) -> Node:
    shape = tuple(shape)
    if len(shape) < x.ndim:
        raise ShapeError(f"broadcast_to: cannot broadcast {render(x.shape)} to fewer dims {render(shape)}")
    for src, dst in zip(x.shape, shape[len(shape) - x.ndim:]):
        if not is_one(src):
            ctx.require_eq(src, dst, f"broadcast_to: {render(x.shape)} to {render(shape)}")
    if shape == x.shape:
        return x
    return Node.make("broadcast_to", x.dtype, shape, (x,))


def concat(ctx: ShapeContext, pieces: Sequence[Node], axis: int) -> Node:
    """The pieces (one dtype and rank) joined along `axis`; every other size must be equal (a
    run-time check where that is not decided now). Not a view: each piece is stored into its
    slice of one buffer (concat_slices; fusion/partition)."""
    if not pieces:
        raise ShapeError("cat: no tensors to join")
    first = pieces[0]
    if first.ndim == 0:
        raise ShapeError("cat: a zero-dimensional value cannot be joined")
    if not isinstance(axis, int) or not -first.ndim <= axis < first.ndim:
        raise ShapeError(f"cat: axis {axis} invalid for rank {first.ndim}")
    axis %= first.ndim
    for p in pieces:
        if p.ndim != first.ndim or p.dtype != first.dtype:
            raise ShapeError(f"cat: a piece of rank {p.ndim} ({p.dtype.name.lower()}) beside one of rank "
                             f"{first.ndim} ({first.dtype.name.lower()})")
        for d in range(first.ndim):
            if d != axis:
                ctx.require_eq(p.shape[d], first.shape[d], f"cat: sizes {render(p.shape)} and "
                                                           f"{render(first.shape)} off axis {axis}")
    if len(pieces) == 1:
        return first
    shape = first.shape[:axis] + (sum(p.shape[axis] for p in pieces),) + first.shape[axis + 1:]
    return Node.make("concat", first.dtype, shape, tuple(pieces), axis=axis)


def concat_slices(node: Node) -> list[Node]:
    """Per piece of a concat node: the slice view of the node that the piece fills."""
    axis, start, out = node.attr("axis"), 0, []
    for p in node.inputs:
        shape = node.shape[:axis] + (p.shape[axis],) + node.shape[axis + 1:]
        out.append(Node.make("slice", node.dtype, shape, (node,), axis=axis, start=start, step=1, keep=True))
        start = start + p.shape[axis]
    return out


def _require_nonneg(ctx: ShapeContext, d: Dim, why: str) -> None:
    """Record `d >= 0` (as max(d, 0) == d when it is not decided now)."""
    lo, hi = bounds(d)
    if lo >= 0:
        return
    if hi < 0:
        raise ShapeError(why)
    ctx.require_eq(sym_max(d, 0), d, why)


def slice_view(ctx: ShapeContext, x: Node, axis: int, start: Dim, length: Dim, step: int = 1,
               keep: bool = True) -> Node:
    """Elements start, start + step, ... (`length` of them) along `axis`; keep=False takes one
    element (length 1) and drops the axis. Invariant: every index read lies in [0, size) —
    decided now or recorded as a run-time check (a negative step needs concrete sizes)."""
    if not -x.ndim <= axis < x.ndim or not isinstance(step, int) or step == 0:
        raise ShapeError(f"slice: axis {axis} / step {step} invalid for rank {x.ndim}")
    axis %= x.ndim
    size = x.shape[axis]
    if not keep:
        length, step = 1, 1
    last = start + (length - 1) * step
    what = f"slice of {render(x.shape)} at axis {axis} from {start}, {length} x step {step}"
    lowest, highest = (last, start) if step < 0 else (start, last)
    _require_nonneg(ctx, lowest, f"{what}: negative index")
    _require_nonneg(ctx, size - 1 - highest, f"{what}: index past the end")
    if keep and step == 1 and decide_eq(start, 0) is True and decide_eq(length, size) is True:
        return x
    shape = x.shape[:axis] + ((length,) if keep else ()) + x.shape[axis + 1:]
    return Node.make("slice", x.dtype, shape, (x,), axis=axis, start=start, step=step, keep=keep)
