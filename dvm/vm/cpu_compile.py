"""Compile the CPU VM once per machine, not once per process.

The VM is one numba entry point (cpu_entry.run_units) cached on disk. A cold cache costs a long
compile (~13 min on this project's 2-core machine); processes that start together on it (pytest
workers, data-loader workers, one process per rank) would each compile the same code. `ensure`
makes the first use in every process take an exclusive lock on a file beside numba's cache: the
first process compiles and writes the cache; the others wait, then load it (~0.3 s). Where the
lock cannot be taken (no fcntl, a read-only cache directory) each process compiles on its own, as
numba does by default.
"""
from __future__ import annotations

import os
import threading

import numba

_LOCK_NAME = "dvm-vm-compile.lock"
_thread_lock = threading.Lock()
done = False   # set once ensure() has compiled or loaded the VM in this process (read per launch)


def ensure(dispatcher, example_args: tuple) -> None:
    """Compile (or load from the disk cache) `dispatcher` for the types of example_args, once per
    process, under the machine-wide lock."""
    global done
    if done:
        return
    with _thread_lock:
        if done:
            return
        sig = tuple(numba.typeof(a) for a in example_args)
        fd = _lock_file(dispatcher)
        try:
            dispatcher.compile(sig)
        finally:
            if fd is not None:
                os.close(fd)   # closing the descriptor releases the lock
        done = True


def _lock_file(dispatcher) -> int | None:
    """A descriptor holding the exclusive lock on the file beside the dispatcher's disk cache
    (blocks while another process holds it), or None."""
    try:
        import fcntl
        path = os.path.join(dispatcher._cache._cache_path, _LOCK_NAME)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except (ImportError, AttributeError, OSError):
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError:
        os.close(fd)
        return None
    return fd
