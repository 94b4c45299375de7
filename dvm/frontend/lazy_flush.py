"""Computing a pending graph: the structural plan cache, the DVM launch, and the eager replay.

A flush takes the live results of the pending graph (placeholders someone still holds, directly
or through a view, and tensors with a pending in-place write), and looks up the Plan for (trie
node, live values): a CompiledGraph of exactly those outputs, on the node's symbolic sizes, with
its TensorLauncher (all of its vector kernels in ONE VM launch; a new size costs one encode).
The cache key is the pending graph's structure (the trie path: ops, dtypes, ranks, broadcast
pattern, equal sizes, aliasing) and never its sizes; it is an LRU of PLAN_CACHE_MAX plans under
a lock. DVM writes each result into its placeholder; a tensor written in place gets its new value
copied in after the launch (every read of the graph has happened by then).

The eager replay runs the recorded calls again through PyTorch, in program order, writing live
placeholders through the ops' `.out` overloads: exactly eager's computation. It serves pending
graphs too small to gain from fusion (the adaptive rule, lazy.Policy) and graphs DVM cannot
compile (counted with the reason).
"""
from __future__ import annotations

import threading
from collections import OrderedDict

import torch
from torch.utils._pytree import tree_leaves

from ..graph.build import ShapeContext, permute
from ..graph.node import topo_order
from ..graph.symbolic import SymExpr, free_symbols
from ..runtime import counters
from ..runtime.compiled import CompiledGraph
from .lazy_ops import Kind, out_variant
from .lazy_trie import TORCH_OF
from .lazy_vars import Ref
from .torch_launch import TensorLauncher, input_spans, to_numpy, writable_over

PLAN_CACHE_MAX = 256
_PLANS: OrderedDict = OrderedDict()
_LOCK = threading.Lock()


class Plan:
    """The compiled form of one pending-graph structure with one set of live outputs."""

    def __init__(self, prefix, values: tuple, perms: tuple):
        self.n_ops = prefix.n_ops
        self.error: str | None = None
        self.graph = self.launcher = None
        # a placeholder in eager's permuted layout is written row-major in its dim order
        nodes = [prefix.nodes[j] if perm is None else permute(ShapeContext(), prefix.nodes[j], perm)
                 for j, perm in zip(values, perms)]
        uniq: list = []
        self.source = []          # per value: ("in", slot) or ("out", index of the graph's outputs)
        for n in nodes:
            if n.op == "input":
                self.source.append(("in", n.attr("index")))
                continue
            if n not in uniq:
                uniq.append(n)
            self.source.append(("out", uniq.index(n)))
        self.scalars = tuple((slot, TORCH_OF[dt]) for slot, dt in prefix.scalars)
        self.syms = _needed_symbols(list(prefix.inputs) + uniq)
        self.kernels = 0
        if uniq:
            try:
                self.graph = CompiledGraph(list(prefix.inputs), uniq)
                self.launcher = TensorLauncher(self.graph)
                self.kernels = len(self.graph.templates)
            except Exception as e:  # noqa: BLE001 - the graph runs eagerly, with the reason
                self.error = f"{type(e).__name__}: {e}"
        self._lock = threading.Lock()
        self._scalar_bufs = [_scalar_buffer(dt) for _, dt in self.scalars]
        self.timing: dict = {}    # size bucket -> Timing

    def choose(self, nbytes: int) -> bool:
        """Whether this flush runs on DVM (else the eager replay), from the times both paths took
        on earlier flushes of this plan with about as many bytes (Timing)."""
        bucket = nbytes.bit_length()
        t = self.timing.get(bucket)
        if t is None:
            if len(self.timing) >= TIMING_BUCKETS_MAX:
                self.timing.clear()
            t = self.timing[bucket] = Timing()
        return t.choose()

    def prefers_dvm(self, nbytes: int) -> bool:
        t = self.timing.get(nbytes.bit_length())
        return t is None or t.prefers_dvm()

    def observe(self, nbytes: int, dvm: bool, seconds: float) -> None:
        t = self.timing.get(nbytes.bit_length())
        if t is not None:
            t.observe(dvm, seconds)

    def fill_scalars(self, slots: list) -> list:
        """The plan's 0-d tensors, holding this call's runtime scalars (the caller holds _lock
        until its launch has read them)."""
        for (slot, _), (_, view) in zip(self.scalars, self._scalar_bufs):
            view[()] = slots[slot]
        return [t for t, _ in self._scalar_bufs]

    def fresh_scalars(self, slots: list) -> list:
        return [torch.tensor(slots[slot], dtype=dt) for slot, dt in self.scalars]


