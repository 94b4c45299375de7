"""The CPU VM: runs verified Programs with a numba interpreter compiled once per machine, in pieces.

  abi.py   every constant shared between the Python side and the compiled code
  host/    the Python side: decode table, descriptors, launches, threads (the OpenMP team or its own
           workers), pieces and their compile
  jit/     the compiled code: the core (jit/entry, jit/interp) and the pieces it calls per
           instruction (jit/kernels, mem, reduce, rowlevel; fast paths: jit/rowtree, jit/fused/)

Same contract and semantics as the reference VM (dvm/vm/reference.py); see vm/contract.py.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ...codegen import isa
from ...codegen.program import ProgramLayout
from ...codegen.target import Target
from ..contract import VM
from .host import startup
from .host.decode import DECODE, handled
from .host.desc import PARALLEL_MIN_ELEMS
from .host.fuse_plan import rereads_rows, tight_rows, whole_row_forms
from .host.run import default_threads, run, run_addrs


def warm_up(wait_fast: bool = False) -> None:
    """Load (or, on a cold machine, compile) the VM's core; with wait_fast, also wait until its
    fast paths are loaded (they compile in the background on a cold machine)."""
    startup.ensure_core()
    if wait_fast:
        startup.wait_fast()


def fast_ready() -> bool:
    """Whether the VM's fast paths are loaded (warm_up has started getting them)."""
    return startup.fast_ready()


def threads() -> int:
    """The threads a parallel kernel launched from this thread takes now (host/run.default_threads:
    DVM_NUM_THREADS, else PyTorch's intra-op threads where its OpenMP runtime is loaded, else the
    number of CPUs)."""
    return default_threads()


def thread_pool() -> str:
    """Which threads share the parallel kernels now (host/openmp), in words."""
    from .host.run import _TEAM
    return _TEAM.describe()


class CpuVM(VM):
    """The numba CPU VM under the VM contract."""
    name = "cpu"

    @property
    def target(self) -> Target:
        return _TARGET

    def warm_up(self) -> None:
        warm_up()

    def handles(self, spec: isa.InstrSpec) -> bool:
        return handled(spec)

    def run(self, layout: ProgramLayout, buffers: list[np.ndarray], threads: int | None = None) -> None:
        run(layout, buffers, threads)

    def bind(self, layout: ProgramLayout, numels) -> Callable[[list[int]], None]:
        from .host.launch import bound_runner
        return bound_runner(layout, list(numels))


_TARGET = Target("cpu", whole_row_forms=whole_row_forms, tight_rows=tight_rows, rereads_rows=rereads_rows,
                 serial_lanes=PARALLEL_MIN_ELEMS)
VM_INSTANCE = CpuVM()

__all__ = ["DECODE", "VM_INSTANCE", "fast_ready", "handled", "run", "run_addrs", "thread_pool", "warm_up"]
