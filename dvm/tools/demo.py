"""`dvm demo`: a tiny Llama over changing sequence lengths; `dvm demo --builder`: builder-API
kernels over a stream of changing shapes.

The model demo (the default) is a short `dvm bench models`: a tiny Hugging Face Llama (random
weights, no downloads) over DEMO_LENGTHS random sequence lengths at batch sizes 1 and 3, eagerly,
under torch.compile(backend="dvm", dynamic=True), and under Inductor with dynamic=True (a fresh
cache; skipped with --no-inductor). It prints first-call time (backend compile vs Dynamo/AOT
tracing), total stream time, steady-state latency (and each compiled system's speed-up over eager
timed side by side), graphs compiled, the max abs error of the logits vs eager, and DVM's kernels
and fallbacks; it exits 1 if DVM's logits differ from eager's
beyond rtol = atol = 1e-4 (fused f32 reductions sum in another order, see tests/test_hf_models.py).
Lengths start at 2: a length of 1 is one more Dynamo specialization (one more graph) for every
compiled system, and each costs Inductor seconds; `dvm bench models` includes it.

The builder demo: each kernel is traced once per signature; every new shape costs one encode (microseconds), a
repeated shape is a cache hit. Every result is checked against a NumPy float64 reference: it
passes if it is within the float32 tolerances of torch.testing.assert_close (rtol 1.3e-6,
atol 1e-5), or if its error is no more than twice that of the same formula computed eagerly in
NumPy float32 (a LayerNorm over 2 nearly equal values amplifies float32 rounding by 1/std, for
eager code just as for DVM). The demo exits non-zero if any result fails. It runs on the selected
VM (DVM_VM; the CPU VM by default); shapes stay small so that DVM_VM=reference (NumPy, a Python
loop per tile) runs it in seconds too.
"""
from __future__ import annotations

import sys
import time

import numpy as np

import dvm
from dvm.runtime import counters as _counters

from .bench_encode import KERNELS, BenchKernel, _log_uniform

RTOL, ATOL = 1.3e-6, 1e-5   # torch.testing.assert_close defaults for float32
NEW_SHAPES = 12             # per kernel
REPEATS = 4                 # per kernel: shapes seen before (cache hits)
MAX_ROWS, MAX_COLS = 256, 6000   # log-uniform; cols > 4096: several column tiles (elementwise), one wide tile (norms)


