"""The CPU VM's cached launch path: a verified program bound once to its buffers' element counts,
then called with nothing but the buffers' addresses (runtime.compiled.Launch keeps one per call
signature). The addresses are packed into an address table kept with the runner. A launch of small
kernels goes straight to numba's compiled entry of run_units (_ChainRunner); a launch with a big
kernel runs its kernels one by one, each on the threads its size gets (_ListRunner). Both offer
`caller`, which also folds the outputs' allocation and the launch count into one function (a
builder kernel's cached call, a torch segment's direct call).
"""
from __future__ import annotations

import struct
import threading
from functools import lru_cache, partial
from typing import Callable

import numpy as np

from ....codegen.program import ProgramLayout
from ...buffers import data_ptr
from . import startup
from .desc import prog_desc
from .pieces import TABLE
from .run import NO_SCHED, check, run_kernels


def bound_runner(layout: ProgramLayout, numels: list[int]) -> Callable[[list[int]], None]:
    """run.run_addrs(layout, ·) with its per-launch work done once: the returned function takes
    the buffers' addresses (their element counts are `numels`, fixed per launch signature)."""
    startup.ensure_core()
    _, descs, _, chain, stack = prog_desc(layout)
    if chain is None or stack is not None:
        return _ListRunner(descs, stack, chain, numels)
    return _ChainRunner(chain, numels)


@lru_cache(maxsize=64)
def _packer(n: int) -> Callable:
    return struct.Struct(f"{n}q").pack_into


class _Runner:
    """A program bound to its buffers' element counts. `go(table, NO_SCHED, False)` runs it on an
    address table (the n addresses, then the n element counts, C-contiguous int64) and returns the
    VM's error code. The runner's own table is packed with the addresses (one C call) under its
    lock; a launch that finds the lock taken (another thread runs the runner: the VM releases the
    GIL) packs a fresh one. One object with slots, not a closure: a model keeps one per segment
    and size, and the garbage collector walks each."""
    __slots__ = ("go", "table", "numels", "pack", "lock")

    def __init__(self, go: Callable, numels: list[int]):
        n = len(numels)
        self.go, self.numels = go, tuple(numels)
        self.table = np.array([0] * n + list(numels), np.int64)   # what the entry unboxes
        self.pack, self.lock = _packer(n), threading.Lock()

    def __call__(self, addrs: list[int]) -> None:
        if self.lock.acquire(False):
            try:
                self.pack(self.table, 0, *addrs)
                err = self.go(self.table, NO_SCHED, False)
            finally:
                self.lock.release()
        else:
            err = self._fresh(*addrs)
        if err:
            check(err)

    def _fresh(self, *addrs: int) -> int:
        """A run with its own address table (another thread holds the runner's)."""
        return self.go(np.array([*addrs, *self.numels], np.int64), NO_SCHED, False)

    def caller(self, outs: tuple, on_launch: Callable[[], object], ptr: Callable[[object], int] = data_ptr,
               single: bool = False, workspaces: tuple = ()) -> Callable:
        """A function (inputs) -> outputs running this program on the inputs and fresh outputs, with
        on_launch() per call. outs: one (allocator, *its arguments) per output (the runner's
        buffers after the inputs); ptr: an input's or output's address (NumPy arrays by default;
        the torch frontend passes its tensors' data_ptr). workspaces: (element count, dtype) of
        the runner's last buffers, the caller's own: allocated once and used under the runner's
        lock, so by one launch at a time (a launch that finds the lock taken allocates its own).
        It returns the output itself when `single` (one output), else the tuple of outputs. For
        one output of one or two inputs and no workspace (most launches), the same steps as
        __call__ in one function, without the address list between them."""
        n_in = len(self.numels) - len(outs) - len(workspaces)
        go, table, pack, lock, fresh = self.go, self.table, self.pack, self.lock, self._fresh
        if len(outs) != 1 or n_in not in (1, 2) or workspaces:
            makes = tuple(partial(*o) for o in outs)
            kept = tuple(np.empty(n, dt) for n, dt in workspaces)   # alive while call_any is (read below)
            ws_addrs = tuple(w.ctypes.data for w in kept)

            def call_any(arrays):
                made = tuple([make() for make in makes])
                on_launch()
                if lock.acquire(False):
                    try:
                        pack(table, 0, *map(ptr, arrays), *map(ptr, made), *ws_addrs)
                        err = go(table, NO_SCHED, False)
                    finally:
                        lock.release()
                else:
                    own = [np.empty_like(w) for w in kept]
                    err = fresh(*map(ptr, arrays), *map(ptr, made), *(w.ctypes.data for w in own))
                if err:
                    check(err)
                return made[0] if single else made
            return call_any
        # one output of one or two inputs (most launches): the addresses as plain arguments
        make = partial(*outs[0])
        one_in = n_in == 1

        def call(arrays):
            o = make()
            on_launch()
            if lock.acquire(False):
                try:
                    if one_in:
                        pack(table, 0, ptr(arrays[0]), ptr(o))
                    else:
                        pack(table, 0, ptr(arrays[0]), ptr(arrays[1]), ptr(o))
                    err = go(table, NO_SCHED, False)
                finally:
                    lock.release()
            else:
                err = fresh(*map(ptr, arrays), ptr(o))
            if err:
                check(err)
            return o if single else (o,)
        return call


class _ChainRunner(_Runner):
    """A chain of small kernels (host/desc._chain), run whole in one call of numba's compiled entry
    for its argument types (host/startup.ENTRY), without the dispatcher's type matching of seven
    arguments."""
    __slots__ = ()

    def __init__(self, chain: np.ndarray, numels: list[int]):
        super().__init__(partial(startup.ENTRY, 0, -1, chain, TABLE), numels)


class _ListRunner(_Runner):
    """Kernels with a big one, or small ones with a stack: as one parallel job, else as the chain
    or one by one, each on the threads its size gets (host/run.run_kernels)."""
    __slots__ = ()

    def __init__(self, descs, stack, chain, numels: list[int]):
        super().__init__(partial(_run_list, tuple(descs), stack, chain), numels)


def _run_list(descs: tuple, stack, chain, table: np.ndarray, _sched: np.ndarray, _wait: bool) -> int:
    """run.run_kernels on an address table, with `go`'s calling convention (see _Runner: the last
    two arguments stand for the entry's)."""
    return run_kernels(descs, table, None, stack, chain)
