"""Parallel kernels on the OpenMP team of the process, where it has one (PyTorch's).

PyTorch's OpenMP threads spin on their cores for a while after each of its parallel ops (libgomp:
about 300,000 turns). The VM's own workers (host/threads) then share two cores with them, and a
kernel right after a matmul ran at about half speed. Run through GOMP_parallel, the kernel gets
that team itself: threads already awake, no thread more than PyTorch's, and the same spin after
it that PyTorch's next op expects. GOMP_parallel is exported by libgomp and, for compatibility, by
LLVM's libomp and Intel's libiomp5. A runtime is only looked up among the libraries the process
has loaded: the VM never loads one itself. A process forked from this one never uses the team:
libgomp's pool is its parent's, and a parallel region there waits forever (PyTorch's own matmul
does); it runs on the VM's workers.
"""
from __future__ import annotations

import ctypes
import os
import re
import sys
import threading

import numpy as np

from ....config import config
from .. import abi
from .pieces import TABLE, loaded
from .stack import chunk_size, line_aligned_words

_RUNTIME = re.compile(r"/lib(gomp|iomp5|omp)[^/]*\.so[^/]*$")


def loaded_runtime() -> str | None:
    """The path of an OpenMP runtime mapped into this process, or None."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.rstrip("\n").partition("/")[2]
                if path and _RUNTIME.search("/" + path):
                    return "/" + path
    except OSError:   # pragma: no cover - no procfs: the VM's own workers run
        pass
    return None


def _runtime_function(path: str, name: str):
    """Function `name` of the runtime at `path`, already loaded (the VM never loads one); None
    where it is not there."""
    try:
        return getattr(ctypes.CDLL(path, mode=getattr(os, "RTLD_NOLOAD", 0) | os.RTLD_LOCAL), name)
    except (OSError, AttributeError):
        return None


def _gomp_parallel(path: str):
    """GOMP_parallel(fn, data, num_threads, flags) of the runtime at `path`."""
    fn = _runtime_function(path, "GOMP_parallel")
    if fn is not None:
        fn.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint)
        fn.restype = None
    return fn


def _omp_get_max_threads(path: str):
    """omp_get_max_threads() of the runtime at `path`: the size of the calling thread's next
    parallel region (PyTorch's intra-op threads: torch.set_num_threads sets it)."""
    fn = _runtime_function(path, "omp_get_max_threads")
    if fn is not None:
        fn.argtypes, fn.restype = (), ctypes.c_int
    return fn


class OpenMPTeam:
    """Launches a kernel's work units on the process's OpenMP team, once both the runtime and the
    VM's team body (the FAST piece "team", jit/team) are there; `usable()` says whether they are."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._parallel = None
        self._max_threads = None   # the runtime's omp_get_max_threads
        self._path = None   # the runtime's file
        self._body = 0
        self._modules_seen = -1   # len(sys.modules) at the last look for a runtime
        self._jobs = threading.local()   # per launching thread: {buffer count: (job, its address)}
        self._forked = False
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._after_fork)

    def _after_fork(self) -> None:
        self._forked, self._body = True, 0

    def usable(self) -> bool:
        if not config().openmp or self._forked:
            return False
        if self._body:
            return True
        self._look_up()
        if self._parallel is not None and loaded("team").ready:
            self._body = loaded("team").address
        return self._body != 0

    def size(self) -> int | None:
        """The size the team has for this thread's next parallel region (PyTorch's intra-op
        threads), where the process has an OpenMP runtime the VM may use; else None."""
        if not config().openmp or self._forked:
            return None
        self._look_up()
        return None if self._max_threads is None else max(1, self._max_threads())

    def _look_up(self) -> None:
        """Find the process's OpenMP runtime, looking again only after an import (a runtime is
        loaded by one)."""
        if self._parallel is not None or len(sys.modules) == self._modules_seen:
            return
        with self._lock:
            if self._parallel is None:
                self._modules_seen = len(sys.modules)
                self._path = loaded_runtime()
                if self._path:
                    self._parallel, self._max_threads = _gomp_parallel(self._path), _omp_get_max_threads(self._path)

    def describe(self) -> str:
        """Which threads run the parallel kernels now, in words."""
        if self.usable():
            return f"the OpenMP team of {self._path}"
        if not config().openmp:
            return "the VM's own workers (DVM_OPENMP=0)"
        if self._forked:
            return "the VM's own workers (a forked process: the OpenMP team is its parent's)"
        if self._parallel is not None:
            return "the VM's own workers until the team body is compiled"
        return "the VM's own workers (no OpenMP runtime in this process)"

    def launch(self, d, bufs: np.ndarray, nthreads: int) -> int:
        """Run the units of kernel d (host/desc) on nthreads threads of the team, this one among
        them; returns the VM's error code. The job array is this thread's own, re-used: the call
        returns after the team's end barrier, when no thread reads it any more."""
        job, at = self._job(bufs.shape[0])
        job[abi.J_U0], job[abi.J_U1] = 0, d.n_units
        job[abi.J_BLOB], job[abi.J_BLOB_N] = d.blob_at, d.blob.shape[0]
        job[abi.J_SCHED:abi.J_SCHED + abi.S_CHUNK] = 0
        job[abi.J_SCHED + abi.S_CHUNK] = chunk_size(d.n_units, nthreads)
        job[abi.J_BUFS:] = bufs
        self._parallel(self._body, at, nthreads, 0)
        return int(job[abi.J_SCHED + abi.S_ERR])

    def launch_stack(self, stack, recs_at: int, bufs: np.ndarray, nthreads: int) -> None:
        """Run a stacked launch (host/stack; its errors go to its records at recs_at) on nthreads
        threads of the team, this one among them."""
        job, at = self._job(bufs.shape[0])
        job[abi.J_U0], job[abi.J_U1] = abi.STACK, recs_at
        job[abi.J_BLOB], job[abi.J_BLOB_N] = stack.chain_at, stack.chain.shape[0]
        job[abi.J_BUFS:] = bufs
        self._parallel(self._body, at, nthreads, 0)

    def _job(self, n_words: int) -> tuple:
        jobs = getattr(self._jobs, "by_size", None)
        if jobs is None:
            jobs = self._jobs.by_size = {}
        got = jobs.get(n_words)
        if got is None:
            job = line_aligned_words(abi.J_BUFS + n_words)   # J_SCHED starts a cache line too
            job[abi.J_TAB], job[abi.J_TAB_N] = TABLE.ctypes.data, TABLE.shape[0]
            job[abi.J_NBUFS] = n_words // 2
            got = jobs[n_words] = (job, job.ctypes.data)
        return got
