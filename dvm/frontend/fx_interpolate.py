"""`F.interpolate` as one call of PyTorch's own upsampling kernel (a Dynamo-graph rewrite, before
AOTAutograd).

Dynamo records `F.interpolate` as one node; AOTAutograd then traces it through the Python
decompositions PyTorch registers for the upsampling ops (py_impl on their CompositeImplicit and
Autograd keys, applied whatever the decomposition table): index tensors, `_unsafe_index` gathers
and the interpolation arithmetic, several graph nodes per call. DVM has no gather, so those
gathers ran as PyTorch calls on index tensors: a bilinear 4x upsampling of 1x64x32x32 took 8x
eager's time, a bicubic one too. Each such node becomes `torch.ops.dvm.interpolate`, a custom op
AOTAutograd keeps whole: it runs `F.interpolate` itself (PyTorch's kernel: eager's bits), its
shape comes from the sizes or scale factors (symbolic where the input's are), and its gradient is
`dvm.interpolate_backward`, the upsampling op's own backward kernel (a custom op too: called
directly, the backward ops fail on symbolic sizes under AOTAutograd's fake tensors).

Rewritten: the modes with such a decomposition (nearest, nearest-exact, linear, bilinear,
bicubic, trilinear), constant mode / align_corners / recompute_scale_factor / antialias and scale
factors, sizes of ints, of symbolic ints or a torch.Size node. Anything else stays as it was
(counted).
"""
from __future__ import annotations

import inspect

import torch
import torch.nn.functional as F
from torch._decomp.decompositions import upsample_compute_output_size
from torch._prims_common import suggest_memory_format

from ..runtime import counters

_PARAMETERS = inspect.signature(F.interpolate).parameters
_SIGNATURE = tuple(_PARAMETERS)   # (input, size, scale_factor, mode, align_corners, recompute_scale_factor, antialias)
_DEFAULTS = {n: p.default for n, p in _PARAMETERS.items() if p.default is not inspect.Parameter.empty}
# mode -> the spatial ranks whose upsampling op PyTorch decomposes (antialias: bilinear, bicubic)
_RANKS = {"nearest": (1, 2, 3), "nearest-exact": (1, 2, 3), "linear": (1,), "bilinear": (2,), "trilinear": (3,),
          "bicubic": (2,)}
_RANKS_AA = {"bilinear": (2,), "bicubic": (2,)}
_SCHEMA_ARGS = "SymInt[]? size, float[]? scale_factor, str mode, bool? align_corners, bool? recompute_scale_factor, " \
               "bool antialias"
_NEAREST = ("nearest", "nearest-exact")


@torch.library.custom_op("dvm::interpolate", mutates_args=(), schema=f"(Tensor x, {_SCHEMA_ARGS}) -> Tensor")
def interpolate(x, size, scale_factor, mode, align_corners, recompute_scale_factor, antialias):
    """F.interpolate (PyTorch's kernel; every mode rewritten allocates its output)."""
    return F.interpolate(x, size=size, scale_factor=scale_factor, mode=mode, align_corners=align_corners,
                         recompute_scale_factor=recompute_scale_factor, antialias=antialias)


@interpolate.register_fake
def _(x, size, scale_factor, mode, align_corners, recompute_scale_factor, antialias):
    shape = upsample_compute_output_size(x.size(), size, scale_factor)
    return torch.empty((*x.shape[:2], *shape), dtype=x.dtype, device=x.device,
                       memory_format=suggest_memory_format(x))


def _backward_op(mode: str, rank: int, antialias: bool):
    """The ATen backward of the upsampling op F.interpolate calls for `mode` at `rank`."""
    if antialias:
        return getattr(torch.ops.aten, f"_upsample_{mode}{rank}d_aa_backward").default
    name = {"nearest": "upsample_nearest", "nearest-exact": "_upsample_nearest_exact"}.get(mode, f"upsample_{mode}")
    return getattr(torch.ops.aten, f"{name}{rank}d_backward").default


@torch.library.custom_op("dvm::interpolate_backward", mutates_args=(),
                         schema=f"(Tensor grad, SymInt[] input_size, {_SCHEMA_ARGS}) -> Tensor")
