"""The op table: the single source of truth for every DVM graph op.

Each OpDef states the op's kind, arity, type-promotion rule, the dtype categories it accepts,
the register banks that implement it natively and its NumPy reference semantics (on float64
for the float banks, int64 for the integer bank, bool for the bool bank). The ISA table, the
reference VM, the builder API and the generated tests all derive from OP_TABLE.
"""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np

from .dtypes import Bank, Category

F, D, I, B = Bank.F32, Bank.F64, Bank.I64, Bank.B8
FLOAT_BANKS = (F, D)
NUM_BANKS = (F, D, I)
ALL_CATS = frozenset(Category)
NUMERIC = frozenset({Category.INT, Category.FLOAT})
INTLIKE = frozenset({Category.BOOL, Category.INT})
FLOAT_ONLY = frozenset({Category.FLOAT})


class Kind(enum.Enum):
    ELEMENTWISE = "elementwise"
    REDUCE = "reduce"
    MOVEMENT = "movement"
    MEMORY = "memory"
    INDEX = "index"
    CONST = "const"
    CAST = "cast"
    CONCAT = "concat"


class Promo(enum.Enum):
    DEFAULT = "default"            # result = promoted inputs
    INT_TO_FLOAT = "int_to_float"  # promoted, ints and bools become the default float
    ALWAYS_BOOL = "always_bool"    # compute in the promoted dtype, result bool
    LOGICAL = "logical"            # inputs become bool, result bool
    SUM_LIKE = "sum_like"          # bool/int results become int64 (sum, prod)
    KEEP = "keep"                  # result dtype = input dtype (max, min)
    LONG = "long"                  # result int64 (argmax, argmin)
    FLOAT_ONLY = "float_only"      # float inputs only, result = input (mean)
    NONE = "none"                  # not a computing op


@dataclass(frozen=True)
class OpDef:
    name: str
    kind: Kind
    arity: int
    promo: Promo = Promo.NONE
    accepts: frozenset = ALL_CATS
    banks: tuple = ()
    ref: Optional[Callable] = None
    int32_overflows: bool = False   # int32 results must be wrapped back to 32 bits
    identity_for_int: bool = False  # op is the identity on int/bool inputs (floor, round, ...)
    bool_via_int: bool = False      # bool inputs computed in the int bank, result cast back
    reject_bool: str = ""           # PyTorch's error text for bool inputs, if it rejects them
    doc: str = ""
    extra: dict = field(default_factory=dict, hash=False, compare=False)


# ---------------------------------------------------------------------------------------------
# NumPy reference semantics (PyTorch's), on float64 / int64 / bool arrays.

_erf = np.vectorize(math.erf, otypes=[np.float64])
_erfc = np.vectorize(math.erfc, otypes=[np.float64])
_SQRT1_2 = 1.0 / math.sqrt(2.0)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _sigmoid(x):
    with np.errstate(over="ignore"):
        return np.where(x >= 0, 1.0 / (1.0 + np.exp(-np.abs(x))), np.exp(-np.abs(x)) / (1.0 + np.exp(-np.abs(x))))


def _sign(x):
    if x.dtype.kind == "f":
        return np.where(np.isnan(x), 0.0, np.sign(x)) + 0.0
    return np.sign(x)


def _relu(x):
    return np.where(x < 0, np.zeros_like(x), x)


def _int_floor_divide(a, b):
    if np.any(b == 0):
        raise ZeroDivisionError("integer division by zero")
    with np.errstate(over="ignore"):
        return np.floor_divide(a, b)


def _float_floor_divide(a, b):
    with np.errstate(all="ignore"):
        mod = np.fmod(a, b)
        div = (a - mod) / b
        div = np.where((mod != 0) & ((b < 0) != (mod < 0)), div - 1.0, div)
        fl = np.floor(div)
        fl = np.where(div - fl > 0.5, fl + 1.0, fl)
        out = np.where(div != 0, fl, np.copysign(0.0, a / b))
        return np.where(b == 0, a / b, out)


def _floor_divide(a, b):
    return _int_floor_divide(a, b) if a.dtype.kind in "iu" else _float_floor_divide(a, b)


