"""`dvm bench models`: Hugging Face models over a stream of changing sequence lengths.

Tiny `transformers` models built from small configs with random weights (no downloads; the
environment gets HF_HUB_OFFLINE=1) run a stream of random (batch, sequence length) inputs, in
inference (eval, torch.no_grad, use_cache=False), under each system side by side, each in a fresh
Dynamo state (torch._dynamo.reset() between systems):

  eager                  the model as written
  inductor_dynamic_cold  torch.compile(model, dynamic=True), Inductor, fresh temporary
                         TORCHINDUCTOR_CACHE_DIR and Inductor's in-memory caches cleared
  inductor_dynamic_warm  the same stream again after torch._dynamo.reset(), caches kept
  inductor_default_cold  torch.compile(model) (dynamic=None: automatic dynamic, a static first
                         compile, then recompiles with the changing dimensions symbolic), cold
  inductor_default_warm  the same, warm
  dvm                    torch.compile(model, backend="dvm", dynamic=True)

Per system: the first call's time, split into the backend's own compile time and the rest
(Dynamo + AOTAutograd tracing, plus the first run itself); the backend's compile time over the
whole stream; the total stream time (every call, compiles included); the number of graphs
compiled (recompiles = graphs - 1; for DVM the "torch_dynamo_graphs" counter, for Inductor a
counting wrapper backend; Dynamo's counters["stats"]["unique_graphs"] is recorded too); whether
Dynamo hit its recompile limit (it then runs the frame eagerly for good: reported, never hidden);
the maximum absolute error of the logits against eager over the stream; and the steady-state
latency of every (batch, length) of the stream (median of repeated calls after the stream),
summarised per length bucket. A compiled system's steady-state calls each follow an eager call on
the same input, timed too: its speed-up over eager comes from pairs that saw the same machine
speed, while the systems themselves run minutes apart (bench_models_report). For DVM, the
kernels of the compiled graph: segments (VM launches per forward), vector kernels, cube (matmul)
ops run through PyTorch, fallback ops with reasons.

Backend compile time: Inductor's is the time spent in compile_fx_inner (lowering, code generation,
C++ compilation; a warm cache hit may skip it), measured by a wrapper backend that calls
torch._inductor.compile_fx.compile_fx with a timed inner_compile. DVM's is the time spent
building dvm.frontend.torch_runtime.CompiledFx objects (planning, fusion, templates), measured by
wrapping the class inside dvm.frontend.torch_backend for the duration of the benchmark.

Before any system runs, Dynamo is warmed up once on a trivial function (backend "eager"), so
Dynamo's own import-time start-up is paid by no system in particular. Inductor's first compile in
the process also pays Inductor's start-up (imports, C++ compiler checks): it is the first
Inductor system of the first model, and it is said in the report.
"""
from __future__ import annotations

import logging
import math
import os
import shutil
import sys
import tempfile
import time
from typing import Callable

import numpy as np

from .bench_common import (finish_report, fmt_time, loadavg, machine_info, progress, restore_vm_threads, whole_vm,
                           set_vm_threads, vm_extra)
from .bench_models_probes import LimitWatcher, Stats, TimeDvmCompiler, dvm_result, inductor_backend

DEFAULT_JSON = os.path.join("bench-results", "models.json")
DEFAULT_MD = os.path.join("bench-results", "models.md")
DEFAULT_PNG = os.path.join("bench-results", "models.png")
MODEL_NAMES = ("llama", "qwen2_moe")
DEFAULT_LENGTHS = 32
QUICK_LENGTHS = 6
MAX_LENGTH = 1024
DEFAULT_BATCHES = (1, 3)
DEFAULT_REPEAT = 5
# Tiny models: each op's parallel region lasts microseconds, and on a shared 2-core machine an
# OpenMP thread waiting for a busy core stalls it for a scheduler quantum (eager at 2 threads ran
# 10-40x slower than at 1 under load 2). One thread by default, the same for every system
# (torch's intra-op threads: eager, Inductor's C++ kernels, matmuls; DVM_NUM_THREADS: DVM's CPU VM).
DEFAULT_THREADS = 1
QUICK_REPEAT = 2
BUCKETS = ((1, 16), (17, 128), (129, 512), (513, 1024))
# fused f32 reductions (RMSNorm means, softmax sums) sum in another order than ATen; the error
# grows through the layers and the LM head (the tolerance of tests/test_hf_models.py)
RTOL = ATOL = 1e-4
VOCAB = 256

