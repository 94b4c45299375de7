"""Run a planned ATen FX graph: PyTorch steps and DVM segments, in graph order.

Each segment is one CompiledGraph, built once per FX graph on symbolic sizes; all of its vector
kernels run in ONE VM launch (sequence stacking: CompiledGraph puts them in one Program). The
plan becomes a new FX graph (one node per PyTorch op, one per segment), and FX's code generator
turns it into straight-line Python, so a call pays no interpretation per step. A call binds
symbol values from the placeholders (SymInt arguments and tensor sizes); a segment launches on
its input tensors' data pointers (torch_launch). DVM adds no size guards; the shape facts
recorded while tracing are checked at each call (a clear ShapeError, never a wrong result).
"""
from __future__ import annotations

import collections
import operator
import time
from typing import Sequence

import torch
import torch.fx as fx
from torch.fx.graph import _BoxedCodeGen

from ..errors import ShapeError
from ..graph.build import permute
from ..graph.node import topo_order
from ..graph.symbolic import SymExpr, evaluate, free_symbols
from ..runtime import counters
from ..runtime.compiled import CompiledGraph
from .aten_table import Unsupported
from . import fx_sdpa
from .fx_patterns import HalfSigns, Rolled, half_signs
from .fx_segments import ROTATE_IN_TORCH, SegmentStep, TorchStep, fake, plan
from .torch_calls import fast_call, linear_folds
from .torch_launch import TensorLauncher

# DVM outputs are row-major; PyTorch's may follow an input's memory order (see torch_calls).
STORE_IN_TORCH_ORDER = False
COMPILED: collections.deque = collections.deque(maxlen=64)   # recent graphs, for explain


def _pure(step: TorchStep) -> bool:
    """A step without side effects: a view, a rotate_half's slices, neg and cat, or Python size
    arithmetic (`operator` functions on SymInts, and getitem). Other Python callables
    (higher-order ops such as with_effects) are not."""
    return step.kind == "view" or step.reason == ROTATE_IN_TORCH or \
        (step.kind == "python" and getattr(step.node.target, "__module__", None) in ("_operator", "operator"))


_CHECKED_MAX = 4096   # size tuples whose shape checks passed, remembered per segment


def _bare(d) -> str | None:
    if isinstance(d, torch.SymInt):
        expr = d.node.expr
        return str(expr) if expr.is_Symbol else None
    return None


def _stride_order(v) -> tuple | None:
    """The permutation that lists v's dims in PyTorch's memory order (None: row-major already)."""
    if not isinstance(v, torch.Tensor) or v.ndim < 2:
        return None
    try:
        sizes = [int(d.node.hint) if isinstance(d, torch.SymInt) else int(d) for d in v.shape]
        strides = [int(d.node.hint) if isinstance(d, torch.SymInt) else int(d) for d in v.stride()]
    except (TypeError, AttributeError):
        return None
    perm = tuple(sorted(range(v.ndim), key=lambda i: -strides[i]))
    if perm == tuple(range(v.ndim)):
        return None
    acc, expect = 1, [0] * v.ndim
    for i in reversed(perm):
        expect[i] = acc
        acc *= sizes[i]
    if any(sizes[i] > 1 and expect[i] != strides[i] for i in range(v.ndim)):
        return None          # not a dense permutation (expanded, overlapping): keep row-major
    # dims of size 1 keep their place: only the order of the others matters
    big = [i for i in perm if sizes[i] > 1]
    if big == sorted(big):
        return None
    return perm


def _emit_torch(g: fx.Graph, n: fx.Node, remap: dict, row_major: set) -> fx.Node:
    """n as a call in the run graph g (its arguments mapped through remap). row_major: the run
    graph's nodes whose tensors are row-major at run time (a plain view of one is added)."""
    first = remap.get(n.args[0]) if n.args and isinstance(n.args[0], fx.Node) else None
    target = fast_call(n.target, len(n.args), bool(n.kwargs), first in row_major)
    get = remap.__getitem__
    out = g.call_function(target, fx.map_arg(n.args, get), fx.map_arg(n.kwargs, get))
    if target is torch.Tensor.view:
        row_major.add(out)
    return out


