"""`dvm fuzz shapes`: many distinct shapes through `@dvm.kernel(dynamic=False)` (a trace, a
graph, a Program and a launch per shape) and many distinct Programs (a checked stream each)
through the verifier; resident memory must stay flat: every cache is bounded (codegen.lru).

Resident memory (VmRSS) is read after the first call of each phase and at its end, and after a
warm-up that fills the caches (twice DVM_CACHE_SIZE shapes), so the report separates what the
full caches hold from any growth after that.
"""
from __future__ import annotations

import gc
import sys
import time
from dataclasses import dataclass

import numpy as np

import dvm
from ..config import config

BUDGET_MB = 50.0     # growth allowed over a whole phase (issue 50)
PROGRESS_EVERY = 10_000


def rss_mb() -> float:
    """This process's resident memory (VmRSS), in MiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise OSError("no VmRSS in /proc/self/status")


@dataclass
class Phase:
    name: str
    count: int
    seconds: float
    start_mb: float      # after the phase's first call
    warm_mb: float       # after the warm-up (caches full)
    end_mb: float

    @property
    def growth_mb(self) -> float:
        return self.end_mb - self.start_mb

    @property
    def growth_after_warmup_mb(self) -> float:
        return self.end_mb - self.warm_mb


@dvm.kernel(dynamic=False)
def scaled_shift(k, x):
    """One trace per concrete shape (dynamic=False)."""
    x = k.load(x)
    return k.store(k.add(k.mul(x, 2.0), 1.0))


def shape_of(i: int) -> tuple[int, int]:
    """Distinct shapes for distinct i, at most 97 x (2 + i // 97) elements."""
    return 1 + i % 97, 2 + i // 97


def _phase(name: str, count: int, step, quiet: bool) -> Phase:
    step(0)
    gc.collect()
    start = rss_mb()
    warm_at = min(count, 2 * config().cache_size)
    warm = start
    t0 = time.perf_counter()
    for i in range(1, count):
        step(i)
        if i == warm_at:
            gc.collect()
            warm = rss_mb()
        if not quiet and i % PROGRESS_EVERY == 0:
            print(f"[dvm fuzz shapes] {name}: {i}/{count}, resident {rss_mb():.0f} MiB", file=sys.stderr, flush=True)
    gc.collect()
    return Phase(name, count, time.perf_counter() - t0, start, warm, rss_mb())


def kernel_phase(count: int, quiet: bool = False) -> Phase:
    def step(i: int) -> None:
        x = np.ones(shape_of(i), np.float32)
        y = scaled_shift(x)
        if y[0, 0] != 3.0:
            raise AssertionError(f"dvm fuzz shapes: wrong result {y[0, 0]} for shape {x.shape}")
    return _phase("dynamic=False kernel", count, step, quiet)


def verifier_phase(count: int, quiet: bool = False) -> Phase:
    from .fuzz_corpus import build_seed, distinct_programs
    programs = distinct_programs(build_seed("layernorm").program, count)

    def step(i: int) -> None:
        dvm.verify(next(programs))
    return _phase("verifier (distinct streams)", count, step, quiet)


def markdown(phases: list[Phase], caches: dict) -> str:
    lines = ["| phase | distinct | seconds | resident after the first (MiB) | growth (MiB) | growth after the "
             "caches filled (MiB) | budget |", "| --- | ---: | ---: | ---: | ---: | ---: | :---: |"]
    for p in phases:
        verdict = "pass" if p.growth_mb <= BUDGET_MB else "MISS"
        lines.append(f"| {p.name} | {p.count} | {p.seconds:.0f} | {p.start_mb:.0f} | {p.growth_mb:.1f} | "
                     f"{p.growth_after_warmup_mb:.1f} | {verdict} (<= {BUDGET_MB:.0f}) |")
    lines.append("")
    lines.append("Caches at the end: " + ", ".join(f"{k.removeprefix('cache_')} {v}" for k, v in sorted(caches.items())))
    return "\n".join(lines)