SYSTEMS = ("eager", "inductor_dynamic_cold", "inductor_dynamic_warm", "inductor_default_cold",
           "inductor_default_warm", "dvm")
INDUCTOR_SYSTEMS = SYSTEMS[1:5]
LABELS = {"eager": "eager", "inductor_dynamic_cold": "Inductor dynamic=True, cold",
          "inductor_dynamic_warm": "Inductor dynamic=True, warm",
          "inductor_default_cold": "Inductor dynamic=None, cold",
          "inductor_default_warm": "Inductor dynamic=None, warm",
          "dvm": "DVM (dynamic=True)"}
SHORT = {"eager": "eager", "dvm": "DVM", "inductor_dynamic_cold": "Inductor\ndynamic\ncold",
         "inductor_dynamic_warm": "Inductor\ndynamic\nwarm", "inductor_default_cold": "Inductor\ndefault\ncold",
         "inductor_default_warm": "Inductor\ndefault\nwarm"}


# ---------------------------------------------------------------------------------------------
# Models: small configs, random weights, no downloads.
def _llama(seed: int):
    import torch
    import transformers
    cfg = transformers.LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB,
                                   max_position_embeddings=2048, use_cache=False)
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(cfg)


def _qwen2_moe(seed: int):
    import torch
    import transformers
    cfg = transformers.Qwen2MoeConfig(hidden_size=128, intermediate_size=256, moe_intermediate_size=64,
                                      shared_expert_intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB,
                                      num_experts=4, num_experts_per_tok=2, max_position_embeddings=2048,
                                      use_cache=False)
    torch.manual_seed(seed)
    return transformers.Qwen2MoeForCausalLM(cfg)


MODELS: dict[str, tuple[Callable, str]] = {
    "llama": (_llama, "LlamaForCausalLM: 2 layers, hidden 128, MLP 256, 4 heads (2 KV), vocab 256"),
    "qwen2_moe": (_qwen2_moe, "Qwen2MoeForCausalLM: 2 layers, hidden 128, 4 experts (top-2, MLP 64) "
                              "+ shared expert 128, 4 heads (2 KV), vocab 256"),
}


def stream_lengths(n: int, seed: int, max_length: int = MAX_LENGTH) -> list[int]:
    """n distinct random lengths in 1 .. max_length, 1 included, log-uniform (so that every
    bucket gets some), at least one per bucket when n allows, in random order."""
    rng = np.random.default_rng(seed)
    n = min(n, max_length)
    out = [1]
    for lo, hi in BUCKETS:   # one per bucket first
        hi = min(hi, max_length)
        if len(out) < n and lo <= hi and not any(lo <= x <= hi for x in out):
            out.append(int(rng.integers(lo, hi + 1)))
    while len(out) < n:
        x = int(round(math.exp(rng.uniform(0.0, math.log(max_length)))))
        x = min(max(x, 1), max_length)
        if x not in out:
            out.append(x)
    rng.shuffle(out)
    return [int(x) for x in out]


def make_stream(lengths: list[int], batches: list[int], seed: int) -> list[tuple[int, int]]:
    """Every (batch, length) pair, in random order (a length arrives at each batch size)."""
    pairs = [(b, L) for L in lengths for b in batches]
    order = np.random.default_rng(seed + 1).permutation(len(pairs))
    return [pairs[i] for i in order]


def _ids(b: int, L: int, seed: int):
    import torch
    g = torch.Generator().manual_seed(seed * 1_000_003 + b * 7919 + L)
    return torch.randint(0, VOCAB, (b, L), generator=g)