def _remainder(a, b):
    if a.dtype.kind in "iu":
        if np.any(b == 0):
            raise ZeroDivisionError("integer remainder by zero")
        return np.remainder(a, b)
    with np.errstate(all="ignore"):
        mod = np.fmod(a, b)
        return np.where((mod != 0) & ((b < 0) != (mod < 0)), mod + b, mod)


def _pow(a, b):
    if a.dtype.kind in "iu":
        neg = b < 0
        with np.errstate(over="ignore"):
            pos = np.power(a, np.where(neg, 0, b))
        negval = np.where(a == 1, 1, np.where(a == -1, np.where(b % 2 == 0, 1, -1), 0))
        return np.where(neg, negval, pos)
    with np.errstate(all="ignore"):
        return np.power(a, b)


def _rsqrt(x):
    with np.errstate(all="ignore"):
        return 1.0 / np.sqrt(x)


def _reciprocal(x):
    with np.errstate(all="ignore"):
        return 1.0 / x


def _gelu(x):
    # 0.5*x*(1+erf(x/sqrt2)) without the cancellation of 1+erf for x << 0: 0.5*x*erfc(-x/sqrt2)
    return 0.5 * x * _erfc(-x * _SQRT1_2)


def _gelu_tanh(x):
    # 0.5*x*(1+tanh(u)) == x*sigmoid(2u): the same function, without the cancellation for x << 0
    with np.errstate(all="ignore"):
        u = _SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)
        return x * _sigmoid(2.0 * u)


def _silu(x):
    return x * _sigmoid(x)


def _errstate(fn):
    def wrapped(*a):
        with np.errstate(all="ignore"):
            return fn(*a)
    wrapped.__name__ = getattr(fn, "__name__", "ref")
    return wrapped


def _unary(name, promo, ref, accepts=ALL_CATS, banks=FLOAT_BANKS, **kw) -> OpDef:
    return OpDef(name, Kind.ELEMENTWISE, 1, promo, accepts, banks, _errstate(ref), **kw)


def _binary(name, promo, ref, accepts=ALL_CATS, banks=NUM_BANKS, **kw) -> OpDef:
    return OpDef(name, Kind.ELEMENTWISE, 2, promo, accepts, banks, _errstate(ref), **kw)


_NEG_BOOL = ("Negation, the `-` operator, on a bool tensor is not supported. If you are trying "
             "to invert a mask, use the `~` or `logical_not()` operator instead.")
_SUB_BOOL = ("Subtraction, the `-` operator, with a bool tensor is not supported. "
             "Use the `^` or `logical_xor()` operator instead.")

