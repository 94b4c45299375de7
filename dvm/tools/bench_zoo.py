"""`dvm bench models --zoo`: steady state of many `transformers` architectures, cell by cell.

For every model of the zoo (bench_zoo_models) and every thread count, in one process:

  1. Inductor, torch.compile(dynamic=True), *cold*: torch._dynamo.reset(), Inductor's in-memory
     caches cleared, a fresh TORCHINDUCTOR_CACHE_DIR; one pass over the cells (compiles included).
  2. Inductor dynamic=True *warm*: torch._dynamo.reset() again, the same cache directory; one pass.
  3. DVM, torch.compile(backend="dvm", dynamic=True), beside the warm Inductor (Dynamo keeps one
     cache entry per backend); one pass, each output checked against eager's.
  4. Steady state of every cell (batch, length): after a warm-up call each, rounds of one call of
     each system (eager, Inductor warm, DVM) in a rotating order, so the three see the same machine
     speed; the median per system (and the fastest call, the least disturbed on a busy machine). Rounds: at least `repeat`, more for short calls (~TARGET_S of
     timing per system and cell, at most MAX_ROUNDS).

The models run in float32 (`dtype`: bfloat16 or float16, weights and activations converted).
Inductor bakes the thread count into its C++ kernels, so both Inductor compiles are repeated per
thread count (a cache directory per thread count). Reported per cell: the three medians, the
speed-ups over eager, the max abs error of DVM and of Inductor against eager (TOLERANCE of the dtype).
Per model: the DVM graph's segments, vector kernels, matmuls and fallbacks per forward (with their
reasons), the graphs each system compiled, first-call and pass times, and the fixed cost per
forward (host time: Python, guards, argument binding, allocation, launch overheads), estimated as
the intercept at zero tokens of the line through the batch-1 cells at the two shortest lengths.
"""
from __future__ import annotations

import copy
import gc
import math
import os
import shutil
import tempfile
import time

import numpy as np

from .bench_common import INDUCTOR_CACHE_ENV, finish_report, loadavg, machine_info, progress, restore_env, vm_extra
from .bench_models import _restore_threads, _set_threads, _warm_dynamo
from .bench_models_probes import Stats, TimeDvmCompiler, dvm_graph_info, inductor_backend
from .bench_models_run import ATOL, RTOL, compare
from .bench_zoo_models import QUICK, ZOO, first_output, inputs

DEFAULT_JSON = os.path.join("bench-results", "models_zoo.json")
DEFAULT_MD = os.path.join("bench-results", "models_zoo.md")
DEFAULT_PNG = os.path.join("bench-results", "models_zoo.png")
LENGTHS = (8, 64, 256, 1024)
BATCHES = (1, 4)
THREADS = (1, 2)
QUICK_LENGTHS = (8, 64)
QUICK_BATCHES = (1,)
QUICK_THREADS = (1,)
REPEAT = 11          # rounds at least: a long call gets few from TARGET_S, and its median must hold
QUICK_REPEAT = 3
TARGET_S = 0.25      # timing per system and cell the rounds aim at
MAX_ROUNDS = 200
SYSTEMS = ("eager", "inductor", "dvm")   # steady state: Inductor is the warm dynamic=True compile
# (rtol, atol) of the logits against eager's per dtype. In 16 bits eager rounds every op's result
# and a fused kernel only its outputs: the logits differ by a few of the dtype's steps, and an MoE
# router's near-tie can send a token to another expert in either system. Logits outside the
# tolerance pass if they are within FP32_FACTOR x eager's distance (+ atol) from the float32
# model's (the 16-bit weights in float32), as `dvm verify archs --mode bf16` judges.
TOLERANCE = {"float32": (RTOL, ATOL), "float16": (1e-2, 1e-2), "bfloat16": (8e-2, 8e-2)}
FP32_FACTOR = 2.0
DTYPES = tuple(TOLERANCE)