def _bucket(L: int) -> str:
    for lo, hi in BUCKETS:
        if lo <= L <= hi:
            return f"{lo}-{hi}"
    return f">{BUCKETS[-1][1]}"


def _compare(logits, want) -> tuple[float, str]:
    """(max abs error, "" or why the logits are outside rtol = atol = RTOL / ATOL of eager's)."""
    if tuple(logits.shape) != tuple(want.shape):
        return math.inf, f"shape {tuple(logits.shape)} vs {tuple(want.shape)}"
    err = (logits - want).abs()
    worst = float(err.max())
    inside = bool((err <= ATOL + RTOL * want.abs()).all())
    return worst, "" if inside else f"max abs err {worst:.3g}"


# ---------------------------------------------------------------------------------------------
class _Run:
    def __init__(self, repeat: int, seed: int, quiet: bool, bench: str = "models"):
        self.repeat, self.seed, self.quiet, self.bench = repeat, seed, quiet, bench
        self.t_start = time.perf_counter()
        self.first_inductor: dict | None = None

    def log(self, msg: str) -> None:
        progress(self.bench, f"{msg}  [{time.perf_counter() - self.t_start:.1f} s]", self.quiet)

    def steady(self, fn, eager, stream) -> list[dict]:
        """Every (batch, length) of the stream again, `repeat` timed calls each. With `eager` (the
        uncompiled model), each call of fn follows an eager call on the same input, timed too: the
        pair sees the same machine speed, so their ratio does not drift with it."""
        steady = []
        for b, L in sorted(set(stream)):
            ids = _ids(b, L, self.seed)
            ts, te = [], []
            for _ in range(self.repeat):
                if eager is not None:
                    t0 = time.perf_counter()
                    eager(input_ids=ids)
                    te.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                fn(input_ids=ids)
                ts.append(time.perf_counter() - t0)
            rec = {"batch": b, "length": L, "median_s": float(np.median(ts)), "min_s": min(ts)}
            if te:
                rec["eager_median_s"] = float(np.median(te))
            steady.append(rec)
        return steady

    def system(self, name: str, model, model_name: str, stream, reference: dict | None,
               cache_dir: str | None = None) -> tuple[dict, dict]:
        """Run the stream (and then the steady-state timings) under one system."""
        import torch
        import torch._dynamo
        from torch._dynamo.utils import counters as dynamo_counters

        from dvm.runtime import counters as dvm_counters
        tag = f"{model_name} {name}"
        torch._dynamo.reset()
        dynamo_counters.clear()
        stats = Stats()
        watcher = LimitWatcher()
        dlog = logging.getLogger("torch._dynamo.convert_frame")
        dlog.addHandler(watcher)
        timer = None
        dvm_before = dvm_counters.snapshot()
        if name == "eager":
            fn = model
        elif name == "dvm":
            timer = TimeDvmCompiler(stats).__enter__()
            fn = torch.compile(model, backend="dvm", dynamic=True)
        else:
            if name.endswith("_cold"):
                from torch._inductor.utils import clear_caches
                clear_caches()
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache_dir
            fn = torch.compile(model, backend=inductor_backend(stats),
                               dynamic=True if "dynamic" in name else None)
        self.log(f"{tag}: start ({LABELS[name]}{'; cache ' + cache_dir if cache_dir else ''})")

        def graphs() -> int:
            if name == "dvm":
                return dvm_counters.snapshot().get("torch_dynamo_graphs", 0) - dvm_before.get("torch_dynamo_graphs", 0)
            return stats.graphs

        outputs = {} if reference is None else None
        calls, max_err, bad = [], 0.0, []
        first: dict = {}
        try:
            with torch.no_grad():
                t_stream = time.perf_counter()
                for i, (b, L) in enumerate(stream):
                    ids = _ids(b, L, self.seed)
                    g0, c0 = graphs(), stats.backend_s
                    t0 = time.perf_counter()
                    logits = fn(input_ids=ids).logits
                    dt = time.perf_counter() - t0
                    new = graphs() - g0
                    comp = stats.backend_s - c0
                    calls.append({"batch": b, "length": L, "s": dt, "new_graphs": new, "backend_compile_s": comp})
                    if i == 0:
                        first = {"first_call_s": dt, "backend_compile_first_s": comp,
                                 "tracing_first_s": max(0.0, dt - comp)}
                    if outputs is not None:
                        outputs[(b, L)] = logits
                    else:
                        err, why = _compare(logits, reference[(b, L)])
                        max_err = max(max_err, err)
                        if why:
                            bad.append(f"b={b} L={L}: {why}")
                    self.log(f"{tag}: [{i + 1}/{len(stream)}] batch {b} length {L}: {fmt_time(dt)}"
                             + (f" ({new} new graph(s), backend compile {fmt_time(comp)})" if new else ""))
                stream_s = time.perf_counter() - t_stream
                graphs_stream = graphs()
                if name == "dvm":   # the stream's first calls may have run before the fast paths loaded
                    whole_vm(self.bench, self.quiet)
                steady = self.steady(fn, model if name != "eager" else None, stream)
                self.log(f"{tag}: steady state timed ({len(steady)} shapes x {self.repeat}"
                         + (", each call beside an eager call)" if name != "eager" else ")"))
        finally:
            dlog.removeHandler(watcher)
            if timer is not None:
                timer.__exit__(None, None, None)
        unique = int(dynamo_counters["stats"].get("unique_graphs", 0))
        limit_keys = {f"{k}:{kk}": v for k, d in dynamo_counters.items() for kk, v in d.items()
                      if "recompile limit" in str(kk).lower() or "recompile_limit" in str(kk)}
        res = {"system": name, "label": LABELS[name], **first,
               "backend_compile_total_s": stats.backend_s, "backend_compiles": stats.backend_calls,
               "stream_total_s": stream_s, "stream_calls": len(stream), "calls": calls,
               "graphs": graphs_stream if name != "eager" else 0,
               "recompiles": max(0, graphs_stream - 1) if name != "eager" else 0,
               "graphs_after_stream": (graphs() - graphs_stream) if name != "eager" else 0,
               "dynamo_unique_graphs": unique,
               "recompile_limit_hit": bool(watcher.messages or limit_keys),
               "recompile_limit_messages": watcher.messages[:4] + [f"{k} x{v}" for k, v in limit_keys.items()],
               "max_abs_err": None if reference is None else (max_err if math.isfinite(max_err) else None),
               "within_tolerance": True if reference is None else not bad,
               "mismatches": bad[:10], "steady": steady, "buckets": _buckets(steady),
               "speedup_vs_eager": _buckets(steady, paired=True) if name != "eager" else None}
        if name.startswith("inductor"):
            res["inductor_compile_fx_total_s"] = stats.wrapper_s
            res["dynamic"] = True if "dynamic" in name else None
            res["cache"] = "cold" if name.endswith("_cold") else "warm"
        if name == "dvm":
            res["dvm"] = dvm_result(stats, dvm_before, dvm_counters.snapshot(), stream, graphs_stream)
        if name == "inductor_dynamic_cold" or name == "inductor_default_cold":
            if self.first_inductor is None:
                self.first_inductor = {"model": model_name, "system": name, "first_call_s": first.get("first_call_s")}
                res["first_inductor_compile_in_process"] = True
        self.log(f"{tag}: done: first call {fmt_time(first.get('first_call_s'))} (backend compile "
                 f"{fmt_time(first.get('backend_compile_first_s'))}), stream {fmt_time(stream_s)}, "
                 f"{res['graphs']} graph(s)" + (", RECOMPILE LIMIT HIT" if res["recompile_limit_hit"] else "")
                 + ("" if res["max_abs_err"] is None else f", max abs err {res['max_abs_err']:.3g}")
                 + ("" if res["within_tolerance"] else " OUTSIDE TOLERANCE"))
        return res, outputs


