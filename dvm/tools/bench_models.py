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

import math
import os
import shutil
import sys
import tempfile
import time
from typing import Callable

import numpy as np

from .bench_common import (INDUCTOR_CACHE_ENV, finish_report, loadavg, machine_info, restore_env, restore_vm_threads,
                           set_vm_threads, vm_extra)
# input_ids as _ids: bench_ab_child imports bench_models._ids from every checkout since 19fe007
from .bench_models_run import ATOL, BUCKETS, LABELS, RTOL, VOCAB, SystemRun
from .bench_models_run import input_ids as _ids  # noqa: F401

DEFAULT_JSON = os.path.join("bench-results", "models.json")
DEFAULT_MD = os.path.join("bench-results", "models.md")
DEFAULT_PNG = os.path.join("bench-results", "models.png")
MODEL_NAMES = ("llama", "qwen2_moe")
DEFAULT_LENGTHS = 32
QUICK_LENGTHS = 6
MAX_LENGTH = 1024
DEFAULT_BATCHES = (1, 3)
DEFAULT_REPEAT = 5
LAYERS = 2          # decoder layers of each model (--layers: how a new size's cost grows with depth)
MAX_LAYERS = 64
# Tiny models: each op's parallel region lasts microseconds, and on a shared 2-core machine an
# OpenMP thread waiting for a busy core stalls it for a scheduler quantum (eager at 2 threads ran
# 10-40x slower than at 1 under load 2). One thread by default, the same for every system
# (torch's intra-op threads: eager, Inductor's C++ kernels, matmuls; DVM_NUM_THREADS: DVM's CPU VM).
DEFAULT_THREADS = 1
QUICK_REPEAT = 2
# ---------------------------------------------------------------------------------------------
# Models: small configs, random weights, no downloads.
def _llama(seed: int, layers: int = LAYERS):
    import torch
    import transformers
    cfg = transformers.LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=layers,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB,
                                   max_position_embeddings=2048, use_cache=False)
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(cfg)


def _qwen2_moe(seed: int, layers: int = LAYERS):
    import torch
    import transformers
    cfg = transformers.Qwen2MoeConfig(hidden_size=128, intermediate_size=256, moe_intermediate_size=64,
                                      shared_expert_intermediate_size=128, num_hidden_layers=layers,
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
        quiet: bool = False, bench: str = "models", layers: int = LAYERS) -> dict:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import dvm.frontend.torch_backend  # noqa: F401  (registers backend "dvm")
    old_threads = _set_threads(threads)
    try:
        return _run(models, n_lengths, batches, seed, inductor, repeat, lengths, inductor_modes, warm,
                    threads, quiet, bench, layers)
    finally:
        _restore_threads(old_threads)


def _run(models, n_lengths, batches, seed, inductor, repeat, lengths, inductor_modes, warm, threads,
         quiet, bench, layers) -> dict:
    import torch
    import transformers

    import dvm
    load_start = loadavg()
    t0 = time.time()
    r = SystemRun(repeat, seed, quiet, bench)
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
    old_cache = os.environ.get(INDUCTOR_CACHE_ENV)
    results = {}
    try:
        for m in models:
            make, what = MODELS[m]
            model = make(seed, layers).eval()
            what = what.replace(f"{LAYERS} layers", f"{layers} layers")
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
                    restore_env(INDUCTOR_CACHE_ENV, old_cache)
            torch._dynamo.reset()
            results[m] = {"what": what, "systems": per}
            del ref
    finally:
        restore_env(INDUCTOR_CACHE_ENV, old_cache)
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
        "vm": vm, "seed": seed, "layers": layers, "repeat": repeat, "batches": list(batches), "lengths": list(lengths),
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
         inductor: bool | None = None, repeat: int | None = None, threads: int = DEFAULT_THREADS,
         layers: int = LAYERS, json_path: str | None = DEFAULT_JSON,
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
                 threads=threads, layers=layers)
    from .bench_models_report import markdown, plot
    return finish_report(report, markdown(report), plot, json_path, md_path, png_path, out, "model(s)")
