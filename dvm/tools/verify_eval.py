"""A torch-backend segment's outputs computed by PyTorch eager, in the segment's own dtypes or in
float64, from the input tensors the segment ran on.

The segment's outputs are evaluated op by op from the ATen graph the backend compiled (the
graph AOTAutograd handed over, after DVM's decompositions: what `aot_eager` would run), walking
back from each output to the segment's inputs: the members DVM lowered, the ops of recognized
patterns they absorbed, and the views DVM replayed. Leaves are the segment's input tensors; a
rotate_half input that the run graph passed as roll(x, h) gives x back by roll(t, -h) (exact: a
permutation); sizes come from the launch's symbol values.

float64: every floating input is upcast, and every floating dtype argument of an op (casts,
factories) becomes float64, so no op rounds to a narrower type; integer and bool values stay.
Evaluation runs with autocast off (the graph's casts are explicit) and without autograd.
"""
from __future__ import annotations

import collections

import torch
import torch.fx as fx

from ..frontend.aten_common import fake
from ..frontend.fx_patterns import HalfSigns, Rolled
from ..frontend.fx_rolled_blocks import RolledBlocks
from ..frontend.fx_rotate_pairs import RotatedPairs, rotate_pairs
from ..frontend.fx_syms import Syms
from ..graph.symbolic import evaluate

_HALF_FLOATS = (torch.float16, torch.bfloat16, torch.float32)
# additive reductions (and the ATen composites made of one): an output computed through one is
# judged by the accumulative-error standard (verify_metrics)
ACCUMULATING = frozenset({"sum", "mean", "var", "var_mean", "std", "std_mean", "prod", "nansum", "norm",
                          "linalg_vector_norm", "logsumexp", "cumsum", "_softmax", "_log_softmax",
                          "native_layer_norm", "_fused_rms_norm"})


def _unrolled_blocks(key: RolledBlocks, t: torch.Tensor) -> torch.Tensor:
    """The base of a roll_blocks input (fx_rolled_blocks) from its value t: the span it took,
    rolled back and moved back; zeros beside the span (the segment reads the base only there)."""
    y = torch.roll(t, -key.h, -1)
    for m in reversed(key.moves):
        y = y.transpose(m[1], m[2]) if m[0] == "transpose" else y.permute([m[1].index(i) for i in range(y.dim())])
    span = y.flatten(-2)
    width = fake(key.x).shape[-1]
    if (key.lo, key.hi) == (0, width):
        return span.contiguous()
    base = span.new_zeros(*span.shape[:-1], width)
    base[..., key.lo:key.hi] = span
    return base


class NotVerifiable(Exception):
    """The segment's values cannot be recomputed from its inputs (the reason is reported)."""


def _upcast(v):
    if isinstance(v, torch.Tensor) and v.is_floating_point() and v.dtype != torch.float64:
        return v.to(torch.float64)
    if isinstance(v, torch.dtype) and v in _HALF_FLOATS:
        return torch.float64
    return v


