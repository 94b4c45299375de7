"""The reports of lazy mode: a region's (LazyRegion.report(), dvm.lazy(explain=True)) and the
recent flushes of every thread with the lazy counters (dvm.explain() without arguments)."""
from __future__ import annotations

from collections import Counter

from ..runtime import counters
from .lazy_mode import RECENT, Stats


def report(stats: Stats | None = None) -> str:
    """A lazy region's report (stats), or, without one, the recent flushes of every thread and the
    lazy counters since dvm.reset_counters()."""
    if stats is None:
        return _recent_report()
    lines = [_summary(stats.events, stats.ops)]
    lines += _by_reason(stats.events)
    lines.append("flushes in order:")
    for i, ev in enumerate(stats.events):
        lines.append(f"  {i + 1}. {_event(ev)}")
        graph = getattr(ev.plan, "graph", None)
        if graph is not None:
            lines += [f"       {g.describe()}" for g in graph.plan.groups]
    if stats.passed:
        lines.append("ran at once through PyTorch, not recorded (small, or not fusable; any that read or wrote "
                     "what was pending ran after a flush): " + _counts(stats.passed))
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
