"""The float mask `where(keep, 0, fill)` of a bool attention mask, made once per mask tensor.

Hugging Face passes an encoder's padding mask as a materialized bool `keep` of [B, 1, L, S]
whose L query rows are one row repeated per batch entry. Where a mask of at least
ROW_MASK_MIN_ENTRIES entries is such a mask (checked once per tensor version, eight bytes at a
time), its float mask is the where of one row per batch entry, expanded over the L rows (a view,
stride 0 along L): the same values at every index, so the flash kernel and a broadcast add give
the same bits (measured: the CPU flash kernel at B 4, H 4, L = S 64-1024), the where does 1/L of
the work, and the kernel reads one row of S per block instead of L. At 4 x 1024, one thread: the
where 2.35 ms -> 8 µs once a forward, each layer's flash call 34.1 -> 31.5 ms. Smaller masks
take the plain where (the check costs about what it saves there).
"""
from __future__ import annotations

import numpy as np
import torch

from .fx_attention_math import remembered

aten = torch.ops.aten
ROW_MASK_MIN_ENTRIES = 1 << 16


def filled_mask(keep: torch.Tensor, fill: float, dtype: torch.dtype) -> torch.Tensor:
    """where(keep, 0, fill) in dtype (remembered on keep: made once a forward, not per layer), a
    view of its first query row where every query row repeats it (_rows_repeat)."""
    def make():
        zero = torch.zeros((), dtype=dtype, device=keep.device)
        full = torch.full((), fill, dtype=dtype, device=keep.device)
        if _rows_repeat(keep):
            return aten.where.self(keep[..., :1, :], zero, full).expand(keep.shape)
        return aten.where.self(keep, zero, full)
    return remembered(keep, "_dvm_fill_mask", (fill, dtype), make)


def _rows_repeat(keep: torch.Tensor) -> bool:
    """keep (a CPU bool mask [..., L, S] of at least ROW_MASK_MIN_ENTRIES entries, L > 1) holds,
    for each leading index, one query row L times."""
    if keep.dtype != torch.bool or not keep.is_cpu or keep.dim() < 2 or keep.shape[-2] < 2 or \
            keep.numel() < ROW_MASK_MIN_ENTRIES:
        return False
    if keep.stride(-2) == 0:
        return True
    rows = keep.detach().numpy().reshape(-1, keep.shape[-2], keep.shape[-1])
    if rows.shape[-1] % 8 == 0 and rows.flags.c_contiguous:
        rows = rows.view(np.uint64)   # (eight entries a comparison)
    return bool((rows == rows[:, :1, :]).all())
