"""Always-on, cheap counters: traces, encodes, cache hits, launches, copies, encode times, and the
entries, bytes and evictions of every bounded cache (codegen.lru families)."""
from __future__ import annotations

import itertools
import threading
from collections import Counter

from ..codegen.lru import cache_stats

_LOCK = threading.Lock()
_COUNTS: Counter = Counter()
# Launches, cache hits and torch segment launches (the launch path's counts, kept only here):
# next() on an itertools.count is one C call, atomic under the GIL and ~5x cheaper than a lock
# round trip with two dict updates (~340 ns a launch). A launch that hit the program cache
# advances one count (_LAUNCH_HITS), so the launch path's bumps below are bound C methods, with
# no Python frame: launches = launch hits + other launches, cache_hits = launch hits + hits
# outside a launch. Their values are read from repr(count) ("count(N)"); reset() records the
# values it starts from.
_LAUNCH_HITS = itertools.count()
_LAUNCH_OTHERS = itertools.count()
_HITS_ELSEWHERE = itertools.count()
_SEGMENTS = itertools.count()   # torch backend segment launches (frontend/torch_runtime)
_POOL_REUSES = itertools.count()   # outputs and workspaces in re-used memory (runtime/buffer_pool)
_FAST = {"launch_hits": _LAUNCH_HITS, "launch_others": _LAUNCH_OTHERS, "hits_elsewhere": _HITS_ELSEWHERE,
         "torch_segment_launches": _SEGMENTS, "pool_reuses": _POOL_REUSES}
_BASE = dict.fromkeys(_FAST, 0)
_ENCODE_NS: list[int] = []
_MAX_SAMPLES = 100_000


def bump(name: str, n: int = 1) -> None:
    with _LOCK:
        _COUNTS[name] += n


def bump_many(counts: dict) -> None:
    """Several counters at once (one lock round trip: lazy mode's flushes)."""
    with _LOCK:
        for name, n in counts.items():
            _COUNTS[name] += n


def bump_launch(cache_hit: bool) -> None:
    """One launch (the hot path: no lock), and a program cache hit when it was one."""
    next(_LAUNCH_HITS if cache_hit else _LAUNCH_OTHERS)


# the hot path's bumps, without a Python frame: a launch that hit the program cache, a torch
# backend segment launch, an output or workspace handed out from the buffer pool
bump_cached_launch = _LAUNCH_HITS.__next__
bump_segment = _SEGMENTS.__next__
bump_pool_reuse = _POOL_REUSES.__next__


def bump_cache_hit() -> None:
    """A program cache hit outside a launch (an encode that found its Program)."""
    next(_HITS_ELSEWHERE)


def _value(c: itertools.count) -> int:
    """The next number `c` would return, i.e. how many times it was advanced."""
    return int(repr(c)[len("count("):-1])


def _launch_counts() -> dict:
    n = {name: _value(c) - _BASE[name] for name, c in _FAST.items()}
    return {"launches": n["launch_hits"] + n["launch_others"], "cache_hits": n["launch_hits"] + n["hits_elsewhere"],
            "torch_segment_launches": n["torch_segment_launches"], "pool_reuses": n["pool_reuses"]}


def record_encode(ns: int) -> None:
    with _LOCK:
        _COUNTS["encodes"] += 1
        if len(_ENCODE_NS) < _MAX_SAMPLES:
            _ENCODE_NS.append(ns)


def snapshot() -> dict:
    """Current counts, plus encode-time percentiles in microseconds when there are samples."""
    with _LOCK:
        out = dict(_COUNTS)
        out.update((name, n) for name, n in _launch_counts().items() if n)
        samples = sorted(_ENCODE_NS)
    if samples:
        out["encode_us_p50"] = samples[len(samples) // 2] / 1e3
        out["encode_us_p99"] = samples[min(len(samples) - 1, int(len(samples) * 0.99))] / 1e3
    out.update(cache_stats())
    return out


def reset() -> None:
    with _LOCK:
        _COUNTS.clear()
        _ENCODE_NS.clear()
        _BASE.update((name, _value(c)) for name, c in _FAST.items())