class SegmentRunner:
    def __init__(self, seg, graph_syms: set):
        self.seg = seg
        nodes, self.out_map = [], []
        for fxn in seg.outputs:
            node = seg.value[fxn]
            if node.op == "input":
                self.out_map.append((fxn, True, node.attr("index"), None))
                continue
            perm = _stride_order(fake(fxn)) if STORE_IN_TORCH_ORDER else None
            inv = None
            if perm is not None:   # store in PyTorch's memory order, view back (costs a kernel)
                node = permute(seg.ctx, node, perm)
                inv = tuple(perm.index(i) for i in range(len(perm)))
            if node not in nodes:
                nodes.append(node)
            self.out_map.append((fxn, False, nodes.index(node), inv))
        needed: set = set()
        for node in topo_order(nodes):
            for d in node.shape:
                needed |= {s.name for s in free_symbols(d)}
            if node.op == "const" and isinstance(node.attr("value"), SymExpr):
                needed |= {s.name for s in free_symbols(node.attr("value"))}
        for c in seg.ctx.checks:
            needed |= {s.name for s in free_symbols(c.lhs) | free_symbols(c.rhs if c.rhs is not None else 0)}
        self.binds, bound = [], set(graph_syms)
        for i, node in enumerate(seg.input_nodes):
            for j, d in enumerate(node.shape):
                s = d.as_symbol() if isinstance(d, SymExpr) else None
                if s is not None and s.name not in bound:
                    self.binds.append((i, j, s.name))
                    bound.add(s.name)
        if needed - bound:
            raise Unsupported(f"sizes {sorted(needed - bound)} cannot be bound from the inputs")
        self.checks = list(seg.ctx.checks)
        self._checked: set = set()      # env value tuples (fixed key order) that passed the checks
        self.inputs = list(seg.inputs)
        self.outputs = [fxn for fxn, _, _, _ in self.out_map]   # run()'s results, in this order
        self.results = [(is_input, k, inv) for _, is_input, k, inv in self.out_map]
        # the launch's outputs are the results, in order: run() returns them as they come
        self._direct = self.results == [(False, k, None) for k in range(len(self.results))]
        t0 = time.perf_counter()
        self.graph = CompiledGraph(seg.input_nodes, nodes) if nodes else None
        self.compile_s = time.perf_counter() - t0
        # guarded: CompiledFx runs behind Dynamo's guards (see torch_launch.guarded_signature)
        self.launch = TensorLauncher(self.graph, guarded=True) if self.graph else None
        self.n_kernels = len(self.graph.templates) if self.graph else 0

    def check(self, env) -> None:
        """The shape facts recorded while tracing, once per distinct tuple of sizes."""
        key = tuple(env.values())      # the env's key order is fixed per graph and segment
        if key in self._checked:
            return
        for c in self.checks:
            lhs = evaluate(c.lhs, env)
            if (lhs == 0) if c.rhs is None else lhs != evaluate(c.rhs, env):
                raise ShapeError(f"dvm torch backend: {c.why} (sizes {env})")
        if len(self._checked) >= _CHECKED_MAX:
            self._checked.clear()
        self._checked.add(key)

    def run(self, env: dict, *tensors: torch.Tensor) -> Sequence[torch.Tensor]:
        """The segment's outputs (self.outputs' order) from its input tensors (self.inputs' order)."""
        if self.binds:
            env = dict(env)
            for i, j, name in self.binds:
                env[name] = tensors[i].shape[j]
        if self.checks:
            self.check(env)
        counters.bump_segment()
        outs = self.launch(env, tensors) if self.launch is not None else ()
        if self._direct:
            return outs
        # an input passed through is copied row-major, like every DVM output: later views work
        return tuple([tensors[k].clone(memory_format=torch.contiguous_format) if is_input
                      else outs[k] if inv is None else outs[k].permute(inv)
                      for is_input, k, inv in self.results])


def _signs_call(s: HalfSigns):
    """The run graph's call for a HalfSigns input (FX cannot print the key as an argument). The
    tensor is made at the first call, not here: the backend compiles under a fake tensor mode."""
    def signs() -> torch.Tensor:
        return half_signs(s)
    return signs


