"""The GPU VM under the VM contract: device images, bound launches, compile accounting.

Triton is imported on first use (warm_up, bind, run), never at import: the CPU-only install has
no Triton, and its users get a DeviceError that says how to install it. In Triton's interpreter
mode (TRITON_INTERPRET=1 when the kernels are defined) the VM runs on the CPU over host buffers:
that is how its differential tests run without a GPU.
"""
from __future__ import annotations

import threading
from typing import Callable, NamedTuple, Sequence

import numpy as np

from ...codegen.program import ProgramLayout
from ...codegen.target import Target
from ...config import config
from ...errors import DeviceError
from ...graph.dtypes import DType
from ...runtime import counters
from ..contract import VM
from . import abi, memory, specialize, tiered
from .image import program_image
from .launcher import launcher

TARGET = Target("gpu", max_tile=abi.TILE)
SPILL_GRID_PER_SM = 4        # program instances per multiprocessor when registers spill
INTERPRETED_SPILL_GRID = 4   # ... and in interpreter mode
TRACKED_LAUNCHES = 4096      # launches whose argument types launch_signatures() records


class _Kernels:
    """The compiled (or interpreted) kernel and what launching it needs, made once per process."""

    def __init__(self):
        try:
            from . import interp
        except ImportError as e:
            if e.name != "triton":
                raise
            raise DeviceError("the GPU VM needs Triton: pip install 'dvm[gpu]' (Triton >= 3.6, "
                              "and a CUDA GPU unless TRITON_INTERPRET=1)") from e
        self.kernel = interp.vm_kernel
        self.interpreted = type(self.kernel).__name__ == "InterpretedFunction"
        self.signatures: set = set()     # argument types and constexprs of the first launches
        self.tracked = 0
        self.lock = threading.Lock()
        self._spill_grid: int | None = None
        self.launchers = {name: launcher(self.kernel, {"TILE": abi.TILE, "HOT_D": hot_d, "HOT_I": hot_i}, abi.OPTIONS)
                          for name, (_, hot_d, hot_i, _) in abi.VARIANTS.items()}

    def spill_grid(self) -> int:
        if self._spill_grid is None:
            if self.interpreted:
                self._spill_grid = INTERPRETED_SPILL_GRID
            else:
                import triton
                driver = triton.runtime.driver.active
                props = driver.utils.get_device_properties(driver.get_current_device())
                self._spill_grid = SPILL_GRID_PER_SM * int(props["multiprocessor_count"])
        return self._spill_grid

    def compiled_variants(self) -> int | None:
        """How many binaries Triton compiled for the kernel in this process (None: interpreted)."""
        if self.interpreted:
            return None
        caches = getattr(self.kernel, "device_caches", None) or {}
        return sum(len(entry[0]) for entry in caches.values())

    def launch(self, grid: int, args: list[int], variant: str) -> None:
        _, hot_d, hot_i, _ = abi.VARIANTS[variant]
        if self.tracked < TRACKED_LAUNCHES:   # (what Triton keys a binary on, for the first launches)
            with self.lock:
                self.tracked += 1
                self.signatures.add(tuple(type(a).__name__ for a in args) + (abi.TILE, hot_d, hot_i, abi.NUM_WARPS))
        self.launchers[variant](grid, args)


_KERNELS: _Kernels | None = None
_KERNELS_LOCK = threading.Lock()


def kernels() -> _Kernels:
    global _KERNELS
    if _KERNELS is None:
        with _KERNELS_LOCK:
            if _KERNELS is None:
                _KERNELS = _Kernels()
    return _KERNELS


def address_of(buf) -> int:
    """The data address of a buffer object: CUDA array interface, DLPack-era `data_ptr()`, or a
    NumPy array (host memory: interpreter mode only, checked by the caller)."""
    cai = getattr(buf, "__cuda_array_interface__", None)
    if cai is not None:
        return int(cai["data"][0])
    if isinstance(buf, np.ndarray):
        return buf.__array_interface__["data"][0]
    ptr = getattr(buf, "data_ptr", None)
    if ptr is not None:
        return int(ptr())
    raise DeviceError(f"a {type(buf).__name__} exposes no device address (__cuda_array_interface__ or "
                      "data_ptr())")


class _Plan(NamedTuple):
    grid: int
    block: int                   # the kernel block's address in the device image
    variant: str
    tier: object                 # tiered.Tier of its structure (None: not specialisable)
    kl: object                   # its KernelLayout
    written: tuple               # (argument, bytes) it stores to


