"""Run a planned ATen FX graph: PyTorch steps and DVM segments, in graph order.

Each segment is one CompiledGraph, built once per FX graph on symbolic sizes; all of its vector
kernels run in ONE VM launch (sequence stacking: CompiledGraph puts them in one Program). The
plan becomes a new FX graph (one node per PyTorch op, one per segment), and FX's code generator
turns it into straight-line Python, so a call pays no interpretation per step. A call binds
symbol values from the placeholders (SymInt arguments and tensor sizes); a segment launches on
its input tensors' data pointers (torch_launch). DVM adds no size guards; the shape facts
recorded while tracing are checked at each call (a clear ShapeError, never a wrong result).
Segments run as torch_segment.SegmentRunner. The steps computing values that depend on sizes
only (fx_sizeonly: HF's positions and causal mask) go into a function of their own, called
through a cache keyed by the size values (SizeConsts) at the start of the run graph.
"""
from __future__ import annotations

import collections
import operator
import time

import torch
import torch.fx as fx
from torch.fx.graph import _BoxedCodeGen

from ..runtime import counters
from . import (fx_attention, fx_attention_bias, fx_attention_math, fx_clones, fx_const_index, fx_cse,
               fx_product_activation, fx_reinplace, fx_sdpa, fx_sibling_linears, fx_view_chains)
from .aten_common import SIZE_QUERIES, fake
from .fx_const_layout import output_in_read_order
from .fx_patterns import HalfSigns, Rolled, half_signs
from .fx_rolled_blocks import RolledBlocks, roll_blocks
from .fx_rotate_pairs import RotatedPairs, rotate_pairs
from .fx_segments import ROTATE_IN_TORCH, SegmentStep, TorchStep, plan
from .fx_sizeonly import SizeConsts, move_first, size_args, size_only
from .torch_calls import ROW_MAJOR_RESULTS, fast_call, identity_of, linear_activation, linear_folds, linear_kxm
from .torch_segment import SegmentRunner

COMPILED: collections.deque = collections.deque(maxlen=64)   # recent graphs, for explain


def _pure(step: TorchStep) -> bool:
    """A step without side effects: a view, a rotate_half's slices, neg and cat, a size query, or
    Python size arithmetic (`operator` functions on SymInts, and getitem). Other Python callables
    (higher-order ops such as with_effects) are not."""
    return step.kind == "view" or step.reason == ROTATE_IN_TORCH or step.node.target in SIZE_QUERIES or \
        (step.kind == "python" and getattr(step.node.target, "__module__", None) in ("_operator", "operator"))


def _bare(d) -> str | None:
    if isinstance(d, torch.SymInt):
        expr = d.node.expr
        return str(expr) if expr.is_Symbol else None
    return None


def _emit_torch(g: fx.Graph, n: fx.Node, remap: dict, row_major: set) -> fx.Node:
    """n as a call in the run graph g (its arguments mapped through remap). row_major: the run
    graph's nodes whose tensors are row-major at run time (a plain view of one is added)."""
    first = remap.get(n.args[0]) if n.args and isinstance(n.args[0], fx.Node) else None
    target = fast_call(n.target, n.args, bool(n.kwargs), first in row_major)
    get = remap.__getitem__
    out = g.call_function(target, fx.map_arg(n.args, get), fx.map_arg(n.kwargs, get))
    if target is torch.Tensor.view or target in ROW_MAJOR_RESULTS:
        row_major.add(out)
    return out


def _drop_unread(g: fx.Graph, droppable: set) -> None:
    """Erase the calls of droppable (steps without effects: _pure) whose values nothing
    in g reads (a step found needed through a reader whose call reads another node)."""
    for n in reversed(list(g.nodes)):
        if n in droppable and not n.users:
            g.erase_node(n)
            counters.bump("torch_unread_steps_dropped")


def _signs_call(s: HalfSigns):
    """The run graph's call for a HalfSigns input (FX cannot print the key as an argument). The
    tensor is made at the first call, not here: the backend compiles under a fake tensor mode."""
    def signs() -> torch.Tensor:
        return half_signs(s)
    return signs


def _reads(step, runners: dict, folds: dict) -> list:
    """The FX nodes whose values a step reads: a segment's inputs (a segment run through PyTorch:
    its members' arguments), an F.linear fold's operands, a PyTorch op's arguments."""
    out: list = []
    if isinstance(step, SegmentStep):
        runner = runners[id(step)]
        if isinstance(runner, SegmentRunner):
            return [x.x if isinstance(x, (Rolled, RolledBlocks, RotatedPairs)) else x
                    for x in runner.inputs if not isinstance(x, HalfSigns)] + \
                runner.write_dsts
        for m in step.segment.members + [n for n, _, _ in step.segment.writes]:
            fx.node.map_arg((m.args, m.kwargs), lambda a: out.append(a) or a)
        return out
    if step.node in folds:
        return folds[step.node].reads()
    fx.node.map_arg((step.node.args, step.node.kwargs), lambda a: out.append(a) or a)
    return out


