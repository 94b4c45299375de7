"""`dvm bench floor`: the elementwise chains of `dvm bench ops` on the CPU VM beside hand-fused C
loops of the same chains (floor_chains.c) and the copy roofline, in one run.

The question it answers: how much of the gap between a chain and the copy roofline is the VM's
(one pass over an L1/L2 tile per instruction), and how much the arithmetic's own (the f32 math
on this machine's cores). Two C builds: the VM's own math (the same polynomials, fused in
registers: the floor for any interpreter of it) and glibc's vector math under -ffast-math (what a
static compiler with a vendor library reaches). Each result is checked against the case's NumPy
reference before it is timed. Needs a C compiler with OpenMP (cc / gcc); without one the C
columns say so. Progress goes to stderr, the table to stdout.
"""
from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .bench_common import (finish_report, fmt_time, loadavg, machine_info, progress, restore_vm_threads,
                           set_vm_threads, time_call, whole_vm)
from .bench_ops_baselines import Mismatch, check, copy_pair
from .bench_ops_cases import CASES

SOURCE = Path(__file__).with_name("floor_chains.c")
CHAINS = ("chain8", "tanh_exp", "silu_mul", "bias_gelu")
DEFAULT_JSON = "bench-results/floor.json"
DEFAULT_MD = "bench-results/floor.md"
DEFAULT_SHAPE = (4096, 4096)
BUILDS = {   # name -> (compiler flags, what it is)
    "ours": (["-O3", "-march=native", "-ffp-contract=fast"], "C, the VM's math, fused"),
    "libmvec": (["-O3", "-march=native", "-ffast-math", "-DLIBMVEC"], "C, glibc libmvec, -ffast-math"),
}
DEFAULT_REPEAT = 10


def say(msg: str) -> None:
    progress("floor", msg)


@dataclass
class FloorLib:
    name: str
    lib: ctypes.CDLL | None
    error: str = ""

    def has(self, chain: str) -> bool:
        return self.lib is not None and (chain != "bias_gelu" or bool(self.lib.dvm_floor_has_bias_gelu()))

    def runner(self, chain: str, inputs: list[np.ndarray]):
        """A function () -> output running the C loop of `chain` on `inputs` into one preallocated
        output (touched once here: like the copy roofline's destination and DVM's pooled outputs,
        it pays no page faults when timed)."""
        fn = getattr(self.lib, f"dvm_floor_{chain}")
        fn.restype = None
        ptrs = [ctypes.c_void_p(a.ctypes.data) for a in inputs]
        shape = inputs[0].shape
        if chain == "bias_gelu":
            tail = [ctypes.c_int64(int(np.prod(shape[:-1]))), ctypes.c_int64(shape[-1])]
        else:
            tail = [ctypes.c_int64(inputs[0].size)]

        out = np.zeros(shape, np.float32)
        dst = ctypes.c_void_p(out.ctypes.data)

        def run() -> np.ndarray:
            fn(dst, *ptrs, *tail)
            return out
        return run


def _subnormals_kept() -> bool:
    """Whether float32 subnormals survive arithmetic in this process (MXCSR's FTZ / DAZ off)."""
    tiny = np.array([1e-40], np.float32)
    return bool((tiny * np.float32(1.0))[0] != 0)


def build(name: str, workdir: str) -> FloorLib:
    """Compile floor_chains.c as build `name` into workdir; a FloorLib without lib (and the reason)
    when there is no compiler or it fails. Compiled and linked in two steps: linking with
    -ffast-math adds GCC's crtfastmath.o (GCC < 13 even to a shared library), whose constructor
    sets flush-to-zero for the whole process when the library loads, and NumPy and the VM would
    then flush subnormals. The load is refused if the library changed that anyway."""
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if cc is None:
        return FloorLib(name, None, "no C compiler (cc / gcc) on PATH")
    flags, _ = BUILDS[name]
    obj, out = os.path.join(workdir, f"floor_{name}.o"), os.path.join(workdir, f"floor_{name}.so")
    libs = ["-lmvec"] if name == "libmvec" else []
    steps = ([cc, *flags, "-fopenmp", "-fPIC", "-c", str(SOURCE), "-o", obj],
             [cc, "-shared", "-fopenmp", obj, "-o", out, *libs, "-lm"])
    for cmd in steps:
        try:
            subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=120)
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as e:
            detail = getattr(e, "stderr", "") or str(e)
            return FloorLib(name, None, f"{' '.join(cmd)} failed: {detail.strip()[:300]}")
    lib = ctypes.CDLL(out)
    if not _subnormals_kept():   # pragma: no cover - the two-step link keeps crtfastmath.o out
        raise RuntimeError(f"loading {out} turned on flush-to-zero in this process: results are no longer "
                           "IEEE; not measuring")
    return FloorLib(name, lib)


def _case(chain: str):
    return next(c for c in CASES if c.name == chain)


