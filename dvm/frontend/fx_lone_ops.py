"""A segment of one cheap elementwise op of PyTorch values runs as PyTorch's op.

A DVM segment pays a launch (Python, binding, the VM's entry and its per-tile dispatch) to save
memory passes between the ops it fuses. A segment of one op saves none: its one pass is the pass
PyTorch's kernel makes. Where that op does no transcendental math (arithmetic, comparisons,
selects, casts, copies), PyTorch's kernel is as fast per element as the VM's, and its fixed cost
is lower: alone, such a segment took 1.06-2.9x the time of the op in PyTorch at every size
from 16 to 1 M elements (docs/DECISIONS.md, "A segment of one cheap elementwise op"). So after
planning, a segment whose members are one such op of PyTorch values (segment inputs, or views of
them that PyTorch takes) and views of its result becomes PyTorch steps, and its results are
eager's bit for bit.
Ops with transcendental math (the VM's exp, sigmoid, tanh, ... are faster than PyTorch's from
~64 K elements on), reductions (softmax: no single rule) and anything fused with another op stay
in DVM. CPU tensors only (a device's launches were not measured).
"""
from __future__ import annotations

import torch
import torch.fx as fx

from . import aten_table as T
from .aten_common import EDGE_PADS

REASON = ("one cheap elementwise op alone: PyTorch's kernel makes the same single pass at a lower "
          "fixed cost than a DVM launch")
ENABLED = True   # off: such an op is a segment of its own (tests of single ops' lowering compare the two)

_A, _P = torch.ops.aten, torch.ops.prims
# One pass, no transcendental math: arithmetic, comparisons, logic, selects, casts and copies (flips, rolls, pads
# and a slice's gradient among them: alone, a reversed last axis took the VM 2.6x PyTorch's time at 2 M elements).
CHEAP = frozenset(getattr(packet, overload) for packet, overloads in (
    (_A.add, ("Tensor", "Scalar")), (_A.sub, ("Tensor", "Scalar")), (_A.mul, ("Tensor", "Scalar")),
    (_A.div, ("Tensor", "Scalar", "Tensor_mode", "Scalar_mode")), (_A.floor_divide, ("default", "Scalar")),
    (_A.remainder, ("Tensor", "Scalar")), (_A.neg, ("default",)), (_A.abs, ("default",)),
    (_A.maximum, ("default",)), (_A.minimum, ("default",)), (_A.clamp, ("default", "Tensor")),
    (_A.clamp_min, ("default",)), (_A.clamp_max, ("default",)), (_A.relu, ("default",)),
    (_A.where, ("self", "ScalarSelf", "ScalarOther", "Scalar")),
    (_A.eq, ("Tensor", "Scalar")), (_A.ne, ("Tensor", "Scalar")), (_A.lt, ("Tensor", "Scalar")),
    (_A.le, ("Tensor", "Scalar")), (_A.gt, ("Tensor", "Scalar")), (_A.ge, ("Tensor", "Scalar")),
    (_A.logical_and, ("default",)), (_A.logical_or, ("default",)), (_A.logical_not, ("default",)),
    (_A.bitwise_and, ("Tensor", "Scalar")), (_A.bitwise_or, ("Tensor", "Scalar")),
    (_A.bitwise_not, ("default",)), (_A._to_copy, ("default",)), (_A.clone, ("default",)),
    (_P.convert_element_type, ("default",)), (_A.flip, ("default",)), (_A.roll, ("default",)),
    (_A.slice_backward, ("default",)), (_A.constant_pad_nd, ("default",)),
) for overload in overloads if hasattr(packet, overload)) | frozenset(EDGE_PADS)


def single_op(seg) -> fx.Node | None:
    """The one member of seg (fx_segment_lower.Segment) that is not a view, where every other
    member is a view of its result or of such a view; else None."""
    ops = [m for m in seg.members if m.target not in T.VIEW_OPS]
    if len(ops) != 1:
        return None
    made = {ops[0]}
    for m in seg.members:   # (graph order)
        if m is not ops[0]:
            if not m.args or m.args[0] not in made:
                return None
            made.add(m)
    return ops[0]


def lone_cheap_op(seg) -> bool:
    """seg computes one CHEAP op of CPU tensors from PyTorch values (its inputs, or views PyTorch
    takes of them: those steps come before the segment's) and views of its result."""
    op = single_op(seg)
    if op is None or op.target not in CHEAP:
        return False
    v = op.meta.get("val")
    if not isinstance(v, torch.Tensor) or v.device.type != "cpu":
        return False
    args = []
    fx.node.map_arg((op.args, op.kwargs), lambda a: args.append(a) or a)
    return bool(args) and all(a in seg.inputs or a in seg.views for a in args)