class _Zoo:
    def __init__(self, repeat: int, quiet: bool, dtype: str = "float32"):
        self.repeat, self.quiet, self.t0 = repeat, quiet, time.perf_counter()
        self.rtol, self.atol = TOLERANCE[dtype]
        self.fp32: dict = {}   # (b, L) -> (the float32 model's logits, eager's max abs distance from them)

    def log(self, msg: str) -> None:
        progress("models --zoo", f"{msg}  [{time.perf_counter() - self.t0:.1f} s]", self.quiet)

    def one_pass(self, tag: str, fn, zm, cells, ref: dict) -> dict:
        """Every cell once through fn (compiles included): first call, pass time, errors vs ref."""
        import torch
        first, worst, bad = None, 0.0, []
        t_pass = time.perf_counter()
        with torch.no_grad():
            for b, L in cells:
                t0 = time.perf_counter()
                out = first_output(fn(**inputs(zm, b, L)))
                dt = time.perf_counter() - t0
                first = dt if first is None else first
                err, why = compare(out, ref[(b, L)], self.rtol, self.atol)
                if why and (b, L) in self.fp32:
                    why = self._against_fp32(out, b, L, why)
                worst = max(worst, err)
                if why:
                    bad.append(f"b={b} L={L}: {why}")
        res = {"first_call_s": first, "pass_s": time.perf_counter() - t_pass,
               "max_abs_err": worst if math.isfinite(worst) else None, "mismatches": bad}
        self.log(f"{tag}: first call {first:.2f} s, pass {res['pass_s']:.2f} s, max abs err {worst:.2g}"
                 + (" OUTSIDE TOLERANCE" if bad else ""))
        return res

    def references(self, zm, model, cells, dtype: str) -> dict:
        """Eager's logits per cell; in 16 bits also the float32 model's, for _against_fp32."""
        ref = _reference(zm, model, cells)
        if dtype != "float32":
            ref32 = _reference(zm, copy.deepcopy(model).float(), cells)
            self.fp32 = {c: (ref32[c], float((ref[c].float() - ref32[c]).abs().max())) for c in cells}
        return ref

    def _against_fp32(self, out, b: int, L: int, why: str) -> str:
        """No reason (an empty one) where out is within FP32_FACTOR x eager's distance from the
        float32 logits (+ atol); else `why` with both distances."""
        logits32, eager_dist = self.fp32[(b, L)]
        dist = float((out.float() - logits32).abs().max())
        if dist <= FP32_FACTOR * eager_dist + self.atol:
            return ""
        return f"{why}; {dist:.3g} from float32's logits, eager {eager_dist:.3g}"

    def steady(self, fns: dict, zm, b: int, L: int) -> dict:
        """Median seconds per call of each system at (b, L), calls alternating between systems."""
        import torch
        kw = inputs(zm, b, L)
        with torch.no_grad():
            t0 = time.perf_counter()
            for fn in fns.values():
                fn(**kw)
            one = (time.perf_counter() - t0) / len(fns)
            rounds = max(self.repeat, min(MAX_ROUNDS, int(TARGET_S / max(one, 1e-6))))
            times: dict = {k: [] for k in fns}
            names = list(fns)
            gc.collect()
            gc.disable()
            try:
                for r in range(rounds):
                    for k in names[r % len(names):] + names[:r % len(names)]:
                        t0 = time.perf_counter()
                        fns[k](**kw)
                        times[k].append(time.perf_counter() - t0)
            finally:
                gc.enable()
        return {k: float(np.median(v)) for k, v in times.items()} | \
            {f"{k}_min": float(min(v)) for k, v in times.items()} | {"rounds": rounds}


def _reference(zm, model, cells) -> dict:
    import torch
    with torch.no_grad():
        return {(b, L): first_output(model(**inputs(zm, b, L))) for b, L in cells}


def _inductor(z: _Zoo, tag: str, model, zm, cells, ref, cache_dir: str, cold: bool):
    import torch
    import torch._dynamo
    torch._dynamo.reset()
    if cold:
        from torch._inductor.utils import clear_caches
        clear_caches()
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache_dir
    stats = Stats()
    fn = torch.compile(model, backend=inductor_backend(stats), dynamic=True)
    res = z.one_pass(tag, fn, zm, cells, ref)
    res.update(graphs=stats.graphs, backend_compile_s=stats.backend_s)
    return fn, res


def _dvm(z: _Zoo, tag: str, model, zm, cells, ref):
    import torch

    from dvm.runtime import counters
    stats = Stats()
    before = counters.snapshot()
    with TimeDvmCompiler(stats):
        fn = torch.compile(model, backend="dvm", dynamic=True)
        res = z.one_pass(tag, fn, zm, cells, ref)
    after = counters.snapshot()
    res.update(graphs=after.get("torch_dynamo_graphs", 0) - before.get("torch_dynamo_graphs", 0),
               backend_compile_s=stats.backend_s,
               graph_fallbacks={k: v - before.get(k, 0) for k, v in after.items()
                                if k.startswith("fallback:graph:") and v != before.get(k, 0)})
    return fn, res


