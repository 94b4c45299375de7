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
from dataclasses import dataclass, field

import torch
import torch.fx as fx

from ..graph.build import ShapeContext, reshape
from ..graph.node import Node
from ..graph.symbolic import SymExpr, decide_eq
from . import aten_table as T
from . import (fx_attention, fx_attention_bias, fx_attention_math, fx_lone_gelu, fx_patterns, fx_rolled_blocks,
               fx_sdpa, fx_sibling_linears, fx_updates)
from .aten_common import fake
from .aten_table import Unsupported
from .fx_rolled_blocks import RolledBlocks
from .fx_syms import Syms
from .gpu_arrays import device_supported


# -- plan ---------------------------------------------------------------------------------------
@dataclass
class Segment:
    index: int
    members: list = field(default_factory=list)      # FX nodes lowered into this segment
    value: dict = field(default_factory=dict)        # FX node -> Node | tuple of Nodes
    inputs: list = field(default_factory=list)       # FX nodes (torch values) flowing in
    input_nodes: list = field(default_factory=list)  # their 'input' Nodes
    outputs: list = field(default_factory=list)      # FX nodes PyTorch needs later
    ctx: ShapeContext = field(default_factory=ShapeContext)
    closed: bool = False
    patterns: list = field(default_factory=list)     # recognized patterns lowered here (explain)
    views: dict = field(default_factory=dict)        # PyTorch view FX node -> its Node here
    writes: list = field(default_factory=list)       # (copy_ FX node, value, graph input it updates)


ROTATE_IN_TORCH = "rotate_half of a PyTorch value: neg + cat in PyTorch, products fused"


@dataclass
class TorchStep:
    node: fx.Node
    kind: str      # "fallback", "view", "cube", "python", "torch" (a planning choice, with reason)
    reason: str = ""


@dataclass
class SegmentStep:
    segment: Segment


def _is_tensor(v) -> bool:
    return isinstance(v, torch.Tensor)


def _arg_nodes(n: fx.Node) -> list:
    out: list = []
    fx.node.map_arg((n.args, n.kwargs), lambda a: out.append(a) or a)
    return out


# the attention calls the fx rewrites put in the graph: PyTorch steps, with their reasons
_ATTENTION_CALLS = {fx_sdpa.sdpa_keep_mask: fx_sdpa.REASON, fx_attention.attention_nan_rows: fx_attention.REASON,
                    fx_attention_bias.attention_biased: fx_attention_bias.REASON,
                    fx_attention_math.attention_guarded: fx_attention_math.REASON}


