"""`dvm bench encode`: how long it takes to encode a NEW instance of a fused vector kernel.

For each benchmark kernel (kernels below) and each of many random shapes, every one of them a new
set of symbol values (a cache miss), two times are measured:

  encode      the pure encode step, `codegen.encoder.encode_program(templates, args, env, layouts)`
  first call  what a call pays for a new shape apart from tracing and running the VM: coerce the
              arguments, look the trace up, bind the symbols, compute the layouts, look the
              program cache up (a miss), encode, and verify the new Program

The budget (DESIGN.md section 9) is p50 <= 20 us, p99 <= 100 us for encoding a new instance.
No VM runs in the timed part. Traces happen before timing (every signature the measured shapes
need is traced and warmed up with shapes that are not measured).
"""
from __future__ import annotations

import gc
import math
import os
import sys
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

import dvm
from ..frontend.library import bias_gelu, layernorm, rmsnorm, softmax  # noqa: F401 (re-exported for the demo)

from .bench_common import loadavg, machine_info, percentiles, progress, write_json

BUDGET_P50_US = 20.0
BUDGET_P99_US = 100.0
DEFAULT_SHAPES = 2000
QUICK_SHAPES = 60
DEFAULT_JSON = os.path.join("bench-results", "encode.json")
MAX_ROWS = 4096
MAX_COLS = 8192


# ---------------------------------------------------------------------------------------------
# The benchmark kernels (the demo runs the same ones), each with a NumPy reference.
@dvm.kernel
def chain8(k, x):
    """An 8-op elementwise chain."""
    x = k.load(x)
    t = k.mul(x, 1.702)
    t = k.sigmoid(t)
    t = k.mul(x, t)
    t = k.add(t, 0.1)
    t = k.tanh(t)
    t = k.mul(t, t)
    t = k.sub(t, 0.5)
    t = k.abs(t)
    return k.store(t)


_erf = np.vectorize(math.erf, otypes=[np.float64])

# NumPy references. They compute in the dtype of their arguments: pass float64 copies for the
# high-precision reference, the float32 arguments themselves for "eager in the same dtype".


def _ref_chain8(x):
    t = 1.0 / (1.0 + np.exp(-(x * 1.702)))
    return np.abs(np.tanh(x * t + 0.1) ** 2 - 0.5)


def _ref_bias_gelu(x, b):
    v = x + b
    return (0.5 * v * (1.0 + _erf(v / math.sqrt(2.0)))).astype(v.dtype)


def _ref_softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _ref_layernorm(x, w, b):
    xc = x - x.mean(axis=-1, keepdims=True)
    return xc / np.sqrt((xc * xc).mean(axis=-1, keepdims=True) + 1e-5) * w + b


def _ref_rmsnorm(x, w):
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + 1e-6) * w


@dataclass(frozen=True)
class BenchKernel:
    name: str
    fn: dvm.KernelFunction
    n_vectors: int              # extra arguments of shape (cols,) after x
    reference: Callable
    what: str


KERNELS = (
    BenchKernel("chain8", chain8, 0, _ref_chain8, "8-op elementwise chain"),
    BenchKernel("bias_gelu", bias_gelu, 1, _ref_bias_gelu, "broadcast bias-add + GELU"),
    BenchKernel("softmax", softmax, 0, _ref_softmax, "softmax (last dim)"),
    BenchKernel("layernorm", layernorm, 2, _ref_layernorm, "LayerNorm with weight and bias"),
    BenchKernel("rmsnorm", rmsnorm, 1, _ref_rmsnorm, "RMSNorm with weight"),
)


# ---------------------------------------------------------------------------------------------
def _log_uniform(rng: np.random.Generator, lo: int, hi: int) -> int:
    """An integer in [lo, hi], log-uniformly distributed (small sizes as common as large)."""
    return int(min(hi, max(lo, math.floor(math.exp(rng.uniform(math.log(lo), math.log(hi + 1)))))))