def _buckets(steady: list[dict], paired: bool = False) -> dict:
    """{batch: {bucket: median over the bucket's lengths of their steady-state medians}}; paired:
    of eager's median / the system's, both timed side by side (> 1: faster than eager)."""
    out: dict = {}
    for b in sorted({s["batch"] for s in steady}):
        row = {}
        for lo, hi in BUCKETS:
            at = [s for s in steady if s["batch"] == b and lo <= s["length"] <= hi]
            vals = [s["eager_median_s"] / s["median_s"] for s in at] if paired else [s["median_s"] for s in at]
            row[f"{lo}-{hi}"] = float(np.median(vals)) if vals else None
        out[str(b)] = row
    return out


def _warm_dynamo() -> float:
    """Pay Dynamo's import-time start-up once, outside every system (backend "eager")."""
    import torch
    import torch._dynamo
    t0 = time.perf_counter()
    f = torch.compile(lambda x: torch.relu(x) + 1, backend="eager")
    f(torch.ones(3))
    torch._dynamo.reset()
    return time.perf_counter() - t0


def _set_threads(n: int) -> tuple[int, str | None]:
    """n threads for every system: torch's intra-op threads and the CPU VM's pool."""
    import torch
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    return old, set_vm_threads(n)


def _restore_threads(old: tuple[int, str | None]) -> None:
    import torch
    torch.set_num_threads(old[0])
    restore_vm_threads(old[1])


