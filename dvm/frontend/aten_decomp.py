"""The decompositions DVM hands AOTAutograd and lazy mode (decompositions(): PyTorch's of the ops
DECOMPOSE and WIDE_DECOMPOSE name, and DVM's own, TABLE). DVM's own replace PyTorch's where
PyTorch's reach prims that DVM does not lower (var and std: prims.var): the same values from aten
ops DVM fuses; wide_only, which keeps PyTorch's op for 16-bit inputs where a decomposition would round each
step of what PyTorch's kernel rounds once. The variance is two-pass (the mean, then the mean
square of the deviations), computed in float32 for 16-bit inputs as PyTorch's CPU kernels do; its
divisor max(N - correction, 0) is a tensor (a sum of ones over the reduced dims), so no symbolic
size becomes a scalar operand. The mean var_mean and std_mean return is torch.mean's: over a row
holding an infinite element, +-inf (NaN with both signs), where eager's running (Welford) mean is
NaN unless that element comes last."""
from __future__ import annotations

import torch

aten = torch.ops.aten
HALVES = (torch.float16, torch.bfloat16)


def _dims(x, dim) -> list[int]:
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return list(range(x.dim()))
    return [dim] if isinstance(dim, int) else list(dim)


def _var_mean(x, dim, correction, keepdim):
    """(var, mean) of x over dim, float32 for a 16-bit x, or None where the op should stay
    (a complex or 0-d input)."""
    if not x.is_floating_point() or x.dim() == 0:
        return None
    dims = _dims(x, dim)
    xf = cast_to(x, torch.float32) if x.dtype in HALVES else x
    mean = aten.mean.dim(xf, dims, True)
    d = aten.sub.Tensor(xf, mean)
    square_sum = aten.sum.dim_IntList(aten.mul.Tensor(d, d), dims, keepdim)
    count = aten.sum.dim_IntList(aten.ones_like.default(xf), dims, keepdim)
    c = 1 if correction is None else correction
    divisor = aten.clamp_min.default(aten.sub.Tensor(count, c), 0)
    if not keepdim:
        mean = aten.squeeze.dims(mean, dims)
    return aten.div.Tensor(square_sum, divisor), mean


def cast_to(v, dtype):
    """v in dtype (v itself where it is already)"""
    return v if v.dtype == dtype else aten._to_copy.default(v, dtype=dtype)


def _as(x, *values):
    """values in x's dtype (rounded once, from float32, for a 16-bit x)"""
    out = tuple(cast_to(v, x.dtype) for v in values)
    return out if len(out) > 1 else out[0]


def var(x, dim=None, *, correction=None, keepdim=False):
    vm = _var_mean(x, dim, correction, keepdim)
    return NotImplemented if vm is None else _as(x, vm[0])


def var_mean(x, dim=None, *, correction=None, keepdim=False):
    vm = _var_mean(x, dim, correction, keepdim)
    return NotImplemented if vm is None else _as(x, *vm)


def std(x, dim=None, *, correction=None, keepdim=False):
    vm = _var_mean(x, dim, correction, keepdim)
    return NotImplemented if vm is None else _as(x, aten.sqrt.default(vm[0]))


def std_mean(x, dim=None, *, correction=None, keepdim=False):
    vm = _var_mean(x, dim, correction, keepdim)
    return NotImplemented if vm is None else _as(x, aten.sqrt.default(vm[0]), vm[1])


def wide_only(decomposition):
    """decomposition for float32 / float64 inputs; a 16-bit input keeps the op (PyTorch's kernel
    computes it in float32 and rounds once, where the decomposition would round its steps)."""
    def decompose(x, *args, **kwargs):
        if isinstance(x, torch.Tensor) and x.dtype in HALVES:
            return NotImplemented
        return decomposition(x, *args, **kwargs)
    return decompose


TABLE = {aten.var.correction: var, aten.var_mean.correction: var_mean, aten.std.correction: std,
         aten.std_mean.correction: std_mean}


# Decompositions handed to AOTAutograd: backward composites (and a few forward ones) become the
# elementwise / reduction ops of aten_table.LOWERINGS, so training graphs fuse; forward composites that DVM has as
# ops (silu, gelu, sigmoid, tanh) or lowers itself (_softmax, native_layer_norm) stay whole. Three
# backward entries keep their op, run by PyTorch's kernel (fx_native_backward). var and std take
# DVM's own (TABLE).
DECOMPOSE = [aten._softmax_backward_data, aten._log_softmax_backward_data, aten.native_layer_norm_backward,
             aten.gelu_backward, aten.silu_backward, aten.sigmoid_backward, aten.tanh_backward,
             aten.threshold_backward, aten.rsub, aten.addcmul, aten.addcdiv, aten.lerp, aten.hardtanh,
             aten.leaky_relu, aten.elu, aten.softplus, aten.mse_loss, aten.mse_loss_backward,
             aten.log_sigmoid_forward, aten.native_dropout_backward, aten.masked_fill_,
             # forward composites PyTorch decomposes into ops DVM lowers (else each a fallback)
             aten.linalg_vector_norm, aten.logsumexp, aten.mish, aten.hardswish, aten.hardsigmoid, aten.celu,
             aten.glu, aten.threshold, aten.frac, aten.xlogy, aten.smooth_l1_loss, aten.huber_loss,
             aten.binary_cross_entropy_with_logits, aten.aminmax, aten.count_nonzero, aten.any, aten.all,
             aten.tril, aten.triu, aten.repeat, aten._prelu_kernel, aten.pixel_shuffle,
             aten.pixel_unshuffle, aten.binary_cross_entropy, aten.soft_margin_loss, aten.norm, aten.logaddexp,
             aten.logaddexp2, aten.heaviside, aten.deg2rad, aten.rad2deg, aten.sinc, aten.fill]
# ... and those only for float32 / float64 inputs (their 16-bit kernels compute in float32 and round
# once; the decompositions round each step: wide_only)
WIDE_DECOMPOSE = [aten.native_group_norm, aten._native_batch_norm_legit, aten._native_batch_norm_legit_no_training,
                  aten.logit]


def decompositions() -> dict:
    from torch._decomp import get_decompositions

    from .aten_decomp_math import TABLE as MATH
    from .aten_decomp_nll import TABLE as NLL
    from .fx_native_backward import adjust
    wide = {op: wide_only(fn) for op, fn in get_decompositions(WIDE_DECOMPOSE).items()}
    return adjust(get_decompositions(DECOMPOSE)) | wide | TABLE | NLL | MATH
