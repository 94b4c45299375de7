"""`dvm bench ops`: DVM kernels against NumPy, PyTorch eager, numexpr, Inductor and a copy roofline.

For every case (an elementwise chain, softmax, LayerNorm, a reduction ...: bench_ops_cases) and
every shape of the chosen size classes, one run times side by side:

  dvm               the kernel, called as a user calls it, on the VM `dvm.config.config().vm` selects
  reference VM      the same kernel's Program on the reference (NumPy) VM, forced through
                    runtime.launch.execute(..., vm="reference"); small shapes only
  numpy             the same computation written with NumPy float32 ops
  torch eager       PyTorch composite ops, the way the formula is written
  torch native      PyTorch's fused native kernel where one exists (softmax, layer_norm, rms_norm;
                    after the add for the norms of a residual sum)
  numexpr           numexpr.evaluate with a fixed expression string (elementwise cases)
  inductor static   torch.compile(eager form, dynamic=False), steady state after warm-up
  inductor dynamic  torch.compile(eager form, dynamic=True), steady state after warm-up
  copy              np.copyto of a buffer whose bytes read + written equal the kernel's

Each baseline is reported as a ratio to DVM (baseline time / DVM time: > 1 means DVM is faster),
and DVM's effective bandwidth (bytes read + written / time) as a fraction of the copy's. Inductor's
compile times are reported separately: the first compile (cold: a fresh Inductor cache directory
unless TORCHINDUCTOR_CACHE_DIR is set; the first one in the process also pays Dynamo/Inductor
start-up) and a second compile of the same function after torch._dynamo.reset() (warm cache).

Timing (bench_common.time_call): the median over at least `repeat` samples after warm-up,
time.perf_counter, gc disabled while timing; a sample is enough back-to-back calls to last 20 us,
and short calls get more samples (up to about `min_total_s` of timing each). Every DVM result
is checked against the reference before timing: NumPy's float32 result, or the exact (float64)
result where the NumPy form is itself an approximation (bias_gelu: NumPy has no erf), with
float32 tolerances (Case.tolerance); a mismatch aborts that case loudly and the command exits 1.
The `_bf16` cases take and return bfloat16 (ml_dtypes' NumPy type; PyTorch's bfloat16 for the
baselines): their reference is the NumPy form over the inputs' float32 values, within bfloat16
tolerances; NumPy and numexpr have no bfloat16 arithmetic (n/a).
Baselines are checked too: a baseline that disagrees with the reference is reported, not timed.

With the reference VM selected (DVM_VM=reference) DVM only runs shapes of at most
REFERENCE_MAX_NUMEL elements; larger ones say "skipped: reference VM" in the table.

Where the JSON file of an earlier run exists (the default bench-results/ops.json), the report
ends with the cases whose DVM time moved by 1.5x or more since then (same VM and thread count),
with both runs' copy times beside them: a slowdown shows up without anyone looking for it.
"""
from __future__ import annotations

import functools
import os
import shutil
import sys
import tempfile
import time
from typing import Callable

import numpy as np

import dvm

from .bench_common import (finish_report, fmt_time, loadavg, machine_info, progress, read_report,
                           restore_vm_threads, set_vm_threads, time_call, vm_extra, whole_vm)
from .bench_encode import chain8
from .bench_ops_baselines import (COPY_DELTA, REFERENCE_MAX_NUMEL, Mismatch, as_tensor, baseline_runs, call_on_vm,
                                  check, copy_pair, inductor_compiled)
from .bench_ops_cases import CASE_NAMES, CASES, Case, _torch_forms, add_one
from .bench_ops_report import LABELS, _shape_str, compare, markdown, plot

DEFAULT_JSON = os.path.join("bench-results", "ops.json")
DEFAULT_MD = os.path.join("bench-results", "ops.md")
DEFAULT_PNG = os.path.join("bench-results", "ops.png")
DEFAULT_REPEAT = 10
QUICK_REPEAT = 5
MIN_TOTAL_S = 0.05          # timing per measurement, at least (short calls get more samples)
QUICK_MIN_TOTAL_S = 0.01
LAUNCH_BUDGET_US = 10.0