def run(models=MODEL_NAMES, n_lengths: int = DEFAULT_LENGTHS, batches=DEFAULT_BATCHES, seed: int = 0,
        inductor: bool = True, repeat: int = DEFAULT_REPEAT, lengths: list[int] | None = None,
        inductor_modes=("dynamic", "default"), warm: bool = True, threads: int = DEFAULT_THREADS,
        quiet: bool = False, bench: str = "models") -> dict:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import dvm.frontend.torch_backend  # noqa: F401  (registers backend "dvm")
    old_threads = _set_threads(threads)
    try:
        return _run(models, n_lengths, batches, seed, inductor, repeat, lengths, inductor_modes, warm,
                    threads, quiet, bench)
    finally:
        _restore_threads(old_threads)


def _run(models, n_lengths, batches, seed, inductor, repeat, lengths, inductor_modes, warm, threads,
         quiet, bench) -> dict:
    import torch
    import transformers

    import dvm
    load_start = loadavg()
    t0 = time.time()
    r = _Run(repeat, seed, quiet, bench)
    if lengths is None:
        lengths = stream_lengths(n_lengths, seed)
    stream = make_stream(lengths, list(batches), seed)
    systems = ["eager", "dvm"]
    if inductor:
        for mode in inductor_modes:
            systems += [f"inductor_{mode}_cold"] + ([f"inductor_{mode}_warm"] if warm else [])
    vm = dvm.config.config().vm
    r.log(f"models {','.join(models)}; {len(lengths)} lengths {sorted(lengths)}; batches "
          f"{list(batches)}; {len(stream)} calls per system; systems {', '.join(systems)}; VM {vm}; "
          f"torch threads {torch.get_num_threads()}; 1-min load {load_start}")
    warm_s = _warm_dynamo()
    r.log(f"Dynamo warmed up ({warm_s:.1f} s, not charged to any system)")
    old_cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    results = {}
    try:
        for m in models:
            make, what = MODELS[m]
            model = make(seed).eval()
            r.log(f"{m}: {what}")
            per: dict = {}
            ref = None
            for name in systems:
                if name.endswith("_cold"):
                    tmp = tempfile.mkdtemp(prefix="dvm-bench-models-inductor-")
                    cache = tmp
                elif name.endswith("_warm"):
                    cache = tmp
                else:
                    cache = None
                try:
                    res, outs = r.system(name, model, m, stream, ref, cache)
                except Exception as e:   # a failing system is reported, the others still run
                    msg = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                    print(f"[dvm bench models] {m} {name}: FAILED: {msg}", file=sys.stderr, flush=True)
                    res, outs = {"system": name, "label": LABELS[name], "error": msg}, None
                    if name == "eager":
                        raise
                per[name] = res
                if name == "eager":
                    ref = outs
                if name.endswith("_warm") or (name.endswith("_cold") and not warm):
                    shutil.rmtree(cache, ignore_errors=True)
                    if old_cache is None:
                        os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
                    else:
                        os.environ["TORCHINDUCTOR_CACHE_DIR"] = old_cache
            torch._dynamo.reset()
            results[m] = {"what": what, "systems": per}
            del ref
    finally:
        if old_cache is None:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = old_cache
    extra = vm_extra()
    failures = []
    for m, mr in results.items():
        d = mr["systems"].get("dvm", {})
        if "error" in d:
            failures.append(f"{m}: DVM failed: {d['error']}")
        elif not d.get("within_tolerance", True):
            failures.append(f"{m}: DVM outside tolerance (rtol {RTOL}, atol {ATOL}): {'; '.join(d['mismatches'][:3])}")
        elif d.get("dvm", {}).get("graph_fallbacks"):
            failures.append(f"{m}: DVM fell back to PyTorch for whole graphs: {d['dvm']['graph_fallbacks']}")
    return {
        "benchmark": "models",
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "seconds": round(time.time() - t0, 2),
        "vm": vm, "seed": seed, "repeat": repeat, "batches": list(batches), "lengths": list(lengths),
        "stream": [list(p) for p in stream], "buckets": [f"{lo}-{hi}" for lo, hi in BUCKETS],
        "systems": systems, "inductor": inductor,
        "tolerance": {"rtol": RTOL, "atol": ATOL},
        "dynamo_warmup_s": warm_s,
        "inductor_first_compile_in_process": r.first_inductor,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__, **extra},
        "threads": threads,
        "machine": machine_info(),
        "loadavg_1min": {"start": load_start, "end": loadavg()},
        "models": results,
        "failures": failures,
    }


