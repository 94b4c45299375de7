"""An exact float32 GELU that would be a DVM segment of its own runs as a PyTorch step.

The VM's GELU is accurate to 3.5 ULP (PyTorch's: up to 49) and takes ~2.7x the time of
PyTorch's per element on large tensors; alone, fusing it saves no memory pass. So after
planning, a segment whose members are one exact float32 GELU of a PyTorch value and views of its
result becomes PyTorch steps; the run graph's GELU step chooses by size at run time
(gelu_size: PyTorch's kernel above gelu_size.vm_limit() elements, eager's bit for bit;
the VM's below, where PyTorch's fixed cost dominates). The tanh form (the VM's is faster from
~128 K elements), other dtypes and a GELU fused with anything stay in DVM. docs/DECISIONS.md,
"A segment of one op".
"""
from __future__ import annotations

import torch

from .fx_lone_ops import single_op

REASON = ("exact GELU alone: PyTorch's kernel above a size, ~2.7x faster per element than the VM's (accurate to "
          "3.5 ULP); the VM's below it (gelu_size); fused with nothing, the VM would save no pass")
ENABLED = True   # off: such a GELU is a segment of its own (tests compare the two)
_GELU = torch.ops.aten.gelu.default


def lone_gelu(seg) -> bool:
    """seg's members (fx_segment_lower.Segment) are one exact float32 GELU of a PyTorch value (one of
    seg.inputs) and views of its result."""
    g = single_op(seg)
    if g is None or g.target is not _GELU:
        return False
    approximate = g.kwargs.get("approximate", g.args[1] if len(g.args) > 1 else "none")
    v = g.meta.get("val")
    return approximate == "none" and isinstance(v, torch.Tensor) and v.dtype == torch.float32 and \
        g.args[0] in seg.inputs
