"""Lowering FX nodes into the open DVM segment: the half of fx_segments.Planner that builds DVM
graphs (the other half walks the FX graph and decides what to try).

A node's tensor arguments become values of the segment, new segment inputs, DVM views replayed on
the PyTorch value a chain of views starts from (replay_view), or rotate_half's roll as a slice of
one roll_blocks input (fx_rolled_blocks); each result is checked against PyTorch's fake value
(dtype, rank, sizes; a size equality DVM cannot decide becomes a run-time check of the segment).
A lowering that fails leaves the segment, its inputs and its checks as they were.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass, field

import torch
import torch.fx as fx

from ..fusion.reshape_push import offending_reshape
from ..graph import build
from ..graph.build import ShapeContext, reshape
from ..graph.node import Node
from ..graph.symbolic import decide_eq
from ..graph.views import split_chain
from . import aten_table as T
from . import fx_patterns, fx_rolled_blocks
from .aten_common import fake
from .aten_table import Unsupported
from .fx_rolled_blocks import RolledBlocks
from .fx_rotate_pairs import RotatedPairs
from .gpu_arrays import device_supported


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



def is_tensor(v) -> bool:
    return isinstance(v, torch.Tensor)


def arg_nodes(n: fx.Node) -> list:
    out: list = []
    fx.node.map_arg((n.args, n.kwargs), lambda a: out.append(a) or a)
    return out


class SegmentLowering:
    """Lowering into the open segment. The Planner subclass holds the state these methods read
    (gm, syms, open, segments, seg_of, rolled, roll_spans, torch_views, _new_views) and defines
    need_torch (a value PyTorch must have computed by this point of the plan)."""

    def dvm_arg(self, seg: Segment, a, new_inputs: list):
        if not isinstance(a, fx.Node):
            if isinstance(a, fx_patterns.HalfSigns):
                return self.extra_input(seg, a, None, new_inputs)
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
        if not is_tensor(v):
            raise Unsupported(f"argument {a.name} of type {type(v).__name__}")
        known = self._known_input(seg, a, new_inputs)
        if known is not None:
            return known
        r = self.rolled.get(a)
        if r is not None:
            signs = r.signs()
            rolled = self.rolled_blocks(seg, r, new_inputs) if isinstance(r, fx_patterns.Rolled) else None
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
        if not outs or not all(is_tensor(o) for o in outs):
            return "non-tensor result"
        if n.target in T.VIEW_OPS and not any(self.seg_of.get(a) is self.open and self.open is not None
                                              for a in arg_nodes(n)[:1]):
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
            self.need_torch(a.x if isinstance(a, (fx_patterns.Rolled, RolledBlocks, RotatedPairs)) else a)   # (HalfSigns: a no-op)
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
        (roll(r.x, r.h, r.axis), shaped as v), a RotatedPairs (rotate_pairs(r.x), shaped as v) or a
        HalfSigns (a constant tensor)."""
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
        if a.target is operator.getitem:
            return self._replay_piece(seg, a, new_inputs)
        src = a.args[0] if a.args else None
        handler = T.LOWERINGS.get(a.target)
        if a not in self.torch_views or handler is None or not isinstance(src, fx.Node) \
                or (src.target in T.CUBE_OPS and a.target in T.RESHAPE_OPS) or not is_tensor(fake(a)):
            return None

        def view() -> Node:
            args = self.dvm_arg(seg, a.args, new_inputs)
            kwargs = {k: self.dvm_arg(seg, v, new_inputs) for k, v in a.kwargs.items()}
            return handler(_Lower(seg.ctx, fake(a), self.syms), *args, **kwargs)
        return self._replayed(seg, a, new_inputs, view)

    def _replay_piece(self, seg: Segment, a: fx.Node, new_inputs: list) -> Node | None:
        """a = getitem(split, i) of a split PyTorch takes of a PyTorch value (split, chunk,
        split_with_sizes or unbind along a constant dim: GPT-NeoX's q / k / v, an MoE's gate and
        up halves) as the DVM slice (select) of the split's input that the piece is: the run graph
        then drops the split where nothing else reads its pieces. None where it is not such a piece."""
        split, i = a.args if len(a.args) == 2 else (None, None)
        piece = _piece_of(split, i) if split in self.torch_views else None
        if piece is None:
            return None
        src, dim, i, sizes = piece

        def view() -> Node:
            x = self.dvm_arg(seg, src, new_inputs)
            axis = dim % max(x.ndim, 1)
            if sizes is None:   # unbind
                return build.slice_view(seg.ctx, x, axis, i, 1, keep=False)
            start = sum(sizes[:i]) if isinstance(sizes, list) else i * self.dvm_arg(seg, sizes, new_inputs)
            return build.slice_view(seg.ctx, x, axis, start, self.syms.shape(fake(a))[axis], 1)
        return self._replayed(seg, a, new_inputs, view)

    def _replayed(self, seg: Segment, a: fx.Node, new_inputs: list, view) -> Node | None:
        """view() checked against a's PyTorch value and remembered as a's replayed view; where
        anything fails, new_inputs, the checks and the replayed views are left as they were (a
        stays a PyTorch input): None."""
        n_inputs, n_checks, views = len(new_inputs), len(seg.ctx.checks), dict(self._new_views)
        try:
            node = self.check(seg, view(), fake(a))
            if _copied(node):
                raise Unsupported("a view the kernels would copy")
        except Exception:  # noqa: BLE001 - any failure: a stays a PyTorch input
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


def _copied(node: Node) -> bool:
    """Whether node's chain of views needs a copy of part of it in the kernels (a reshape merging
    permuted axes: fusion.reshape_push.offending_reshape). Replayed on a PyTorch value, such a chain
    would copy it into a workspace every call, even where its strides make the view free; PyTorch's
    own view, a segment input, is strides the kernels load as they are."""
    return offending_reshape(split_chain(node)[1], 0) >= 0


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


def _piece_of(split, i) -> tuple | None:
    """(the split's input, dim, i, sizes) of an FX split, split_with_sizes or unbind node with a
    constant dim and index (sizes: split's size, an int or a SymInt node; split_with_sizes' int
    list; None for unbind), else None."""
    if not isinstance(split, fx.Node) or not isinstance(i, int) or split.kwargs or i < 0:
        return None
    args = split.args
    if not args or not isinstance(args[0], fx.Node):
        return None
    if split.target is T.aten.unbind.int:
        dim = args[1] if len(args) > 1 else 0
        return (args[0], dim, i, None) if isinstance(dim, int) else None
    if split.target not in (T.aten.split.Tensor, T.aten.split_with_sizes.default) or len(args) < 2:
        return None
    sizes, dim = args[1], args[2] if len(args) > 2 else 0
    if not isinstance(dim, int):
        return None
    if split.target is T.aten.split.Tensor:
        return (args[0], dim, i, sizes) if isinstance(sizes, fx.Node) or isinstance(sizes, int) and sizes > 0 \
            else None
    if isinstance(sizes, (list, tuple)) and all(isinstance(k, int) for k in sizes) and i < len(sizes):
        return args[0], dim, i, list(sizes)
    return None
