"""The CPU VM's threads (host/openmp, host/threads, jit/team, jit/sync): parallel kernels on the
process's OpenMP team (PyTorch's), and on the VM's own workers with their spin and mailboxes; results
bitwise those of one thread either way."""
from __future__ import annotations

import functools
import os
import sys
import time

import numpy as np
import pytest
import torch

from dvm import config as dvm_config
from dvm.vm import cpu
from dvm.vm.cpu import abi as cpu_sync
from dvm.vm.cpu.host import run as cpu_run

from test_cpu_vm import RNG, ew_kernel, layernorm, run_on, softmax

pytestmark = [pytest.mark.cpu_vm, pytest.mark.vm_once]   # the CPU VM's own machinery


@pytest.fixture
def spin_us(monkeypatch):
    """Set DVM_SPIN_US within one test (config reloaded), on the VM's own workers (DVM_OPENMP=0:
    this process has PyTorch's OpenMP runtime)."""
    monkeypatch.setenv("DVM_OPENMP", "0")

    def set_spin(us: int) -> None:
        monkeypatch.setenv("DVM_SPIN_US", str(us))
        dvm_config.reload()
    set_spin(dvm_config.config().spin_us)
    yield set_spin
    monkeypatch.delenv("DVM_SPIN_US")
    monkeypatch.delenv("DVM_OPENMP")
    dvm_config.reload()   # a worker still spinning stops within the last spin time set


@pytest.fixture
def openmp_team():
    """The OpenMP team of this process (PyTorch's), with its GOMP_parallel calls counted."""
    cpu.warm_up(wait_fast=True)   # the team body is a fast piece
    team = cpu_run._TEAM
    if not team.usable():
        pytest.skip(f"no OpenMP team: {cpu.thread_pool()}")
    real, calls = team._parallel, []

    def counted(*args):
        calls.append(args[2])   # the team's size
        return real(*args)
    team._parallel = counted
    yield calls
    team._parallel = real


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="looks the runtime up in /proc/self/maps")
def test_openmp_runtime_found_with_torch():
    from dvm.vm.cpu.host import openmp
    assert torch.get_num_threads() >= 1   # PyTorch's runtime is loaded by now
    path = openmp.loaded_runtime()
    assert path is not None and "omp" in path.rsplit("/", 1)[-1]
    assert openmp._gomp_parallel(path) is not None


def test_openmp_team_runs_parallel_kernels(openmp_team, monkeypatch):
    """Parallel kernels on the OpenMP team: bitwise the results of one thread, for every team
    size, a division by zero still raises; DVM_OPENMP=0 takes the VM's own workers."""
    x = RNG.standard_normal((300, 3000)).astype(np.float32)
    big = RNG.standard_normal(1 << 20).astype(np.float32)
    gelu = ew_kernel("gelu", 1)
    one = functools.partial(cpu.run, threads=1)
    want = (run_on(one, softmax, x) + run_on(one, gelu, big) + run_on(one, layernorm, x, x[0], x[1]))
    for n in (2, 3, 2):
        run_n = functools.partial(cpu.run, threads=n)
        del openmp_team[:]
        got = run_on(run_n, softmax, x) + run_on(run_n, gelu, big) + run_on(run_n, layernorm, x, x[0], x[1])
        assert [g.tobytes() for g in got] == [w.tobytes() for w in want]
        assert len(openmp_team) >= 3 and max(openmp_team) == n   # (fewer where a kernel has fewer units)
    a = np.arange(1 << 17, dtype=np.int64)
    b = np.ones(1 << 17, dtype=np.int64)
    b[-5] = 0   # in the last units: another thread of the team may run them
    with pytest.raises(ZeroDivisionError):
        run_on(functools.partial(cpu.run, threads=2), ew_kernel("floor_divide", 2), a, b)
    monkeypatch.setenv("DVM_OPENMP", "0")
    dvm_config.reload()
    try:
        n_calls = len(openmp_team)
        assert "DVM_OPENMP=0" in cpu.thread_pool()
        assert run_on(functools.partial(cpu.run, threads=2), softmax, x)[0].tobytes() == want[0].tobytes()
        assert len(openmp_team) == n_calls
    finally:
        monkeypatch.delenv("DVM_OPENMP")
        dvm_config.reload()
    assert "OpenMP team" in cpu.thread_pool()


