"""The vector width the CPU VM's pieces are compiled for.

LLVM tunes every AVX-512 CPU model to prefer 256-bit vectors (its `prefer-256-bit` feature: on the
first AVX-512 Xeons, 512-bit instructions lower the core's clock). The VM's loops are float32
math over whole tiles, which run 1.3-1.5x faster with 512-bit vectors on later models
(docs/DECISIONS.md, Start-up). So the build processes (host/startup) compile the pieces with that
preference turned off on AVX-512 CPUs, except the models whose clock drops (NARROW_CPUS).

Invariant: only the width of the vectors changes, never a lane's arithmetic. The VM's math has
explicit FMAs and at most fastmath `contract` (never `reassoc`: no reduction is reordered by the
vectorizer), so 512-bit code gives the 256-bit code's results bit for bit.

A user's NUMBA_CPU_FEATURES is left alone: the pieces are then built with exactly those features.
Nothing changes in the user's process: only the build processes get the features. The disk cache
key (host/cache) leaves the preference out (`key_features`): a piece compiled in the user's
process (where its build process failed; numba's default width there) loads as well. The pieces'
source stamp (host/pieces.source_hash) includes `stamp()`, so code built before this choice is
not loaded for it.
"""
from __future__ import annotations

import os
from functools import lru_cache

WIDE = "-prefer-256-bit"      # the LLVM feature string item that lets the vectorizer use zmm
# AVX-512 CPU models whose clock drops under 512-bit instructions (LLVM's reason to prefer 256)
NARROW_CPUS = frozenset({"skylake-avx512", "cascadelake", "cooperlake", "cannonlake", "knl", "knm"})


@lru_cache(maxsize=1)
def build_features() -> str | None:
    """The NUMBA_CPU_FEATURES the build processes compile with: the user's, where set; else the
    host's features (as numba computes them) plus WIDE on an AVX-512 CPU not in NARROW_CPUS;
    else None (numba's default)."""
    user = os.environ.get("NUMBA_CPU_FEATURES")
    if user:
        return user
    from llvmlite import binding as llvm
    from numba.core.codegen import get_host_cpu_features
    if llvm.get_host_cpu_name() in NARROW_CPUS:
        return None
    features = get_host_cpu_features()
    if "+avx512f" not in features.split(","):
        return None
    return f"{features},{WIDE}"


def stamp() -> str:
    """What the pieces' source stamp says of the width: the same in the build processes (which
    get build_features() as NUMBA_CPU_FEATURES) and in the process that loads their code."""
    return "zmm" if WIDE in (build_features() or "").split(",") else ""


def key_features(features: str) -> str:
    """A codegen's feature string without the width preference: the disk cache key's part."""
    return ",".join(f for f in features.split(",") if f != WIDE)
