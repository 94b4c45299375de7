"""DVM dtypes, register banks and PyTorch type promotion.

Invariant: every logical dtype lives in exactly one register bank; f16/bf16 compute in the
f32 bank, int32 in the i64 bank (wrapped back to 32 bits where an op can overflow).
"""
from __future__ import annotations

import enum
from typing import Iterable

import ml_dtypes
import numpy as np


class Category(enum.IntEnum):
    BOOL = 0
    INT = 1
    FLOAT = 2


class Bank(enum.IntEnum):
    """Typed register banks of the VMs (the index is the bank code in Programs)."""
    F32 = 0
    F64 = 1
    I64 = 2
    B8 = 3

    @property
    def short(self) -> str:
        return _BANK_SHORT[self]

    @property
    def np_dtype(self) -> np.dtype:
        return _BANK_NP[self]


_BANK_SHORT = {Bank.F32: "f32", Bank.F64: "f64", Bank.I64: "i64", Bank.B8: "b8"}
_BANK_NP = {Bank.F32: np.dtype(np.float32), Bank.F64: np.dtype(np.float64),
            Bank.I64: np.dtype(np.int64), Bank.B8: np.dtype(np.bool_)}


class DType(enum.IntEnum):
    """Logical dtypes. The integer value is the dtype code stored in Programs."""
    BOOL = 0
    INT32 = 1
    INT64 = 2
    FLOAT16 = 3
    BFLOAT16 = 4
    FLOAT32 = 5
    FLOAT64 = 6

    @property
    def short(self) -> str:
        return _SHORT[self]

    @property
    def category(self) -> Category:
        return _CATEGORY[self]

    @property
    def bank(self) -> Bank:
        return _BANK[self]

    @property
    def np_dtype(self) -> np.dtype:
        return _NP[self]

    @property
    def itemsize(self) -> int:
        return _NP[self].itemsize

    @property
    def is_float(self) -> bool:
        return self.category is Category.FLOAT

    def __repr__(self) -> str:
        return self.short


_SHORT = {DType.BOOL: "bool", DType.INT32: "int32", DType.INT64: "int64", DType.FLOAT16: "float16",
          DType.BFLOAT16: "bfloat16", DType.FLOAT32: "float32", DType.FLOAT64: "float64"}
_CATEGORY = {DType.BOOL: Category.BOOL, DType.INT32: Category.INT, DType.INT64: Category.INT,
             DType.FLOAT16: Category.FLOAT, DType.BFLOAT16: Category.FLOAT,
             DType.FLOAT32: Category.FLOAT, DType.FLOAT64: Category.FLOAT}
_BANK = {DType.BOOL: Bank.B8, DType.INT32: Bank.I64, DType.INT64: Bank.I64, DType.FLOAT16: Bank.F32,
         DType.BFLOAT16: Bank.F32, DType.FLOAT32: Bank.F32, DType.FLOAT64: Bank.F64}
_NP = {DType.BOOL: np.dtype(np.bool_), DType.INT32: np.dtype(np.int32), DType.INT64: np.dtype(np.int64),
       DType.FLOAT16: np.dtype(np.float16), DType.BFLOAT16: np.dtype(ml_dtypes.bfloat16),
       DType.FLOAT32: np.dtype(np.float32), DType.FLOAT64: np.dtype(np.float64)}
_BY_NAME = {v: k for k, v in _SHORT.items()} | {"half": DType.FLOAT16, "float": DType.FLOAT32,
                                                 "double": DType.FLOAT64, "long": DType.INT64,
                                                 "int": DType.INT32, "bf16": DType.BFLOAT16,
                                                 "f16": DType.FLOAT16, "f32": DType.FLOAT32,
                                                 "f64": DType.FLOAT64}
_BY_NP = {v: k for k, v in _NP.items()}

DEFAULT_FLOAT = DType.FLOAT32
DEFAULT_INT = DType.INT64


def dtype_of(x: object) -> DType:
    """Resolve a DType, its name, a NumPy dtype or an array to a DType (TypeError otherwise)."""
    hit = _BY_NP.get(x) if isinstance(x, np.dtype) else None
    if hit is not None:
        return hit
    if isinstance(x, DType):
        return x
    if isinstance(x, str):
        if x in _BY_NAME:
            return _BY_NAME[x]
        raise TypeError(f"unknown dtype name {x!r}; supported: {', '.join(_SHORT.values())}")
    try:
        npd = np.dtype(getattr(x, "dtype", x))
    except TypeError:
        raise TypeError(f"cannot interpret {x!r} as a dtype") from None
    if npd in _BY_NP:
        return _BY_NP[npd]
    raise TypeError(f"unsupported dtype {npd}; supported: {', '.join(_SHORT.values())}")


def promote_pair(a: DType, b: DType) -> DType:
    """torch.promote_types for the supported dtypes."""
    if a == b:
        return a
    if a.category != b.category:
        return a if a.category > b.category else b
    if {a, b} == {DType.FLOAT16, DType.BFLOAT16}:
        return DType.FLOAT32
    return max(a, b)  # enum order is promotion order within a category


def default_for(category: Category) -> DType:
    return {Category.BOOL: DType.BOOL, Category.INT: DEFAULT_INT, Category.FLOAT: DEFAULT_FLOAT}[category]


def result_type(dims: Iterable[DType], zero_dims: Iterable[DType], scalars: Iterable[Category]) -> DType:
    """PyTorch's result_type over three priority tiers: dimensioned tensors, 0-d tensors, Python scalars.

    The highest category wins; within it the highest tier that has that category decides the dtype,
    and a category present only among Python scalars gives the default dtype of that category.
    """
    dims, zero_dims, scalars = list(dims), list(zero_dims), list(scalars)
    cats = [d.category for d in dims + zero_dims] + scalars
    if not cats:
        raise ValueError("result_type of nothing")
    top = max(cats)
    for tier in (dims, zero_dims):
        in_top = [d for d in tier if d.category == top]
        if in_top:
            out = in_top[0]
            for d in in_top[1:]:
                out = promote_pair(out, d)
            return out
    return default_for(top)


def round_to_dtype(value: float | int | bool, dtype: DType) -> float | int | bool:
    """Round a Python scalar to what `dtype` can hold (RNE for floats, wrap for ints)."""
    if dtype is DType.BOOL:
        return bool(value)
    if dtype.category is Category.INT:
        v = int(value)
        bits = 8 * dtype.itemsize
        v &= (1 << bits) - 1
        return v - (1 << bits) if v >= 1 << (bits - 1) else v
    return float(np.array(value, dtype=np.float64).astype(dtype.np_dtype).astype(np.float64))