# Shapes (rows, cols) per size class.
SIZES: dict[str, list[tuple[int, int]]] = {
    "small": [(32, 128)],                       # 4 K elements
    "medium": [(256, 1024), (4096, 128)],       # 256 K; 512 K of a 128-wide model's rows (4 x 1024 tokens)
    # 16 M; and 4 M of a 1024-wide model's activations at 4 x 1024 tokens, which with its output
    # (32 MiB) leaves a 32 MiB last-level cache as the 16 M do
    "large": [(4096, 4096), (4096, 1024)],
    # tails everywhere: a row length just past 1000, a tall skinny 17-wide one (first-axis
    # reductions over 4097 rows, last-axis ones over 17), many short rows of a head's width
    # (8192x64), long prime-length rows that fill 61 % of a one-row tile (13x20011), and a few
    # rows past 65536 columns (7x65537: the sweeps, but one 131072-lane tile for the norms and
    # softmax, whose row forms read rows in place), and rows just past a power of two (2048x513:
    # an attention's 513 keys)
    "odd": [(1000, 1001), (4097, 17), (8192, 64), (13, 20011), (7, 65537), (2048, 513)],
}
SIZE_ORDER = ("small", "medium", "large", "odd")


def _size_class(shape: tuple) -> str:
    for name, shapes in SIZES.items():
        if tuple(shape) in shapes:
            return name
    return "custom"


