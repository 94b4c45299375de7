"""Cut an ATen FX graph (symbolic sizes) into DVM segments and PyTorch steps, once per graph.

Nodes are visited in graph order. A lowerable node joins the open segment; its tensor arguments
that are not values of that segment become segment inputs. A node that is not lowerable runs
through PyTorch; it closes the open segment only when it needs one of its values (or mutates),
so independent PyTorch ops (weight transposes, matmuls of other values) do not split segments.
Views of tensors outside the open segment are planned as PyTorch views (no copy); a segment
that reads such a view replays the chain of views as DVM nodes on the value it starts from
(replay_view), and the run graph drops the PyTorch views nothing else reads (~3 us a call saved
on this host). Views inside a segment are DVM reshape/permute/broadcast nodes, replayed by
PyTorch on the segment's output only when a PyTorch op needs the view. Segment outputs are
exactly the values PyTorch needs later.
Sizes are SymPy expressions on the FX side; they are converted to DVM SymExpr once (fx_syms).
"""
from __future__ import annotations

import operator
from dataclasses import dataclass

import torch
import torch.fx as fx

from ..graph.symbolic import SymExpr
from . import aten_table as T
from . import (fx_attention, fx_attention_bias, fx_attention_math, fx_gelu_chain, fx_lone_gelu, fx_lone_ops,
               fx_native_backward, fx_patterns, fx_rolled_blocks, fx_rotate_pairs, fx_sdpa, fx_sibling_linears,
               fx_updates)
from .aten_common import SIZE_QUERIES
from .aten_table import Unsupported
from .fx_segment_lower import Segment, SegmentLowering, arg_nodes
from .fx_syms import Syms


# -- plan ---------------------------------------------------------------------------------------
ROTATE_IN_TORCH = "rotate_half of a PyTorch value: neg + cat in PyTorch, products fused"


@dataclass
class TorchStep:
    node: fx.Node
    kind: str      # "fallback", "view", "cube", "size" (a size query), "python", "torch" (a planning choice, with reason)
    reason: str = ""


@dataclass
class SegmentStep:
    segment: Segment


# the attention calls the fx rewrites put in the graph: PyTorch steps, with their reasons
_ATTENTION_CALLS = {fx_sdpa.sdpa_keep_mask: fx_sdpa.REASON, fx_attention.attention_nan_rows: fx_attention.REASON,
                    fx_attention_bias.attention_biased: fx_attention_bias.REASON,
                    fx_attention_math.attention_guarded: fx_attention_math.REASON}


