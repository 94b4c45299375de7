"""What lazy mode does with each ATen op, derived once per op from the one lowering table
(aten_table: LOWERINGS, VIEW_OPS, CUBE_OPS; aten_decomp.decompositions) and the op's schema. Nothing here lowers
an op: recording calls the table's handlers (lazy_trie).

Kinds: RECORD (a table op: appended to the pending graph), VIEW (a view: PyTorch takes it on the
placeholder, the table's handler gives its DVM node), INPLACE (`x.op_(...)`, `copy_`: recorded as
the functional op, its value written to x at the flush), CUBE (the matmul family: runs through
PyTorch), DECOMP (a composite the torch backend decomposes too: its decomposition is recorded),
OTHER (anything else: runs through PyTorch, after the pending values it reads are computed).

Arguments are encoded by their schema type: tensors, sizes (SymInt: a symbol per distinct
value, lazy_trie), scalars (Python numbers: an input of the graph where that gives the same
result as a constant, else part of the structure) and literals (part of the structure).
"""
from __future__ import annotations

import enum
import functools
from dataclasses import dataclass

import torch

from . import aten_decomp, aten_table as T

aten = torch.ops.aten


class Kind(enum.IntEnum):
    RECORD = 0
    VIEW = 1
    INPLACE = 2
    CUBE = 3
    DECOMP = 4
    OTHER = 5


class Arg(enum.IntEnum):
    TENSOR = 0     # Tensor / Tensor? (a Python number here is a wrapped scalar)
    TENSORS = 1    # Tensor[] / Tensor?[]
    SIZE = 2       # SymInt, SymInt?, SymInt[]
    SCALAR = 3     # Scalar (number)
    LITERAL = 4    # int, int[], bool, float, str, dtype, ...


# Python float scalars that may be graph inputs (their value is not structure): the argument,
# the tensor argument whose dtype they meet, whether a half-precision partner reads them at f32
# ("opmath", build.elementwise's CPU-scalar rule for the second operand of mul / div), and the
# tensor arguments that must have the partner's dtype (the op computes in their common dtype).
# Only where a float scalar meets a dimensioned float tensor: then a 0-d input of the dtype the
# constant would be cast to computes exactly what the constant computes (decided in lazy_record).
RUNTIME_SCALARS: dict = {
    "add": {"other": ("self", False), "alpha": ("other", True)},
    "sub": {"other": ("self", False), "alpha": ("other", True)},
    "rsub": {"other": ("self", False)},
    "mul": {"other": ("self", True)},
    "div": {"other": ("self", True)},
    "where": {"self": ("other", False), "other": ("self", False)},
    "masked_fill": {"value": ("self", False)},
    "clamp": {"min": ("self", False), "max": ("self", False)},
    "clamp_min": {"min": ("self", False)},
    "clamp_max": {"max": ("self", False)},
    "addcmul": {"value": ("tensor1", True, ("self", "tensor2"))},
    "addcdiv": {"value": ("tensor1", True, ("self", "tensor2"))},
}

# the matmul family beyond aten_table.CUBE_OPS (all run through PyTorch: cube kernels)
_CUBE_NAMES = frozenset({"mm", "bmm", "addmm", "baddbmm", "addbmm", "matmul", "mv", "addmv", "dot", "vdot",
                         "linear", "_grouped_mm", "addr", "outer", "_scaled_mm"})
# ops that hand a value to Python: the flush reason they count under
VALUE_READS = {aten._local_scalar_dense.default: "item", aten.is_nonzero.default: "bool",
               aten.equal.default: "item"}
# handlers of the table that take their result shape from PyTorch's (lw.out_shape); lazy mode
# derives it symbolically (lazy_lower) for these only
NEEDS_OUT_SHAPE = frozenset({aten.view.default, aten._unsafe_view.default, aten.reshape.default,
                             aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default,
                             aten.expand.default, aten.full_like.default, aten.zeros_like.default,
                             aten.ones_like.default, aten.new_ones.default, aten.new_zeros.default,
                             aten.slice.Tensor, aten.cat.default})
# table ops lazy mode does not record: factories (no tensor argument to fuse with: they run),
# arange-indexing (its result shape needs the index tensors' values)
_NOT_RECORDED = frozenset({aten.index.Tensor, aten.full.default, aten.arange.default, aten.scalar_tensor.default,
                           aten.slice_backward.default})


@dataclass(frozen=True)
class OpInfo:
    func: object
    kind: Kind
    name: str                      # short name (explain)
    args: tuple                    # ((name, Arg, kwarg_only), ...) in schema order
    handler: object = None         # the table's lowering (RECORD, VIEW, INPLACE)
    functional: object = None      # INPLACE: the out-of-place op recorded for it
    writes: tuple = ()             # names of arguments the op writes (mutable schemas)
    returns_alias: bool = False    # a view-like result (aliases an argument)
    scalars: dict | None = None    # RUNTIME_SCALARS entry of the op's packet
    single: bool = True            # one tensor result (else a tuple of them)
    kinds: dict | None = None      # argument name -> Arg
    pos: dict | None = None        # argument name -> position