def interpolate_backward(grad, input_size, size, scale_factor, mode, align_corners, recompute_scale_factor,
                         antialias):
    """The gradient of dvm.interpolate's input: the upsampling op's own backward kernel (its
    scales: the factors, unless sizes were given or the factors recomputed, as F.interpolate
    passes them)."""
    rank = len(input_size) - 2
    scales = list(scale_factor) if scale_factor is not None and not recompute_scale_factor else [None] * rank
    corners = () if mode in _NEAREST else (bool(align_corners),)
    return _backward_op(mode, rank, antialias)(grad, list(grad.shape[2:]), list(input_size), *corners, *scales)


@interpolate_backward.register_fake
def _(grad, input_size, size, scale_factor, mode, align_corners, recompute_scale_factor, antialias):
    return torch.empty(input_size, dtype=grad.dtype, device=grad.device, memory_format=suggest_memory_format(grad))


def _setup(ctx, inputs, output):
    ctx.input_size, ctx.args = inputs[0].shape, inputs[1:]


def _backward(ctx, grad):
    return (torch.ops.dvm.interpolate_backward(grad, ctx.input_size, *ctx.args),) + (None,) * len(ctx.args)


interpolate.register_autograd(_backward, setup_context=_setup)


def _arguments(node: torch.fx.Node) -> dict | None:
    """F.interpolate's arguments by name, or None where more were passed than it takes."""
    if len(node.args) > len(_SIGNATURE) or any(k not in _SIGNATURE for k in node.kwargs):
        return None
    got = {**_DEFAULTS, **dict(zip(_SIGNATURE, node.args)), **node.kwargs}
    return got if "input" in got else None


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _int_like(v) -> bool:
    return isinstance(v, (int, torch.SymInt)) and not isinstance(v, bool)


def _size_entry(v) -> bool:
    """An int, or a graph node of a (symbolic) int."""
    return _int_like(v.meta.get("example_value") if isinstance(v, torch.fx.Node) else v)


def _sizes_of(node: torch.fx.Node, rank: int) -> bool:
    """A graph node of `rank` (symbolic) ints: a torch.Size such as `x.shape[2:]`."""
    value = node.meta.get("example_value")
    return isinstance(value, (tuple, list)) and len(value) == rank and all(_int_like(v) for v in value)


def _as_list(value, rank: int, accept) -> list | None:
    """A size or scale factor as one entry per spatial dim (a scalar repeated), or None where an
    entry is not accepted."""
    items = list(value) if isinstance(value, (list, tuple)) else [value] * rank
    return items if len(items) == rank and all(accept(v) for v in items) else None


def _rewritable(args: dict, rank: int) -> tuple | None:
    """(size, scale_factor) as lists for the custom op, or None where the call stays as it is."""
    mode, antialias = args["mode"], args["antialias"]
    if not isinstance(mode, str) or rank not in (_RANKS_AA if antialias is True else _RANKS).get(mode, ()):
        return None
    if not all(isinstance(args[k], (bool, type(None))) for k in ("align_corners", "recompute_scale_factor")) \
            or not isinstance(antialias, bool):
        return None
    size, scale = args["size"], args["scale_factor"]
    if (size is None) == (scale is None):
        return None
    if size is not None:
        if isinstance(size, torch.fx.Node) and _sizes_of(size, rank):
            return size, None   # a torch.Size node (`x.shape[2:]`)
        size = _as_list(size, rank, _size_entry)
        return None if size is None else (size, None)
    scale = _as_list(scale, rank, _number)
    return None if scale is None else (None, [float(s) for s in scale])


def rewrite(gm: torch.fx.GraphModule) -> int:
    """Each F.interpolate node that _rewritable takes becomes dvm.interpolate; the number of them."""
    done = 0
    for node in list(gm.graph.find_nodes(op="call_function", target=F.interpolate)):
        args = _arguments(node)
        x = args and args["input"]
        value = x.meta.get("example_value") if isinstance(x, torch.fx.Node) else None
        plain = isinstance(value, torch.Tensor) and value.dim() >= 3
        lists = _rewritable(args, value.dim() - 2) if plain else None
        if lists is None:
            counters.bump("torch_interpolate_kept")
            continue
        with gm.graph.inserting_before(node):
            new = gm.graph.call_function(torch.ops.dvm.interpolate.default,
                                         (x, *lists, args["mode"], args["align_corners"],
                                          args["recompute_scale_factor"], args["antialias"]))
        new.meta.update(node.meta)
        node.replace_all_uses_with(new)
        gm.graph.erase_node(node)
        done += 1
    if done:
        gm.recompile()
        counters.bump("torch_interpolate_native", done)   # shown by dvm.explain
    return done
