"""One system's run in `dvm bench models` (bench_models): the stream of (batch, length) inputs
under eager, Inductor or DVM, with its first call, compiles, errors against eager and steady
state (SystemRun.system), and what the benchmark's parts share: the systems and their labels, the
length buckets, the tolerance and the models' vocabulary.
"""
from __future__ import annotations

import logging
import math
import os
import time

import numpy as np

from .bench_common import fmt_time, progress, whole_vm
from .bench_models_probes import LimitWatcher, Stats, TimeDvmCompiler, dvm_result, inductor_backend

BUCKETS = ((1, 16), (17, 128), (129, 512), (513, 1024))
# fused f32 reductions (RMSNorm means, softmax sums) sum in another order than ATen; the error
# grows through the layers and the LM head (the tolerance of tests/test_hf_models.py)
RTOL = ATOL = 1e-4
VOCAB = 256

SYSTEMS = ("eager", "inductor_dynamic_cold", "inductor_dynamic_warm", "inductor_default_cold",
           "inductor_default_warm", "dvm")
LABELS = {"eager": "eager", "inductor_dynamic_cold": "Inductor dynamic=True, cold",
          "inductor_dynamic_warm": "Inductor dynamic=True, warm",
          "inductor_default_cold": "Inductor dynamic=None, cold",
          "inductor_default_warm": "Inductor dynamic=None, warm",
          "dvm": "DVM (dynamic=True)"}
SHORT = {"eager": "eager", "dvm": "DVM", "inductor_dynamic_cold": "Inductor\ndynamic\ncold",
         "inductor_dynamic_warm": "Inductor\ndynamic\nwarm", "inductor_default_cold": "Inductor\ndefault\ncold",
         "inductor_default_warm": "Inductor\ndefault\nwarm"}


def input_ids(b: int, L: int, seed: int):
    """The token ids of one (batch, length) input: the same for every system and run."""
    import torch
    g = torch.Generator().manual_seed(seed * 1_000_003 + b * 7919 + L)
    return torch.randint(0, VOCAB, (b, L), generator=g)


def compare(logits, want, rtol: float = RTOL, atol: float = ATOL) -> tuple[float, str]:
    """(max abs error, "" or why the logits are outside rtol / atol of eager's)."""
    if tuple(logits.shape) != tuple(want.shape):
        return math.inf, f"shape {tuple(logits.shape)} vs {tuple(want.shape)}"
    err = (logits.float() - want.float()).abs()
    worst = float(err.max())
    inside = bool((err <= atol + rtol * want.float().abs()).all())
    return worst, "" if inside else f"max abs err {worst:.3g}"


class SystemRun:
    """The runs of one benchmark: each system's stream, first call and steady state (system())."""

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
            ids = input_ids(b, L, self.seed)
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
                    ids = input_ids(b, L, self.seed)
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
                        err, why = compare(logits, reference[(b, L)])
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
               "mismatches": bad[:10], "steady": steady, "buckets": buckets(steady),
               "speedup_vs_eager": buckets(steady, paired=True) if name != "eager" else None}
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


def buckets(steady: list[dict], paired: bool = False) -> dict:
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