class _Run:
    """State of one `dvm bench ops` run."""

    def __init__(self, repeat: int, min_total_s: float, inductor: bool, quiet: bool):
        self.repeat, self.min_total_s, self.inductor, self.quiet = repeat, min_total_s, inductor, quiet
        self.t_start = time.perf_counter()
        self.vm = dvm.config.config().vm
        self.torch_forms = _torch_forms()
        self.first_inductor_compile: dict | None = None
        self.failed: list[str] = []

    def log(self, msg: str) -> None:
        progress("ops", f"{msg}  [{time.perf_counter() - self.t_start:.1f} s]", self.quiet)

    def timed(self, fn) -> dict:
        return time_call(fn, self.repeat, self.min_total_s)

    # -- one (case, shape) ----------------------------------------------------------------------
    def bench_case(self, case: Case, shape: tuple, rng: np.random.Generator) -> dict:
        import torch
        arrays = case.inputs(rng, shape)
        want = case.reference(arrays)   # (the exact result where the case has one: NumPy's is checked too)
        ref = "the exact float64 result" if case.exact is not None else "NumPy"
        numel = int(np.prod(shape))
        nbytes = sum(a.nbytes for a in arrays) + want.size * arrays[0].itemsize
        rtol, atol = case.tolerance(shape, want)
        row: dict = {"case": case.name, "what": case.what, "shape": list(shape), "size_class": _size_class(shape),
                     "numel": numel, "bytes": nbytes, "tolerance": {"rtol": rtol, "atol": atol},
                     "dvm": {}, "baselines": {}, "inductor_compile_s": {}}
        tag = f"{case.name} {_shape_str(shape)}"

        # DVM: correctness first, then timing.
        d = row["dvm"]
        d["vm"] = self.vm
        if self.vm == "reference" and numel > REFERENCE_MAX_NUMEL:
            d.update(status="skipped", note="skipped: reference VM")
            self.log(f"{tag}: dvm skipped (reference VM, {numel} elements > {REFERENCE_MAX_NUMEL})")
        else:
            try:
                t0 = time.perf_counter()
                got = case.kernel(*arrays)
                d["first_call_s"] = time.perf_counter() - t0
                check(got, want, rtol, atol, f"DVM ({self.vm} VM)", ref, case.dtype)
            except Exception as e:   # a mismatch or a crash aborts the case, loudly
                kind = "mismatch" if isinstance(e, Mismatch) else "error"
                msg = str(e) if isinstance(e, Mismatch) else f"{type(e).__name__}: {e}"
                d.update(status=kind, note=msg)
                self.failed.append(f"{tag}: {msg}")
                print(f"[dvm bench ops] {tag}: DVM {kind.upper()}, case aborted: {msg}", file=sys.stderr,
                      flush=True)
                return row
            t = self.timed(lambda: case.kernel(*arrays))
            d.update(status="ok", time=t, median_s=t["median_s"])
            self.log(f"{tag}: dvm ({self.vm}) {fmt_time(t['median_s'])}")

        # The baselines.
        targs = [as_tensor(a) for a in arrays]
        runs = baseline_runs(case, arrays, targs, self.torch_forms[case.name], numel, self.vm, self.inductor,
                             lambda eager, mode: self.inductor_fn(case, eager, targs, mode, row))
        for name, (fn, note) in runs.items():
            b = row["baselines"][name] = {"note": note} if note else {}
            if fn is None:
                b["status"] = "skipped" if note.startswith(("skipped", "not run")) else "n/a"
                continue
            try:
                if name.startswith("inductor_"):
                    fn = fn()   # compiles (timed separately), returns the steady-state callable
                got = fn()
                check(got, want, rtol, atol, LABELS[name], ref, case.dtype)
            except Mismatch as e:
                b.update(status="mismatch", note=str(e))
                print(f"[dvm bench ops] {tag}: baseline {LABELS[name]} MISMATCH, not timed: {e}",
                      file=sys.stderr, flush=True)
                continue
            except Exception as e:
                b.update(status="error", note=f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
                print(f"[dvm bench ops] {tag}: baseline {LABELS[name]} failed: {b['note']}", file=sys.stderr,
                      flush=True)
                continue
            t = self.timed(fn)
            b.update(status="ok", time=t, median_s=t["median_s"])
            self.log(f"{tag}: {LABELS[name]} {fmt_time(t['median_s'])}")

        # The copy roofline: np.copyto of nbytes / 2 (read) into nbytes / 2 (written), preallocated.
        n_copy = max(1, nbytes // 8)
        src, dst = copy_pair(n_copy)
        t = self.timed(functools.partial(np.copyto, dst, src))
        row["baselines"]["copy"] = {"status": "ok", "time": t, "median_s": t["median_s"],
                                    "note": f"np.copyto of {n_copy * 4} bytes into a preallocated buffer "
                                            f"(both 64-byte aligned, {COPY_DELTA} bytes apart mod 4096)"}
        self.log(f"{tag}: copy {fmt_time(t['median_s'])}")
        del src, dst

        # Ratios and bandwidths.
        dvm_s = d.get("median_s")
        for name, b in row["baselines"].items():
            s = b.get("median_s")
            b["gbps"] = nbytes / s / 1e9 if s else None
            b["ratio_to_dvm"] = s / dvm_s if (s and dvm_s) else None
        copy_s = row["baselines"]["copy"]["median_s"]
        d["gbps"] = nbytes / dvm_s / 1e9 if dvm_s else None
        d["copy_fraction"] = copy_s / dvm_s if dvm_s else None
        row["copy_gbps"] = nbytes / copy_s / 1e9
        return row

    # -- Inductor -------------------------------------------------------------------------------
    def inductor_fn(self, case: Case, eager: Callable, targs: list, mode: str, row: dict) -> Callable:
        """Inductor's steady-state callable of `eager` (bench_ops_baselines.inductor_compiled); the
        compile times go into row["inductor_compile_s"], the first one in the process is kept."""
        tag = f"{case.name} {_shape_str(tuple(row['shape']))}"
        self.log(f"{tag}: Inductor {mode}: compiling")
        fn, info = inductor_compiled(eager, targs, mode)
        if self.first_inductor_compile is None:
            info["first_in_process"] = True
            self.first_inductor_compile = {"case": case.name, "shape": row["shape"], "mode": mode,
                                           "seconds": info["first_s"]}
        row["inductor_compile_s"][mode] = info
        self.log(f"{tag}: Inductor {mode}: compile {info['first_s']:.2f} s cold, {info['warm_s']:.2f} s warm")
        return fn

    # -- launch overhead ------------------------------------------------------------------------
    def launch_overhead(self) -> dict:
        import torch
        x = np.ones((1,), np.float32)
        tx = torch.from_numpy(x)
        probes = {
            "dvm_add": (f"DVM add_one ({self.vm} VM)", lambda: add_one(x)),
            "dvm_chain8": (f"DVM chain8 ({self.vm} VM)", lambda: chain8(x)),
        }
        if self.vm != "reference":
            probes["reference_vm_add"] = ("DVM add_one (reference VM, forced)",
                                          lambda: call_on_vm(add_one, [x], "reference"))
        probes["torch_add"] = ("torch.add (eager)", lambda: torch.add(tx, 1.0))
        probes["numpy_add"] = ("np.add", lambda: np.add(x, np.float32(1.0)))
        out = {}
        for key, (label, fn) in probes.items():
            fn()
            t = time_call(fn, self.repeat, max(self.min_total_s, 0.02), warmup=20)
            out[key] = {"what": label, "median_us": t["median_s"] * 1e6, "time": t}
            self.log(f"launch overhead: {label} {t['median_s'] * 1e6:.2f} us")
        out["budget_us"] = LAUNCH_BUDGET_US
        out["dvm_within_budget"] = out["dvm_add"]["median_us"] <= LAUNCH_BUDGET_US
        out["dvm_vs_torch"] = out["dvm_add"]["median_us"] / out["torch_add"]["median_us"]
        return out


def _set_threads(n: int) -> dict:
    """n threads for every system: torch, numexpr and the CPU VM."""
    import numexpr
    import torch
    old = {"torch": torch.get_num_threads(), "numexpr": numexpr.set_num_threads(n), "dvm": set_vm_threads(n)}
    torch.set_num_threads(n)
    return old


def run(sizes=("small", "medium", "large", "odd"), cases=None, repeat: int = DEFAULT_REPEAT,
        inductor: bool = True, min_total_s: float = MIN_TOTAL_S, threads: int = 2, seed: int = 0,
        quiet: bool = False) -> dict:
    import numexpr
    import torch
    chosen = [c for c in CASES if cases is None or c.name in cases]
    shapes = [(s, shape) for s in SIZE_ORDER if s in sizes for shape in SIZES[s]]
    old_threads = _set_threads(threads)
    whole_vm("ops", quiet)
    old_cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    tmp_cache = None
    if inductor and old_cache is None:
        tmp_cache = tempfile.mkdtemp(prefix="dvm-bench-inductor-")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = tmp_cache
    load_start = loadavg()
    t0 = time.time()
    r = _Run(repeat, min_total_s, inductor, quiet)
    r.log(f"VM {r.vm}; {len(chosen)} cases x {len(shapes)} shapes "
          f"({', '.join(_shape_str(s) for _, s in shapes)}); repeat {repeat}; threads {threads}; "
          f"Inductor {'on' if inductor else 'off'}")
    rows = []
    rng = np.random.default_rng(seed)
    try:
        launch = r.launch_overhead()
        n = len(chosen) * len(shapes)
        i = 0
        for _, shape in shapes:
            for case in chosen:
                i += 1
                r.log(f"[{i}/{n}] {case.name} {_shape_str(shape)} ({case.what})")
                rows.append(r.bench_case(case, shape, rng))
    finally:
        torch.set_num_threads(old_threads["torch"])
        numexpr.set_num_threads(old_threads["numexpr"])
        restore_vm_threads(old_threads["dvm"])
        if tmp_cache is not None:
            if old_cache is None:
                os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
            shutil.rmtree(tmp_cache, ignore_errors=True)
    extra = vm_extra()
    return {
        "benchmark": "ops",
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "seconds": round(time.time() - t0, 2),
        "vm": r.vm,
        "dtype": "float32 (bfloat16: the _bf16 cases)",
        "repeat": repeat, "min_total_s": min_total_s, "threads": threads, "seed": seed,
        "sizes": list(sizes), "shapes": [list(s) for _, s in shapes],
        "reference_vm_max_numel": REFERENCE_MAX_NUMEL,
        "inductor": inductor,
        "inductor_cache": None if not inductor else ("fresh temporary directory (cold)" if tmp_cache
                                                      else f"TORCHINDUCTOR_CACHE_DIR={old_cache}"),
        "inductor_first_compile_in_process": r.first_inductor_compile,
        "versions": {"torch": torch.__version__, "numexpr": numexpr.__version__, **extra},
        "machine": machine_info(),
        "loadavg_1min": {"start": load_start, "end": loadavg()},
        "launch_overhead": launch,
        "results": rows,
        "failures": r.failed,
    }


def parse_sizes(text: str) -> list[str]:
    sizes = [s.strip() for s in text.split(",") if s.strip()]
    bad = [s for s in sizes if s not in SIZES]
    if not sizes or bad:
        raise ValueError(f"unknown size class(es) {', '.join(bad) or repr(text)}; choose from {', '.join(SIZE_ORDER)}")
    return sizes


def parse_cases(text: str) -> list[str]:
    cases = [s.strip() for s in text.split(",") if s.strip()]
    bad = [s for s in cases if s not in CASE_NAMES]
    if not cases or bad:
        raise ValueError(f"unknown case(s) {', '.join(bad) or repr(text)}; choose from {', '.join(CASE_NAMES)}")
    return cases


def main(sizes=None, cases=None, quick: bool = False, repeat: int | None = None, inductor: bool | None = None,
         json_path: str | None = DEFAULT_JSON, md_path: str | None = DEFAULT_MD,
         png_path: str | None = DEFAULT_PNG, threads: int = 2, seed: int = 0, out=None) -> int:
    """Run, print the markdown tables on `out`, write JSON / markdown / PNG. Exit 1 if a DVM result
    disagreed with NumPy (or DVM failed) in any case."""
    out = out or sys.stdout
    if sizes is None:
        sizes = ["small"] if quick else list(SIZE_ORDER)
    if repeat is None:
        repeat = QUICK_REPEAT if quick else DEFAULT_REPEAT
    if inductor is None:
        inductor = not quick
    previous = read_report(json_path, "ops", out)   # the run this one replaces
    report = run(sizes=sizes, cases=cases, repeat=repeat, inductor=inductor,
                 min_total_s=QUICK_MIN_TOTAL_S if quick else MIN_TOTAL_S, threads=threads, seed=seed)
    if previous is not None:
        report["changes_vs_previous"] = compare(previous, report)
    return finish_report(report, markdown(report), plot, json_path, md_path, png_path, out, "case(s)")