class SegmentEval:
    """What a segment computes, as an ATen subgraph: its outputs, leaves and ops (once per
    segment runner)."""

    def __init__(self, runner):
        self.runner = runner
        # (result index of the launch, FX node) of each output DVM computed (not passed through)
        self.outputs = [(k, fxn) for fxn, is_input, k, _ in runner.out_map if not is_input]
        self.perms = {k: inv for _, is_input, k, inv in runner.out_map if not is_input}
        self.owner = runner.seg.members[0].graph.owning_module if runner.seg.members else None
        self._syms = Syms()
        self._inputs = {x for x in runner.inputs if isinstance(x, fx.Node)}
        self.ops: collections.Counter = collections.Counter()

    def accumulating(self, fxn: fx.Node) -> bool:
        """fxn is computed, in this segment, through an additive reduction."""
        stack, seen = [fxn], set()
        while stack:
            n = stack.pop()
            if n in seen or n in self._inputs or n.op != "call_function":
                continue
            seen.add(n)
            name = _packet(n.target)
            if name in ACCUMULATING:
                return True
            stack.extend(_arg_nodes(n))
        return False

    def leaves(self, tensors) -> dict:
        out: dict = {}
        for key, t in zip(self.runner.inputs, tensors):
            if isinstance(key, fx.Node):
                out[key] = t
        for key, t in zip(self.runner.inputs, tensors):
            if isinstance(key, Rolled) and key.x not in out:
                out[key.x] = torch.roll(t, -key.h, key.axis)
            elif isinstance(key, RolledBlocks) and key.x not in out:
                out[key.x] = _unrolled_blocks(key, t)
            elif isinstance(key, RotatedPairs) and key.x not in out:   # (its own inverse, signs swapped)
                out[key.x] = rotate_pairs(t, key.negs[::-1])
            elif not isinstance(key, (fx.Node, Rolled, HalfSigns, RolledBlocks, RotatedPairs)):
                raise NotVerifiable(f"segment input of type {type(key).__name__}")
        return out

    def run(self, env: dict, tensors, f64: bool) -> list:
        """The values of self.outputs (in order), in the graph's dtypes or in float64."""
        leaves = self.leaves(tensors)
        memo = {n: (_upcast(v) if f64 else v) for n, v in leaves.items()}
        count = not self.ops
        with torch.no_grad(), torch.autocast("cpu", enabled=False):
            for _, fxn in self.outputs:
                self._eval(fxn, memo, env, f64, count)
        return [memo[fxn] for _, fxn in self.outputs]

    def _eval(self, root: fx.Node, memo: dict, env: dict, f64: bool, count: bool) -> None:
        stack = [root]
        while stack:
            n = stack[-1]
            if n in memo:
                stack.pop()
                continue
            size = self._size(n, env)
            if size is not None:
                memo[n] = size
                stack.pop()
                continue
            pending = [a for a in _arg_nodes(n) if a not in memo]
            if pending:
                stack.extend(pending)
                continue
            stack.pop()
            memo[n] = self._compute(n, memo, f64)
            if count and n.op == "call_function":
                self.ops[_op_name(n.target)] += 1

    def _size(self, n: fx.Node, env: dict):
        """A size value (SymInt in the graph) from the launch's symbol values; None otherwise."""
        v = fake(n)
        if isinstance(v, int) and not isinstance(v, bool):
            return v if n.op != "call_function" else None
        if not isinstance(v, torch.SymInt):
            return None
        try:
            return int(evaluate(self._syms.dim(v), env))
        except Exception:  # noqa: BLE001 - a symbol not in env: computed from its arguments
            return None

    def _compute(self, n: fx.Node, memo: dict, f64: bool):
        if n.op == "get_attr":
            v = getattr(self.owner, n.target)
            return _upcast(v) if f64 else v
        if n.op != "call_function":
            raise NotVerifiable(f"{n.op} {n.name} is not among the segment's inputs")
        get = memo.__getitem__
        args = fx.node.map_arg(n.args, get)
        kwargs = fx.node.map_arg(n.kwargs, get)
        if f64:
            args = _map(args, _upcast)
            kwargs = {k: _map(v, _upcast) for k, v in kwargs.items()}
        return n.target(*args, **kwargs)

    def dvm_values(self, outs) -> list:
        """DVM's launch results in self.outputs' order (permuted back where the run graph does)."""
        vals = []
        for k, _ in self.outputs:
            inv = self.perms[k]
            vals.append(outs[k] if inv is None else outs[k].permute(inv))
        return vals


def _map(v, fn):
    if isinstance(v, (list, tuple)):
        return type(v)(_map(x, fn) for x in v)
    return fn(v)


def _arg_nodes(n: fx.Node) -> list:
    out: list = []
    fx.node.map_arg((n.args, n.kwargs), lambda a: out.append(a) or a)
    return out


def _packet(target) -> str:
    packet = getattr(target, "overloadpacket", None)
    return getattr(packet, "__name__", "") if packet is not None else getattr(target, "__name__", "")


def _op_name(target) -> str:
    name = getattr(target, "__name__", None) if not isinstance(target, torch._ops.OpOverload) else None
    if name is None:
        name = str(target)
    return name.replace("aten.", "").replace(".default", "")