def test_default_threads_follow_torch_set_num_threads(openmp_team, monkeypatch):
    """Without DVM_NUM_THREADS a parallel kernel takes the threads torch.set_num_threads gives
    PyTorch's ops (none more: one thread runs no parallel region); DVM_NUM_THREADS, where set, wins."""
    x = RNG.standard_normal((300, 3000)).astype(np.float32)
    monkeypatch.delenv("DVM_NUM_THREADS", raising=False)
    dvm_config.reload()
    old = torch.get_num_threads()
    try:
        want = None
        for n in (1, 3, 2):
            torch.set_num_threads(n)
            assert cpu.threads() == n
            del openmp_team[:]
            got = run_on(cpu.run, softmax, x)[0]
            assert max(openmp_team, default=1) == n
            want = got if want is None else want
            assert got.tobytes() == want.tobytes()
        torch.set_num_threads(1)
        monkeypatch.setenv("DVM_NUM_THREADS", "2")
        dvm_config.reload()
        assert cpu.threads() == 2
        del openmp_team[:]
        assert run_on(cpu.run, softmax, x)[0].tobytes() == want.tobytes()
        assert max(openmp_team) == 2
    finally:
        torch.set_num_threads(old)
        monkeypatch.delenv("DVM_NUM_THREADS", raising=False)
        dvm_config.reload()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork only")
def test_forked_process_runs_parallel_kernels_without_the_team(openmp_team):
    """A process forked after the team ran (a DataLoader worker) must not enter a parallel region
    of its parent's OpenMP pool (it would wait forever): it runs on the VM's workers, with the
    same results."""
    x = RNG.standard_normal((300, 3000)).astype(np.float32)
    two = functools.partial(cpu.run, threads=2)
    want = run_on(two, softmax, x)[0]
    assert openmp_team   # the parent ran it on the team
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:   # pragma: no cover - the child reports through the pipe
        ok = 0
        try:
            ok = int("forked" in cpu.thread_pool() and run_on(two, softmax, x)[0].tobytes() == want.tobytes())
        finally:
            os.write(write, bytes([ok]))
            os._exit(0)
    os.close(write)
    deadline = time.monotonic() + 120
    while os.waitpid(pid, os.WNOHANG) == (0, 0):
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            pytest.fail("the forked process hung in a parallel kernel")
        time.sleep(0.05)
    assert os.read(read, 1) == b"\x01"
    os.close(read)
    assert "OpenMP team" in cpu.thread_pool()   # the parent keeps its team


def _wait_all(state: int, seconds: float = 5.0) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if all(mb[cpu_sync.MB_STATE] == state for mb in cpu_run._WORKERS.mbox):
            return True
        time.sleep(0.005)
    return False


def test_spinning_workers_take_posted_jobs(spin_us):
    """A worker that spins after a job takes the next launch's job from its mailbox (cpu_sync):
    results stay bitwise those of one thread, a division by zero in a posted job still raises,
    and a worker whose spin time ran out sleeps and is woken through the queue again."""
    x = RNG.standard_normal((300, 3000)).astype(np.float32)
    want = run_on(functools.partial(cpu.run, threads=1), softmax, x)
    two = functools.partial(cpu.run, threads=2)
    spin_us(200_000)
    run_on(two, softmax, x)   # a sleeping worker: queued; then it spins
    taken = sum(int(mb[cpu_sync.MB_TAKEN]) for mb in cpu_run._WORKERS.mbox)
    for _ in range(20):
        got = run_on(two, softmax, x)
        assert got[0].tobytes() == want[0].tobytes()
    assert sum(int(mb[cpu_sync.MB_TAKEN]) for mb in cpu_run._WORKERS.mbox) > taken
    if sys.platform.startswith("linux"):   # past the first 1/SPIN_ALONE of its window a spinning worker
        assert all(mb[cpu_sync.MB_YIELD] != 0 for mb in cpu_run._WORKERS.mbox)   # yields the core at each
        window_us = 400_000                                                       # turn, still taking jobs
        spin_us(window_us)

        def taken_now() -> int:
            return sum(int(mb[cpu_sync.MB_TAKEN]) for mb in cpu_run._WORKERS.mbox)
        big = RNG.standard_normal((2000, 4000)).astype(np.float32)   # a job long enough for a worker
        want_big = run_on(functools.partial(cpu.run, threads=1), softmax, big)   # that yielded its core
        for _ in range(10):   # to be scheduled on a loaded machine (other pytest workers)
            run_on(two, softmax, x)   # the worker spins anew after this job (or after its queued copy)
            time.sleep(2 * window_us / cpu_sync.SPIN_ALONE / 1e6)
            taken = taken_now()
            assert run_on(two, softmax, big)[0].tobytes() == want_big[0].tobytes()
            if taken_now() > taken:
                break
        assert taken_now() > taken
    a = np.arange(1 << 17, dtype=np.int64)
    b = np.ones(1 << 17, dtype=np.int64)
    b[-5] = 0   # in the last units: the worker may be the one that runs them
    for _ in range(5):
        with pytest.raises(ZeroDivisionError):
            run_on(two, ew_kernel("floor_divide", 2), a, b)
    spin_us(1000)
    run_on(two, softmax, x)
    assert _wait_all(cpu_sync.SLEEPING)
    assert run_on(two, softmax, x)[0].tobytes() == want[0].tobytes()
    spin_us(0)   # no spinning at all: every job goes through the queue
    assert _wait_all(cpu_sync.SLEEPING)
    assert run_on(two, softmax, x)[0].tobytes() == want[0].tobytes()
    assert _wait_all(cpu_sync.SLEEPING)