def _needed(steps: list, runners: dict, folds: dict, skip: set, output: fx.Node) -> set:
    """The FX nodes whose values the run graph reads: the output's arguments and those of every
    step it runs. A view PyTorch would take only for segments that replay it
    (fx_segment_lower.replay_view), or size arithmetic only such a view used, is not among them, and
    is not run."""
    needed: set = set()
    fx.node.map_arg(output.args, lambda a: needed.add(a) or a)
    for step in reversed(steps):   # (only later steps read a step's values)
        if _emits(step, skip, needed):
            needed.update(_reads(step, runners, folds))
    return needed


def _emits(step, skip: set, needed: set) -> bool:
    """The step becomes a call of the run graph (a pure step whose value nothing reads does not)."""
    return isinstance(step, SegmentStep) or (step.node not in skip and (not _pure(step) or step.node in needed))


def _made(step) -> list:
    return step.segment.members if isinstance(step, SegmentStep) else [step.node]


def _weights(placeholders: list) -> frozenset:
    """The placeholders of an inference graph that are parameters or buffers (AOTAutograd's
    static inputs, from the tracing context of the graph being compiled)."""
    ctx = torch._guards.TracingContext.try_get()
    static = getattr(getattr(ctx, "fw_metadata", None), "static_input_indices", None) or ()
    return frozenset(placeholders[i] for i in static
                     if i < len(placeholders) and isinstance(fake(placeholders[i]), torch.Tensor))


def _prefix(steps: list, consts: set, inputs: list, output: fx.Node, emit: "_Emitter") -> tuple[list, list]:
    """The steps that make only size-only values (consts) from inputs (sizes, weights) and earlier
    such steps, and the values of theirs that the other steps (those emitted) or the graph's
    output read."""
    avail, prefix = set(inputs), []
    for step in steps:
        made = _made(step)
        if all(n in consts for n in made) and all(a in avail for a in emit.reads(step)):
            prefix.append(step)
            avail.update(made)
    ids = {id(step) for step in prefix}
    later = [a for step in steps if id(step) not in ids and emit.emits(step) for a in emit.reads(step)]
    fx.node.map_arg(output.args, lambda a: later.append(a) or a)
    inputs = set(inputs)
    return prefix, [a for a in dict.fromkeys(later) if a in avail and a not in inputs]


