"""Backward ops that run as PyTorch's own kernels, not decomposed and fused.

AOTAutograd decomposes backward composites with DVM's table (aten_decomp.decompositions) so that
training graphs fuse; three of them are kept whole and the planner takes each as a PyTorch step
with its reason (REASONS). Each is one fused pass in PyTorch whose decomposition the VM runs in
several times its time, at every size measured (16 K - 512 K elements, float32; one thread), more
than fusing it with its neighbours saves (a pass of its result):
- native_layer_norm_backward: its row sums and ~20 elementwise steps per element, 4-6x PyTorch's
  time (with its weight and bias gradients, column sums);
- _softmax_backward_data: a row sum and a product, 2-3x;
- gelu_backward, exact form, float32 / bfloat16 / float16: an erf and an exp per element, ~2.7x.
  Its tanh form, which the VM runs as fast as PyTorch or faster, and float64 are decomposed.
"""
from __future__ import annotations

import torch

aten = torch.ops.aten
REASONS = {
    aten.native_layer_norm_backward.default: "LayerNorm's gradient: PyTorch's fused kernel, 4-6x faster than "
                                             "the VM's decomposition (row and column sums, ~20 steps an element)",
    aten._softmax_backward_data.default: "softmax's gradient: PyTorch's fused kernel, 2-3x faster than the VM's "
                                         "decomposition (a row sum and a product)",
    aten.gelu_backward.default: "exact GELU's gradient: PyTorch's kernel, ~2.7x faster per element than the VM's "
                                "erf and exp (its decomposition); fusing it would save one pass",
}
GELU_NATIVE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
ENABLED = True   # off: every one of them is decomposed and fused (A/B runs; read when AOTAutograd traces)


def _exact_gelu(grad, x, approximate: str = "none") -> bool:
    return approximate == "none" and x.dtype in GELU_NATIVE_DTYPES


_KEPT_WHEN = {aten.gelu_backward.default: _exact_gelu}   # the others of REASONS: always


def adjust(table: dict) -> dict:
    """AOTAutograd's decomposition table, the entries of the ops of REASONS returning
    NotImplemented (the op stays in the graph: make_fx's convention) where they are kept."""
    for op in [op for op in table if op in REASONS]:
        table[op] = _kept_when(_KEPT_WHEN.get(op), table[op])
    return table


def _kept_when(keep, decomposition):
    def decompose(*args, **kwargs):
        if ENABLED and (keep is None or keep(*args, **kwargs)):
            return NotImplemented
        return decomposition(*args, **kwargs)
    return decompose
