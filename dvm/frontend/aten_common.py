"""What every ATen lowering module shares: the dtype map and the Unsupported signal."""
from __future__ import annotations

import torch

from ..graph.dtypes import DType

TORCH_TO_DVM = {torch.bool: DType.BOOL, torch.int32: DType.INT32, torch.int64: DType.INT64,
                torch.float16: DType.FLOAT16, torch.bfloat16: DType.BFLOAT16,
                torch.float32: DType.FLOAT32, torch.float64: DType.FLOAT64}


class Unsupported(Exception):
    """This op (with these arguments) is not lowered; the reason is counted."""


def dvm_dtype(dt) -> DType:
    d = TORCH_TO_DVM.get(dt)
    if d is None:
        raise Unsupported(f"dtype {dt}")
    return d