class _Emitter:
    """Emits planned steps as calls in a run graph (the main one, or the size-consts function)."""

    def __init__(self, runners: dict, folds: dict, skip: set, needed: set, owner: "CompiledFx"):
        self.runners, self.folds, self.skip, self.needed, self.owner = runners, folds, skip, needed, owner
        self.row_major: set = set()   # run-graph nodes whose tensors are row-major at run time
        self.droppable: set = set()   # run-graph calls without effects (_drop_unread)

    def reads(self, step) -> list:
        return _reads(step, self.runners, self.folds)

    def emits(self, step) -> bool:
        return _emits(step, self.skip, self.needed)

    def __call__(self, step, g: fx.Graph, remap: dict, env: fx.Node, row_major: set | None = None) -> None:
        row_major = self.row_major if row_major is None else row_major
        if isinstance(step, TorchStep):
            self.torch_step(step, g, remap, row_major)
            return
        runner = self.runners[id(step)]
        if isinstance(runner, Exception):
            for n in step.segment.members:
                remap[n] = _emit_torch(g, n, remap, row_major)
                ts = TorchStep(n, "fallback", f"segment not compiled: {type(runner).__name__}: {runner}")
                self.owner.torch_steps.append(ts)
                counters.bump(f"fallback:{n.target}:{ts.reason}")
            for n, _, _ in step.segment.writes:
                remap[n] = _emit_torch(g, n, remap, row_major)
            return
        for x in runner.inputs:   # inputs computed for segments only (fx_patterns)
            if isinstance(x, Rolled) and x not in remap:   # rotate_half's halves swapped
                remap[x] = g.call_function(torch.roll, (remap[x.x], x.h, x.axis))
                counters.bump("torch_rotate_half_rolls")
            elif isinstance(x, RolledBlocks) and x not in remap:   # ... in every head of x at once
                remap[x] = g.call_function(roll_blocks, (remap[x.x], x.h, x.block, x.lo, x.hi, x.moves))
                counters.bump("torch_rotate_half_block_rolls")
            elif isinstance(x, RotatedPairs) and x not in remap:   # an interleaved rotate of x, whole
                remap[x] = g.call_function(rotate_pairs, (remap[x.x], x.negs))
                counters.bump("torch_rotate_pairs")
            elif isinstance(x, HalfSigns) and x not in remap:
                remap[x] = g.call_function(_signs_call(x), ())
        call = g.call_function(runner.run, (env, *[remap[x] for x in runner.inputs],
                                            *[remap[x] for x in runner.write_dsts]))
        for k, fxn in enumerate(runner.outputs):
            remap[fxn] = g.call_function(operator.getitem, (call, k))
            if runner.results[k][2] is None:   # stored row-major (not permuted back)
                row_major.add(remap[fxn])
        self.owner.segments.append(runner)
        counters.bump("torch_segments")
        for kind in step.segment.patterns:
            counters.bump(f"torch_pattern:{kind}")

    def torch_step(self, step: TorchStep, g: fx.Graph, remap: dict, row_major: set) -> None:
        n = step.node
        if _pure(step) and n not in self.needed:   # replayed, or rolled, in segments
            counters.bump(f"torch_unused_{step.kind}_steps")
            return
        if n in self.folds:   # t + view + (add)mm + view: one F.linear (torch_calls)
            fold = self.folds[n]
            args = tuple(remap[a] for a in fold.reads())
            if fold.activation is not None:
                remap[n] = g.call_function(linear_activation, args, dict(fold.activation, kxm=fold.stored_kxm))
            else:
                remap[n] = g.call_function(linear_kxm if fold.stored_kxm else torch.nn.functional.linear, args)
            row_major.add(remap[n])
            counters.bump("torch_linear_folds")
        elif n not in self.skip:
            same = identity_of(n, fake)
            if same is not None:
                remap[n] = remap[same]
                counters.bump("torch_identity_views")
            else:
                remap[n] = _emit_torch(g, n, remap, row_major)
                if _pure(step):
                    self.droppable.add(remap[n])
        self.owner.torch_steps.append(step)
        counters.bump(f"{step.kind}:{n.target}" + (f":{step.reason}" if step.kind == "fallback" else ""))


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
        fx_attention.rewrite(gm)
        fx_attention_bias.rewrite(gm)
        fx_sdpa.rewrite(gm)
        fx_attention_math.guard(gm)
        fx_clones.rewrite(gm)
        fx_const_index.rewrite(gm)
        weights = _weights(self.placeholders) if kind == "inference" else frozenset()
        fx_sibling_linears.rewrite(gm, weights)
        fx_product_activation.rewrite(gm)
        fx_cse.rewrite(gm)
        consts = size_only(gm, weights)
        move_first(gm, consts)
        planner = plan(gm, consts[-1] if consts else None)
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
        runners, launchers, env_names = {}, {}, [name for _, _, name in self.binds]
        for step in planner.steps:
            if isinstance(step, SegmentStep):
                try:
                    runners[id(step)] = SegmentRunner(step.segment, env_names, launchers)
                except Exception as e:  # the whole segment runs through PyTorch, with the reason
                    runners[id(step)] = e
        output = next(n for n in gm.graph.nodes if n.op == "output")
        self._emit = _Emitter(runners, folds, skip, _needed(planner.steps, runners, folds, skip, output), self)
        prefix = self._size_consts(gm, planner.steps, set(consts), weights, env, g, remap, output)
        for step in planner.steps:
            if id(step) not in prefix:
                self._emit(step, g, remap, env)
        g.output(fx.map_arg(output.args[0], remap.__getitem__))
        _drop_unread(g, self._emit.droppable | {env})   # (bind_sizes: no segment may read it)
        fx_view_chains.merge_views(g)
        self.view_chains = fx_view_chains.fold(g)
        self.scatters_in_place = fx_reinplace.rewrite(g)
        g.set_codegen(_BoxedCodeGen())
        # straight-line Python from FX's code generator: one call per PyTorch op or DVM segment
        self.runner = fx.GraphModule(gm, g, class_name="DvmRunner")
        self._forward = self.runner.forward
        self.compile_s = time.perf_counter() - t0
        counters.bump("torch_graphs_compiled")
        COMPILED.append(self)

    def _size_consts(self, gm, steps: list, consts: set, weights: frozenset, env: fx.Node, g: fx.Graph,
                     remap: dict, output: fx.Node) -> set:
        """Emit the steps that compute size-only values (fx_sizeonly; from sizes and weights) into
        a function of their own, called through a SizeConsts cache at the start of g; the values
        other steps read are mapped to its results. Returns the ids of those steps."""
        self.consts, self.n_const_segments, self.n_const_torch_steps = None, 0, 0
        sizes = size_args(gm)
        prefix, frontier = _prefix(steps, consts, [*sizes, *weights], output, self._emit)
        if not frontier:
            return set()
        read = {a for step in prefix for a in self._emit.reads(step)}
        read_weights = [ph for ph in self.placeholders if ph in weights and ph in read]   # (graph order)
        args = [*sizes, *read_weights]
        pg, premap, row_major = fx.Graph(), {}, set()
        penv = pg.placeholder("env")
        for ph in args:
            premap[ph] = pg.placeholder(ph.name)
        for step in prefix:
            self._emit(step, pg, premap, penv, row_major)
        self.n_const_segments, self.n_const_torch_steps = len(self.segments), len(self.torch_steps)
        orders = output_in_read_order(pg, frontier, premap, steps, self._emit.runners)
        self.consts = SizeConsts(fx.GraphModule(gm, pg, class_name="DvmSizeConsts").forward, len(prefix),
                                 len(sizes), len(read_weights))
        call = g.call_function(self.consts, (env, *[remap[ph] for ph in args]))
        for k, a in enumerate(frontier):
            remap[a] = g.call_function(operator.getitem, (call, k))
            if premap[a] in row_major and orders[k] is None:
                self._emit.row_major.add(remap[a])
        counters.bump("torch_size_consts_steps", len(prefix))
        return {id(step) for step in prefix}

    def _size_binder(self, used: list[int]):
        """bind_sizes(*the placeholders listed in used) -> the size symbols' values."""
        binds = [(used.index(i), j, name) for i, j, name in self.binds]

        def bind_sizes(*args) -> dict:
            """The graph's size symbols from its arguments (SymInts and tensor sizes)."""
            return {name: int(args[i]) if j is None else args[i].shape[j] for i, j, name in binds}
        bind_sizes.reads_sizes_only = True   # (fx_reinplace: reads no tensor's values)
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
        if self.consts is not None:
            segs = f", segments 0-{self.n_const_segments - 1} among them" if self.n_const_segments else ""
            weights = (f", reading {self.consts.n_weights} weight(s) (remembered while they are unchanged)"
                       if self.consts.n_weights else "")
            lines.append(f"  size-only values: {self.consts.n_steps} step(s){segs}, computed once per tuple "
                         f"of sizes and remembered{weights}")
        first_of: dict = {}   # graph -> the first segment running it
        for i, s in enumerate(self.segments):
            ops = collections.Counter(str(n.target).replace("aten.", "").replace(".default", "")
                                      for n in s.seg.members)
            lines.append(f"  segment {i}: {s.n_kernels} vector kernel(s) in ONE launch (sequence-stacked), "
                         f"{len(s.inputs)} in / {len(s.out_map)} out; ops: "
                         + ", ".join(f"{k}x{v}" if v > 1 else k for k, v in ops.items()))
            j = first_of.setdefault(s.graph, i) if s.graph is not None else i
            if j != i:
                lines.append(f"    the graph of segment {j} (equal): its Programs and launches, each size encoded once")
            rolls = sum(isinstance(x, Rolled) for x in s.inputs)
            if rolls:
                lines.append(f"    rotate_half of a PyTorch value x{rolls}: roll(x) by PyTorch, "
                             "the halves' signs applied here")
            pairs = sum(isinstance(x, RotatedPairs) for x in s.inputs)
            if pairs:
                lines.append(f"    interleaved rotate (pairs swapped) of a PyTorch value x{pairs}: rotate_pairs(x) by PyTorch, "
                             "the products applying it fused here")
            blocks = sum(isinstance(x, RolledBlocks) for x in s.inputs)
            if blocks:
                lines.append(f"    rotate_half of views of PyTorch values x{blocks}: roll_blocks(x) by PyTorch "
                             "(every head at once), the views and the halves' signs applied here")
            if s.seg.views:
                views = collections.Counter(str(n.target).replace("aten.", "").replace(".default", "")
                                            for n in s.seg.views)
                lines.append("    views of PyTorch values replayed here: "
                             + ", ".join(f"{k}x{v}" if v > 1 else k for k, v in views.items()))
            if s.writes:
                direct = sum(k is not None for _, k, _ in s.writes)
                lines.append(f"    updates {len(s.writes)} graph input(s) (copy_): {direct} stored into the input where "
                             "safe at run time, the rest copied in after the launch")
            if s.seg.patterns:
                pats = collections.Counter(s.seg.patterns)
                lines.append("    recognized: " + ", ".join(f"{k} x{v}" for k, v in sorted(pats.items())))
            if s.graph is not None:
                for g in s.graph.plan.groups:
                    lines.append("    " + g.describe())
        if self.view_chains[0]:
            lines.append(f"  views of PyTorch values: {self.view_chains[0]} chain(s) taken as one call each, those of "
                         f"one value together ({self.view_chains[1]} call(s) fewer; as_strided once sizes repeat)")
        if self.scatters_in_place:
            lines.append(f"  scatters written into their bases: {self.scatters_in_place} (fx_reinplace)")
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
