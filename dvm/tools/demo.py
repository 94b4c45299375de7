"""`dvm demo`: builder-API kernels over a stream of changing shapes.

Each kernel is traced once per signature; every new shape costs one encode (microseconds), a
repeated shape is a cache hit. Every result is checked against a NumPy float64 reference: it
passes if it is within the float32 tolerances of torch.testing.assert_close (rtol 1.3e-6,
atol 1e-5), or if its error is no more than twice that of the same formula computed eagerly in
NumPy float32 (a LayerNorm over 2 nearly equal values amplifies float32 rounding by 1/std, for
eager code just as for DVM). The demo exits non-zero if any result fails. Shapes are small because the reference VM (NumPy, a Python loop
per tile) is the only VM so far.
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
MAX_ROWS, MAX_COLS = 256, 6000   # log-uniform; cols > 4096 take several column tiles


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


def run_demo(seed: int = 0, out=None) -> int:
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


def main(argv=None) -> int:
    return run_demo()


if __name__ == "__main__":
    sys.exit(main())