_OPS: list[OpDef] = [
    # unary ---------------------------------------------------------------------------------
    _unary("neg", Promo.DEFAULT, np.negative, NUMERIC, NUM_BANKS, int32_overflows=True, reject_bool=_NEG_BOOL),
    _unary("abs", Promo.DEFAULT, np.abs, NUMERIC, NUM_BANKS, int32_overflows=True),
    _unary("exp", Promo.INT_TO_FLOAT, np.exp),
    _unary("exp2", Promo.INT_TO_FLOAT, np.exp2),
    _unary("expm1", Promo.INT_TO_FLOAT, np.expm1),
    _unary("log", Promo.INT_TO_FLOAT, np.log),
    _unary("log2", Promo.INT_TO_FLOAT, np.log2),
    _unary("log1p", Promo.INT_TO_FLOAT, np.log1p),
    _unary("sqrt", Promo.INT_TO_FLOAT, np.sqrt),
    _unary("rsqrt", Promo.INT_TO_FLOAT, _rsqrt),
    _unary("reciprocal", Promo.INT_TO_FLOAT, _reciprocal),
    _unary("sin", Promo.INT_TO_FLOAT, np.sin),
    _unary("cos", Promo.INT_TO_FLOAT, np.cos),
    _unary("tanh", Promo.INT_TO_FLOAT, np.tanh),
    _unary("sigmoid", Promo.INT_TO_FLOAT, _sigmoid),
    _unary("erf", Promo.INT_TO_FLOAT, _erf),
    _unary("gelu", Promo.DEFAULT, _gelu, FLOAT_ONLY, doc="0.5*x*(1+erf(x/sqrt(2)))"),
    _unary("gelu_tanh", Promo.DEFAULT, _gelu_tanh, FLOAT_ONLY, doc="GELU, tanh approximation"),
    _unary("silu", Promo.DEFAULT, _silu, FLOAT_ONLY, doc="x*sigmoid(x)"),
    _unary("relu", Promo.DEFAULT, _relu, NUMERIC, NUM_BANKS),
    _unary("floor", Promo.DEFAULT, np.floor, NUMERIC, identity_for_int=True),
    _unary("ceil", Promo.DEFAULT, np.ceil, NUMERIC, identity_for_int=True),
    _unary("round", Promo.DEFAULT, np.round, NUMERIC, identity_for_int=True, doc="half to even"),
    _unary("trunc", Promo.DEFAULT, np.trunc, NUMERIC, identity_for_int=True),
    _unary("sign", Promo.DEFAULT, _sign, ALL_CATS, NUM_BANKS, doc="sign(NaN) = 0 as in PyTorch"),
    _unary("logical_not", Promo.LOGICAL, np.logical_not, ALL_CATS, (B,)),
    _unary("isnan", Promo.ALWAYS_BOOL, np.isnan),
    _unary("isinf", Promo.ALWAYS_BOOL, np.isinf),
    _unary("isfinite", Promo.ALWAYS_BOOL, np.isfinite),
    # binary --------------------------------------------------------------------------------
    _binary("add", Promo.DEFAULT, np.add, int32_overflows=True, bool_via_int=True),
    _binary("sub", Promo.DEFAULT, np.subtract, int32_overflows=True, reject_bool=_SUB_BOOL),
    _binary("mul", Promo.DEFAULT, np.multiply, int32_overflows=True, bool_via_int=True),
    _binary("div", Promo.INT_TO_FLOAT, np.true_divide, banks=FLOAT_BANKS, doc="true division"),
    _binary("floor_divide", Promo.DEFAULT, _floor_divide, NUMERIC, int32_overflows=True),
    _binary("remainder", Promo.DEFAULT, _remainder, NUMERIC, doc="sign of the divisor (Python's %)"),
    _binary("pow", Promo.DEFAULT, _pow, NUMERIC, int32_overflows=True),
    _binary("maximum", Promo.DEFAULT, np.maximum, bool_via_int=True, doc="propagates NaN"),
    _binary("minimum", Promo.DEFAULT, np.minimum, bool_via_int=True, doc="propagates NaN"),
    _binary("eq", Promo.ALWAYS_BOOL, np.equal, bool_via_int=True),
    _binary("ne", Promo.ALWAYS_BOOL, np.not_equal, bool_via_int=True),
    _binary("lt", Promo.ALWAYS_BOOL, np.less, bool_via_int=True),
    _binary("le", Promo.ALWAYS_BOOL, np.less_equal, bool_via_int=True),
    _binary("gt", Promo.ALWAYS_BOOL, np.greater, bool_via_int=True),
    _binary("ge", Promo.ALWAYS_BOOL, np.greater_equal, bool_via_int=True),
    _binary("logical_and", Promo.LOGICAL, np.logical_and, banks=(B,)),
    _binary("logical_or", Promo.LOGICAL, np.logical_or, banks=(B,)),
    _binary("logical_xor", Promo.LOGICAL, np.logical_xor, banks=(B,)),
    _binary("bitwise_and", Promo.DEFAULT, np.bitwise_and, INTLIKE, (I, B)),
    _binary("bitwise_or", Promo.DEFAULT, np.bitwise_or, INTLIKE, (I, B)),
    _binary("bitwise_xor", Promo.DEFAULT, np.bitwise_xor, INTLIKE, (I, B)),
    # ternary -------------------------------------------------------------------------------
    OpDef("where", Kind.ELEMENTWISE, 3, Promo.DEFAULT, ALL_CATS, (F, D, I, B),
          lambda c, a, b: np.where(c, a, b), doc="where(cond, a, b); cond is cast to bool"),
    OpDef("clamp", Kind.ELEMENTWISE, 3, Promo.DEFAULT, NUMERIC, NUM_BANKS,
          lambda x, lo, hi: np.minimum(np.maximum(x, lo), hi), doc="minimum(maximum(x, lo), hi)"),
    # reductions (graph nodes keep reduced dims; keepdims=False is a reshape after) ---------
    OpDef("sum", Kind.REDUCE, 1, Promo.SUM_LIKE, ALL_CATS, NUM_BANKS, extra={"identity": 0}),
    OpDef("prod", Kind.REDUCE, 1, Promo.SUM_LIKE, ALL_CATS, NUM_BANKS, extra={"identity": 1}),
    OpDef("max", Kind.REDUCE, 1, Promo.KEEP, ALL_CATS, NUM_BANKS, bool_via_int=True,
          extra={"identity": "lowest", "nonempty": True}),
    OpDef("min", Kind.REDUCE, 1, Promo.KEEP, ALL_CATS, NUM_BANKS, bool_via_int=True,
          extra={"identity": "highest", "nonempty": True}),
    OpDef("argmax", Kind.REDUCE, 1, Promo.LONG, ALL_CATS, NUM_BANKS, bool_via_int=True,
          extra={"identity": "lowest", "nonempty": True}),
    OpDef("argmin", Kind.REDUCE, 1, Promo.LONG, ALL_CATS, NUM_BANKS, bool_via_int=True,
          extra={"identity": "highest", "nonempty": True}),
    OpDef("mean", Kind.REDUCE, 1, Promo.FLOAT_ONLY, FLOAT_ONLY, FLOAT_BANKS, doc="sum / count"),
    # everything else ------------------------------------------------------------------------
    OpDef("cast", Kind.CAST, 1, doc="convert to attrs['dtype'] (RNE for floats, wrap for ints)"),
    OpDef("input", Kind.MEMORY, 0, doc="a kernel argument"),
    OpDef("const", Kind.CONST, 0, doc="a scalar constant (attrs['value'], may be symbolic)"),
    OpDef("iota", Kind.INDEX, 0, doc="index along attrs['axis'] of attrs['shape'], int64"),
    OpDef("reshape", Kind.MOVEMENT, 1, doc="view with a new shape"),
    OpDef("permute", Kind.MOVEMENT, 1, doc="view with permuted axes"),
    OpDef("broadcast_to", Kind.MOVEMENT, 1, doc="view broadcast to a shape"),
    OpDef("concat", Kind.CONCAT, -1, doc="the inputs joined along attrs['axis'] (any number; equal sizes on "
          "every other axis): each input is stored into its slice of one buffer"),
    OpDef("slice", Kind.MOVEMENT, 1, doc="view of every attrs['step']-th element along attrs['axis'] "
          "from attrs['start'] (step < 0: reversed); attrs['keep'] False drops the axis (select)"),
]

