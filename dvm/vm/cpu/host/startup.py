"""Getting the CPU VM's pieces (host/pieces) into a process: never blocking a first call on more
than the core's compile, and compiling each piece once per machine.

ensure_core: loads the CORE pieces from the disk cache; on a cold machine starts build processes
(host/build, one per core up to four) on every missing piece, the core first, under per-piece
locks (processes that start together compile each piece once), waits until the core is in the
cache, and says on stderr what it waits for. The build processes then go on with the FAST pieces
at low priority while programs run on the generic paths (a background build starts where only
FAST pieces are missing); a watcher thread writes each one's address into the VM table when the
build is done, and says so on stderr.
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import numpy as np

from .. import abi
from . import cache, pieces, tuning
from .pieces import BACKGROUND_FLAG, CORE, FAST, PIECES, install, loaded, say

ENTRY = None   # the core's compiled entry point (jit/entry.run_units), once ensure_core has run
_EMPTY = np.zeros(0, np.int64)
_lock = threading.Lock()
_fast_ready = threading.Event()
_fast_thread: threading.Thread | None = None
_fast_error: str | None = None   # the first fast piece that failed to build, if one did


def ensure_core() -> None:
    """Load or compile the CORE pieces (once per process; blocks on a cold machine), then start
    getting the FAST pieces."""
    global ENTRY
    if ENTRY is not None:
        return
    with _lock:
        if ENTRY is not None:
            return
        names = [p.name for p in PIECES if p.tier == CORE]
        missing = [n for n in names if not loaded(n).try_load()]
        build = None
        if missing:
            t0 = time.perf_counter()
            say(f"compiling the CPU VM's core ({len(missing)} of {_pieces(len(names))}) with numba, once per "
                f"machine: 30-60 s on 2 cores ...")
            build = _Build(missing, _missing_fast())
            build.wait_loaded(missing)
            _load_or_compile(missing)
            say(f"CPU VM core compiled in {time.perf_counter() - t0:.0f} s; cached in {pieces.cache_location()}")
        for n in names:
            install(n)
        _start_fast(build)
        ENTRY = loaded("core").entry


def tsc_now() -> int:
    """The CPU's time-stamp counter, read by the core (host/threads calibrates its spin with it)."""
    ensure_core()
    return ENTRY(abi.TSC_NOW, 0, _EMPTY, pieces.TABLE, _EMPTY, _EMPTY, False)


def wait_fast(timeout: float | None = None) -> bool:
    """Block until the FAST pieces are in the VM table (benchmarks measure the whole VM); False
    if `timeout` seconds passed first. Raises RuntimeError if one failed to build."""
    ensure_core()
    done = _fast_ready.wait(timeout)
    if _fast_error is not None:
        raise RuntimeError(f"a fast piece of the CPU VM failed to build: {_fast_error}")
    return done


def fast_ready() -> bool:
    return _fast_ready.is_set()


def _missing_fast() -> list[str]:
    """The FAST pieces not in the disk cache; those that are get loaded and installed."""
    missing = []
    for n in (p.name for p in PIECES if p.tier == FAST):
        if loaded(n).try_load():
            install(n)
        else:
            missing.append(n)
    return missing


def _start_fast(build: "_Build | None") -> None:
    """Get the FAST pieces: those the core's build processes go on to compile (`build`), else
    a background build of them."""
    global _fast_thread
    missing = _missing_fast()
    if not missing:
        _fast_ready.set()
        return
    if build is None or not build.alive():
        build = _Build([], missing)
        say(f"compiling the CPU VM's fast paths ({_pieces(len(missing))}) in the background (pid "
            f"{build.pids()}); programs run meanwhile, with the same results")
    else:
        say(f"the build processes (pid {build.pids()}) go on with the CPU VM's fast paths "
            f"({_pieces(len(missing))}) in the background; programs run meanwhile, with the same results")
    _fast_thread = threading.Thread(target=_finish_fast, args=(build, missing), name="dvm-cpu-fast", daemon=True)
    _fast_thread.start()


def _finish_fast(build: "_Build", missing: list[str]) -> None:
    """The watcher thread: each fast piece into the table once built. A piece that fails to build
    is said on stderr and stays out (its generic path runs: the same results)."""
    global _fast_error
    t0 = time.perf_counter()
    build.wait_all()
    for n in missing:
        try:
            _load_or_compile([n])
            install(n)
        except Exception as e:   # a bug in a fast piece must not stop the process: said, left out
            _fast_error = f"{n}: {type(e).__name__}: {e}"
            say(f"the CPU VM's fast piece {_fast_error.splitlines()[0]}; it stays out, its generic path runs")
    _fast_ready.set()
    say(f"CPU VM fast paths ready (compiled in {time.perf_counter() - t0:.0f} s)")


def _pieces(n: int) -> str:
    return f"{n} piece" if n == 1 else f"{n} pieces"


def _load_or_compile(names: list[str]) -> None:
    """Load pieces a build process compiled; compile here any it could not (it failed or died)."""
    for n in names:
        if not loaded(n).try_load():
            loaded(n).compile()


class _Build:
    """Build processes (host/build, one per core up to four) compiling pieces into the disk cache.
    Every process is given the same list (pieces.build_order: the core first, each tier longest
    first, the FAST pieces at low priority) and takes the next piece no other process has taken;
    where no lock can be taken, each is given every n-th piece of the list instead."""

    POLL_S = 0.1   # how often a first call waiting for the core looks for it in the cache

    def __init__(self, core: list[str], fast: list[str]):
        n = min(pieces.worker_count(), len(core) + len(fast))
        core, fast = pieces.build_order(core), pieces.build_order(fast)
        shared = n > 0 and cache.can_lock(loaded((core + fast)[0]).cache, (core + fast)[0])
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [_project_root()] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
        if tuning.build_features() is not None:   # the pieces' vector width (host/tuning)
            env["NUMBA_CPU_FEATURES"] = tuning.build_features()
        self.procs = [subprocess.Popen(_build_command(core, fast) if shared else
                                       _build_command(core[k::n], fast[k::n]), env=env, stdin=subprocess.DEVNULL)
                      for k in range(n)]

    def pids(self) -> str:
        return ", ".join(str(p.pid) for p in self.procs)

    def alive(self) -> bool:
        return any(p.poll() is None for p in self.procs)

    def wait_loaded(self, names: list[str]) -> None:
        """Wait until pieces `names` load from the disk cache, or every process has exited."""
        todo = list(names)
        while todo and self.alive():
            time.sleep(self.POLL_S)
            todo = [n for n in todo if not loaded(n).try_load()]

    def wait_all(self) -> None:
        for p in self.procs:
            p.wait()


def _build_command(core: list[str], fast: list[str]) -> list[str]:
    return [sys.executable, "-m", "dvm.vm.cpu.host.build", *core] + ([BACKGROUND_FLAG, *fast] if fast else [])


def _project_root() -> str:
    import dvm
    return os.path.dirname(os.path.dirname(os.path.abspath(dvm.__file__)))
