"""Parallel stacking: the kernels of a Program with a big kernel run as one parallel job (abi.STACK,
jit/entry.run_stack) instead of one job per big kernel and the small ones alone on the launching
thread; so do small kernels only (one call on one thread otherwise) where STACK_MIN_SIDE_WORK of
their work can run beside other work, on the OpenMP team (host/run).

Every thread of the job claims units of kernel 0, goes on to kernel 1 when none is left to claim,
and so on; it waits only before a kernel that depends on the kernels since the last wait: one that
loads an argument they store, or stores one they load or store (by argument, from each kernel's
loads and stores: host/stream). Independent kernels (the RoPE of q and of k, a norm beside a
residual copy, a small kernel beside a big one) so share the threads, and a launch of n kernels
pays one start and one join. A small kernel (below PARALLEL_MIN_ELEMS) is claimed whole by one
thread. An output written over an input (an in-place update: the input is touched by no kernel
but the one storing the output) keeps these waits; any other overlap of a stored argument with
another makes every kernel wait for the ones before it: the order of sequence stacking (checked
per launch, jit/entry._aliases_ordered). Results are bitwise those of running the kernels one by
one: each unit computes the same elements from the same inputs whoever runs it.
"""
from __future__ import annotations

import threading

import numpy as np

from .. import abi

PARALLEL_MIN_ELEMS = 1 << 16   # below this a kernel runs on one thread
# small kernels only (one call on one thread otherwise) are stacked from this much work beside
# the largest of each run between waits: as much as each thread gets of a kernel just big enough
# to be shared between two
STACK_MIN_SIDE_WORK = PARALLEL_MIN_ELEMS // 2
CHUNKS_PER_THREAD = 4   # units are claimed in chunks of about n_units / (threads * this)
CACHE_LINE = 64


def chunk_size(n_units: int, threads: int) -> int:
    """How many units a thread claims at a time (sched[S_CHUNK])."""
    return max(1, n_units // (threads * CHUNKS_PER_THREAD))


def line_aligned_words(n: int) -> np.ndarray:
    """n zeroed int64 words starting on a cache line (kept alive by the view's base)."""
    raw = np.zeros(n + CACHE_LINE // 8, np.int64)
    skip = (-raw.ctypes.data % CACHE_LINE) // 8
    return raw[skip:skip + n]


def arg_owners(descs) -> np.ndarray:
    """Per argument the kernel that stores it, then per argument the kernel that loads or stores
    it (-1: none, -2: several), for jit/entry._aliases_ordered."""
    n = len(descs[0].argst)
    store, touch = np.full(n, -1, np.int64), np.full(n, -1, np.int64)
    for k, d in enumerate(descs):
        for owner, used in ((store, d.argst != 0), (touch, (d.argst != 0) | (d.argld != 0))):
            owner[used] = np.where(owner[used] == -1, k, -2)
    return np.concatenate([store, touch])


def kernel_waits(descs) -> list[int]:
    """Per kernel, 1 where it must wait for the kernels since the last wait (see the module
    docstring), from the descriptors' argst (stored) and argld (loaded) flags."""
    waits = []
    stored: set = set()
    loaded: set = set()
    for d in descs:
        st = set(np.flatnonzero(d.argst).tolist())
        ld = set(np.flatnonzero(d.argld).tolist())
        wait = bool(ld & stored or st & (stored | loaded))
        waits.append(int(wait))
        if wait:
            stored, loaded = st, ld
        else:
            stored, loaded = stored | st, loaded | ld
    return waits


def side_work(descs, waits) -> int:
    """The work that can run beside other work: per run of kernels between waits, all of its work
    but its largest kernel's."""
    total = largest = side = 0
    for d, wait in zip(descs, waits):
        if wait:
            side += total - largest
            total = largest = 0
        total, largest = total + d.work, max(largest, d.work)
    return side + total - largest


class Stack:
    """A Program's kernels as one parallel job: their blobs back to back (`chain`) and the records'
    contents per thread count (abi.G_*: units, chunk, wait, the arguments' owners; counters
    zero)."""
    __slots__ = ("chain", "chain_at", "units", "n_words", "waits", "_descs", "_owners", "_templates", "_mine")

    def __init__(self, descs, waits: list[int], chain: np.ndarray | None = None):
        """Takes the descriptors' blobs into `chain` (their concatenation, given or made): each
        descriptor's blob becomes a view of it (one copy of the words, not two). waits:
        kernel_waits(descs)."""
        self.chain = np.concatenate([d.blob for d in descs]) if chain is None else chain
        self.chain_at = self.chain.ctypes.data
        at = 0
        for d in descs:
            n = d.blob.shape[0]
            d.blob, d.blob_at = self.chain[at:at + n], self.chain_at + 8 * at
            at += n
        self.units = sum(d.n_units for d in descs)
        self._descs, self.waits = tuple(descs), tuple(waits)
        self._owners = arg_owners(descs)
        self.n_words = abi.G_REC + abi.G_WIDTH * len(descs) + len(self._owners)
        self._templates: dict[int, np.ndarray] = {}
        self._mine = threading.local()   # per launching thread: {thread count: (records, address)}

    @classmethod
    def of(cls, descs, chain: np.ndarray | None = None) -> "Stack | None":
        """The stack of a launch of these kernels, or None where stacking has nothing to share:
        fewer than two kernels with work, or (`chain`: small kernels only, which one thread runs
        in one call) less than STACK_MIN_SIDE_WORK of work that can run beside other work."""
        if sum(1 for d in descs if d.n_units) < 2:
            return None
        waits = kernel_waits(descs)
        if chain is not None and side_work(descs, waits) < STACK_MIN_SIDE_WORK:
            return None
        return cls(descs, waits, chain)

    def records(self, nthreads: int, reuse: bool) -> tuple[np.ndarray, int]:
        """Records for a launch on nthreads threads (counters zero), and their address. `reuse`:
        this thread's own records of the last launch, written over (where no thread reads them
        after the launch: the OpenMP team's end barrier); else fresh ones (a late worker may read
        the last ones)."""
        t = self._templates.get(nthreads)
        if t is None:
            t = self._templates[nthreads] = self._template(nthreads)
        if not reuse:
            recs = t.copy()
            return recs, recs.ctypes.data
        mine = self._mine.__dict__
        got = mine.get(nthreads)
        if got is None:
            recs = line_aligned_words(self.n_words)   # each kernel's counters on a line of their own
            got = mine[nthreads] = (recs, recs.ctypes.data)
        got[0][:] = t
        return got

    def _template(self, nthreads: int) -> np.ndarray:
        t = np.zeros(self.n_words, np.int64)
        t[abi.G_NK] = len(self._descs)
        for k, (d, wait) in enumerate(zip(self._descs, self.waits)):
            r = abi.G_REC + abi.G_WIDTH * k
            small = d.work < PARALLEL_MIN_ELEMS
            t[r + abi.S_CHUNK] = max(d.n_units, 1) if small else chunk_size(d.n_units, nthreads)
            t[r + abi.G_UNITS], t[r + abi.G_WAIT] = d.n_units, wait
        t[self.n_words - len(self._owners):] = self._owners
        return t
