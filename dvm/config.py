"""The one place that reads the environment. Everything else asks `config()`.

DVM_DEBUG     0 quiet, 1 timings and counters, 2 fusion groups, 3 graph IR, 4 disassembly, 5 all
DVM_DUMP_DIR  directory where programs and reports are written when debugging (unset: none)
DVM_VM        which VM runs programs: "cpu" (numba, compiled once and cached on disk; the default)
              or "reference" (NumPy, the executable spec); "gpu" (Triton) runs host arrays only in
              Triton's interpreter mode: CUDA tensors always run on the GPU VM
DVM_GPU_SPECIALIZE launches of a kernel structure after which the GPU VM specialises it in the
                   background (vm/gpu/tiered; default 2, 0: interpret only)
DVM_GPU_CACHE      directory for the GPU VM's specialised kernel sources (default ~/.cache/dvm/gpu)
DVM_NUM_THREADS    threads of the CPU VM's parallel kernels (default: PyTorch's intra-op threads,
                   torch.set_num_threads, where the process has PyTorch's OpenMP runtime and
                   DVM_OPENMP=1; else the number of CPUs); results do not depend on it
DVM_CACHE_SIZE     programs kept per compiled graph (LRU, default 512)
DVM_CACHE_MB       MiB that each cache family (all programs, all launches, all builder traces) may hold
                   in all (default 256; codegen/lru)
DVM_POOL_MB        MiB of freed large results kept for re-use (runtime/buffer_pool; default 512, 0: off)
DVM_OPENMP         1 (default): where the process has an OpenMP runtime loaded (PyTorch's), the CPU VM's
                   parallel kernels run on its threads (vm/cpu/host/openmp); 0: on the VM's own workers
DVM_STACK          1 (default): the kernels of a CPU VM launch with a big kernel (or small ones with
                   enough work to share) run as one parallel job, independent ones beside each other
                   (vm/cpu/host/stack); 0: one by one
DVM_SIBLING_MB     MiB of concatenated weights that linears of one input, merged into one matrix product
                   (frontend/fx_sibling_linears), may hold in all (default 256; 0: off)
DVM_SPIN_US        microseconds a CPU VM worker spins for its next job before it sleeps (default 100,
                   0: sleep at once; vm/cpu/jit/sync)
DVM_VERIFY         1: accuracy verification mode (tools/verify): every torch-backend segment that runs
                   is also computed by PyTorch eager and in float64; a summary at exit, a reproducer
                   per failing kernel (in DVM_DUMP_DIR, else ./dvm-verify); default 0
DVM_LAZY           1 (default): dvm.lazy() records and fuses eager PyTorch code; 0: dvm.lazy() is a
                   no-op (A/B runs)
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache

from .vm.registry import VM_NAMES as VMS


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
    verify: bool = False
    lazy: bool = True
    openmp: bool = True
    stack: bool = True
    gpu_specialize: int = 2
    gpu_cache: str = ""
    gpu_vector: bool = False
    sibling_mb: int = 256
    threads_set: bool = False   # DVM_NUM_THREADS is set (else `threads` is the CPU count)


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
                  threads_set=bool(os.environ.get("DVM_NUM_THREADS")),
                  cache_size=_int("DVM_CACHE_SIZE", 512, 1, 1 << 20),
                  pool_mb=_int("DVM_POOL_MB", 512, 0, 1 << 20),
                  spin_us=_int("DVM_SPIN_US", 100, 0, 1_000_000),
                  verify=bool(_int("DVM_VERIFY", 0, 0, 1)), lazy=bool(_int("DVM_LAZY", 1, 0, 1)),
                  openmp=bool(_int("DVM_OPENMP", 1, 0, 1)), stack=bool(_int("DVM_STACK", 1, 0, 1)),
                  gpu_specialize=_int("DVM_GPU_SPECIALIZE", 2, 0, 1 << 30),
                  gpu_vector=bool(_int("DVM_GPU_VECTOR", 0, 0, 1)),
                  gpu_cache=os.environ.get("DVM_GPU_CACHE") or
                  os.path.join(os.path.expanduser("~"), ".cache", "dvm", "gpu"),
                  cache_mb=_int("DVM_CACHE_MB", 256, 1, 1 << 20),
                  sibling_mb=_int("DVM_SIBLING_MB", 256, 0, 1 << 20))


def reload() -> Config:
    """Re-read the environment (tests and the CLI use this after changing it)."""
    config.cache_clear()
    return config()