def random_shape(rng: np.random.Generator, max_rows: int = MAX_ROWS, max_cols: int = MAX_COLS) -> tuple:
    """Rank 2 (rows, cols) or rank 3 (batch, seq, cols) with batch * seq <= max_rows."""
    cols = _log_uniform(rng, 1, max_cols)
    if rng.random() < 0.5:
        return (_log_uniform(rng, 1, max_rows), cols)
    batch = _log_uniform(rng, 1, min(64, max_rows))
    return (batch, _log_uniform(rng, 1, max(1, max_rows // batch)), cols)


def _pattern(shape: tuple) -> tuple:
    # what the builder's trace signature sees of a shape: which dims are 0 or 1
    return tuple(d if d in (0, 1) else -1 for d in shape)


def _sibling(rng: np.random.Generator, shape: tuple) -> tuple:
    """Another shape with the same trace signature (for warm-up)."""
    out = []
    for j, d in enumerate(shape):
        if d in (0, 1):
            out.append(d)
        else:
            hi = MAX_COLS if j == len(shape) - 1 else d   # rows never grow: the arena fits
            out.append(_log_uniform(rng, 2, hi))
    return tuple(out)


class _Arena:
    """Contiguous float32 arrays of any benchmark shape, as views of one big allocation.

    np.empty does not touch its pages, so the memory is virtual until something writes to it;
    the timed part never does (no VM runs)."""

    def __init__(self) -> None:
        self.x = np.empty(MAX_ROWS * MAX_COLS, np.float32)
        self.v = np.empty((3, MAX_COLS), np.float32)

    def args(self, bk: BenchKernel, shape: tuple) -> list[np.ndarray]:
        numel = int(np.prod(shape))
        x = self.x[:numel].reshape(shape)
        return [x] + [self.v[i, :shape[-1]] for i in range(bk.n_vectors)]


def _within(stats: dict) -> bool:
    return stats["p50"] <= BUDGET_P50_US and stats["p99"] <= BUDGET_P99_US


def _progress(msg: str, quiet: bool) -> None:
    progress("encode", msg, quiet)


def bench_kernel(bk: BenchKernel, n_shapes: int, rng: np.random.Generator, arena: _Arena,
                 quiet: bool = False) -> dict:
    from ..codegen.encoder import encode_program
    from ..codegen.verifier import verify
    from ..runtime.compiled import as_buffer

    kf = dvm.kernel(bk.fn.fn)   # fresh: no traces or cached programs from earlier runs
    shapes: list[tuple] = []
    seen: set[tuple] = set()
    while len(shapes) < n_shapes:
        s = random_shape(rng)
        if s not in seen:
            seen.add(s)
            shapes.append(s)

    # Untimed setup: trace every signature the measured shapes need, and prepare each instance's
    # (traced, env, layouts) for the pure-encode loop.
    prepared = []
    for s in shapes:
        traced, env, arrays = kf.instance(*arena.args(bk, s))
        prepared.append((traced, env, [as_buffer(a)[1] for a in arrays]))

    # Warm-up, untimed: per signature, encode + verify a few shapes that are not measured.
    patterns = {_pattern(s): s for s in shapes}
    n_warm = 0
    for s in patterns.values():
        for _ in range(3 if n_shapes >= 200 else 1):
            w = _sibling(rng, s)
            if w in seen:
                continue
            traced, env, arrays = kf.instance(*arena.args(bk, w))
            layouts = [as_buffer(a)[1] for a in arrays]
            verify(encode_program(traced.graph.templates, traced.graph.args, env, layouts))
            verify(traced.graph.program(env, layouts))
            n_warm += 1
    _progress(f"{bk.name}: {n_shapes} new shapes, {len(patterns)} trace signature(s), "
              f"{n_warm} warm-up instances", quiet)

    # Timed: the pure encode step, one new instance per sample.
    encode_ns: list[int] = []
    clock = time.perf_counter_ns
    gc.collect()
    gc.disable()
    try:
        for traced, env, layouts in prepared:
            g = traced.graph
            t0 = clock()
            encode_program(g.templates, g.args, env, layouts)
            encode_ns.append(clock() - t0)
    finally:
        gc.enable()
    enc = percentiles(encode_ns)
    _progress(f"{bk.name}: encode      p50 {enc['p50']:.1f} us  p99 {enc['p99']:.1f} us", quiet)

    # Timed: the first-call path of a new shape, trace excluded (the trace lookup is a dict hit).
    first_ns: list[int] = []
    parts_ns: list[tuple[int, int, int]] = []   # (bind, cache lookup + encode, verify)
    arg_lists = [arena.args(bk, s) for s in shapes]
    gc.collect()
    gc.disable()
    try:
        for args in arg_lists:
            t0 = clock()
            traced, env, arrays = kf.instance(*args)
            layouts = [as_buffer(a)[1] for a in arrays]
            t1 = clock()
            prog = traced.graph.program(env, layouts)
            t2 = clock()
            verify(prog)
            t3 = clock()
            first_ns.append(t3 - t0)
            parts_ns.append((t1 - t0, t2 - t1, t3 - t2))
    finally:
        gc.enable()
    first = percentiles(first_ns)
    first["p50_parts"] = {name: percentiles([p[i] for p in parts_ns])["p50"]
                          for i, name in enumerate(("bind", "program_cache_and_encode", "verify"))}
    parts = ", ".join(f"{k} {v:.1f}" for k, v in first["p50_parts"].items())
    _progress(f"{bk.name}: first call  p50 {first['p50']:.1f} us  p99 {first['p99']:.1f} us  "
              f"(p50 parts, us: {parts})", quiet)
    return {"what": bk.what, "instances": n_shapes, "signatures": len(patterns),
            "encode_us": enc, "first_call_us": first,
            "encode_within_budget": _within(enc), "first_call_within_budget": _within(first)}


def run(n_shapes: int = DEFAULT_SHAPES, seed: int = 0, kernels=None, quiet: bool = False) -> dict:
    if n_shapes < 1:
        raise ValueError("--shapes must be at least 1")
    rng = np.random.default_rng(seed)
    arena = _Arena()
    chosen = [bk for bk in KERNELS if kernels is None or bk.name in kernels]
    t0 = time.time()
    load_start = loadavg()
    results = {}
    for i, bk in enumerate(chosen):
        _progress(f"[{i + 1}/{len(chosen)}] {bk.name} ({bk.what})", quiet)
        results[bk.name] = bench_kernel(bk, n_shapes, rng, arena, quiet)
    return {
        "benchmark": "encode",
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "seconds": round(time.time() - t0, 2),
        "shapes_per_kernel": n_shapes, "seed": seed,
        "shape_ranges": {"rows": [1, MAX_ROWS], "cols": [1, MAX_COLS], "ranks": [2, 3],
                         "distribution": "log-uniform per dim; rank 3 is (batch<=64, seq, cols) "
                                         "with batch*seq <= rows max"},
        "budget_us": {"p50": BUDGET_P50_US, "p99": BUDGET_P99_US},
        "machine": machine_info(),
        # other processes on the machine inflate the tails (p99, max): the load is recorded
        "loadavg_1min": {"start": load_start, "end": loadavg()},
        "kernels": results,
        "all_within_budget": all(r["encode_within_budget"] for r in results.values()),
    }


def markdown_table(report: dict) -> str:
    b = report["budget_us"]
    lines = [
        f"Encode time per new instance, microseconds ({report['shapes_per_kernel']} new shapes per "
        f"kernel; budget p50 <= {b['p50']:g} us, p99 <= {b['p99']:g} us)",
        f"Machine: {report['machine']['cpu']}, {report['machine']['cores']} cores; 1-min load average "
        f"{report['loadavg_1min']['start']} at start, {report['loadavg_1min']['end']} at end",
        "",
        "| kernel | encode p50 | encode p99 | encode max | budget | first call p50 | first call p99 "
        "| first call max | first call vs budget |",
        "| --- | ---: | ---: | ---: | :---: | ---: | ---: | ---: | :---: |",
    ]
    for name, r in report["kernels"].items():
        e, f = r["encode_us"], r["first_call_us"]
        lines.append(f"| {name} | {e['p50']:.1f} | {e['p99']:.1f} | {e['max']:.1f} | "
                     f"{'pass' if r['encode_within_budget'] else 'MISS'} | {f['p50']:.1f} | {f['p99']:.1f} | "
                     f"{f['max']:.1f} | {'pass' if r['first_call_within_budget'] else 'MISS'} |")
    return "\n".join(lines)


def main(n_shapes: int | None = None, seed: int = 0, json_path: str | None = DEFAULT_JSON,
         quick: bool = False, out=None) -> int:
    """Run the benchmark, print the table, write the JSON. --quick: fewer shapes (a smoke run)."""
    out = out or sys.stdout
    if n_shapes is None:
        n_shapes = QUICK_SHAPES if quick else DEFAULT_SHAPES
    report = run(n_shapes, seed)
    print(markdown_table(report), file=out)
    missed = [n for n, r in report["kernels"].items() if not r["encode_within_budget"]]
    if missed:
        print(f"\nbudget MISSED by: {', '.join(missed)}", file=out)
    else:
        print("\nall kernels within the encode budget", file=out)
    if json_path:
        write_json(json_path, report)
        print(f"wrote {json_path}", file=out)
    return 0
