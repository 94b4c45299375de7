"""The dispatch mode of `dvm.lazy()`: every ATen op of the thread passes here (below autograd, so
backward ops too) and is recorded, or runs through PyTorch after the pending values it needs.

Routing (lazy_ops.Kind): table ops are recorded (lazy_record); views of pending tensors are taken
by PyTorch on the placeholder and tracked; in-place ops are recorded as the functional op written
back; decompositions run under the mode. Everything else runs through PyTorch in program order:
first the pending graph is computed (a flush) if the call reads or writes anything pending, reaches
a storage with a pending write, or writes a storage the graph reads. A flush counts its reason
(FLUSH_REASONS) and the op that caused it. Tensor methods that hand memory or values to code
outside PyTorch (`.numpy()`, `.tolist()`, printing, `data_ptr()`, ...) are not ATen ops: hooks on
torch.Tensor flush first (install_hooks, once, while lazy mode is in use).

Adaptive recording (Policy.adaptive): a call whose tensors are all computed already and whose
largest operand has fewer than Policy.min_numel elements runs at once; the flush runs pending
graphs that are too small to gain from fusion through the eager replay (lazy_flush).
"""
from __future__ import annotations

import threading
import time
from collections import Counter, deque
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..runtime import counters
from . import lazy_flush as F
from .lazy_ops import _INFO, VALUE_READS, Kind, decomposition, info as op_info
from .lazy_record import Pending
from .lazy_vars import NotRecorded, storage_ptr

_dynamo_compiling = torch.compiler.is_dynamo_compiling   # a constant True inside Dynamo's trace
FLUSH_REASONS = ("item", "bool", "tolist", "numpy", "print", "storage", "unsupported", "inplace", "matmul",
                 "bound", "exit", "sync")
_Tensor = torch.Tensor
EVENTS_MAX = 256


@dataclass(frozen=True)
class Policy:
    adaptive: bool
    min_numel: int        # adaptive: operands smaller than this run at once
    min_bytes: int        # adaptive: pending graphs reading + writing fewer bytes replay eagerly
    min_ops: int          # adaptive: pending graphs of fewer recorded ops replay eagerly
    max_ops: int          # a pending graph this long is flushed ("bound")


@dataclass
class FlushEvent:
    reason: str
    cause: str            # the op (or Tensor method) that needed the values
    n_ops: int            # recorded ops computed
    path: str             # "dvm", "eager: <why>", "dead" (no live result)
    kernels: int          # DVM vector kernels in the launch
    plan_cached: bool
    us: float
    plan: object = None   # lazy_flush.Plan of a DVM flush (its fusion groups, for the report)


class Stats:
    """What a lazy region did (its report; dvm.explain() keeps the recent ones)."""

    def __init__(self):
        self.ops = Counter()         # recorded op name -> count
        self.events: list = []
        self.passed = Counter()      # op name -> calls run at once (small, or not recordable)

    def add(self, ev: FlushEvent) -> None:
        self.events.append(ev)


RECENT: deque = deque(maxlen=EVENTS_MAX)   # (thread name, FlushEvent), every thread


class State(threading.local):
    def __init__(self):
        self.pending = Pending()
        self.mode: LazyMode | None = None   # set while the thread is in a recording region
        self.depth = 0                      # regions entered since it started recording
        self.policy: Policy | None = None
        self.stats: Stats | None = None
        self.explain = False
        self.last_stats: Stats | None = None
        self.busy = False       # inside a flush: calls pass through


STATE = State()


def flush(reason: str, cause: str) -> None:
    """Compute this thread's pending graph (no-op when nothing is pending)."""
    st = STATE
    p = st.pending
    if p.empty or st.busy:
        return
    t0 = time.perf_counter()
    guards = _plain_kernels(st)
    try:
        outs = [v for v in p.vars if v.alive()]
        kernels, cached, path, plan = 0, False, "dead", None
        if outs:
            plan, cached = F.plan_for(p.prefix, tuple(v.value for v in outs), tuple(v.perm for v in outs))
            nbytes = F.io_bytes(p, outs)
            path = _choose(plan, nbytes, st.policy)
            t1 = time.perf_counter()
            if path == "dvm":
                try:
                    write_back = F.run_dvm(plan, p, outs)
                except Exception as e:  # noqa: BLE001 - never a wrong result: the graph replays
                    path = f"eager: DVM failed ({type(e).__name__}: {e})"
                    counters.bump(f"lazy_fallback:run:{type(e).__name__}")
                    F.replay(p, outs)
                else:
                    write_back()
                    kernels = plan.kernels
            else:
                F.replay(p, outs)
            if path == "dvm" or path in EAGER_TIMED:
                plan.observe(nbytes, path == "dvm", time.perf_counter() - t1)
        ev = FlushEvent(reason, cause, p.n_ops, path, kernels, cached, (time.perf_counter() - t0) * 1e6,
                        plan if path == "dvm" else None)
        _count(ev, p)
    finally:
        _leave(guards)
        p.reset()
        st.busy = False