# Measured adaptivity: per plan and size bucket (bytes read + written, by powers of two), the
# first DVM run (it encodes the Program) is not timed; then DVM_TRIALS DVM runs and EAGER_TRIALS
# eager replays are timed, the path with the smaller minimum of its last WINDOW times is taken,
# and the other one is timed again every REPROBE flushes (times move with the machine's load and
# the sizes within the bucket). The minimum, not a mean or a median: another process stalling a
# run only adds time, and a path's first runs can be much slower than its later ones (a step
# writing fresh 64 MB outputs: their pages), which a median of three trials would keep.
DVM_TRIALS = 3
EAGER_TRIALS = 3
WINDOW = 5
REPROBE = 64
TIMING_BUCKETS_MAX = 64


class Timing:
    __slots__ = ("dvm", "eager", "warm", "flushes")

    def __init__(self):
        self.dvm: list = []
        self.eager: list = []
        self.warm = False
        self.flushes = 0

    def choose(self) -> bool:
        self.flushes += 1
        if len(self.dvm) < DVM_TRIALS:
            return True
        if len(self.eager) < EAGER_TRIALS:
            return False
        faster = min(self.dvm) <= min(self.eager)
        return faster != (self.flushes % REPROBE == 0)

    def prefers_dvm(self) -> bool:
        """DVM is this size's choice so far (an eager replay now is a trial or a re-probe)."""
        return len(self.eager) < EAGER_TRIALS or min(self.dvm) <= min(self.eager)

    def observe(self, dvm: bool, seconds: float) -> None:
        if dvm and not self.warm:       # the first run encoded its Program
            self.warm = True
            return
        times = self.dvm if dvm else self.eager
        times.append(seconds)
        if len(times) > WINDOW:
            del times[0]


def _scalar_buffer(dt):
    t = torch.zeros((), dtype=dt)
    return t, to_numpy(t)


def _needed_symbols(nodes: list) -> tuple:
    names: set = set()
    for node in topo_order([n for n in nodes if n is not None]):
        dims = list(node.shape)
        for _, v in node.attrs:                    # a const's value, a slice's start, ...
            dims.extend(v if isinstance(v, tuple) else (v,))
        for d in dims:
            if isinstance(d, SymExpr):
                names |= {s.name for s in free_symbols(d)}
    return tuple(sorted(names, key=lambda n: int(n[1:])))


def plan_for(prefix, values: tuple, perms: tuple) -> tuple[Plan, bool]:
    """The cached Plan for (structure, live values and their layouts), and whether it was cached."""
    key = (prefix, values, perms)
    with _LOCK:
        plan = _PLANS.get(key)
        if plan is not None:
            _PLANS.move_to_end(key)
            return plan, True
    plan = Plan(prefix, values, perms)
    counters.bump("lazy_plans_compiled")
    if plan.error:
        counters.bump(f"lazy_fallback:plan:{plan.error[:120]}")
    with _LOCK:
        plan = _PLANS.setdefault(key, plan)
        while len(_PLANS) > PLAN_CACHE_MAX:
            _PLANS.popitem(last=False)
    return plan, False


def clear_plans() -> None:
    with _LOCK:
        _PLANS.clear()


def io_bytes(pending, outs: list) -> int:
    """Bytes the pending graph reads (inputs) and writes (live results) at these sizes."""
    n = 0
    for t in pending.slots:
        if isinstance(t, torch.Tensor):
            n += t.numel() * t.element_size()
    for var in outs:
        k = 1
        for d in var.shape:
            k *= d
        n += k * var.dtype.itemsize
    return n


# -- the DVM launch --------------------------------------------------------------------------------
def run_dvm(plan: Plan, pending, outs: list):
    """Launch the plan on the pending graph's inputs; the launch writes the placeholders it can.
    Returns the write-back of the other results (copies into tensors the user holds), to run once
    the launch has succeeded: a failed launch has written nothing the eager replay would not."""
    if not plan.scalars:
        return _launch(plan, pending, outs, ())
    if plan._lock.acquire(False):       # the plan's scalar buffers, one launch at a time
        try:
            return _launch(plan, pending, outs, plan.fill_scalars(pending.slots))
        finally:
            plan._lock.release()
    return _launch(plan, pending, outs, plan.fresh_scalars(pending.slots))