def per_forward(infos: list[dict]) -> dict:
    """What one forward runs: the sums over the graphs it called (infos: their dvm_graph_info)."""
    keys = ("segments", "vector_kernels", "cube_ops", "fallback_ops", "size_only_segments", "size_only_fallback_ops")
    out = {k: sum(g[k] for g in infos) for k in keys}
    fb: dict = {}
    for g in infos:
        for why, k in g["fallbacks"].items():
            fb[why] = fb.get(why, 0) + k
    out["fallbacks"] = dict(sorted(fb.items(), key=lambda kv: -kv[1]))
    out["graphs"] = len(infos)
    return out


def graphs_called(fn, kw: dict) -> list:
    """The DVM CompiledFx objects one call of fn(**kw) runs (the frames of one forward)."""
    import torch

    from dvm.frontend.torch_runtime import CompiledFx
    called, orig = [], CompiledFx.__call__

    def spy(self, *args):
        called.append(self)
        return orig(self, *args)
    CompiledFx.__call__ = spy
    try:
        with torch.no_grad():
            fn(**kw)
    finally:
        CompiledFx.__call__ = orig
    return list(dict.fromkeys(called))


def host_cost(cells: list[dict], batch: int) -> dict:
    """Per system, the intercept at zero tokens of the line through the steady medians of the
    two shortest lengths at `batch` (seconds; None without two such cells)."""
    at = sorted((c for c in cells if c["batch"] == batch), key=lambda c: c["length"])
    if len(at) < 2:
        return {}
    a, b = at[0], at[1]
    out = {}
    for s in SYSTEMS:
        if s in a and s in b:
            slope = (b[s] - a[s]) / (b["length"] - a["length"])
            out[s] = max(0.0, a[s] - slope * a["length"])
    return out


def _model(z: _Zoo, name: str, lengths, batches, threads_list, cold: bool, dtype: str = "float32") -> dict:
    import torch
    zm = ZOO[name]
    model = zm.build().to(getattr(torch, dtype))
    cells = [(b, L) for b in batches for L in lengths]
    z.log(f"{name}: {zm.what}")
    old = _set_threads(1)
    try:
        ref = z.references(zm, model, cells, dtype)
    finally:
        _restore_threads(old)
    out: dict = {"what": zm.what, "per_threads": {}, "cells": []}
    for t in threads_list:
        old = _set_threads(t)
        cache = tempfile.mkdtemp(prefix="dvm-bench-zoo-inductor-")
        try:
            comp = {}
            if cold:
                _, comp["inductor_cold"] = _inductor(z, f"{name} t={t} inductor cold", model, zm, cells, ref,
                                                     cache, True)
            ind, comp["inductor_warm"] = _inductor(z, f"{name} t={t} inductor warm", model, zm, cells, ref,
                                                   cache, False)
            dvm_fn, comp["dvm"] = _dvm(z, f"{name} t={t} dvm", model, zm, cells, ref)
            fns = {"eager": model, "inductor": ind, "dvm": dvm_fn}
            for b, L in cells:
                med = z.steady(fns, zm, b, L)
                cell = {"threads": t, "batch": b, "length": L, **med,
                        "dvm_x": med["eager"] / med["dvm"], "inductor_x": med["eager"] / med["inductor"],
                        "dvm_x_min": med["eager_min"] / med["dvm_min"],
                        "inductor_x_min": med["eager_min"] / med["inductor_min"]}
                out["cells"].append(cell)
                z.log(f"{name} t={t} b={b} L={L}: eager {med['eager'] * 1e3:.3f} ms, Inductor "
                      f"{med['inductor'] * 1e3:.3f} ms ({cell['inductor_x']:.2f}x), DVM {med['dvm'] * 1e3:.3f} ms "
                      f"({cell['dvm_x']:.2f}x) [{med['rounds']} rounds]")
            forward = per_forward([dvm_graph_info(c) for c in graphs_called(dvm_fn, inputs(zm, *cells[-1]))])
            out["per_threads"][str(t)] = {
                "compile": comp, "dvm_forward": forward,
                "host_s": host_cost([c for c in out["cells"] if c["threads"] == t], min(batches))}
        finally:
            _restore_threads(old)
            shutil.rmtree(cache, ignore_errors=True)
            torch._dynamo.reset()
    return out


def geomean(xs) -> float | None:
    xs = [x for x in xs if x and x > 0]
    return float(math.exp(sum(map(math.log, xs)) / len(xs))) if xs else None


