"""The CPU VM's worker threads: persistent daemon threads that share a big kernel's work units
with the launching thread (host/run.run_kernel), fed through a queue when asleep and through their
mailboxes (jit/sync) while they spin after a job. numba's threading layer is never started: its
spinning OpenMP threads slow PyTorch in the same process 10-40x."""
from __future__ import annotations

import ctypes
import queue
import threading
import time
import traceback

import numpy as np

from ....config import config
from .. import abi
from . import startup
from .pieces import TABLE

from .stack import chunk_size, line_aligned_words

assert (abi.S_CHUNK, abi.S_NPOST, abi.S_POST) == (3, 4, 5)   # sched, as _post builds it


class Workers:
    """Persistent daemon threads. A sleeping worker is fed through one C-level SimpleQueue
    (cheaper per launch than ThreadPoolExecutor's futures); after each job it spins on its
    mailbox for DVM_SPIN_US, where the next launch hands it a job through memory (jit/sync). The
    compiled code releases the GIL and reports its errors through the job's sched, never by
    raising."""

    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.count = 0
        self.lock = threading.Lock()
        self.post_lock = threading.Lock()   # one launching thread posts to the mailboxes at a time
        self.mbox: list[np.ndarray] = []   # per worker: its mailbox (jit/sync)
        self.mbox_addr: list[int] = []     # per worker: its mailbox's address
        self.keep: list = []                # per worker: the arrays of the job last posted to it
        self.tsc_per_us = 0.0

    def ensure(self, n: int) -> None:
        if self.count >= n:
            return
        with self.lock:
            if not self.tsc_per_us:
                self.tsc_per_us = _tsc_per_us()
            while self.count < n:
                self.mbox.append(_mailbox())
                self.mbox_addr.append(self.mbox[-1].ctypes.data)
                self.keep.append(None)
                threading.Thread(target=self._loop, args=(self.mbox[-1],), name=f"dvm-cpu-{self.count}",
                                 daemon=True).start()
                self.count += 1

    def _loop(self, row: np.ndarray) -> None:
        while True:
            fn, args = self.jobs.get()
            try:
                fn(*args[:7])   # args[7:]: what else the job reads, alive until it has run
                ticks = int(config().spin_us * self.tsc_per_us)
                if ticks > 0:
                    row[abi.MB_STATE] = abi.SPINNING   # only this worker leaves SLEEPING
                    startup.ENTRY(abi.WORKER, ticks, row, TABLE, row, row, False)
            except BaseException:  # pragma: no cover - e.g. MemoryError: shown, the worker survives
                traceback.print_exc()

    def submit(self, fn, args: tuple) -> None:
        self.jobs.put((fn, args))

    def launch(self, d, blob: np.ndarray, bufs: np.ndarray, helpers: int) -> int:
        """Run the units of kernel d (host/desc) on this thread and `helpers` workers. Returns the
        VM's error code."""
        err, sched = self._launch(0, d.n_units, blob, bufs, helpers, chunk_size(d.n_units, helpers + 1), ())
        return max(err, int(sched[abi.S_ERR]))

    def launch_stack(self, stack, recs: np.ndarray, recs_at: int, bufs: np.ndarray, helpers: int) -> int:
        """Run a stacked launch (host/stack) on this thread and `helpers` workers. Returns this
        thread's error code (the others' are in the records)."""
        return self._launch(abi.STACK, recs_at, stack.chain, bufs, helpers, 0, (recs,))[0]

    def _launch(self, u0: int, u1: int, blob: np.ndarray, bufs: np.ndarray, helpers: int, chunk: int,
                keep: tuple) -> tuple:
        if not self.post_lock.acquire(blocking=False):   # another thread is launching: queue only
            return self._post(u0, u1, blob, bufs, helpers, chunk, keep, [])
        try:
            spinning = [k for k in range(helpers) if self.mbox[k][abi.MB_STATE] == abi.SPINNING]
            return self._post(u0, u1, blob, bufs, helpers, chunk, keep, spinning)
        finally:
            self.post_lock.release()

    def _post(self, u0: int, u1: int, blob: np.ndarray, bufs: np.ndarray, helpers: int, chunk: int,
              keep: tuple, spinning: list) -> tuple:
        """Run job (u0, u1, blob) here and on the workers: (this thread's error code, sched). The
        compiled caller writes the job's fields into the listed mailboxes and posts them
        (jit/sync.post_all): in Python, each `.ctypes.data` costs about a microsecond. `keep`: what
        else the job reads (a stack's records), kept alive with it."""
        sched = np.array([0, 0, 0, chunk, len(spinning)] + [self.mbox_addr[k] for k in spinning], np.int64)
        for k in spinning:
            self.keep[k] = (blob, bufs, sched, keep)   # alive until this mailbox's next post
        entry = startup.ENTRY
        for _ in range(helpers - len(spinning)):   # sleeping (or busy) workers: through the queue
            self.submit(entry, (u0, u1, blob, TABLE, bufs, sched, False, keep))
        return entry(u0, u1, blob, TABLE, bufs, sched, True), sched


def _sched_yield_address() -> int:
    """The C library's sched_yield, or 0 where there is none to call."""
    try:
        return ctypes.cast(ctypes.CDLL(None).sched_yield, ctypes.c_void_p).value or 0
    except (OSError, AttributeError, TypeError):  # pragma: no cover - no C library by that name
        return 0


_SCHED_YIELD = _sched_yield_address()


def _mailbox() -> np.ndarray:
    """A worker's mailbox: MB_WIDTH int64 words alone in their 64-byte cache lines."""
    row = line_aligned_words(abi.MB_WIDTH)
    row[abi.MB_YIELD] = _SCHED_YIELD
    return row


def _tsc_per_us() -> float:
    """Time-stamp counter ticks per microsecond, measured over ~2 ms of busy waiting."""
    tsc_now = startup.tsc_now
    tsc_now()   # loaded (or compiled) before timing
    t0, c0 = time.perf_counter(), tsc_now()
    t1 = t0
    while t1 - t0 < 0.002:
        t1 = time.perf_counter()
    c1 = tsc_now()
    return max((c1 - c0) / max((t1 - t0) * 1e6, 1e-9), 1.0)
