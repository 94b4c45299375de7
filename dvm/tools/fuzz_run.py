"""One mutant of `dvm fuzz programs`: verify it (timed), disassemble it, and run what the verifier
accepts on each VM asked for, every buffer with canary regions of random bytes on both sides;
then compare every VM's outputs with the reference VM's and check the canaries.

Outcomes: rejected (VerifyError from verify or from the buffer checks before running), ran (every
VM ran it, canaries intact, the VMs agree), zerodiv (an integer division by zero in the data, as
in PyTorch: only from a Program with an integer division), skipped (accepted, but its buffers or
its work exceed what a fuzz run executes), and the failures: canary (a canary byte changed),
mismatch (a VM's output differs from the reference VM's), error (any other exception). A crash
or a hang of the process running the VMs is counted by fuzz_programs, which runs this in workers.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

import dvm
from ..codegen import isa
from ..codegen.program import ARG_IN, Program
from ..graph.dtypes import DType

GUARD_BYTES = 256              # canary bytes on each side of every buffer
MAX_RUN_ELEMS = 1 << 20        # larger buffers: accepted but not run
MAX_RUN_TILE_INSTRS = 20_000   # tile x instruction steps a run may take (the reference VM's cost)
MAX_RUN_WORK = 1 << 25         # lane-instructions (ProgramLayout.work) a run may take
INT_DIV = frozenset(isa.opcode(n) for n in ("floor_divide.i64", "remainder.i64"))
# torch.testing.assert_close's default (rtol, atol) per float dtype: the VMs' math functions
# differ by a few ULP
TOLERANCE = {DType.FLOAT16: (1e-3, 1e-5), DType.BFLOAT16: (1.6e-2, 1e-5), DType.FLOAT32: (1.3e-6, 1e-5),
             DType.FLOAT64: (1e-7, 1e-7)}
FAILURES = ("canary", "mismatch", "error")


@dataclass
class Outcome:
    kind: str
    detail: str | None
    verify_ns: int
    words: int


class Guarded:
    """A 1-D buffer of n elements inside random canary bytes."""
    __slots__ = ("raw", "n", "dtype", "canary")

    def __init__(self, data: np.ndarray, canary: bytes):
        self.dtype, self.n = data.dtype, len(data)
        body = data.tobytes()
        self.raw = np.frombuffer(bytearray(canary[:GUARD_BYTES] + body + canary[GUARD_BYTES:]), np.uint8)
        self.canary = canary

    @property
    def view(self) -> np.ndarray:
        return self.raw[GUARD_BYTES:GUARD_BYTES + self.n * self.dtype.itemsize].view(self.dtype)

    def intact(self) -> bool:
        end = GUARD_BYTES + self.n * self.dtype.itemsize
        return bytes(self.raw[:GUARD_BYTES]) + bytes(self.raw[end:]) == self.canary


def _tile_instr_steps(layout) -> int:
    steps = 0
    for kl in layout.kernels:
        row_blocks, col_tiles = -(-kl.rows // kl.bm), -(-kl.cols // kl.bn)
        per_block = sum((sw.init[1] - sw.init[0]) + (sw.fin[1] - sw.fin[0]) + col_tiles * (sw.body[1] - sw.body[0])
                        for sw in kl.sweeps)
        steps += row_blocks * per_block
    return steps


def _buffer_data(layout, inputs, rng) -> list[np.ndarray] | str:
    """The initial contents of every argument's buffer, or why the mutant is not run."""
    out = []
    for a, info in enumerate(layout.args):
        dt = DType(info.dtype).np_dtype
        ext = layout.extents[a]
        need = 0 if ext is None else max(ext[1] + 1, 0)
        if info.role == ARG_IN:
            base = inputs[a] if a < len(inputs) and inputs[a].dtype == dt else np.ones(16, dt)
            n = max(len(base), need)
            if n > MAX_RUN_ELEMS:
                return "input too large"
            data = np.resize(base, n) if n != len(base) else base.copy()
        else:
            if info.numel > MAX_RUN_ELEMS:
                return "output too large"
            data = np.zeros(info.numel, dt)
        out.append(data)
    return out