def summary(models: dict) -> dict:
    cells = [dict(c, model=m) for m, r in models.items() if "cells" in r for c in r["cells"]]
    dvm_x = [c["dvm_x"] for c in cells]
    return {"cells": len(cells), "dvm_geomean_x": geomean(dvm_x), "inductor_geomean_x": geomean(c["inductor_x"] for c in cells),
            "dvm_vs_inductor_geomean": geomean(c["inductor"] / c["dvm"] for c in cells),
            "dvm_min_x": min(dvm_x) if dvm_x else None,
            # the same from each system's fastest call: on a busy machine, preemptions inflate
            # medians of calls longer than a scheduler quantum; the fastest call is the least disturbed
            "dvm_geomean_x_fastest": geomean(c.get("dvm_x_min") for c in cells),
            "inductor_geomean_x_fastest": geomean(c.get("inductor_x_min") for c in cells),
            "misses_fastest": sum(1 for c in cells if c.get("dvm_x_min", 1.0) < 1.0),
            "misses": sorted(({k: c.get(k) for k in ("model", "threads", "batch", "length", "dvm_x", "inductor_x",
                                                      "dvm_x_min")}
                              for c in cells if c["dvm_x"] < 1.0), key=lambda c: c["dvm_x"])}


def run(models=None, lengths=LENGTHS, batches=BATCHES, threads=THREADS, repeat: int = REPEAT,
        cold: bool = True, quiet: bool = False, dtype: str = "float32") -> dict:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    import transformers

    import dvm
    import dvm.frontend.torch_backend  # noqa: F401  (registers backend "dvm")
    models = list(models or ZOO)
    if dtype not in TOLERANCE:
        raise ValueError(f"dtype {dtype!r}: one of {', '.join(DTYPES)}")
    z = _Zoo(repeat, quiet, dtype)
    load_start, t0 = loadavg(), time.time()
    z.log(f"models {','.join(models)}; lengths {list(lengths)}; batches {list(batches)}; threads {list(threads)}; "
          f"{dtype}; VM {dvm.config.config().vm}; 1-min load {load_start}")
    warm_s = _warm_dynamo()
    old_cache = os.environ.get(INDUCTOR_CACHE_ENV)
    results, failures = {}, []
    try:
        for m in models:
            try:
                results[m] = _model(z, m, list(lengths), list(batches), list(threads), cold, dtype)
            except Exception as e:   # a failing model is reported, the others still run
                msg = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                z.log(f"{m}: FAILED: {msg}")
                results[m] = {"what": ZOO[m].what, "error": msg}
                failures.append(f"{m}: {msg}")
                continue
            for t, pt in results[m]["per_threads"].items():
                d = pt["compile"]["dvm"]
                if d["mismatches"]:
                    failures.append(f"{m} t={t}: DVM outside tolerance: {'; '.join(d['mismatches'][:3])}")
                if d["graph_fallbacks"]:
                    failures.append(f"{m} t={t}: whole graphs fell back to PyTorch: {d['graph_fallbacks']}")
    finally:
        restore_env(INDUCTOR_CACHE_ENV, old_cache)
    return {"benchmark": "models_zoo", "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "seconds": round(time.time() - t0, 2), "vm": dvm.config.config().vm, "repeat": repeat,
            "lengths": list(lengths), "batches": list(batches), "threads": list(threads), "cold": cold,
            "dtype": dtype, "tolerance": {"rtol": z.rtol, "atol": z.atol}, "dynamo_warmup_s": warm_s,
            "versions": {"torch": torch.__version__, "transformers": transformers.__version__, **vm_extra()},
            "machine": machine_info(), "loadavg_1min": {"start": load_start, "end": loadavg()},
            "models": results, "summary": summary(results), "failures": failures}


def main(models=None, quick: bool = False, lengths=None, batches=None, threads=None, repeat: int | None = None,
         dtype: str = "float32", json_path: str | None = DEFAULT_JSON, md_path: str | None = DEFAULT_MD,
         png_path: str | None = DEFAULT_PNG, out=None) -> int:
    import sys
    out = out or sys.stdout
    report = run(models=models or (list(QUICK) if quick else None),
                 lengths=lengths or (QUICK_LENGTHS if quick else LENGTHS),
                 batches=batches or (QUICK_BATCHES if quick else BATCHES),
                 threads=threads or (QUICK_THREADS if quick else THREADS),
                 repeat=repeat or (QUICK_REPEAT if quick else REPEAT), dtype=dtype)
    from .bench_zoo_report import markdown, plot
    return finish_report(report, markdown(report), plot, json_path, md_path, png_path, out, "model(s)")
