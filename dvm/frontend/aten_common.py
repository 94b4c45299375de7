"""What every ATen lowering module shares: the dtype map, the Unsupported signal, scalars as
nodes."""
from __future__ import annotations

import torch
import torch.fx

from ..graph import build
from ..graph.dtypes import DType
from ..graph.node import Node
from ..graph.symbolic import SymExpr

TORCH_TO_DVM = {torch.bool: DType.BOOL, torch.int32: DType.INT32, torch.int64: DType.INT64,
                torch.float16: DType.FLOAT16, torch.bfloat16: DType.BFLOAT16,
                torch.float32: DType.FLOAT32, torch.float64: DType.FLOAT64}

# ops that read a tensor's size, stride, element count or offset (no tensor work)
SIZE_QUERIES = frozenset({torch.ops.aten.sym_size.int, torch.ops.aten.sym_stride.int, torch.ops.aten.sym_numel.default,
                          torch.ops.aten.sym_storage_offset.default})

# the edge padding ops, each to whether it reflects (else it replicates the edge)
EDGE_PADS = {getattr(torch.ops.aten, f"{kind}_pad{d}d").default: kind == "reflection"
             for kind in ("reflection", "replication") for d in (1, 2, 3)}


class Unsupported(Exception):
    """This op (with these arguments) is not lowered; the reason is counted."""


def fake(n) -> object:
    """The value (a fake tensor, SymInt, ...) that tracing recorded for FX node n; None for others."""
    return n.meta.get("val") if isinstance(n, torch.fx.Node) else None


def dvm_dtype(dt) -> DType:
    d = TORCH_TO_DVM.get(dt)
    if d is None:
        raise Unsupported(f"dtype {dt}")
    return d


def scalar(v) -> Node:
    """A handler's operand as a node: a node itself, or a Python number / size expression as a
    constant."""
    if isinstance(v, Node):
        return v
    if isinstance(v, (SymExpr, bool, int, float)):
        return build.const(v)
    raise Unsupported(f"argument of type {type(v).__name__}")
