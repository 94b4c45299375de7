"""ATen lowerings of update arithmetic (optimizer steps): functional `copy`, `lerp`, Dynamo's
`prims.fma` (its form of addcmul_ / addcdiv_), and every `_foreach_<op>` whose `<op>` the table
lowers. Part of the one table in aten_table (LOWERINGS); the same handler conventions apply."""
from __future__ import annotations

import torch

from ..graph import build
from .aten_common import Unsupported, dvm_dtype, scalar

aten = torch.ops.aten
prims = torch.ops.prims


def _copy(lw, dst, src, non_blocking=False):
    """aten.copy (copy_ made functional): src broadcast to dst's shape, in dst's dtype."""
    return build.broadcast_view(lw.ctx, build.cast(scalar(src), dvm_dtype(lw.out.dtype)), lw.out_shape)


def _fma(lw, a, b, c):
    """prims.fma (Dynamo's addcmul_ / addcdiv_ / add_ with a tensor alpha): a * b + c, rounded
    twice (DVM has no fused multiply-add): within one rounding of the fused result."""
    dt = dvm_dtype(lw.out.dtype)
    prod = build.elementwise(lw.ctx, "mul", build.cast(scalar(a), dt), scalar(b))
    return build.cast(build.elementwise(lw.ctx, "add", prod, build.cast(scalar(c), dt)), dt)


def _lerp(lw, start, end, weight):
    """start + weight * (end - start), as PyTorch's CPU kernel and reference: from end when
    |weight| >= 0.5 (end - (end - start) * (1 - weight)), which is exact at weight 1."""
    dt = dvm_dtype(lw.out.dtype)
    start, end = build.cast(scalar(start), dt), build.cast(scalar(end), dt)
    diff = build.elementwise(lw.ctx, "sub", end, start)
    if isinstance(weight, (int, float)) and not isinstance(weight, bool):
        far = abs(weight) >= 0.5
        coeff = build.const(weight - 1 if far else weight)
        return build.cast(build.elementwise(lw.ctx, "add", build.elementwise(lw.ctx, "mul", coeff, diff),
                                            end if far else start), dt)
    w = build.cast(scalar(weight), dt)
    far = build.elementwise(lw.ctx, "ge", build.elementwise(lw.ctx, "abs", w), build.const(0.5))
    coeff = build.elementwise(lw.ctx, "where", far, build.elementwise(lw.ctx, "sub", w, build.const(1)), w)
    base = build.elementwise(lw.ctx, "where", far, end, start)
    return build.cast(build.elementwise(lw.ctx, "add", build.elementwise(lw.ctx, "mul", coeff, diff), base), dt)


UPDATE_LOWERINGS = {aten.copy.default: _copy, aten.lerp.Scalar: _lerp, aten.lerp.Tensor: _lerp}


def _foreach(single):
    """_foreach_<op>: the op on each element of the list operands (lists pair by index; a
    scalar or a 0-d tensor is shared), one result each."""
    def fn(lw, *args, **kwargs):
        n = len(lw.out)
        if any(isinstance(a, (list, tuple)) and len(a) != n for a in (*args, *kwargs.values())):
            raise Unsupported("foreach lists of different lengths")

        def pick(a, i):
            return a[i] if isinstance(a, (list, tuple)) else a
        return tuple(single(lw.element(i), *[pick(a, i) for a in args], **{k: pick(v, i) for k, v in kwargs.items()})
                     for i in range(n))
    return fn


# a _foreach_ overload -> the overloads of its single op that take the same operands
_FOREACH_SINGLE = {"Scalar": ("Tensor", "Scalar", "default"), "List": ("Tensor", "default"),
                   "ScalarList": ("Tensor", "Scalar", "default"), "Tensor": ("Tensor", "default"),
                   "ScalarAndTensor": ("Scalar",), "default": ("default", "Tensor")}


def add_foreach(table: dict) -> frozenset:
    """Add to `table` every functional `_foreach_<op>` overload whose `<op>` it lowers; returns
    them. (`_foreach_addcmul` / `_addcdiv.Tensor` take a 1-D tensor of one value per element,
    not a shared operand: left out.)"""
    added = []
    names = {n.split("::")[1].split(".")[0] for n in torch._C._dispatch_get_all_op_names()
             if n.startswith("aten::_foreach_")}
    for name in sorted(n for n in names if not n.endswith("_")):
        single, packet = getattr(aten, name[len("_foreach_"):], None), getattr(aten, name)
        for ov in packet.overloads():
            if single is None or (ov == "Tensor" and name in ("_foreach_addcmul", "_foreach_addcdiv")):
                continue
            handler = next((table[getattr(single, o)] for o in _FOREACH_SINGLE.get(ov, ())
                            if hasattr(single, o) and getattr(single, o) in table), None)
            if handler is not None:
                table[getattr(packet, ov)] = _foreach(handler)
                added.append(getattr(packet, ov))
    return frozenset(added)


def register_late_ops(table: dict) -> None:
    """Add the ops that exist only once another module registered them: Inductor's prims.fma,
    which Dynamo emits for addcmul_ / addcdiv_ (importing it here would cost ~1 s). Called before
    a graph is lowered."""
    if hasattr(prims, "fma"):
        table.setdefault(prims.fma.default, _fma)
