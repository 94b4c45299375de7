"""Tiered execution of the GPU VM: the interpreter serves every kernel at once; a kernel structure
(specialize.structure_key: its stream, never its sizes) launched DVM_GPU_SPECIALIZE times is
specialised into its own Triton kernel by a background thread (source cached on disk under
DVM_GPU_CACHE, binary in Triton's cache); the next launch of that structure runs the interpreter
as usual, then the specialised kernel into shadow copies of what the kernel block writes, and the
specialised kernel is switched in only when every byte agrees. No launch waits for a compile.

States: new -> queued -> ready -> trusted | rejected; a generation or compile error: failed. Each
step is counted (gpu_tier_* in dvm.counters()); `report()` lists the structures.
"""
import hashlib
import os
import queue
import threading
from dataclasses import dataclass, field

import numpy as np

from ...config import config
from ...runtime import counters
from . import abi, specialize
from .launcher import launcher

NEW, QUEUED, READY, TRUSTED, REJECTED, FAILED = "new", "queued", "ready", "trusted", "rejected", "failed"
BYTES_BLOCK = 1024


@dataclass
class Tier:
    key: str
    launches: int = 0
    state: str = NEW
    kernel: object = None          # the specialised JIT function, once ready
    launch: object = None          # its launcher.Launcher
    error: str = ""
    path: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)


class TierManager:
    """Structures, their specialised kernels, and the one background worker that builds them."""

    def __init__(self):
        self.tiers: dict[str, Tier] = {}
        self.lock = threading.Lock()
        self.jobs: queue.Queue = queue.Queue()
        self.worker: threading.Thread | None = None
        self.idle = threading.Event()
        self.idle.set()

    def tier(self, key: str) -> Tier:
        got = self.tiers.get(key)
        if got is None:
            with self.lock:
                got = self.tiers.setdefault(key, Tier(key))
        return got

    def note_launch(self, tier: Tier, kl, compile_args) -> None:
        """Count an interpreted launch of tier's structure; queue it once it ran often enough."""
        tier.launches += 1
        threshold = config().gpu_specialize
        if tier.state == NEW and threshold and tier.launches >= threshold:
            with tier.lock:
                if tier.state != NEW:
                    return
                tier.state = QUEUED
            counters.bump("gpu_tier_queued")
            with self.lock:
                self.idle.clear()
                self.jobs.put((tier, specialize.source(kl), compile_args))
            self._start_worker()

    def _start_worker(self) -> None:
        with self.lock:
            if self.worker is None:
                self.worker = threading.Thread(target=self._work, name="dvm-gpu-specialize", daemon=True)
                self.worker.start()

    def _work(self) -> None:
        while True:
            try:
                tier, src, compile_args = self.jobs.get(timeout=1.0)
            except queue.Empty:
                with self.lock:   # (a job queued meanwhile finds no worker and starts one)
                    if self.jobs.empty():
                        self.worker = None
                        self.idle.set()
                        return
                continue
            try:
                tier.kernel = self._build(tier, src, compile_args)
                tier.state = READY
                counters.bump("gpu_tier_ready")
            except Exception as e:  # the structure keeps running on the interpreter, counted
                tier.state, tier.error = FAILED, f"{type(e).__name__}: {e}"
                counters.bump("gpu_tier_failed")
            finally:
                with self.lock:
                    if self.jobs.empty():
                        self.idle.set()

    def build_now(self, tier: Tier, src: str, compile_args) -> None:
        """Build tier's kernel from `src` in this thread (ready for its check at the next launch)."""
        with tier.lock:
            if tier.state in (TRUSTED, READY):
                return
            tier.state = QUEUED
        try:
            tier.kernel = self._build(tier, src, compile_args)
            tier.state, tier.error = READY, ""
            counters.bump("gpu_tier_ready")
        except Exception as e:
            tier.state, tier.error = FAILED, f"{type(e).__name__}: {e}"
            counters.bump("gpu_tier_failed")

    def _build(self, tier: Tier, src: str, compile_args) -> object:
        """Write the source (once per structure on disk), import it, compile it (a no-op in
        interpreter mode)."""
        directory = config().gpu_cache
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, f"dvm_gpu_{tier.key}_{hashlib.sha256(src.encode()).hexdigest()[:8]}.py")
        if not os.path.exists(path) or open(path).read() != src:
            tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
            with open(tmp, "w") as f:
                f.write(src)
            os.replace(tmp, path)
        tier.path = path
        kernel = specialize.kernel_from(path)
        args, options = compile_args
        tier.launch = launcher(kernel, {"TILE": abi.TILE}, abi.OPTIONS)
        warmup = getattr(kernel, "warmup", None)
        if warmup is not None:
            warmup(*args, grid=(1,), **options)
        return kernel

    def drain(self, timeout: float = 600.0) -> bool:
        """Wait until no specialisation is pending (tests, benchmarks)."""
        return self.idle.wait(timeout)

    def report(self) -> list[dict]:
        return [{"key": t.key, "launches": t.launches, "state": t.state, "error": t.error, "source": t.path}
                for t in self.tiers.values()]


