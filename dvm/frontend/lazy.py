"""`dvm.lazy()`: runtime fusion of eager PyTorch code, the fuser's dynamic-graph half (DESIGN.md §1).

    with dvm.lazy():                 # or @dvm.lazy / @dvm.lazy(...) on a function
        y = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * x * w   # recorded, not run
        z = y @ w2                   # a matmul reads y: the pending graph is fused and run first
    dvm.sync()                       # compute what is pending now (inside a lazy region)
    print(dvm.explain())             # recorded ops, kernels, flushes by reason and their causes

Inside the region every ATen op of the thread goes through a dispatch mode (lazy_mode): ops of
the lowering table are recorded into a pending graph instead of running; at a flush (a value
leaves PyTorch, an op DVM does not support reads a pending value, a matmul, a write that must see
it, the bound, leaving the region, dvm.sync()) the graph is fused, encoded and run by the VM, one
launch for all of its kernels, through a plan cached by the graph's structure (lazy_flush).
Results are eager's; outputs are row-major whatever eager's strides would be.

Adaptive (the default), measured at three levels: an op whose operands are all small runs at
once (MIN_NUMEL); a pending graph replays eagerly when it is tiny (MIN_BYTES, MIN_OPS) or when
its plan measured the eager replay faster than the DVM launch at its size (lazy_flush.Timing);
and a region (a `with` statement's location, or a decorated function) records only while its
entries measure faster recording than running eagerly with lazy mode off (lazy_sites).
`adaptive=False` records and fuses everything.
DVM_LAZY=0 makes dvm.lazy() a no-op (A/B runs).
"""
from __future__ import annotations

import functools
import sys
import time

from ..config import config
from .lazy_mode import EAGER_PROBE, STATE, LazyMode, Policy, Stats, flush, install_hooks
from .lazy_report import report
from .lazy_sites import _SITES, RECORD, RECORD_TIMED, SKIP, SKIP_TIMED, Site, site_at

# Measured on the CPU VM (`dvm bench lazy --calibrate`; docs/DECISIONS.md, "Lazy mode: adaptive"):
# below 2^18 elements not even an 8-op elementwise chain recorded and fused beats eager.
MIN_NUMEL = 1 << 18       # adaptive: a call whose operands all have fewer elements runs at once
MIN_BYTES = 2 << 20       # adaptive: a pending graph reading + writing fewer bytes (that chain's
                          # input + output in f32) replays eagerly without timing DVM
MIN_OPS = 2               # adaptive: one recorded op has nothing to fuse with
DEFAULT_MAX_OPS = 256     # a pending graph this long is flushed ("bound")

_POLICIES: dict = {}


def _policy(adaptive: bool, max_ops: int | None) -> Policy:
    key = (adaptive, max_ops)
    p = _POLICIES.get(key)
    if p is None:
        if max_ops is not None and max_ops < 1:
            raise ValueError(f"dvm.lazy: max_ops must be at least 1, got {max_ops}")
        p = _POLICIES[key] = Policy(adaptive, MIN_NUMEL, MIN_BYTES, MIN_OPS, max_ops or DEFAULT_MAX_OPS)
    return p


class _Quiet:
    """A region entry that does not record: lazy mode off (a skipped entry, DVM_LAZY=0), or
    nested in a recording region (part of it)."""
    __slots__ = ()

    def __call__(self, fn):          # `@dvm.lazy()`: a decorator after all
        return _decorate(fn, _DEFAULT_POLICY, False)

    def __enter__(self):
        st = STATE
        if st.mode is not None:
            st.depth += 1
        return self

    def __exit__(self, *exc) -> bool:
        st = STATE
        if st.mode is not None:
            st.depth -= 1
        return False

    @staticmethod
    def report() -> str:
        return LazyRegion.report()


class _Skipped:
    """An entry that runs eagerly (lazy mode off): nothing to do on entry or exit."""
    __slots__ = ()

    def __call__(self, fn):
        return _decorate(fn, _DEFAULT_POLICY, False)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> bool:
        return False

    @staticmethod
    def report() -> str:
        return LazyRegion.report()


_QUIET, _SKIPPED = _Quiet(), _Skipped()