class Planner:
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
        self.rolled: dict = {}          # rotate_half cat of a PyTorch value -> fx_patterns.Rolled
        self._new_views: dict = {}      # views replayed by the lowering being tried
        self.matches = fx_patterns.find(gm)               # root FX node -> Match
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
            for x in _arg_nodes(a):
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

    # -- lowering -----------------------------------------------------------------------------
    def dvm_arg(self, seg: Segment, a, new_inputs: list):
        if not isinstance(a, fx.Node):
            if isinstance(a, (list, tuple)):
                return type(a)(self.dvm_arg(seg, x, new_inputs) for x in a)
            if isinstance(a, torch.SymInt):
                return self.syms.dim(a)
            return a
        v = getattr(self.gm, a.target) if a.op == "get_attr" else fake(a)
        if seg.value.get(a) is not None and self.seg_of.get(a) is seg:
            return seg.value[a]
        if isinstance(v, (torch.SymInt, int)) and not isinstance(v, bool):
            return self.syms.dim(v)
        if isinstance(v, (float, bool)) or v is None:
            raise Unsupported(f"argument {a.name} is a {type(v).__name__} computed in the graph")
        if not _is_tensor(v):
            raise Unsupported(f"argument {a.name} of type {type(v).__name__}")
        known = self._known_input(seg, a, new_inputs)
        if known is not None:
            return known
        r = self.rolled.get(a)
        if r is not None:
            signs = r.signs()
            rolled = self.rolled_blocks(seg, r, new_inputs)
            if rolled is None:
                rolled = self.extra_input(seg, r, fake(r.cat), new_inputs)
            return r.signed(seg.ctx, rolled, None if signs is None else self.extra_input(seg, signs, None, new_inputs))
        view = self.replay_view(seg, a, new_inputs)
        if view is not None:
            return view
        why = device_supported(v.device)
        if why is not None:
            raise Unsupported(why)
        return self._new_input(seg, a, v.dtype, self.syms.shape(v), a.name, new_inputs)

    @staticmethod
    def _known_input(seg: Segment, key, new_inputs: list) -> Node | None:
        """seg's input Node for key (an FX node, a Rolled or a HalfSigns), committed or new in the
        lowering being tried; None if it has none."""
        if key in seg.inputs:
            return seg.input_nodes[seg.inputs.index(key)]
        for na, node in new_inputs:
            if na == key:
                return node
        return None

    @staticmethod
    def _new_input(seg: Segment, key, dtype: torch.dtype, shape: tuple, name: str, new_inputs: list) -> Node:
        node = Node.make("input", T.dvm_dtype(dtype), shape, index=len(seg.inputs) + len(new_inputs), name=name)
        new_inputs.append((key, node))
        return node

    def try_lower(self, n: fx.Node, match=None) -> str | None:
        """Lower n (or the pattern `match` rooted at n) into the open segment; the reason it
        could not, or None."""
        handler = match.lower if match is not None else T.LOWERINGS.get(n.target)
        if handler is None:
            return "not in table"
        out = fake(n)
        outs = out if isinstance(out, (tuple, list)) else (out,)
        if not outs or not all(_is_tensor(o) for o in outs):
            return "non-tensor result"
        if n.target in T.VIEW_OPS and not any(self.seg_of.get(a) is self.open and self.open is not None
                                              for a in _arg_nodes(n)[:1]):
            return "view"
        seg = self.open or Segment(len(self.segments))
        new_inputs: list = []
        self._new_views = {}
        n_checks = len(seg.ctx.checks)
        try:
            for o in outs:
                T.dvm_dtype(o.dtype)
                why = device_supported(o.device)
                if why is not None:
                    raise Unsupported(why)
            lw = _Lower(seg.ctx, out, self.syms)
            args = self.dvm_arg(seg, match.args if match is not None else n.args, new_inputs)
            kwargs = {} if match is not None else \
                {k: self.dvm_arg(seg, v, new_inputs) for k, v in n.kwargs.items()}
            result = handler(lw, *args, **kwargs)
            results = result if isinstance(result, tuple) else (result,)
            if len(results) != len(outs):
                raise Unsupported("output count")
            results = tuple(self.check(seg, r, o) for r, o in zip(results, outs))
        except Unsupported as e:
            del seg.ctx.checks[n_checks:]
            return str(e)
        except Exception as e:  # DVM's DTypeError / ShapeError and the like: PyTorch decides
            del seg.ctx.checks[n_checks:]
            return f"{type(e).__name__}: {e}"
        if self.open is None:
            self.open = seg
            self.segments.append(seg)
        for a, node in new_inputs:
            self.need_torch(a.x if isinstance(a, (fx_patterns.Rolled, RolledBlocks)) else a)   # (HalfSigns: a no-op)
            seg.inputs.append(a)
            seg.input_nodes.append(node)
        seg.views.update(self._new_views)
        seg.members.append(n)
        seg.value[n] = results if isinstance(out, (tuple, list)) else results[0]
        self.seg_of[n] = seg
        if match is not None:
            seg.patterns.append(match.kind)
        return None

    def extra_input(self, seg: Segment, key, v, new_inputs: list) -> Node:
        """The segment input for a value the run graph computes for segments only: a Rolled
        (roll(r.x, r.h, r.axis), shaped as v) or a HalfSigns (a constant tensor)."""
        known = self._known_input(seg, key, new_inputs)
        if known is not None:
            return known
        if isinstance(key, fx_patterns.HalfSigns):
            return self._new_input(seg, key, key.dtype, (2 * key.h,) + (1,) * key.trailing, "half_signs", new_inputs)
        return self._new_input(seg, key, v.dtype, self.syms.shape(v), f"roll_{key.x.name}", new_inputs)

    def rolled_blocks(self, seg: Segment, r, new_inputs: list) -> Node | None:
        """rotate_half's roll r as a slice of the heads of one roll_blocks input of its base
        (fx_rolled_blocks); None where its views do not allow it or DVM cannot take it."""
        found = fx_rolled_blocks.blocks_of(r, self.roll_spans)
        if found is None:
            return None
        key, heads, start, end = found
        v, n_inputs, n_checks = fake(r.x), len(new_inputs), len(seg.ctx.checks)
        try:
            node = self._known_input(seg, key, new_inputs)
            if node is None:
                shape = list(self.syms.shape(v))
                shape[heads] = (key.hi - key.lo) // key.block
                node = self._new_input(seg, key, v.dtype, tuple(shape), f"roll_blocks_{key.x.name}", new_inputs)
            if (start, end) != (0, node.shape[heads]):
                node = T.LOWERINGS[torch.ops.aten.slice.Tensor](_Lower(seg.ctx, v, self.syms), node, heads, start, end)
            return self.check(seg, node, v)
        except Exception:  # noqa: BLE001 - any failure: the roll and its views stay PyTorch's
            del new_inputs[n_inputs:]
            del seg.ctx.checks[n_checks:]
            return None

    def replay_view(self, seg: Segment, a: fx.Node, new_inputs: list) -> Node | None:
        """a, a view PyTorch takes of a PyTorch value, as a DVM view in seg of that value (or of
        the value a chain of such views starts from), instead of a segment input: the run graph
        then skips the PyTorch call where nothing else needs the view (CompiledFx). None where it
        is not such a view or DVM cannot take it (then a is an input, as before). A reshape of a
        matmul's result stays an input: the run graph may fold it into F.linear (torch_calls)."""
        for known in (seg.views, self._new_views):
            if a in known:
                return known[a]
        src = a.args[0] if a.args else None
        handler = T.LOWERINGS.get(a.target)
        if a not in self.torch_views or handler is None or not isinstance(src, fx.Node) \
                or (src.target in T.CUBE_OPS and a.target in T.RESHAPE_OPS) or not _is_tensor(fake(a)):
            return None
        n_inputs, n_checks, views = len(new_inputs), len(seg.ctx.checks), dict(self._new_views)
        try:
            args = self.dvm_arg(seg, a.args, new_inputs)
            kwargs = {k: self.dvm_arg(seg, v, new_inputs) for k, v in a.kwargs.items()}
            node = self.check(seg, handler(_Lower(seg.ctx, fake(a), self.syms), *args, **kwargs), fake(a))
        except Exception:  # noqa: BLE001 - any failure: the view stays a PyTorch input
            del new_inputs[n_inputs:]
            del seg.ctx.checks[n_checks:]
            self._new_views = views
            return None
        self._new_views[a] = node
        return node

    def check(self, seg: Segment, r: Node, o: torch.Tensor) -> Node:
        if not isinstance(r, Node):
            raise Unsupported("handler result")
        if r.dtype is not T.dvm_dtype(o.dtype):
            raise Unsupported(f"dtype rule gives {r.dtype.short}, PyTorch {o.dtype}")
        shape = self.syms.shape(o)
        if len(shape) != r.ndim:
            if decide_eq(_numel(shape), _numel(r.shape)) is not True:
                raise Unsupported(f"rank {r.ndim}, PyTorch {len(shape)}")
            return reshape(seg.ctx, r, shape)
        for a, b in zip(r.shape, shape):
            if decide_eq(a, b) is False:
                raise Unsupported(f"shape {r.shape}, PyTorch {shape}")
            if decide_eq(a, b) is None:
                seg.ctx.require_eq(a, b, f"shape of {r!r} against PyTorch's {shape}")
        return r

    # -- the walk -----------------------------------------------------------------------------
    def run(self) -> None:
        for n in self.gm.graph.nodes:
            if n.op == "placeholder" or n.op == "get_attr":
                self.ready.add(n)
            elif n.op == "output":
                for a in _arg_nodes(n):
                    self.need_torch(a)
            elif n.op == "call_function":
                self.visit(n)
                if n is self.prefix_last:
                    self.close()
            else:
                raise Unsupported(f"FX op {n.op}")
        if self.open is not None and self.open.writes:   # its results go into inputs only
            self.close()
        self.steps = [x for step in self.steps for x in self._lone_gelu_in_torch(step)]

    def _lone_gelu_in_torch(self, step) -> list:
        """[step], or, for a segment that computes one exact GELU of a PyTorch value and takes
        views of it, that GELU and those views as PyTorch steps (fx_lone_gelu)."""
        seg = step.segment if isinstance(step, SegmentStep) else None
        if seg is None or seg.writes or not fx_lone_gelu.ENABLED or not fx_lone_gelu.lone_gelu(seg):
            return [step]
        self.segments.remove(seg)
        out = []
        for m in seg.members:
            del self.seg_of[m]
            if m.target in T.VIEW_OPS:
                self.torch_views.add(m)
                out.append(TorchStep(m, "view"))
            else:
                out.append(TorchStep(m, "torch", fx_lone_gelu.REASON))
            self.ready.add(m)
        return out

    def visit(self, n: fx.Node) -> None:
        if n in self.absorbed:          # computed by its match's root (or planned there)
            return
        match = self.matches.get(n)
        if match is not None:
            if match.rotate and not (self.open is not None and self.seg_of.get(match.args[0]) is self.open):
                return self.rotate_in_torch(n, match)
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
        applies the halves' signs (fx_patterns.Rolled); the slices, neg and cat are planned in
        PyTorch too, for any other reader (the run graph drops them where there is none). The
        products stay fused. (The flip form reads rows of d/2 elements, which the VM pays per
        row: slower than a PyTorch cat at every length measured.)"""
        rotate = set(match.rotate)
        r = fx_patterns.rolled(match.rotate[0])
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
        for a in _arg_nodes(n):
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
        cuts = self.open is not None and any(self.seg_of.get(a) is self.open for a in _arg_nodes(n))
        for a in _arg_nodes(n):
            self.need_torch(a)
        if n.target in T.VIEW_OPS and not cuts:
            kind = "view"
            self.torch_views.add(n)
        elif n.target in T.CUBE_OPS:
            kind = "cube"
        else:
            kind = "python" if reason == "python" else "fallback"
        self.steps.append(TorchStep(n, kind, reason))
        self.ready.add(n)


def _numel(shape):
    out = 1
    for d in shape:
        out = out * d
    return out


class _Lower:
    """What a table handler sees: the shape context and PyTorch's result for the node."""
    __slots__ = ("ctx", "out", "syms")

    def __init__(self, ctx, out, syms):
        self.ctx, self.out, self.syms = ctx, out, syms

    @property
    def out_shape(self) -> tuple:
        return self.syms.shape(self.out)

    def element(self, i: int) -> "_Lower":
        """What a handler sees for result i of a list-returning op (a _foreach_ op)."""
        return _Lower(self.ctx, self.out[i], self.syms)


def plan(gm: fx.GraphModule, prefix_last: fx.Node | None = None) -> Planner:
    p = Planner(gm, prefix_last)
    p.run()
    return p


__all__ = ["plan", "Planner", "Segment", "SegmentStep", "TorchStep", "SymExpr", "Unsupported"]