def _int_division(layout) -> bool:
    return any(int(c) in INT_DIV for kl in layout.kernels for c in kl.instrs[:, 0])


def run_mutant(words: np.ndarray, inputs: tuple, vms: tuple[str, ...], rng: np.random.Generator) -> Outcome:
    """Verify `words`; run what is accepted on `vms` (the first is the one the others are
    compared with: "reference")."""
    prog = Program(words)
    t0 = time.perf_counter_ns()
    try:
        layout = dvm.verify(prog)
    except dvm.VerifyError:
        return Outcome("rejected", None, time.perf_counter_ns() - t0, len(words))
    except Exception as e:  # noqa: BLE001 - anything but VerifyError is a verifier bug
        return Outcome("error", f"verify raised {type(e).__name__}: {e}", time.perf_counter_ns() - t0, len(words))
    ns = time.perf_counter_ns() - t0
    try:
        dvm.disasm(prog)
    except Exception as e:  # noqa: BLE001
        return Outcome("error", f"disasm of a verified program raised {type(e).__name__}: {e}", ns, len(words))
    data = _buffer_data(layout, inputs, rng)
    if isinstance(data, str):
        return Outcome("skipped", data, ns, len(words))
    if layout.work > MAX_RUN_WORK or _tile_instr_steps(layout) > MAX_RUN_TILE_INSTRS:
        return Outcome("skipped", "too much work to run here", ns, len(words))
    canaries = [rng.integers(0, 256, 2 * GUARD_BYTES, dtype=np.uint8).tobytes() for _ in data]
    results = []
    for vm in vms:
        kind, detail, outs = _run_on(vm, prog, layout, data, canaries)
        if kind != "ran":
            return Outcome(kind, detail, ns, len(words))
        results.append(outs)
    for vm, outs in zip(vms[1:], results[1:]):
        diff = _difference(layout, results[0], outs)
        if diff:
            return Outcome("mismatch", f"{vm} vs {vms[0]}: {diff}", ns, len(words))
    return Outcome("ran", None, ns, len(words))


def _run_on(vm: str, prog: Program, layout, data: list[np.ndarray], canaries: list[bytes]):
    bufs = [Guarded(d, c) for d, c in zip(data, canaries)]
    for b, info in zip(bufs, layout.args):
        if info.role == ARG_IN:
            b.raw.flags.writeable = False
    try:
        dvm.execute(prog, [b.view for b in bufs], vm=vm)
    except dvm.VerifyError:
        return "rejected", None, None
    except ZeroDivisionError as e:
        if not _int_division(layout):
            return "error", f"{vm}: ZeroDivisionError without an integer division: {e}", None
        return "zerodiv", None, None
    except Exception as e:  # noqa: BLE001 - any other exception is a bug
        return "error", f"{vm} raised {type(e).__name__}: {e}", None
    for a, b in enumerate(bufs):
        if not b.intact():
            return "canary", f"{vm} wrote outside buffer {a}", None
    return "ran", None, [b.view.copy() for b, info in zip(bufs, layout.args) if info.role != ARG_IN]


def _difference(layout, expected: list[np.ndarray], actual: list[np.ndarray]) -> str | None:
    outs = [(a, info) for a, info in enumerate(layout.args) if info.role != ARG_IN]
    for (a, info), e, g in zip(outs, expected, actual):
        dt = DType(info.dtype)
        if dt not in TOLERANCE:
            bad = np.flatnonzero(e != g)
        else:
            e64, g64 = e.astype(np.float64), g.astype(np.float64)
            rtol, atol = TOLERANCE[dt]
            with np.errstate(all="ignore"):
                close = (e64 == g64) | (np.abs(e64 - g64) <= atol + rtol * np.abs(e64)) | (np.isnan(e64) & np.isnan(g64))
            bad = np.flatnonzero(~close)
        if len(bad):
            i = int(bad[0])
            return f"argument {a} ({dt.short}) differs at {len(bad)} element(s), first [{i}]: {e[i]!r} vs {g[i]!r}"
    return None