def _needed(steps: list, runners: dict, folds: dict, skip: set, output: fx.Node) -> set:
    """The FX nodes whose values the run graph reads: the output's arguments and those of every
    step it runs (a segment: its inputs; a segment run through PyTorch: its members' arguments).
    A view PyTorch would take only for segments that replay it (fx_segments.replay_view), or
    size arithmetic only such a view used, is not among them, and is not run."""
    needed: set = set()
    fx.node.map_arg(output.args, lambda a: needed.add(a) or a)
    for step in reversed(steps):
        if isinstance(step, SegmentStep):
            runner = runners[id(step)]
            if isinstance(runner, SegmentRunner):
                needed.update(x.x if isinstance(x, Rolled) else x for x in runner.inputs
                              if not isinstance(x, HalfSigns))
            else:
                for m in step.segment.members:
                    fx.node.map_arg((m.args, m.kwargs), lambda a: needed.add(a) or a)
        elif step.node not in skip and (not _pure(step) or step.node in needed):
            n = step.node
            if n in folds:
                needed.update(folds[n])
            else:
                fx.node.map_arg((n.args, n.kwargs), lambda a: needed.add(a) or a)
    return needed


class CompiledFx:
    """The callable returned to AOTAutograd for one ATen graph (boxed calling convention)."""

    def __init__(self, gm: fx.GraphModule, example_inputs, kind: str):
        t0 = time.perf_counter()
        # an instance attribute: AOTAutograd wraps the backward with functools.wraps, which
        # copies the instance __dict__ (a class attribute would be lost, and the call unboxed)
        self._boxed_call = True
        self.gm, self.kind = gm, kind
        self.placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        self.binds, syms = [], set()
        for i, ph in enumerate(self.placeholders):
            v = fake(ph)
            v = example_inputs[i] if v is None and i < len(example_inputs) else v
            dims = [(None, v)] if isinstance(v, torch.SymInt) else \
                list(enumerate(v.shape)) if isinstance(v, torch.Tensor) else []
            for j, d in dims:
                name = _bare(d)
                if name is not None and name not in syms:
                    self.binds.append((i, j, name))
                    syms.add(name)
        fx_sdpa.rewrite(gm)
        planner = plan(gm)
        g, remap = fx.Graph(), {}
        for ph in self.placeholders:
            remap[ph] = g.placeholder(ph.name)
        for n in gm.graph.nodes:
            if n.op == "get_attr":
                remap[n] = g.get_attr(n.target)
        used = sorted({i for i, _, _ in self.binds})
        env = g.call_function(self._size_binder(used), tuple(remap[self.placeholders[i]] for i in used))
        self.segments, self.torch_steps = [], []
        in_torch = {s.node for s in planner.steps if isinstance(s, TorchStep)}
        folds, skip = linear_folds(gm.graph.nodes, in_torch, fake)
        runners, row_major = {}, set()
        for step in planner.steps:
            if isinstance(step, SegmentStep):
                try:
                    runners[id(step)] = SegmentRunner(step.segment, syms)
                except Exception as e:  # the whole segment runs through PyTorch, with the reason
                    runners[id(step)] = e
        output = next(n for n in gm.graph.nodes if n.op == "output")
        needed = _needed(planner.steps, runners, folds, skip, output)
        for step in planner.steps:
            if isinstance(step, TorchStep):
                if _pure(step) and step.node not in needed:   # replayed, or rolled, in segments
                    counters.bump(f"torch_unused_{step.kind}_steps")
                    continue
                if step.node in folds:   # t + view + (add)mm + view: one F.linear (torch_calls)
                    remap[step.node] = g.call_function(torch.nn.functional.linear,
                                                       tuple(remap[a] for a in folds[step.node]))
                    row_major.add(remap[step.node])
                    counters.bump("torch_linear_folds")
                elif step.node not in skip:
                    remap[step.node] = _emit_torch(g, step.node, remap, row_major)
                self.torch_steps.append(step)
                counters.bump(f"{step.kind}:{step.node.target}" + (f":{step.reason}" if step.kind == "fallback" else ""))
                continue
            runner = runners[id(step)]
            if isinstance(runner, Exception):
                e = runner
                for n in step.segment.members:
                    remap[n] = _emit_torch(g, n, remap, row_major)
                    ts = TorchStep(n, "fallback", f"segment not compiled: {type(e).__name__}: {e}")
                    self.torch_steps.append(ts)
                    counters.bump(f"fallback:{n.target}:{ts.reason}")
                continue
            for x in runner.inputs:   # inputs computed for segments only (fx_patterns)
                if isinstance(x, Rolled) and x not in remap:   # rotate_half's halves swapped
                    remap[x] = g.call_function(torch.roll, (remap[x.x], x.h, x.axis))
                    counters.bump("torch_rotate_half_rolls")
                elif isinstance(x, HalfSigns) and x not in remap:
                    remap[x] = g.call_function(_signs_call(x), ())
            call = g.call_function(runner.run, (env, *[remap[x] for x in runner.inputs]))
            for k, fxn in enumerate(runner.outputs):
                remap[fxn] = g.call_function(operator.getitem, (call, k))
                if runner.results[k][2] is None:   # stored row-major (not permuted back)
                    row_major.add(remap[fxn])
            self.segments.append(runner)
            counters.bump("torch_segments")
            for kind in step.segment.patterns:
                counters.bump(f"torch_pattern:{kind}")
        g.output(fx.map_arg(output.args[0], remap.__getitem__))
        g.set_codegen(_BoxedCodeGen())
        # straight-line Python from FX's code generator: one call per PyTorch op or DVM segment
        self.runner = fx.GraphModule(gm, g, class_name="DvmRunner")
        self._forward = self.runner.forward
        self.compile_s = time.perf_counter() - t0
        counters.bump("torch_graphs_compiled")
        COMPILED.append(self)

    def _size_binder(self, used: list[int]):
        """bind_sizes(*the placeholders listed in used) -> the size symbols' values."""
        binds = [(used.index(i), j, name) for i, j, name in self.binds]

        def bind_sizes(*args) -> dict:
            """The graph's size symbols from its arguments (SymInts and tensor sizes)."""
            return {name: int(args[i]) if j is None else args[i].shape[j] for i, j, name in binds}
        return bind_sizes

    def __call__(self, *args):
        # boxed (one list, cleared by the generated code to free inputs early) or plain arguments
        return self._forward(args[0] if len(args) == 1 and isinstance(args[0], list) else list(args))

    # -- explain --------------------------------------------------------------------------------
    def describe(self) -> str:
        lines = [f"{self.kind} graph: {len(self.segments)} DVM segment(s), "
                 f"{sum(s.n_kernels for s in self.segments)} vector kernel(s), "
                 f"{sum(1 for s in self.torch_steps if s.kind == 'cube')} cube kernel(s) through PyTorch, "
                 f"{sum(1 for s in self.torch_steps if s.kind == 'fallback')} fallback op(s); "
                 f"backend compile {self.compile_s * 1e3:.1f} ms"]
        for i, s in enumerate(self.segments):
            ops = collections.Counter(str(n.target).replace("aten.", "").replace(".default", "")
                                      for n in s.seg.members)
            lines.append(f"  segment {i}: {s.n_kernels} vector kernel(s) in ONE launch (sequence-stacked), "
                         f"{len(s.inputs)} in / {len(s.out_map)} out; ops: "
                         + ", ".join(f"{k}x{v}" if v > 1 else k for k, v in ops.items()))
            rolls = sum(isinstance(x, Rolled) for x in s.inputs)
            if rolls:
                lines.append(f"    rotate_half of a PyTorch value x{rolls}: roll(x) by PyTorch, "
                             "the halves' signs applied here")
            if s.seg.views:
                views = collections.Counter(str(n.target).replace("aten.", "").replace(".default", "")
                                            for n in s.seg.views)
                lines.append("    views of PyTorch values replayed here: "
                             + ", ".join(f"{k}x{v}" if v > 1 else k for k, v in views.items()))
            if s.seg.patterns:
                pats = collections.Counter(s.seg.patterns)
                lines.append("    recognized: " + ", ".join(f"{k} x{v}" for k, v in sorted(pats.items())))
            if s.graph is not None:
                for g in s.graph.plan.groups:
                    lines.append("    " + g.describe())
        reasons = collections.Counter((str(s.node.target), s.reason) for s in self.torch_steps if s.kind == "fallback")
        for (op, why), k in sorted(reasons.items()):
            lines.append(f"  fallback {op} x{k}: {why}")
        chosen = collections.Counter((str(s.node.target), s.reason) for s in self.torch_steps if s.kind == "torch")
        for (op, why), k in sorted(chosen.items()):
            lines.append(f"  pytorch {op} x{k}: {why}")
        cubes = collections.Counter(str(s.node.target) for s in self.torch_steps if s.kind == "cube")
        for op, k in sorted(cubes.items()):
            lines.append(f"  cube {op} x{k}: executed by PyTorch (BLAS)")
        return "\n".join(lines)