def _shape(rng: np.random.Generator) -> tuple:
    # sizes >= 2: a size of 1 is part of the trace signature (it broadcasts), so each new
    # placement of a 1 would cost a trace; here each kernel traces once per rank
    cols = _log_uniform(rng, 2, MAX_COLS)
    if rng.random() < 0.5:
        return (_log_uniform(rng, 2, MAX_ROWS), cols)
    return (int(rng.integers(2, 5)), _log_uniform(rng, 2, MAX_ROWS // 4), cols)


def _stream(rng: np.random.Generator) -> list[tuple]:
    """NEW_SHAPES distinct shapes with REPEATS earlier ones mixed in after them."""
    shapes: list[tuple] = []
    while len(shapes) < NEW_SHAPES:
        s = _shape(rng)
        if s not in shapes:
            shapes.append(s)
    stream = list(shapes)
    for _ in range(REPEATS):
        pos = int(rng.integers(2, len(stream) + 1))
        stream.insert(pos, stream[int(rng.integers(0, min(pos, NEW_SHAPES)))])
    return stream


def _args(bk: BenchKernel, shape: tuple, rng: np.random.Generator) -> list[np.ndarray]:
    x = rng.standard_normal(shape).astype(np.float32)
    return [x] + [rng.standard_normal(shape[-1]).astype(np.float32) for _ in range(bk.n_vectors)]


def _last_encode_us() -> float | None:
    samples = getattr(_counters, "_ENCODE_NS", None)   # the runtime's encode-time samples
    return samples[-1] / 1e3 if samples else None


def check(bk: BenchKernel, args: list[np.ndarray], y: np.ndarray) -> tuple[bool, float, float]:
    """(ok, max abs error of y, max abs error of NumPy float32 eager), both against float64."""
    ref = bk.reference(*[a.astype(np.float64) for a in args])
    if y.shape != ref.shape or y.dtype != np.float32:
        return False, float("inf"), 0.0
    if y.size == 0:
        return True, 0.0, 0.0
    with np.errstate(all="ignore"):
        eager = bk.reference(*args).astype(np.float64)
    diff = np.abs(y.astype(np.float64) - ref)
    err, eager_err = float(diff.max()), float(np.abs(eager - ref).max())
    ok = bool(np.all(diff <= ATOL + RTOL * np.abs(ref))) or err <= 2 * eager_err
    return ok, err, eager_err


def run_builder_demo(seed: int = 0, out=None) -> int:
    out = out or sys.stdout
    rng = np.random.default_rng(seed)
    dvm.reset_counters()
    t_start = time.perf_counter()
    failures = 0
    print(f"{'kernel':<10} {'shape':<17} {'instance':<10} {'encode us':>10} {'max abs err':>12} "
          f"{'f32 eager err':>13}  ok", file=out)
    for bk in KERNELS:
        kf = dvm.kernel(bk.fn.fn)   # a fresh KernelFunction: its own traces and program cache
        for shape in _stream(rng):
            args = _args(bk, shape, rng)
            before = dvm.counters().get("encodes", 0)
            y = kf(*args)
            new = dvm.counters().get("encodes", 0) > before
            enc = _last_encode_us() if new else None
            ok, err, eager_err = check(bk, args, y)
            failures += not ok
            print(f"{bk.name:<10} {str(shape):<17} {'new shape' if new else 'cache hit':<10} "
                  f"{'' if enc is None else f'{enc:.1f}':>10} {err:>12.3g} {eager_err:>13.3g}  "
                  f"{'ok' if ok else 'FAIL'}", file=out, flush=True)
    c = dvm.counters()
    print(file=out)
    print(f"summary: {c.get('traces', 0)} traces, {c.get('encodes', 0)} encodes, "
          f"{c.get('cache_hits', 0)} cache hits, {c.get('launches', 0)} launches; encode p50 "
          f"{c.get('encode_us_p50', float('nan')):.1f} us, p99 {c.get('encode_us_p99', float('nan')):.1f} us "
          f"(wall {time.perf_counter() - t_start:.1f} s, VM {dvm.config.config().vm})", file=out)
    if failures:
        print(f"demo FAILED: {failures} result(s) outside tolerance (rtol {RTOL}, atol {ATOL}) and "
              f"worse than twice NumPy float32 eager's error", file=out)
        return 1
    print(f"all results within tolerance (rtol {RTOL}, atol {ATOL}, or no worse than 2x NumPy float32 "
          f"eager's error)", file=out)
    return 0


run_demo = run_builder_demo   # the name before the model demo existed

DEMO_LENGTHS = 10
DEMO_BATCHES = (1, 3)
DEMO_REPEAT = 3


def _demo_lengths(n: int, seed: int) -> list[int]:
    """n distinct log-uniform lengths in 2 .. 1024 (see the module docstring for why not 1)."""
    rng = np.random.default_rng(seed)
    out: list[int] = []
    while len(out) < n:
        x = int(round(float(np.exp(rng.uniform(np.log(2), np.log(1024))))))
        if 2 <= x <= 1024 and x not in out:
            out.append(x)
    return out


def _fmt_table(head: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    line = "  ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(head, widths)))
    out = [line, "-" * len(line)]
    for r in rows:
        out.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))))
    return out