def _plain_kernels(st) -> tuple:
    """Enter computing pending values (the thread's mode busy): below autograd and the
    in-place/view bookkeeping, which ran when the calls were recorded (grad_fn, version
    counters); only values are computed, as the kernels would have. No Python dispatch either:
    the replay and the copies are plain kernels (through this mode each would cost ~3 us more).
    Returns the guards for _leave (the caller clears st.busy after it)."""
    st.busy = True
    below = torch._C._AutoDispatchBelowADInplaceOrView()   # (a guard takes its state when made:
    below.__enter__()                                       # make each right before entering it)
    plain = torch._C._DisableTorchDispatch()
    plain.__enter__()
    return below, plain


def _leave(guards: tuple) -> None:
    below, plain = guards
    plain.__exit__(None, None, None)
    below.__exit__(None, None, None)


EAGER_MEASURED = "eager: measured faster than DVM"
EAGER_PROBE = "eager: timing the eager replay"   # DVM preferred so far; the replay's time is taken
EAGER_TIMED = (EAGER_MEASURED, EAGER_PROBE)


def _choose(plan, nbytes: int, policy: Policy) -> str:
    if plan.error:
        return f"eager: DVM cannot compile it ({plan.error})"
    if plan.graph is None:
        return "dvm"        # results are inputs passed through: copies only
    if policy is not None and policy.adaptive:
        if plan.n_ops < policy.min_ops:
            return "eager: too few ops to fuse"
        if nbytes < policy.min_bytes:
            return "eager: too small to gain from fusion"
        if not plan.choose(nbytes):
            return EAGER_PROBE if plan.prefers_dvm(nbytes) else EAGER_MEASURED
    return "dvm"


def _count(ev: FlushEvent, p) -> None:
    counts = {"lazy_flushes": 1, f"lazy_flush:{ev.reason}": 1, "lazy_ops_recorded": p.n_ops}
    if ev.path == "dvm":
        counts.update(lazy_dvm_launches=1, lazy_dvm_kernels=ev.kernels)
        counts["lazy_plan_hits" if ev.plan_cached else "lazy_plan_misses"] = 1
    elif ev.path == "dead":
        counts["lazy_dead_graphs"] = 1
    else:
        counts[f"lazy_eager:{ev.path[len('eager: '):].split(' (')[0]}"] = 1
    counters.bump_many(counts)
    st = STATE
    if st.stats is not None:
        st.stats.add(ev)
    RECENT.append((threading.current_thread().name, ev))


def _reason(info, err: NotRecorded | None) -> str:
    if err is not None and err.flush:
        return err.kind
    if info.kind is Kind.CUBE:
        return "matmul"
    if info.func in VALUE_READS:
        return VALUE_READS[info.func]
    if info.writes:
        return "inplace"
    return "unsupported"


def _worth_recording(args, p: Pending, min_numel: int) -> bool:
    """Adaptive recording: some argument is pending, or the largest tensor argument has at
    least min_numel elements."""
    by_id = p.by_id
    for a in args:
        if isinstance(a, _Tensor):
            if a.numel() >= min_numel:
                return True
            e = by_id.get(id(a))
            if e is not None and e[1]() is a:
                return True
        elif isinstance(a, (list, tuple)):
            for x in a:
                if isinstance(x, _Tensor) and (x.numel() >= min_numel or p.var_of(x) is not None):
                    return True
    return False


