"""Issue 50, hole 4: every cache is bounded by entries and bytes, with its size in dvm.counters().
A `@dvm.kernel(dynamic=False)` kernel kept one trace per shape forever (20,000 shapes: +342 MB
resident); the verifier's stream cache held up to 4,096 streams of up to ~6.5 MB each. Here the
entry bounds are lowered so that a short run fills every cache; `dvm fuzz shapes` runs 100,000
shapes and 100,000 distinct Programs at the default bounds (BENCHMARKS.md)."""
from __future__ import annotations

import pytest

import dvm
from dvm import config as dvm_config
from dvm.codegen import lru, verifier_stream
from dvm.tools import fuzz_shapes

CACHE_SIZE = 32
SHAPES = 1500
GROWTH_MB = 8.0     # after the caches filled; without the bounds: ~17 KB a shape, ~25 MB here


@pytest.fixture
def small_caches(monkeypatch):
    monkeypatch.setenv("DVM_CACHE_SIZE", str(CACHE_SIZE))
    dvm_config.reload()
    monkeypatch.setattr(verifier_stream.STREAMS, "max_entries", CACHE_SIZE)
    yield
    monkeypatch.undo()
    dvm_config.reload()


def test_counters_report_every_cache_family():
    snap = dvm.counters()
    for family in ("verifier", "programs", "launches", "traces"):
        for what in ("entries", "bytes", "evictions"):
            assert f"cache_{family}_{what}" in snap


def test_dynamic_false_shapes_leave_memory_flat(small_caches):
    phase = fuzz_shapes.kernel_phase(SHAPES, quiet=True)
    traces = fuzz_shapes.scaled_shift._traces
    assert len(traces) <= CACHE_SIZE and len(fuzz_shapes.scaled_shift._launches) <= CACHE_SIZE
    snap = dvm.counters()
    assert snap["cache_traces_evictions"] >= SHAPES - 2 * CACHE_SIZE
    assert phase.growth_after_warmup_mb <= GROWTH_MB, phase


def test_distinct_programs_leave_the_verifier_flat(small_caches):
    phase = fuzz_shapes.verifier_phase(SHAPES, quiet=True)
    assert len(verifier_stream.STREAMS) <= CACHE_SIZE
    assert phase.growth_after_warmup_mb <= GROWTH_MB, phase


def test_byte_budget_evicts_across_a_family():
    fam = lru.CacheFamily("test_budget", 1000)
    a, b = lru.BoundedDict(fam, 100), lru.BoundedDict(fam, 100)
    for i in range(6):
        a.put(i, i, 100)
    for i in range(6):
        b.put(i, i, 100)
    assert fam.bytes <= 1000 and len(a) + len(b) == 10
    assert 0 not in a and 5 in b   # the least recently used dict gave up its oldest first
    b.put("big", 0, 5000)          # alone over the budget: kept, everything else goes
    assert list(b) == ["big"] and len(a) == 0 and fam.bytes == 5000
    del a, b
    import gc
    gc.collect()
    assert fam.entries == 0 and fam.bytes == 0