MANAGER = TierManager()


# --- device bytes: copies and comparisons for the bitwise check ------------------------------------
def _byte_kernels():
    import triton
    import triton.language as tl

    @triton.jit(do_not_specialize=["src", "dst", "n"])
    def copy_bytes(src: tl.int64, dst: tl.int64, n: tl.int64, BLOCK: tl.constexpr):
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        tl.store(dst.to(tl.pointer_type(tl.int8)) + offs, tl.load(src.to(tl.pointer_type(tl.int8)) + offs, mask=m),
                 mask=m)

    @triton.jit(do_not_specialize=["a", "b", "n", "out"])
    def count_diff(a: tl.int64, b: tl.int64, n: tl.int64, out: tl.int64, BLOCK: tl.constexpr):
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        x = tl.load(a.to(tl.pointer_type(tl.int8)) + offs, mask=m, other=0)
        y = tl.load(b.to(tl.pointer_type(tl.int8)) + offs, mask=m, other=0)
        differ = m & (x != y)   # (per lane: Triton's tl.sum is a @jit helper the interpreter may not run)
        tl.atomic_add(out.to(tl.pointer_type(tl.int64)) + offs * 0, differ.to(tl.int64), mask=differ)

    return copy_bytes, count_diff


_BYTES = None


def byte_kernels():
    global _BYTES
    if _BYTES is None:
        _BYTES = _byte_kernels()
    return _BYTES


def bitwise_check(run_interpreted, run_specialised, addrs: list[int], written: list[tuple[int, int]], mem) -> bool:
    """Run the interpreter on the real buffers, the specialised kernel on shadow copies of the
    `written` buffers ((argument, bytes) pairs), and compare those bytes."""
    copy_bytes, count_diff = byte_kernels()
    run_interpreted(addrs)
    shadows, shadow_addrs = [], list(addrs)
    for arg, nbytes in written:
        buf = mem.empty(nbytes)
        shadows.append(buf)
        shadow_addrs[arg] = mem.address(buf)
        if nbytes:
            copy_bytes[(-(-nbytes // BYTES_BLOCK),)](addrs[arg], shadow_addrs[arg], nbytes, BLOCK=BYTES_BLOCK)
    run_specialised(shadow_addrs)
    counter = mem.upload(np.zeros(1, np.int64))
    for arg, nbytes in written:
        if nbytes:
            count_diff[(-(-nbytes // BYTES_BLOCK),)](addrs[arg], shadow_addrs[arg], nbytes, mem.address(counter),
                                                     BLOCK=BYTES_BLOCK)
    return int(mem.download(counter)[0]) == 0


def compile_args() -> tuple[list[int], dict]:
    """Arguments of a warm-up compile: every argument an int64 address (any value: they are
    annotated i64 and never specialised), and the launch options of vm.py."""
    return [1 << 40] * len(abi.ARG_NAMES), {"TILE": abi.TILE, **abi.OPTIONS}