class LazyMode(TorchDispatchMode):
    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # no torch._disable_dynamo wrapper around __torch_dispatch__ (~0.7 us a call): while
        # Dynamo traces a function called in a lazy region, the mode passes calls through (the
        # compiled graph's ops are recorded when it runs)
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        st = STATE
        if st.busy or _dynamo_compiling():
            return func(*args, **kwargs)
        info = _INFO.get(id(func)) or op_info(func)
        kind, p, policy = info.kind, st.pending, st.policy
        err = None
        if kind is Kind.RECORD or kind is Kind.INPLACE or kind is Kind.DECOMP:
            if not policy.adaptive or _worth_recording(args, p, policy.min_numel):
                if kind is Kind.DECOMP or (kind is Kind.INPLACE and info.handler is None and info.functional):
                    out = self._decompose(info, args, kwargs)
                    if out is not NotImplemented:   # (else kept whole, fx_native_backward: run below)
                        return out
                else:
                    try:
                        out = p.record(info, args, kwargs) if kind is Kind.RECORD else \
                            p.record_inplace(info, args, kwargs)
                    except NotRecorded as e:
                        err = e
                    else:
                        if st.stats is not None:
                            ops = st.stats.ops
                            ops[info.name] = ops.get(info.name, 0) + 1
                        if p.n_ops >= policy.max_ops:
                            flush("bound", info.name)
                        return out
        elif kind is Kind.VIEW:
            if args and isinstance(args[0], _Tensor) and p.var_of(args[0]) is not None:
                real = func(*args, **kwargs)
                p.record_view(info, args, kwargs, real)
                return real
            return func(*args, **kwargs)
        if func is _LOCAL_SCALAR and not p.empty:
            value = _peek(p, args[0])
            if value is not None:
                return func(value)
        if not p.empty and ((err is not None and err.flush) or p.touches(info, args, kwargs)):
            flush(_reason(info, err), info.name + (f" ({err.reason})" if err is not None else ""))
        if st.stats is not None:
            st.stats.passed[info.name] += 1
        return func(*args, **kwargs)

    def _decompose(self, info, args, kwargs):
        """A composite under the mode (its parts recorded); an in-place composite writes its
        functional result back with copy_ (recorded too). NotImplemented: the op is kept whole."""
        if info.kind is Kind.INPLACE:
            with self:
                r = decomposition(info.functional)(*args, **kwargs)
                return r if r is NotImplemented else args[0].copy_(r)
        with self:
            return decomposition(info.func)(*args, **kwargs)


_LOCAL_SCALAR = torch.ops.aten._local_scalar_dense.default   # .item()


def _peek(p, t):
    """t's pending value computed alone (lazy_flush.peek, counted), or None."""
    var = p.var_of(t) if isinstance(t, _Tensor) else None
    if var is None or var.root is not None or var.value is None:
        return None
    st = STATE
    guards = _plain_kernels(st)
    try:
        value = F.peek(p, var)
    finally:
        _leave(guards)
        st.busy = False
    if value is not None:
        counters.bump("lazy_item_computed_alone")
    return value


# -- Tensor methods that leave PyTorch ---------------------------------------------------------------
# method name -> (flush reason, whether the caller may write the memory it gets)
HOOKED = {"tolist": ("tolist", False), "numpy": ("numpy", True), "__array__": ("numpy", True),
          "__repr__": ("print", False), "__str__": ("print", False), "__format__": ("print", False),
          "__bool__": ("bool", False), "data_ptr": ("storage", True), "untyped_storage": ("storage", True),
          "storage": ("storage", True), "__dlpack__": ("storage", True), "__reduce_ex__": ("storage", True)}
_ORIGINAL: dict = {}
_HOOK_LOCK = threading.Lock()


def needs_flush(t, writable: bool) -> bool:
    """t's memory, handed out of PyTorch now, would miss a pending value (or be written under the
    pending graph's feet)."""
    p = STATE.pending
    if p.empty or STATE.busy or not isinstance(t, _Tensor):
        return False
    if p.var_of(t) is not None:
        return True
    if not (p.dirty or (writable and p.in_storages)):
        return False
    ptr = storage_ptr(t)
    return ptr in p.dirty or (writable and ptr in p.in_storages)


def _hook(name: str, reason: str, writable: bool):
    original = getattr(torch.Tensor, name)

    def method(self, *args, **kwargs):
        if needs_flush(self, writable):
            flush(reason, f"Tensor.{name}")
        return original(self, *args, **kwargs)
    method.__name__ = name
    method.__doc__ = original.__doc__
    method.__wrapped__ = original
    return original, method


def install_hooks() -> None:
    """Wrap the methods of HOOKED on torch.Tensor (once per process; each call of a wrapped
    method costs one thread-local lookup when nothing is pending)."""
    if _ORIGINAL:
        return
    with _HOOK_LOCK:
        if _ORIGINAL:
            return
        made = {name: _hook(name, *how) for name, how in HOOKED.items()}
        for name, (original, method) in made.items():
            _ORIGINAL[name] = original
            setattr(torch.Tensor, name, method)