def parse_list(text: str, what: str, choices=None, cast=str) -> list:
    items = [s.strip() for s in text.split(",") if s.strip()]
    if not items:
        raise ValueError(f"empty {what} list {text!r}")
    try:
        vals = [cast(s) for s in items]
    except ValueError:
        raise ValueError(f"bad {what} list {text!r}") from None
    if choices is not None:
        bad = [v for v in vals if v not in choices]
        if bad:
            raise ValueError(f"unknown {what}(s) {', '.join(map(str, bad))}; choose from {', '.join(choices)}")
    return vals


def main(models=None, n_lengths: int | None = None, batches=None, seed: int = 0, quick: bool = False,
         inductor: bool | None = None, repeat: int | None = None, threads: int = DEFAULT_THREADS, json_path: str | None = DEFAULT_JSON,
         md_path: str | None = DEFAULT_MD, png_path: str | None = DEFAULT_PNG, out=None) -> int:
    """Run, print the markdown on `out`, write JSON / markdown / PNG. Exit 1 if DVM failed, or its
    logits differed from eager's beyond the tolerance, or a whole graph fell back to PyTorch."""
    out = out or sys.stdout
    if models is None:
        models = ["llama"] if quick else list(MODEL_NAMES)
    if n_lengths is None:
        n_lengths = QUICK_LENGTHS if quick else DEFAULT_LENGTHS
    if batches is None:
        batches = [1] if quick else list(DEFAULT_BATCHES)
    if inductor is None:
        inductor = not quick
    if repeat is None:
        repeat = QUICK_REPEAT if quick else DEFAULT_REPEAT
    report = run(models=models, n_lengths=n_lengths, batches=batches, seed=seed, inductor=inductor, repeat=repeat,
                 threads=threads)
    from .bench_models_report import markdown, plot
    return finish_report(report, markdown(report), plot, json_path, md_path, png_path, out, "model(s)")