def _measure(chain: str, shape: tuple, libs: list[FloorLib], threads: int, repeat: int,
             rng: np.random.Generator) -> dict:
    case = _case(chain)
    inputs = case.inputs(rng, shape)
    want = (case.exact(*inputs) if case.exact else case.numpy(*inputs)).astype(np.float32)
    rtol, atol = case.tolerance(shape, want)
    row: dict = {"case": chain, "shape": list(shape), "numel": int(np.prod(shape)),
                 "bytes": int(sum(a.nbytes for a in inputs) + want.nbytes)}
    check(case.kernel(*inputs), want, rtol, atol, f"DVM {chain}")   # Mismatch: main lists it
    row["dvm_s"] = time_call(lambda: case.kernel(*inputs), repeat)["median_s"]
    say(f"{chain} {shape}: DVM {fmt_time(row['dvm_s'])}")
    for lib in libs:
        if not lib.has(chain):
            row[lib.name] = None
            continue
        lib.lib.dvm_floor_threads(threads)
        run = lib.runner(chain, inputs)
        try:
            check(run(), want, rtol, atol, f"C {lib.name} {chain}")
            row[lib.name] = time_call(run, repeat)["median_s"]
            row[f"{lib.name}_error"] = None
        except Mismatch as e:   # shown in the table, never timed
            row[lib.name], row[f"{lib.name}_error"] = None, str(e)
        say(f"{chain} {shape}: C {lib.name} {fmt_time(row[lib.name])}")
    src, dst = copy_pair(row["bytes"] // 8)   # a copy reads and writes half the bytes each
    row["copy_s"] = time_call(lambda: np.copyto(dst, src), repeat)["median_s"]
    return row


def parse_shape(text: str) -> tuple[int, int]:
    """'ROWSxCOLS' -> (rows, cols), both at least 1."""
    try:
        rows, cols = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise ValueError(f"--shape: expected ROWSxCOLS (e.g. 4096x4096), got {text!r}") from None
    if rows < 1 or cols < 1:
        raise ValueError(f"--shape: sizes must be at least 1, got {text!r}")
    return rows, cols


def parse_chains(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    bad = [n for n in names if n not in CHAINS]
    if bad or not names:
        raise ValueError(f"--cases: unknown {', '.join(bad) or '(none given)'}; choose from {','.join(CHAINS)}")
    return names


def _pct(t: float | None, copy: float) -> str:
    return "—" if t is None else f"{fmt_time(t)} ({100 * copy / t:.0f} %)"


def render(report: dict) -> str:
    m = report["machine"]
    lines = [f"{report['stamp']}; {m.get('cpu', '?')}, {m.get('cores', '?')} cores; threads {report['threads']}; "
             f"1-min load {report['load_start']} at start, {report['load_end']} at end; {report['seconds']:.0f} s in all.",
             "", "Each cell: time per call and, in parentheses, the share of the copy roofline's bandwidth "
             "(np.copyto of the same bytes, one thread, as in `dvm bench ops`). *VM / C floor*: DVM's time over the "
             "fused C loop with the VM's own math (1.0 = no interpretation cost).", ""]
    for name, why in report["unavailable"].items():
        lines.append(f"C build '{name}' not available: {why}")
    lines += ["| case | shape | DVM | " + " | ".join(BUILDS[b][1] for b in BUILDS) + " | copy | VM / C floor |",
              "| --- | --- | ---: | " + " | ".join("---:" for _ in BUILDS) + " | ---: | ---: |"]
    for r in report["rows"]:
        c = r["copy_s"]
        ratio = f"{r['dvm_s'] / r['ours']:.2f}" if r.get("ours") else "—"
        cells = [_pct(r.get(b), c) for b in BUILDS]
        lines.append(f"| {r['case']} | {'x'.join(map(str, r['shape']))} | {_pct(r['dvm_s'], c)} | "
                     f"{' | '.join(cells)} | {fmt_time(c)} | {ratio} |")
    errors = [r[f"{b}_error"] for r in report["rows"] for b in BUILDS if r.get(f"{b}_error")]
    return "\n".join(lines + [""] + [f"- result check failed (not timed): {e}" for e in errors])


def main(shape: tuple = DEFAULT_SHAPE, chains: tuple = CHAINS, threads: int = 2, repeat: int = DEFAULT_REPEAT,
         seed: int = 0, json_path: str | None = DEFAULT_JSON, md_path: str | None = DEFAULT_MD) -> int:
    t0 = time.perf_counter()
    old = set_vm_threads(threads)
    whole_vm("floor")
    report = {"benchmark": "floor", "stamp": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
              "machine": machine_info(), "threads": threads, "load_start": loadavg()}
    try:
        with tempfile.TemporaryDirectory(prefix="dvm-floor-") as workdir:
            libs = []
            for name in BUILDS:
                say(f"compiling {SOURCE.name} ({name})")
                libs.append(build(name, workdir))
            report["unavailable"] = {lib.name: lib.error for lib in libs if lib.lib is None}
            rng = np.random.default_rng(seed)
            report["rows"], report["failures"] = [], []
            for chain in chains:
                try:
                    report["rows"].append(_measure(chain, shape, libs, threads, repeat, rng))
                except Mismatch as e:
                    report["failures"].append(str(e))
    finally:
        restore_vm_threads(old)
    report["load_end"] = loadavg()
    report["seconds"] = time.perf_counter() - t0
    text = render(report)
    return finish_report(report, text, None, json_path, md_path, None, sys.stdout, "result checks")
