"""DVM's decompositions of elementwise functions that are not ops of DVM's table into ops that are:
sinh, cosh, log10, hypot, nan_to_num, sgn (of real tensors). Each is computed in a wider type than
its result and rounded once: float64 for float32 inputs (the formulas' own rounding stays below
float32's), float32 for 16-bit ones (float64 for hypot's squares); a float64 input is computed in
float64 with formulas that keep its range (no overflow before the result would overflow).
Integer, bool and complex inputs keep PyTorch's kernel (NotImplemented)."""
from __future__ import annotations

import math

import torch

from .aten_decomp import cast_to

aten = torch.ops.aten
_WIDER = {torch.float16: torch.float32, torch.bfloat16: torch.float32, torch.float32: torch.float64,
          torch.float64: torch.float64}
# |x| from which exp(-|x|) is below float64's rounding of exp(|x|): sinh and cosh are e^|x| / 2
_HYPERBOLIC_LARGE = 20.0
_INV_LN10 = 1.0 / math.log(10.0)


def _wide(x):
    """x in its computing type, or None where the function keeps PyTorch's kernel"""
    wider = _WIDER.get(x.dtype)
    return None if wider is None else cast_to(x, wider)


def _half_exp(a):
    """exp(a) / 2 for a >= 0 without overflowing before the result does"""
    return aten.exp.default(aten.sub.Tensor(a, math.log(2.0)))


def sinh(x):
    w = _wide(x)
    if w is None:
        return NotImplemented
    a = aten.abs.default(w)
    small = aten.mul.Tensor(aten.sub.Tensor(aten.expm1.default(w), aten.expm1.default(aten.neg.default(w))), 0.5)
    large = _half_exp(a)
    large = torch.where(aten.lt.Scalar(w, 0), aten.neg.default(large), large)
    return cast_to(torch.where(aten.lt.Scalar(a, _HYPERBOLIC_LARGE), small, large), x.dtype)


def cosh(x):
    w = _wide(x)
    if w is None:
        return NotImplemented
    a = aten.abs.default(w)
    e = aten.exp.default(a)
    small = aten.mul.Tensor(aten.add.Tensor(e, aten.reciprocal.default(e)), 0.5)
    return cast_to(torch.where(aten.lt.Scalar(a, _HYPERBOLIC_LARGE), small, _half_exp(a)), x.dtype)


def log10(x):
    w = _wide(x)
    if w is None:
        return NotImplemented
    return cast_to(aten.mul.Tensor(aten.log.default(w), _INV_LN10), x.dtype)


def hypot(a, b):
    out = torch.result_type(a, b)
    if out not in _WIDER:
        return NotImplemented
    a, b = aten.abs.default(cast_to(a, torch.float64)), aten.abs.default(cast_to(b, torch.float64))
    if out != torch.float64:    # squares of float32 / 16-bit values neither overflow nor underflow in float64
        r = aten.sqrt.default(aten.add.Tensor(aten.mul.Tensor(a, a), aten.mul.Tensor(b, b)))
    else:
        big, small = aten.maximum.default(a, b), aten.minimum.default(a, b)
        ratio = torch.where(aten.eq.Scalar(big, 0), 0.0, aten.div.Tensor(small, big))
        r = aten.mul.Tensor(big, aten.sqrt.default(aten.add.Tensor(aten.mul.Tensor(ratio, ratio), 1.0)))
    either_inf = aten.logical_or.default(aten.isinf.default(a), aten.isinf.default(b))
    return cast_to(torch.where(either_inf, float("inf"), r), out)          # hypot(inf, nan) = inf


def nan_to_num(x, nan=None, posinf=None, neginf=None):
    if not x.is_floating_point():
        return NotImplemented
    info = torch.finfo(x.dtype)
    out = torch.where(aten.isnan.default(x), 0.0 if nan is None else nan, x)
    out = torch.where(aten.eq.Scalar(x, float("inf")), info.max if posinf is None else posinf, out)
    return torch.where(aten.eq.Scalar(x, float("-inf")), info.min if neginf is None else neginf, out)


def sgn(x):
    if x.is_complex() or x.dtype == torch.bool:
        return NotImplemented
    return aten.sign.default(x)


TABLE = {aten.sinh.default: sinh, aten.cosh.default: cosh, aten.log10.default: log10, aten.hypot.default: hypot,
         aten.nan_to_num.default: nan_to_num, aten.sgn.default: sgn}
