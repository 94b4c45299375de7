"""The body an OpenMP team runs for one parallel kernel of the CPU VM (host/openmp.OpenMPTeam).

A process with PyTorch has an OpenMP runtime whose threads spin for a while after each of
PyTorch's parallel ops. The VM's own workers would share the cores with those spinning threads;
run on the same team instead, a kernel finds its helpers already awake. Every thread of the team,
the launching one included, calls team_body with the same job (abi.J_*) and claims chunks of work
units from the job's atomic counter (jit/entry._exec_units), so who runs which unit never changes
a result; errors go to the job's sched. The team's end barrier is the launch's join.
"""
from __future__ import annotations

from numba import carray

from ..abi import H_LEN, J_BLOB, J_BLOB_N, J_BUFS, J_NBUFS, J_SCHED, J_TAB, J_TAB_N, J_U0, J_U1, S_CHUNK, STACK
from .bits import ptr_i64
from .entry import _run_kernel, run_stack


def team_body(job):
    """Run the job at address `job` (abi.J_*) with the other threads of a team: one kernel's units
    [J_U0, J_U1), or a stacked launch (J_U0 == STACK: jit/entry.run_stack; its errors are in its
    records). C signature void(int64): the pointer GOMP_parallel passes. Compiled (host/pieces)
    like the pieces, as a C function."""
    j = carray(ptr_i64(job), J_BUFS)
    blob = carray(ptr_i64(j[J_BLOB]), j[J_BLOB_N])
    tab = carray(ptr_i64(j[J_TAB]), j[J_TAB_N])
    bufs = carray(ptr_i64(job + 8 * J_BUFS), 2 * j[J_NBUFS])
    if j[J_U0] == STACK:
        run_stack(blob, tab, bufs, j[J_U1])
        return
    base = blob.ctypes.data
    kernel = carray(ptr_i64(base), blob[H_LEN])
    _run_kernel(j[J_U0], j[J_U1], kernel, base, tab, bufs, carray(ptr_i64(job + 8 * J_SCHED), S_CHUNK + 1))