def _launch(plan: Plan, pending, outs: list, scalars):
    env = {name: pending.env[name] for name in plan.syms}
    tensors = list(pending.slots)
    for (slot, _), t in zip(plan.scalars, scalars):
        tensors[slot] = t
    dsts = [var.tensor() for var in outs]
    written = [False] * len(outs)        # DVM writes this output into its tensor directly
    results = ()
    if plan.graph is not None:
        into = [None] * len(plan.graph.outputs)
        spans = None
        for i, (var, dst, (kind, k)) in enumerate(zip(outs, dsts, plan.source)):
            if kind != "out" or into[k] is not None or dst is None:
                continue
            if var.external:
                spans = spans if spans is not None else input_spans(pending.slots)
                if not _writable_in_place(plan, pending, k, dst, spans):
                    continue
                counters.bump("lazy_written_in_place")
            into[k] = dst if var.perm is None else dst.permute(var.perm)
            written[i] = True
        results = plan.launcher(env, tensors, into)

    def write_back() -> None:
        for var, dst, done, (kind, k) in zip(outs, dsts, written, plan.source):
            if done or dst is None:
                continue
            src = tensors[k] if kind == "in" else results[k]
            dst.copy_(src if var.perm is None or kind == "in" else src.permute(_inverse(var.perm)))
    return write_back


def _writable_in_place(plan: Plan, pending, k: int, dst: torch.Tensor, spans: list) -> bool:
    """Whether output k (dst's new value) can be written into dst by the launch itself, not
    copied in after it (torch_launch.writable_over), and no result is dst's old value passed
    through (copied out after the launch)."""
    slot = pending.slot_of.get(id(dst))
    if slot is not None and pending.slots[slot] is not dst:
        slot = None
    return (slot is None or ("in", slot) not in plan.source) and writable_over(plan.graph, k, dst, spans, slot)


def _inverse(perm: tuple) -> tuple:
    return tuple(perm.index(i) for i in range(len(perm)))


# -- a value alone, the rest left pending -----------------------------------------------------------
# `.item()` of a pending value computed from at most PEEK_MAX_OPS recorded ops whose tensor inputs
# have at most PEEK_MAX_NUMEL elements (an optimizer's step count) is computed alone (peek): a
# flush there would cut the pending graph in two (torch.optim's Adam reads its step this way
# between the moments' and the parameter's updates)
PEEK_MAX_OPS = 16
PEEK_MAX_NUMEL = 4096


def peek(pending, var):
    """Var's pending value computed now from its ancestors in the log, writing nothing (an
    in-place op through its functional form, in the target's dtype); None when they are more or
    larger than the PEEK limits, or not all recorded ops (the caller flushes)."""
    need, picked = {var.value}, []
    for entry in reversed(pending.log):
        info, rargs, rkwargs, values, _ = entry
        if not need.intersection(values):
            continue
        if len(picked) == PEEK_MAX_OPS or info.kind not in (Kind.RECORD, Kind.INPLACE) or \
                (info.kind is Kind.INPLACE and info.functional is None):
            return None
        picked.append(entry)
        need.difference_update(values)
        for a in tree_leaves((rargs, rkwargs)):
            if isinstance(a, Ref):
                need.add(a.j)
            elif isinstance(a, torch.Tensor) and a.numel() > PEEK_MAX_NUMEL:
                return None
    if need:
        return None
    vals: dict = {}
    for info, rargs, rkwargs, values, _ in reversed(picked):
        args = [_resolve(a, vals) for a in rargs]
        kwargs = {k: _resolve(v, vals) for k, v in rkwargs.items()}
        if info.kind is Kind.INPLACE:
            r = (info.functional(*args, **kwargs).to(args[0].dtype),)
        else:
            r = info.func(*args, **kwargs)
        for j, t in zip(values, r if isinstance(r, (tuple, list)) else (r,)):
            vals[j] = t
    return vals[var.value]


# -- the eager replay ------------------------------------------------------------------------------
def _resolve(x, vals: dict):
    if isinstance(x, Ref):
        return vals[x.j]
    if isinstance(x, list):
        return [_resolve(v, vals) for v in x]
    return x


def replay(pending, outs: list) -> None:
    """The recorded calls through PyTorch, in order; live placeholders written in place."""
    vals: dict = {}
    for info, eargs, ekwargs, values, refs in pending.log:
        args = [_resolve(a, vals) for a in eargs]
        kwargs = {k: _resolve(v, vals) for k, v in ekwargs.items()}
        if info.kind is Kind.INPLACE:
            info.func(*args, **kwargs)
            vals[values[0]] = args[0]
            continue
        targets = [r() for r in refs]
        ov = out_variant(info.func) if targets and all(t is not None for t in targets) else None
        if ov is not None:
            fn, names = ov
            fn(*args, **kwargs, **dict(zip(names, targets)))
            results = targets
        else:
            r = info.func(*args, **kwargs)
            results = r if isinstance(r, (tuple, list)) else (r,)
        for j, t in zip(values, results):
            vals[j] = t
    for var in outs:
        dst, src = var.tensor(), vals[var.value]
        if dst is not None and dst is not src:
            dst.copy_(src)