class LazyRegion:
    """What `dvm.lazy(...)` returns: a context manager (and a decorator factory)."""
    __slots__ = ("policy", "explain", "site", "action", "t0")

    def __init__(self, policy: Policy, explain: bool = False, site: Site | None = None, action: int | None = None):
        self.policy, self.explain, self.site, self.action, self.t0 = policy, explain, site, action, 0.0

    def __call__(self, fn):
        return _decorate(fn, self.policy, self.explain)

    def __enter__(self):
        st = STATE
        if st.mode is not None:
            st.depth += 1           # nested in a recording region: part of it
            self.action = None
            return self
        if self.action is None:     # (an object entered again: decide again)
            self.action = _decide(self.policy, self.site)
        self.t0 = time.perf_counter()
        if self.action in (SKIP, SKIP_TIMED):
            return self
        install_hooks()
        st.policy, st.stats, st.explain, st.depth = self.policy, Stats(), self.explain, 1
        mode = LazyMode()
        mode.__enter__()
        st.mode = mode
        return self

    def __exit__(self, *exc) -> bool:
        st = STATE
        action, self.action = self.action, None
        if action is None:
            if st.mode is not None:
                st.depth -= 1
            return False
        if action in (SKIP, SKIP_TIMED):
            if action == SKIP_TIMED and self.site is not None:
                self.site.observe(False, time.perf_counter() - self.t0)
            return False
        try:
            flush("exit", "leaving dvm.lazy()")
        finally:
            st.mode.__exit__(None, None, None)
            stats = st.stats
            st.mode = st.stats = st.policy = None
            st.depth, st.last_stats = 0, stats
            if self.site is not None:
                self.site.observe(True, time.perf_counter() - self.t0 if action == RECORD_TIMED else None,
                                  any(ev.n_ops for ev in stats.events),
                                  any((ev.path == "dvm" and ev.kernels) or ev.path == EAGER_PROBE
                                      for ev in stats.events))
            if self.explain:
                print(report(stats), file=sys.stderr)
        return False

    @staticmethod
    def report() -> str:
        """What this thread's last recording lazy region recorded, fused and flushed."""
        stats = STATE.last_stats
        return report(stats) if stats is not None else "dvm.lazy: no region has recorded in this thread"


def _decide(policy: Policy, site: Site | None) -> int:
    if not config().lazy:
        return SKIP
    if not policy.adaptive or site is None:
        return RECORD
    return site.action()


def _decorate(fn, policy: Policy, explain: bool):
    if not policy.adaptive:
        @functools.wraps(fn)
        def recording(*args, **kwargs):
            with LazyRegion(policy, explain, None):
                return fn(*args, **kwargs)
        recording.lazy_site = None
        return recording
    site = Site()

    @functools.wraps(fn)
    def lazily(*args, **kwargs):
        if site.skips:               # the fast path of Site.action's SKIP (nested in a recording
            site.skips -= 1          # region, the calls are recorded all the same)
            return fn(*args, **kwargs)
        with LazyRegion(policy, explain, site):
            return fn(*args, **kwargs)
    lazily.lazy_site = site
    return lazily


def lazy(fn=None, *, adaptive: bool = True, explain: bool = False, max_ops: int | None = None):
    """`with dvm.lazy(): ...`, `@dvm.lazy` or `@dvm.lazy(adaptive=..., explain=..., max_ops=...)`.
    adaptive: small work runs eagerly and regions measure whether recording pays (module
    docstring); explain: print the region's report to stderr when it ends; max_ops: flush a
    pending graph of this many recorded ops (default DEFAULT_MAX_OPS)."""
    if fn is None and adaptive is True and explain is False and max_ops is None and STATE.mode is None:
        frame = sys._getframe(1)
        site = _SITES.get((id(frame.f_code), frame.f_lasti))
        if site is None or site.code is not frame.f_code:
            site = site_at(frame)
        if site.skips:
            site.skips -= 1          # the fast path of Site.action's SKIP
            return _SKIPPED
        action = _decide(_DEFAULT_POLICY, site)
        return _SKIPPED if action == SKIP else LazyRegion(_DEFAULT_POLICY, False, site, action)
    policy = _policy(adaptive, max_ops)
    if fn is not None:
        if not callable(fn):
            raise TypeError("dvm.lazy: use `with dvm.lazy():`, `@dvm.lazy` or `@dvm.lazy(...)`")
        return _decorate(fn, policy, explain)
    if STATE.mode is not None:
        return _QUIET               # nested in a recording region
    site = site_at(sys._getframe(1)) if adaptive else None
    action = _decide(policy, site)
    if action == SKIP and not explain:
        return _SKIPPED
    return LazyRegion(policy, explain, site, action)


_DEFAULT_POLICY = _policy(True, None)


def sync() -> None:
    """Compute this thread's pending graph now (inside a lazy region; elsewhere nothing is pending)."""
    flush("sync", "dvm.sync()")


def active() -> bool:
    """Whether this thread is inside a recording lazy region."""
    return STATE.mode is not None