def _arg_kind(t) -> Arg:
    while isinstance(t, torch.OptionalType):
        t = t.getElementType()
    if isinstance(t, torch.TensorType):
        return Arg.TENSOR
    if isinstance(t, torch.ListType):
        e = t.getElementType()
        while isinstance(e, torch.OptionalType):
            e = e.getElementType()
        if isinstance(e, torch.TensorType):
            return Arg.TENSORS
        return Arg.SIZE if isinstance(e, torch.SymIntType) else Arg.LITERAL
    if isinstance(t, torch.SymIntType):
        return Arg.SIZE
    if isinstance(t, torch.NumberType):
        return Arg.SCALAR
    return Arg.LITERAL


def short_name(func) -> str:
    return str(func).replace("aten.", "").replace(".default", "")


def _schema_args(func) -> tuple:
    args = []
    for a in func._schema.arguments:
        kind = _arg_kind(a.real_type)
        if func is aten.slice.Tensor and a.name == "step":
            kind = Arg.LITERAL   # the table's slice needs a concrete step
        args.append((a.name, kind, a.kwarg_only))
    return tuple(args)


def _functional(func):
    """The out-of-place overload of an in-place op (`add_.Tensor` -> `add.Tensor`), or None."""
    packet = func.overloadpacket.__name__
    if not packet.endswith("_") or packet.startswith("_"):
        return None
    base = getattr(aten, packet[:-1], None)
    return getattr(base, func._overloadname, None) if base is not None else None


@functools.lru_cache(maxsize=1)
def _decompositions() -> dict:
    return aten_decomp.decompositions()


def _cube(func) -> bool:
    return func in T.CUBE_OPS or func.overloadpacket.__name__ in _CUBE_NAMES


def _base_kind(func) -> Kind:
    """RECORD, DECOMP or OTHER for an out-of-place op."""
    if func in T.LOWERINGS and func not in _NOT_RECORDED and func not in T.VIEW_OPS and func not in T.FOREACH_OPS:
        return Kind.RECORD
    if func in _decompositions() or _implicit(func):
        return Kind.DECOMP
    return Kind.OTHER


def _implicit(func) -> bool:
    """A CompositeImplicitAutograd op reaching the mode (called from a decomposition): its
    composite runs under the mode, so its parts are recorded."""
    try:
        return func.has_kernel_for_dispatch_key(torch._C.DispatchKey.CompositeImplicitAutograd)
    except (AttributeError, RuntimeError):  # pragma: no cover - an op without the query
        return False


# id(OpOverload) -> OpInfo: OpOverload's __hash__ is Python code (~0.3 us a lookup); the op
# objects live as long as the process, and each OpInfo keeps its op (so no id is reused)
_INFO: dict = {}


def info(func) -> OpInfo:
    """The OpInfo of an ATen OpOverload (computed once per op)."""
    got = _INFO.get(id(func))
    if got is None:
        got = _INFO[id(func)] = _make_info(func)
    return got


def _make_info(func) -> OpInfo:
    schema = func._schema
    name = short_name(func)
    args = _schema_args(func)
    writes = tuple(a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write)
    alias = any(r.alias_info is not None for r in schema.returns) and not writes
    scalars = RUNTIME_SCALARS.get(func.overloadpacket.__name__.rstrip("_"))
    common = dict(func=func, name=name, args=args, writes=writes, returns_alias=alias, scalars=scalars,
                  single=len(schema.returns) == 1 and str(schema.returns[0].type) == "Tensor",
                  kinds={n: k for n, k, _ in args}, pos={n: i for i, (n, _, _) in enumerate(args)})
    if _cube(func):
        return OpInfo(kind=Kind.CUBE, **common)
    if _implicit(func) and not schema.is_mutable:
        # a composite reaching the mode (to, reshape, contiguous, narrow: a view or a copy
        # depending on the layout): its parts are recorded, never the composite run whole
        return OpInfo(kind=Kind.DECOMP, **common)
    if func in T.VIEW_OPS or (alias and func not in T.LOWERINGS):
        return OpInfo(kind=Kind.VIEW, handler=T.LOWERINGS.get(func), **common)
    if func is aten.copy_.default:
        return OpInfo(kind=Kind.INPLACE, **common)
    if schema.is_mutable:
        fn = _functional(func)
        if fn is not None and writes == ("self",) and not any(a.is_out for a in schema.arguments) \
                and _base_kind(fn) in (Kind.RECORD, Kind.DECOMP):
            return OpInfo(kind=Kind.INPLACE, handler=T.LOWERINGS.get(fn), functional=fn, **common)
        return OpInfo(kind=Kind.OTHER, **common)
    kind = _base_kind(func)
    return OpInfo(kind=kind, handler=T.LOWERINGS.get(func) if kind is Kind.RECORD else None, **common)


def decomposition(func):
    """The function computing func from recordable ops (aten_decomp's table, or its composite)."""
    return _decompositions().get(func) or func.decompose


@functools.lru_cache(maxsize=None)
def out_variant(func):
    """(the `.out` overload computing func's results into given tensors, its out-argument names)
    or None: the eager replay writes a live placeholder with it instead of copying a result."""
    names = [a.name for a in func._schema.arguments]
    n_out = len(func._schema.returns)
    for ov in func.overloadpacket.overloads():
        cand = getattr(func.overloadpacket, ov)
        sch = cand._schema
        outs = [a.name for a in sch.arguments if a.is_out]
        if len(outs) != n_out or not outs:
            continue
        if [a.name for a in sch.arguments if not a.is_out] == names and \
                all(str(a.type) == str(b.type) for a, b in zip([x for x in sch.arguments if not x.is_out],
                                                               func._schema.arguments)):
            return cand, tuple(outs)
    return None