def run_model_demo(seed: int = 0, inductor: bool = True, out=None, n_lengths: int = DEMO_LENGTHS,
                   batches=DEMO_BATCHES, repeat: int = DEMO_REPEAT) -> int:
    from . import bench_models as bm
    from .bench_common import fmt_time
    from .bench_models_report import bucket_head, bucket_rows
    out = out or sys.stdout
    lengths = _demo_lengths(n_lengths, seed)
    systems = "eager, DVM" + (", Inductor dynamic=True (cold cache)" if inductor else "")
    print(f"dvm demo: {bm.MODELS['llama'][1]}, random weights; {len(lengths)} random sequence lengths "
          f"{sorted(lengths)} x batch {list(batches)}; {systems}.", file=out)
    if inductor:
        print("Inductor's first compile dominates the demo's time (10-60 s on a 2-core machine); "
              "--no-inductor skips it. Progress on stderr.", file=out, flush=True)
    t0 = time.perf_counter()
    report = bm.run(models=["llama"], lengths=lengths, batches=list(batches), seed=seed, inductor=inductor,
                    inductor_modes=("dynamic",), warm=False, repeat=repeat, bench="demo")
    per = report["models"]["llama"]["systems"]
    print(file=out)
    head = ["system", "first call", "= backend compile", "+ tracing/run", "total stream",
            "backend compile (all)", "graphs", "max abs err", "within tol"]
    rows = []
    for name in report["systems"]:
        s = per[name]
        if "error" in s:
            rows.append([bm.LABELS[name], "FAILED: " + s["error"][:60]] + [""] * 7)
            continue
        compiled = name != "eager"
        rows.append([bm.LABELS[name], fmt_time(s["first_call_s"]),
                     fmt_time(s["backend_compile_first_s"]) if compiled else "-",
                     fmt_time(s["tracing_first_s"]) if compiled else "-",
                     fmt_time(s["stream_total_s"]),
                     fmt_time(s["backend_compile_total_s"]) if compiled else "-",
                     (str(s["graphs"]) + (" LIMIT HIT" if s["recompile_limit_hit"] else "")) if compiled else "-",
                     "-" if s["max_abs_err"] is None else f"{s['max_abs_err']:.2g}",
                     "-" if name == "eager" else ("yes" if s["within_tolerance"] else "NO")])
    for line in _fmt_table(head, rows):
        print(line, file=out)
    print(file=out)
    head = ["steady state per call"] + bucket_head(report)
    rows = bucket_rows(report, "llama", "buckets", fmt_time, "-")
    # ratios to eager calls timed alternately with the system's (bench_models_run.SystemRun.steady)
    rows += bucket_rows(report, "llama", "speedup_vs_eager", lambda v: f"{v:.2f}x", "-", ": speed-up over eager")
    for line in _fmt_table(head, rows):
        print(line, file=out)
    d = per.get("dvm", {})
    g = d.get("dvm", {}).get("main_graph")
    print(file=out)
    if g:
        print(f"DVM: {g['vector_kernels']} vector kernels in {g['segments']} VM launches per forward, "
              f"{g['cube_ops']} matmuls through PyTorch, {g['fallback_ops']} ops through PyTorch "
              f"(fallbacks: {', '.join(sorted({k.split(':')[0].replace('aten.', '') for k in g['fallbacks']}))}); "
              f"backend compile {g['compile_s'] * 1e3:.1f} ms; {d['graphs']} graph(s) for "
              f"{d['dvm']['size1_patterns']} pattern(s) of sizes equal to 1 (Dynamo's own specializations), "
              f"{d['dvm']['recompiles_beyond_size1']} recompiles beyond them.", file=out)
    print(f"first call = the backend's own compile (Inductor: compile_fx_inner; DVM: fusion, templates) "
          f"+ the rest (Dynamo + AOTAutograd tracing, the run); total stream: all {len(report['stream'])} calls, "
          f"compiles included; steady state per call: medians of each system's own rounds; speed-up: against "
          f"eager calls timed alternately with the system's (eager timed alone and between another "
          f"system's calls can differ, so the rows need not divide into the ratios); "
          f"graphs: Dynamo graphs compiled (one per pattern of sizes equal to 1). Threads: {report['threads']}; 1-min load "
          f"{report['loadavg_1min']['start']} -> {report['loadavg_1min']['end']} on "
          f"{report['machine']['cores']} cores; VM {report['vm']}; {time.perf_counter() - t0:.0f} s in all. "
          f"Full benchmark: dvm bench models.", file=out)
    if report["failures"]:
        print("demo FAILED: " + "; ".join(report["failures"]), file=out)
        return 1
    print(f"DVM's logits match eager's at every (batch, length) (rtol = atol = {bm.RTOL:g}).", file=out)
    return 0


def main(argv=None) -> int:
    return run_model_demo()


if __name__ == "__main__":
    sys.exit(main())
