"""Always-on, cheap counters: traces, encodes, cache hits, launches, copies, encode times."""
from __future__ import annotations

import threading
from collections import Counter

_LOCK = threading.Lock()
_COUNTS: Counter = Counter()
_ENCODE_NS: list[int] = []
_MAX_SAMPLES = 100_000


def bump(name: str, n: int = 1) -> None:
    with _LOCK:
        _COUNTS[name] += n


def bump_launch(cache_hit: bool) -> None:
    """One launch (the hot path: one lock round trip), and a program cache hit when it was one."""
    with _LOCK:
        _COUNTS["launches"] += 1
        if cache_hit:
            _COUNTS["cache_hits"] += 1


def record_encode(ns: int) -> None:
    with _LOCK:
        _COUNTS["encodes"] += 1
        if len(_ENCODE_NS) < _MAX_SAMPLES:
            _ENCODE_NS.append(ns)


def snapshot() -> dict:
    """Current counts, plus encode-time percentiles in microseconds when there are samples."""
    with _LOCK:
        out = dict(_COUNTS)
        samples = sorted(_ENCODE_NS)
    if samples:
        out["encode_us_p50"] = samples[len(samples) // 2] / 1e3
        out["encode_us_p99"] = samples[min(len(samples) - 1, int(len(samples) * 0.99))] / 1e3
    return out


def reset() -> None:
    with _LOCK:
        _COUNTS.clear()
        _ENCODE_NS.clear()
