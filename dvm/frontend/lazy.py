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

Adaptive (the default): an op whose operands are small runs at once, a pending graph too small to
gain from fusion replays eagerly (thresholds measured by `dvm bench lazy --calibrate`; see
docs/DECISIONS.md), and a region (a `with` statement's location, or a decorated function) whose
entries fused nothing is skipped, lazy mode off, for a number of entries that doubles while it
keeps fusing nothing (SITE_*), then tried again. `adaptive=False` records and fuses everything.
DVM_LAZY=0 makes dvm.lazy() a no-op (A/B runs).
"""
from __future__ import annotations

import functools
import sys
import threading
from collections import Counter

from ..config import config
from ..runtime import counters
from .lazy_mode import RECENT, STATE, LazyMode, Policy, Stats, flush, install_hooks

# Measured on the CPU VM (`dvm bench lazy --calibrate`, docs/DECISIONS.md "Lazy mode thresholds").
MIN_NUMEL = 16_384        # adaptive: a call whose operands all have fewer elements runs at once
MIN_BYTES = 256 * 1024    # adaptive: a pending graph reading + writing fewer bytes replays eagerly
MIN_OPS = 2               # adaptive: one recorded op has nothing to fuse with
DEFAULT_MAX_OPS = 256     # a pending graph this long is flushed ("bound")
SITE_STREAK = 2           # entries in a row that fused nothing before a region is skipped
SITE_SKIP_FIRST = 16      # entries skipped the first time; doubles per streak up to:
SITE_SKIP_MAX = 1024
SITES_MAX = 4096

_POLICIES: dict = {}
_SITES: dict = {}
_SITES_LOCK = threading.Lock()


def _policy(adaptive: bool, max_ops: int | None) -> Policy:
    key = (adaptive, max_ops)
    p = _POLICIES.get(key)
    if p is None:
        if max_ops is not None and max_ops < 1:
            raise ValueError(f"dvm.lazy: max_ops must be at least 1, got {max_ops}")
        p = _POLICIES[key] = Policy(adaptive, MIN_NUMEL, MIN_BYTES, MIN_OPS, max_ops or DEFAULT_MAX_OPS)
    return p


class Site:
    """Where a lazy region is entered: what its entries fused decides whether the next ones record."""
    __slots__ = ("streak", "skip", "period", "entries", "skipped")

    def __init__(self):
        self.streak, self.skip, self.period, self.entries, self.skipped = 0, 0, SITE_SKIP_FIRST, 0, 0

    def learn(self, stats: Stats) -> None:
        if any(ev.path == "dvm" and ev.kernels for ev in stats.events):
            self.streak, self.period = 0, SITE_SKIP_FIRST
            return
        self.streak += 1
        if self.streak >= SITE_STREAK:
            self.skip, self.streak = self.period, 0
            self.period = min(2 * self.period, SITE_SKIP_MAX)
            counters.bump("lazy_regions_skipped")


def _site_at(frame) -> Site:
    key = (frame.f_code, frame.f_lasti)
    site = _SITES.get(key)
    if site is None:
        with _SITES_LOCK:
            if len(_SITES) >= SITES_MAX:
                _SITES.clear()
            site = _SITES.setdefault(key, Site())
    return site


class LazyRegion:
    """What `dvm.lazy(...)` returns: a context manager, and a decorator factory. It holds no
    per-entry state (the thread's STATE does), so one object serves every entry and thread."""
    __slots__ = ("policy", "explain", "site")

    def __init__(self, policy: Policy, explain: bool = False, site: Site | None = None):
        self.policy, self.explain, self.site = policy, explain, site

    def __call__(self, fn):
        return _decorate(fn, self.policy, self.explain)

    def __enter__(self):
        st = STATE
        if st.mode is not None:
            st.depth += 1           # nested in a recording region: part of it
            return self
        if not config().lazy:
            return self             # DVM_LAZY=0
        site = self.site or _site_at(sys._getframe(1))
        site.entries += 1
        if site.skip and self.policy.adaptive:
            site.skip -= 1
            site.skipped += 1
            return self
        install_hooks()
        st.policy, st.stats, st.site, st.explain, st.depth = self.policy, Stats(), site, self.explain, 1
        mode = LazyMode()
        mode.__enter__()
        st.mode = mode
        return self

    def __exit__(self, *exc) -> bool:
        st = STATE
        if st.mode is None:
            return False
        st.depth -= 1
        if st.depth:
            return False
        try:
            flush("exit", "leaving dvm.lazy()")
        finally:
            st.mode.__exit__(None, None, None)
            stats, site, policy, explain = st.stats, st.site, st.policy, st.explain
            st.mode = st.stats = st.site = st.policy = None
            st.last_stats = stats
            if policy.adaptive:
                site.learn(stats)
            if explain:
                print(report(stats), file=sys.stderr)
        return False

    @staticmethod
    def report() -> str:
        """What this thread's last lazy region recorded, fused and flushed."""
        stats = STATE.last_stats
        return report(stats) if stats is not None else "dvm.lazy: no region has recorded in this thread"


def _decorate(fn, policy: Policy, explain: bool):
    region = LazyRegion(policy, explain, Site())

    @functools.wraps(fn)
    def lazily(*args, **kwargs):
        with region:
            return fn(*args, **kwargs)
    return lazily


def lazy(fn=None, *, adaptive: bool = True, explain: bool = False, max_ops: int | None = None):
    """`with dvm.lazy(): ...`, `@dvm.lazy` or `@dvm.lazy(adaptive=..., explain=..., max_ops=...)`.
    adaptive: small work runs eagerly (module docstring); explain: print the region's report to
    stderr when it ends; max_ops: flush a pending graph of this many recorded ops (default
    DEFAULT_MAX_OPS)."""
    if fn is None and adaptive is True and explain is False and max_ops is None:
        return _DEFAULT
    policy = _policy(adaptive, max_ops)
    if fn is not None:
        if not callable(fn):
            raise TypeError("dvm.lazy: use `with dvm.lazy():`, `@dvm.lazy` or `@dvm.lazy(...)`")
        return _decorate(fn, policy, explain)
    return LazyRegion(policy, explain)


_DEFAULT = LazyRegion(_policy(True, None))


def sync() -> None:
    """Compute this thread's pending graph now (inside a lazy region; elsewhere nothing is pending)."""
    flush("sync", "dvm.sync()")


def active() -> bool:
    """Whether this thread is inside a recording lazy region."""
    return STATE.mode is not None


# -- reports -----------------------------------------------------------------------------------------
def report(stats: Stats | None = None) -> str:
    """A lazy region's report (stats), or, without one, the recent flushes of every thread and the
    lazy counters since dvm.reset_counters()."""
    if stats is None:
        return _recent_report()
    lines = [_summary(stats.events, stats.ops)]
    lines += _by_reason(stats.events)
    lines.append("flushes in order:")
    lines += [f"  {i + 1}. {_event(ev)}" for i, ev in enumerate(stats.events)]
    if stats.passed:
        lines.append("ran at once through PyTorch (not recorded): " + _counts(stats.passed))
    return "\n".join(lines)


def _summary(events, ops: Counter | None) -> str:
    n_ops = sum(ev.n_ops for ev in events)
    dvm = [ev for ev in events if ev.path == "dvm"]
    eager = [ev for ev in events if ev.path.startswith("eager")]
    head = f"dvm.lazy: {n_ops} op(s) recorded" + (f" ({_counts(ops)})" if ops else "")
    return (f"{head}; {len(events)} flush(es): {len(dvm)} DVM launch(es) with "
            f"{sum(ev.kernels for ev in dvm)} vector kernel(s), {len(eager)} eager replay(s), "
            f"{sum(1 for ev in events if ev.path == 'dead')} with no live result")


def _by_reason(events) -> list:
    by = Counter(ev.reason for ev in events)
    lines = ["flushes by reason:"]
    for reason, k in by.most_common():
        causes = Counter(ev.cause for ev in events if ev.reason == reason)
        lines.append(f"  {reason} x{k}: " + _counts(causes))
    return lines


def _event(ev) -> str:
    how = f"DVM, {ev.kernels} kernel(s), plan {'cached' if ev.plan_cached else 'compiled'}" \
        if ev.path == "dvm" else ev.path
    return f"{ev.reason} <- {ev.cause}: {ev.n_ops} op(s) -> {how}, {ev.us:.0f} us"


def _counts(c: Counter) -> str:
    return ", ".join(f"{k} x{v}" if v > 1 else k for k, v in c.most_common())


def _recent_report() -> str:
    events = [ev for _, ev in RECENT]
    snap = counters.snapshot()
    lazy_counts = {k: v for k, v in sorted(snap.items()) if k.startswith("lazy_")}
    lines = [_summary(events, None) + f" (the last {len(events)} flushes of any thread)"]
    lines += _by_reason(events)
    lines += [f"  {_event(ev)}  [{thread}]" for thread, ev in list(RECENT)[-20:]]
    lines.append("lazy counters: " + (", ".join(f"{k}={v}" for k, v in lazy_counts.items()) or "none"))
    return "\n".join(lines)