OP_TABLE: dict[str, OpDef] = {op.name: op for op in _OPS}
assert len(OP_TABLE) == len(_OPS), "duplicate op name"

UNARY = tuple(o.name for o in _OPS if o.kind is Kind.ELEMENTWISE and o.arity == 1)
BINARY = tuple(o.name for o in _OPS if o.kind is Kind.ELEMENTWISE and o.arity == 2)
TERNARY = tuple(o.name for o in _OPS if o.kind is Kind.ELEMENTWISE and o.arity == 3)
REDUCTIONS = tuple(o.name for o in _OPS if o.kind is Kind.REDUCE)
MOVEMENTS = tuple(o.name for o in _OPS if o.kind is Kind.MOVEMENT)  # views: no instruction of their own
# reductions the VMs implement (mean lowers to sum / count)
VM_REDUCTIONS = ("sum", "prod", "max", "min", "argmax", "argmin")


def reduce_identity(op: str, bank: Bank):
    """The accumulator start value of reduction `op` in `bank`."""
    ident = OP_TABLE[op].extra["identity"]
    if ident == "lowest":
        return -np.inf if bank in FLOAT_BANKS else np.iinfo(np.int64).min
    if ident == "highest":
        return np.inf if bank in FLOAT_BANKS else np.iinfo(np.int64).max
    return ident
