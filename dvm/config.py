"""The one place that reads the environment. Everything else asks `config()`.

DVM_DEBUG     0 quiet, 1 timings and counters, 2 fusion groups, 3 graph IR, 4 disassembly, 5 all
DVM_DUMP_DIR  directory where programs and reports are written when debugging (unset: none)
DVM_VM        which VM runs programs: "cpu" (numba, compiled once and cached on disk; the default)
              or "reference" (NumPy, the executable spec)
DVM_NUM_THREADS    threads of the CPU VM (default: the number of CPUs); results do not depend on it
DVM_CACHE_SIZE     programs kept per compiled graph (LRU, default 512)
DVM_CACHE_MB       MiB that each cache family (all programs, all launches, all builder traces) may hold
                   in all (default 256; codegen/lru)
DVM_POOL_MB        MiB of freed large results kept for re-use (runtime/buffer_pool; default 512, 0: off)
DVM_SPIN_US        microseconds a CPU VM worker spins for its next job before it sleeps (default 100,
                   0: sleep at once; vm/cpu_sync)
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache

VMS = ("cpu", "reference")


@dataclass(frozen=True)
class Config:
    debug: int
    dump_dir: str | None
    vm: str
    threads: int
    cache_size: int
    pool_mb: int
    cache_mb: int
    spin_us: int


def _int(name: str, default: int, lo: int, hi: int) -> int:
    raw = os.environ.get(name, "")
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer") from None
    if not lo <= value <= hi:
        raise ValueError(f"{name}={value} is outside [{lo}, {hi}]")
    return value


@lru_cache(maxsize=1)
def config() -> Config:
    vm = os.environ.get("DVM_VM", "cpu") or "cpu"
    if vm not in VMS:
        raise ValueError(f"DVM_VM={vm!r}: available VMs are {', '.join(VMS)}")
    return Config(debug=_int("DVM_DEBUG", 0, 0, 5), dump_dir=os.environ.get("DVM_DUMP_DIR") or None,
                  vm=vm, threads=_int("DVM_NUM_THREADS", os.cpu_count() or 1, 1, 1024),
                  cache_size=_int("DVM_CACHE_SIZE", 512, 1, 1 << 20),
                  pool_mb=_int("DVM_POOL_MB", 512, 0, 1 << 20),
                  spin_us=_int("DVM_SPIN_US", 100, 0, 1_000_000),
                  cache_mb=_int("DVM_CACHE_MB", 256, 1, 1 << 20))


def reload() -> Config:
    """Re-read the environment (tests and the CLI use this after changing it)."""
    config.cache_clear()
    return config()
