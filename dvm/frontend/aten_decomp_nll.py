"""DVM's decompositions of the negative log-likelihood loss (cross-entropy's second half):
nll_loss_forward / nll_loss2d_forward and their backward ops. PyTorch's reach gather and scatter,
which DVM does not lower; these pick the target's class with a compare against the class index
(one-hot), so the loss is a reduction over the class axis that fuses with the log-softmax before it,
and the gradient an elementwise select that fuses with the log-softmax gradient after it.

Semantics as PyTorch's kernels: class axis 1 (0 for a 1-D input), ignore_index rows contribute
nothing, weight per class, reduction none / mean / sum, total_weight the sum of the kept rows'
weights. A target outside [0, C) that is not ignore_index is an error in eager; here no data check
can raise from inside a fused kernel, so that row's loss is NaN (and so a mean or sum): visible,
never a plausible number. For 16-bit inputs the reduced loss and total weight are summed and
divided in float32 and rounded once."""
from __future__ import annotations

import torch

from .aten_decomp import HALVES, cast_to

aten = torch.ops.aten
_NONE, _MEAN, _SUM = 0, 1, 2          # torch.nn._reduction's enum


def _channel_dim(x) -> int:
    return 0 if x.dim() < 2 else 1


def _on_class_axis(v, x, cd):
    """the 1-D v (a value per class) laid along x's class axis, 1 elsewhere"""
    shape = [1] * x.dim()
    shape[cd] = v.shape[0]
    return aten.view.default(v, shape)


def _match(x, target, cd):
    """True at each row's target class (its one-hot), over x's shape"""
    classes = aten.arange.default(x.shape[cd], dtype=torch.int64, device=x.device)
    return aten.eq.Tensor(_on_class_axis(classes, x, cd), aten.unsqueeze.default(target, cd))


def _picked(values, match, cd):
    """values at each row's target class: the sum of one value and zeros, exact"""
    return aten.sum.dim_IntList(aten.where.ScalarOther(match, values, 0), [cd])


def _out_of_range(target, kept, classes):
    return aten.logical_and.default(kept, aten.logical_or.default(aten.lt.Scalar(target, 0),
                                                                  aten.ge.Scalar(target, classes)))


def _decomposed(x, target) -> bool:
    """a floating input with a class axis (a 1-D input with a 1-D target, which reads only
    target[0], keeps PyTorch's kernel)"""
    return x.dim() > 0 and x.is_floating_point() and not (x.dim() == 1 and target.dim() > 0)


def nll_loss_forward(x, target, weight, reduction, ignore_index):
    if not _decomposed(x, target):
        return NotImplemented
    cd = _channel_dim(x)
    match = _match(x, target, cd)
    kept = aten.ne.Scalar(target, ignore_index)
    picked = _picked(x, match, cd)
    w = None if weight is None else _picked(_on_class_axis(weight, x, cd), match, cd)
    loss = aten.neg.default(picked if w is None else aten.mul.Tensor(picked, w))
    loss = aten.where.ScalarOther(kept, loss, 0)
    loss = aten.where.ScalarSelf(_out_of_range(target, kept, x.shape[cd]), float("nan"), loss)
    if reduction == _NONE and x.dim() > 1:
        return loss, aten.new_zeros.default(x, [])
    wide = torch.float32 if x.dtype in HALVES else x.dtype
    kept_weight = cast_to(kept, wide) if w is None else aten.where.ScalarOther(kept, cast_to(w, wide), 0)
    total = aten.sum.default(kept_weight)
    if reduction != _NONE:
        loss = aten.sum.default(cast_to(loss, wide))
        if reduction == _MEAN:
            loss = aten.div.Tensor(loss, total)
    return cast_to(loss, x.dtype), cast_to(total, x.dtype)


def nll_loss_backward(grad, x, target, weight, reduction, ignore_index, total_weight):
    if not _decomposed(x, target):
        return NotImplemented
    cd = _channel_dim(x)
    if reduction == _MEAN:
        grad = aten.div.Tensor(grad, total_weight)
    if grad.dim() > 0 and x.dim() > grad.dim():
        grad = aten.unsqueeze.default(grad, cd)
    if weight is not None:
        grad = aten.mul.Tensor(grad, _on_class_axis(weight, x, cd))
    selected = aten.logical_and.default(_match(x, target, cd),
                                        aten.unsqueeze.default(aten.ne.Scalar(target, ignore_index), cd))
    return cast_to(aten.where.ScalarOther(selected, aten.neg.default(grad), 0), x.dtype)


TABLE = {aten.nll_loss_forward.default: nll_loss_forward, aten.nll_loss2d_forward.default: nll_loss_forward,
         aten.nll_loss_backward.default: nll_loss_backward, aten.nll_loss2d_backward.default: nll_loss_backward}