class BoundProgram:
    """A verified Program on the device: the image is uploaded once; a call launches each kernel
    block in order (sequence stacking: kernel k + 1 starts after kernel k on the same stream),
    on the interpreter or, once trusted, on its structure's specialised kernel (tiered.py)."""
    __slots__ = ("image", "plans", "scratch", "scratch_addr", "mem", "k")

    def __init__(self, layout: ProgramLayout, k: _Kernels):
        self.k = k
        self.mem = memory.provider(k.interpreted)
        words, blocks = program_image(layout)
        self.image = self.mem.upload(words)
        base = self.mem.address(self.image)
        cta_words = max((im.cta_words for _, im in blocks), default=0)
        spill_grid = k.spill_grid() if any(im.spills for _, im in blocks) else 0
        self.scratch = self.mem.empty(max(1, spill_grid * cta_words) * 8) if spill_grid else self.image
        self.scratch_addr = self.mem.address(self.scratch)
        self.plans = []   # kernels with work items; one without launches nothing
        for (at, im), kl in zip(blocks, layout.kernels):
            if im.items == 0:
                continue
            written = sorted({int(kl.opnd_arg[j]) for _, j, _ in kl.stream.stores})
            written = tuple((a, layout.args[a].numel * DType(layout.args[a].dtype).itemsize) for a in written)
            tier = tiered.MANAGER.tier(_structure(kl)) if config().gpu_specialize else None
            self.plans.append(_Plan(min(im.items, spill_grid) if im.spills else im.items, base + 8 * at,
                                    im.variant, tier, kl, written))

    def _slots(self, addrs: Sequence[int]) -> tuple[list[int], object]:
        """The launch arguments after the block address for buffers at `addrs`, and the argument
        table to keep alive (arguments beyond the N_SLOTS kernel arguments)."""
        n = len(addrs)
        if n > abi.N_SLOTS:
            table = self.mem.upload(np.array(addrs[abi.N_SLOTS:], np.int64))
            counters.bump("gpu_arg_table_uploads")
            return [*addrs[:abi.N_SLOTS], self.mem.address(table), self.scratch_addr], table
        return [*addrs, *[self.scratch_addr] * (abi.N_SLOTS - n), self.scratch_addr, self.scratch_addr], None

    def _specialised(self, plan: "_Plan", slots: list[int]) -> None:
        plan.tier.launch(plan.grid, [plan.block, *slots])

    def __call__(self, addrs: Sequence[int]) -> None:
        if 0 in addrs:   # (an empty buffer may have no storage: every argument stays a large int64)
            addrs = [a or self.scratch_addr for a in addrs]
        slots, keep = self._slots(addrs)   # (keep: the table lives until the launches are queued)
        for plan in self.plans:
            tier = plan.tier
            state = tier.state if tier is not None else None
            if state == tiered.TRUSTED:
                self._specialised(plan, slots)
                counters.bump("gpu_specialised_launches")
            elif state == tiered.READY and tier.lock.acquire(False):
                try:
                    self._check(plan, list(addrs))
                finally:
                    tier.lock.release()
            else:
                self.k.launch(plan.grid, [plan.block, *slots], plan.variant)
                if tier is not None:
                    tiered.MANAGER.note_launch(tier, plan.kl, tiered.compile_args())

    def _check(self, plan: _Plan, addrs: list[int]) -> None:
        """Interpreter on the real buffers, the specialised kernel on shadows: switch it in if equal."""
        keep = []

        def interpreted(a):
            slots, table = self._slots(a)
            keep.append(table)
            self.k.launch(plan.grid, [plan.block, *slots], plan.variant)

        def specialised(a):
            slots, table = self._slots(a)
            keep.append(table)
            self._specialised(plan, slots)

        same = tiered.bitwise_check(interpreted, specialised, addrs, list(plan.written), self.mem)
        plan.tier.state = tiered.TRUSTED if same else tiered.REJECTED
        counters.bump("gpu_tier_trusted" if same else "gpu_tier_rejected")


def _structure(kl) -> str:
    """The structure key of kl's stream (cached on the verifier's Stream)."""
    derived, name = kl.stream.derived, ("gpu_structure", config().gpu_vector)
    key = derived.get(name)
    if key is None:
        key = derived[name] = specialize.structure_key(kl)
    return key


class GpuVM(VM):
    name = "gpu"
    device = "cuda"

    @property
    def target(self) -> Target:
        return TARGET

    @property
    def host_buffers(self) -> bool:
        """Host (NumPy) buffers are device memory only for the interpreted VM."""
        return kernels().interpreted

    def warm_up(self) -> None:
        kernels()

    def run(self, layout: ProgramLayout, buffers: list, threads: int | None = None) -> None:
        k = kernels()
        if not k.interpreted and any(isinstance(b, np.ndarray) for b in buffers):
            raise DeviceError("the GPU VM runs on device buffers; got a NumPy array (host memory)")
        if k.interpreted and any(hasattr(b, "__cuda_array_interface__") for b in buffers):
            raise DeviceError("the GPU VM's kernels were defined in Triton's interpreter mode "
                              "(TRITON_INTERPRET=1): they run on host memory, not on CUDA buffers")
        _bound(layout, k)([address_of(b) for b in buffers])

    def bind(self, layout: ProgramLayout, numels: Sequence[int]) -> Callable[[Sequence[int]], None]:
        return _bound(layout, kernels())

    def compiled_variants(self) -> int | None:
        return kernels().compiled_variants()

    def specialise_now(self, layout: ProgramLayout) -> list[str]:
        """Build the specialised kernels of layout's structures now (not in the background); they
        switch in after their bitwise check at the next launch. Returns their states."""
        out = []
        for kl in layout.kernels:
            tier = tiered.MANAGER.tier(_structure(kl))
            tiered.MANAGER.build_now(tier, specialize.source(kl), tiered.compile_args())
            out.append(tier.state)
        return out

    def launch_signatures(self) -> set:
        """The distinct (argument types, constexprs, NUM_WARPS) of the first TRACKED_LAUNCHES
        launches in this process: each element is one compiled binary (one per abi.VARIANTS
        entry used)."""
        return set(kernels().signatures)


def _bound(layout: ProgramLayout, k: _Kernels) -> BoundProgram:
    """One BoundProgram per verified layout (its image stays on the device while the layout lives)."""
    got = layout.__dict__.get("_gpu_bound")
    if got is None:
        got = layout.__dict__.setdefault("_gpu_bound", BoundProgram(layout, k))
    return got