class Planner(SegmentLowering):
    def __init__(self, gm: fx.GraphModule, prefix_last: fx.Node | None = None):
        """prefix_last: the last of the size-only nodes moved to the graph's start
        (fx_sizeonly); the open segment closes after it, so no segment mixes them with others."""
        self.gm, self.prefix_last = gm, prefix_last
        self.syms = Syms()
        self.steps: list = []
        self.segments: list[Segment] = []
        self.open: Segment | None = None
        self.seg_of: dict = {}          # FX node -> Segment (DVM values)
        self.ready: set = set()         # FX nodes with a torch value at this point of the plan
        self.reasons: dict = {}         # FX node -> fallback reason
        self.torch_views: set = set()   # FX nodes of views PyTorch takes (segments may replay them)
        self.rolled: dict = {}          # rotate of a PyTorch value -> fx_patterns.Rolled / fx_rotate_pairs.RotatedPairs
        self._new_views: dict = {}      # views replayed by the lowering being tried
        self.matches = {**fx_patterns.find(gm), **fx_rotate_pairs.find(gm), **fx_gelu_chain.find(gm)}   # root -> Match
        self.absorbed = {a: m for m in self.matches.values() for a in m.absorbed}
        self.roll_spans = fx_rolled_blocks.spans(   # (base, block, moves) -> the span roll_blocks takes
            r for r in (fx_patterns.rolled(m.rotate[0]) for m in self.matches.values() if m.rotate) if r is not None)
        self.position: dict | None = None    # FX node -> its index in the graph (fx_updates)

    # -- torch availability -------------------------------------------------------------------
    def need_torch(self, a) -> None:
        if not isinstance(a, fx.Node) or a in self.ready:
            return
        seg = self.seg_of[a]
        if seg is self.open:
            self.close()
        if a.target in T.VIEW_OPS:
            for x in arg_nodes(a):
                self.need_torch(x)
            self.steps.append(TorchStep(a, "view"))
            self.torch_views.add(a)
        elif a not in seg.outputs:   # (a write into an input may have made it an output already)
            seg.outputs.append(a)
        self.ready.add(a)

    def close(self) -> None:
        if self.open is not None:
            self.open.closed = True
            self.steps.append(SegmentStep(self.open))
            self.open = None

    # -- the walk -----------------------------------------------------------------------------
    def run(self) -> None:
        for n in self.gm.graph.nodes:
            if n.op == "placeholder" or n.op == "get_attr":
                self.ready.add(n)
            elif n.op == "output":
                for a in arg_nodes(n):
                    self.need_torch(a)
            elif n.op == "call_function":
                self.visit(n)
                if n is self.prefix_last:
                    self.close()
            else:
                raise Unsupported(f"FX op {n.op}")
        if self.open is not None and self.open.writes:   # its results go into inputs only
            self.close()
        self.steps = [x for step in self.steps for x in self._lone_op_in_torch(step)]

    def _lone_op_in_torch(self, step) -> list:
        """[step], or, for a segment that computes one op PyTorch runs faster alone (an exact
        GELU: fx_lone_gelu; a cheap elementwise op: fx_lone_ops) and takes views of it, that op
        and those views as PyTorch steps."""
        seg = step.segment if isinstance(step, SegmentStep) else None
        if seg is None or seg.writes:
            return [step]
        if fx_lone_gelu.ENABLED and fx_lone_gelu.lone_gelu(seg):
            reason = fx_lone_gelu.REASON
        elif fx_lone_ops.ENABLED and fx_lone_ops.lone_cheap_op(seg):
            reason = fx_lone_ops.REASON
        else:
            return [step]
        self.segments.remove(seg)
        out = []
        for m in seg.members:
            del self.seg_of[m]
            if m.target in T.VIEW_OPS:
                self.torch_views.add(m)
                out.append(TorchStep(m, "view"))
            else:
                out.append(TorchStep(m, "torch", reason))
            self.ready.add(m)
        return out

    def visit(self, n: fx.Node) -> None:
        if n in self.absorbed:          # computed by its match's root (or planned there)
            return
        match = self.matches.get(n)
        if match is not None:
            if match.rotate and not (self.open is not None and self.seg_of.get(match.args[0]) is self.open):
                if not (fx_patterns.ROPE_OF_TORCH_VALUES and match.kind == "rope" and self.try_lower(n, match) is None):
                    self.rotate_in_torch(n, match)
                return
            if self.try_lower(n, match) is None:
                return
            self.unabsorb(n, match, ())
        self.visit_plain(n)

    def unabsorb(self, n: fx.Node, match, in_torch) -> None:
        """Plan a match's absorbed nodes one by one (those in `in_torch` run in PyTorch)."""
        for a in match.absorbed:
            self.absorbed.pop(a, None)
        absorbed = set(match.absorbed)
        for a in self.gm.graph.nodes:
            if a is n:
                break
            if a in absorbed:
                self.to_torch(a, ROTATE_IN_TORCH) if a in in_torch else self.visit(a)

    def rotate_in_torch(self, n: fx.Node, match) -> None:
        """rotate_half of a PyTorch value: a segment reading it takes roll(x) from PyTorch and
        applies the halves' signs (fx_patterns.Rolled; an interleaved rotate: rotate_pairs(x),
        fx_rotate_pairs.RotatedPairs); the slices, neg and cat are planned in
        PyTorch too, for any other reader (the run graph drops them where there is none). The
        products stay fused. (A rope of a PyTorch value is the flip form in the segment where
        the segment can take it: visit.)"""
        rotate = set(match.rotate)
        r = match.in_torch or fx_patterns.rolled(match.rotate[0])
        if r is not None:   # its consumers in segments read roll(x) (dvm_arg)
            self.rolled[r.cat] = r
        self.unabsorb(n, match, rotate)
        if n in rotate:
            self.to_torch(n, ROTATE_IN_TORCH)
            return
        self.visit_plain(n)
        seg = self.seg_of.get(n)
        if seg is not None:
            how = "as roll(x) by PyTorch" if r is not None else "in PyTorch"
            seg.patterns.append(f"{match.kind} (rotate_half {how})")

    def to_torch(self, n: fx.Node, reason: str) -> None:
        for a in arg_nodes(n):
            self.need_torch(a)
        self.steps.append(TorchStep(n, "view" if n.target in T.VIEW_OPS else "torch", reason))
        self.ready.add(n)
        if n.target in T.VIEW_OPS:
            self.torch_views.add(n)

    def visit_plain(self, n: fx.Node) -> None:
        src = n.args[0] if n.target is operator.getitem and n.args else None
        if isinstance(src, fx.Node) and isinstance(self.seg_of.get(src) and self.seg_of[src].value[src], tuple):
            seg = self.seg_of[src]          # one result of a multi-output DVM op
            seg.members.append(n)
            seg.value[n] = seg.value[src][n.args[1]]
            self.seg_of[n] = seg
            return
        if n.target in _ATTENTION_CALLS:
            return self.to_torch(n, _ATTENTION_CALLS[n.target])
        if n.target in fx_native_backward.REASONS:   # (kept whole by aten_decomp.decompositions)
            return self.to_torch(n, fx_native_backward.REASONS[n.target])
        if isinstance(n.target, fx_sibling_linears.WeightCats):
            return self.to_torch(n, fx_sibling_linears.REASON)
        if n.target is fx_updates.COPY_ and fx_updates.absorb_write(self, n):
            return
        reason = self.try_lower(n) if isinstance(n.target, torch._ops.OpOverload) else "python"
        if reason is None:
            return
        schema = getattr(n.target, "_schema", None)
        if schema is not None and schema.is_mutable:
            self.close()
        cuts = self.open is not None and any(self.seg_of.get(a) is self.open for a in arg_nodes(n))
        for a in arg_nodes(n):
            self.need_torch(a)
        if n.target in T.VIEW_OPS and not cuts:
            kind = "view"
            self.torch_views.add(n)
        elif n.target in T.CUBE_OPS:
            kind = "cube"
        elif n.target in SIZE_QUERIES:
            kind = "size"
        else:
            kind = "python" if reason == "python" else "fallback"
        self.steps.append(TorchStep(n, kind, reason))
        self.ready.add(n)


def plan(gm: fx.GraphModule, prefix_last: fx.Node | None = None) -> Planner:
    p = Planner(gm, prefix_last)
    p.run()
    return p


__all__ = ["plan", "Planner", "Segment", "SegmentStep", "TorchStep", "SymExpr", "Unsupported"]
