"""Running a verified Program on the CPU VM: buffers or addresses in, the compiled core called once
per launch of small kernels, or once per kernel with the big ones' work units shared between the
calling thread and DVM_NUM_THREADS - 1 helpers: the OpenMP team of the process where it has one
(host/openmp: PyTorch's), else the VM's own persistent workers (host/threads). numba's own
threading layer is never used: its spinning OpenMP threads slow PyTorch in the same process 10-40x.
A launch of several kernels with a big one runs them as one parallel job (host/stack: parallel
stacking). Counted: cpu_parallel_openmp, cpu_parallel_workers (per parallel kernel), cpu_stacked_openmp,
cpu_stacked_workers (per stacked launch).

Work units are row blocks (each runs all sweeps of its rows, so reductions never cross threads and
results do not depend on the thread count), or, for kernels with one sweep and no init/fin,
single tiles.
"""
from __future__ import annotations

import numpy as np

from ....codegen.program import ProgramLayout
from ....config import config
from ....runtime.counters import bump
from ...buffers import data_ptr
from .. import abi
from .desc import prog_desc
from .pieces import TABLE
from . import startup
from .openmp import OpenMPTeam
from .stack import PARALLEL_MIN_ELEMS, Stack
from .threads import Workers

NO_SCHED = np.zeros(0, np.int64)
_WORKERS = Workers()
_TEAM = OpenMPTeam()


def check(err: int) -> None:
    """Raise for an error code of the compiled code."""
    if err == abi.ERR_ZERODIV:
        raise ZeroDivisionError("integer division or remainder by zero")
    if err != abi.ERR_OK:
        raise NotImplementedError(f"CPU VM: unhandled instruction (error {err})")


def run_kernel(d, blob: np.ndarray, bufs: np.ndarray, threads: int | None) -> int:
    """Run one kernel's work units; returns the VM's error code. Big kernels are shared with
    DVM_NUM_THREADS - 1 helpers (the OpenMP team's threads or the VM's workers): the caller starts
    at once and helpers join when they wake up (a sleeping worker's handoff costs tens of
    microseconds, a spinning one's a fraction of one, see jit/sync), claiming chunks of units from
    an atomic counter, so a late helper costs nothing."""
    nthreads = 1
    if d.work >= PARALLEL_MIN_ELEMS:
        nthreads = min(default_threads() if threads is None else max(1, int(threads)), d.n_units)
    if nthreads == 1:
        return startup.ENTRY(0, d.n_units, blob, TABLE, bufs, NO_SCHED, False)
    if _TEAM.usable():
        bump("cpu_parallel_openmp")
        return _TEAM.launch(d, bufs, nthreads)
    bump("cpu_parallel_workers")
    _WORKERS.ensure(nthreads - 1)
    return _WORKERS.launch(d, blob, bufs, nthreads - 1)


def default_threads() -> int:
    """DVM_NUM_THREADS where it is set; else the OpenMP team's size where the process has a
    runtime (PyTorch's: the VM's kernels take the threads torch.set_num_threads gives PyTorch's
    own ops, and no more); else the number of CPUs."""
    c = config()
    team = None if c.threads_set else _TEAM.size()
    return c.threads if team is None else team


def run_kernels(descs, bufs: np.ndarray, threads: int | None, stack: Stack | None = None,
                chain: np.ndarray | None = None) -> int:
    """The kernels of a launch: as one parallel job (host/stack, parallel stacking) where it has a
    stack and more than one thread runs it (and DVM_STACK=1; small kernels only on the OpenMP
    team: a job handed to the VM's workers costs more than they gain); else the chain of small
    kernels in one call, or in order (kernel i+1 starts after kernel i finished), up to the first
    error; returns its code (0: none)."""
    if stack is not None and config().stack:
        nthreads = min(default_threads() if threads is None else max(1, int(threads)), stack.units)
        team = _TEAM.usable()
        if nthreads > 1 and (team or chain is None):
            return run_stack(stack, bufs, nthreads, team)
    if chain is not None:
        return startup.ENTRY(0, -1, chain, TABLE, bufs, NO_SCHED, False)
    for d in descs:
        if d.n_units:
            err = run_kernel(d, d.blob, bufs, threads)
            if err:
                return err
    return 0


def run_stack(stack: Stack, bufs: np.ndarray, nthreads: int, team: bool) -> int:
    """A stacked launch on nthreads threads (the OpenMP team's where `team`, else this one and the
    VM's workers); returns an error code of its kernels (0: none)."""
    if team:
        bump("cpu_stacked_openmp")
        recs, at = stack.records(nthreads, True)
        _TEAM.launch_stack(stack, at, bufs, nthreads)
        return recs.item(abi.G_ERR)
    bump("cpu_stacked_workers")
    _WORKERS.ensure(nthreads - 1)
    recs, at = stack.records(nthreads, False)
    err = _WORKERS.launch_stack(stack, recs, at, bufs, nthreads - 1)
    return err or recs.item(abi.G_ERR)


def run(layout: ProgramLayout, buffers: list[np.ndarray], threads: int | None = None) -> None:
    """Execute a verified program (see codegen.verifier.verify / check_buffers)."""
    outs = prog_desc(layout)[2]
    bufs = buffers
    copied = ()
    for b in buffers:
        if not b.flags.c_contiguous:
            bufs = [np.ascontiguousarray(x) for x in buffers]
            copied = [a for a in outs if not buffers[a].flags.c_contiguous]
            break
    try:
        run_addrs(layout, np.array([data_ptr(b) for b in bufs] + [b.shape[0] for b in bufs], np.int64), threads)
    finally:
        for a in copied:
            buffers[a][...] = bufs[a]
    _ = bufs  # keep the (possibly copied) buffers alive until the VM has finished


def run_addrs(layout: ProgramLayout, bufs: np.ndarray, threads: int | None = None) -> None:
    """Execute a verified program on buffers given by base address and element count (`bufs`: the
    n addresses, then the n counts, int64). The caller keeps the buffers alive and guarantees
    they passed check_buffers (or have the same dtypes and extents as buffers that did)."""
    if startup.ENTRY is None:   # a module attribute: the cheapest check a launch can make
        startup.ensure_core()
    pd = prog_desc(layout)
    check(run_kernels(pd[1], bufs, threads, pd[4], pd[3]))
