"""A matrix product called from compiled numba code through a BLAS the process already has,
against PyTorch's linear from Python (a measurement for issue 49's mix kernels; not a test).

    python -m dvm.tools.gemm_probe [--threads N] [--samples N] [--shapes MxNxK,...]
    python -m dvm.tools.gemm_probe --forward MODEL,... [--cells BxL,...] [--rounds N] [--threads N]

A mix kernel runs a matmul and its elementwise epilogue in one VM launch. This probe measures
what that launch could gain where it matters most, small products: the float32 product
y = x @ w.T (x: M x K, w: N x K, PyTorch's linear layout), and the same with a bias and a ReLU
applied to the output while it is in cache, each called as one compiled function, against
`F.linear(x, w)` and `F.linear(x, w, b).relu_()` from Python. BLAS libraries tried, each where
its symbol is exported: MKL's Fortran `sgemm_` in libtorch_cpu (PyTorch's x86 wheels link MKL
statically and export it) and NumPy's OpenBLAS (`scipy_sgemm_64_`, 64-bit integers). Each product
is checked against PyTorch's (`bitwise` where equal, else the largest difference). Calls of the
systems alternate one by one; medians of the samples. `--forward` measures the product inside
whole forwards of zoo models compiled with DVM instead (tools/gemm_probe_forward).
"""
from __future__ import annotations

import argparse
import contextlib
import ctypes
import glob
import os
import statistics
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from numba import njit

from .bench_common import progress

DEFAULT_SHAPES = ((8, 128, 128), (8, 384, 128), (8, 256, 256), (8, 768, 768), (64, 128, 128), (64, 512, 128),
                  (256, 128, 128))
MKL = "MKL"   # the name blas_libraries gives MKL's sgemm_ starts with it
_SGEMM = ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * 13)   # Fortran sgemm: every argument by address
# the systems timed, in the order of their calls and of the table's columns
SYSTEMS = ("F.linear", "compiled product", "F.linear + bias, relu_", "compiled product + bias + ReLU")


def _openblas_paths() -> list[str]:
    return glob.glob(os.path.join(os.path.dirname(np.__file__), os.pardir, "numpy.libs", "libscipy_openblas64_*.so"))


def set_threads(threads: int) -> None:
    """PyTorch's threads (MKL's sgemm_ follows them) and NumPy's OpenBLAS's."""
    torch.set_num_threads(threads)
    for path in _openblas_paths():
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(path).scipy_openblas_set_num_threads64_(ctypes.c_int(threads))


def blas_libraries() -> dict[str, tuple[ctypes._CFuncPtr, type]]:
    """name -> (its sgemm, the integer type of its arguments), for each BLAS found in this process's
    libraries."""
    found = {}
    try:
        lib = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"))
        found[f"{MKL} (libtorch_cpu sgemm_)"] = (_SGEMM(("sgemm_", lib)), np.int32)
    except (OSError, AttributeError):
        pass
    for path in _openblas_paths():
        try:
            found["OpenBLAS (NumPy scipy_sgemm_64_)"] = (_SGEMM(("scipy_sgemm_64_", ctypes.CDLL(path))), np.int64)
        except (OSError, AttributeError):
            pass
    return found


def mkl_sgemm():
    """MKL's sgemm_ (the BLAS PyTorch's products use, on its threads) where this process exports
    it, else None."""
    return next((f for name, (f, _) in blas_libraries().items() if name.startswith(MKL)), None)


def _compiled(sgemm):
    """(product, product + bias + ReLU) as compiled functions calling `sgemm` on addresses."""
    @njit
    def product(t, n, ints, isz, scal, w, x, c):   # isz: the integers' size in bytes
        k = ints + 2 * isz
        sgemm(t, n, ints, ints + isz, k, scal, w, k, x, k, scal + 4, c, ints)

    @njit
    def product_bias_relu(t, n, ints, isz, scal, w, x, c, out, bias):
        product(t, n, ints, isz, scal, w, x, c)
        for i in range(out.shape[0]):   # the epilogue, on each row while it is in cache
            for j in range(out.shape[1]):
                v = out[i, j] + bias[j]
                out[i, j] = v if v > 0 else np.float32(0)
    return product, product_bias_relu


class _Call:
    """sgemm's operands for y = x @ w.T into c (row-major M x N), as column-major
    c.T = op(w.T) x.T: transa 'T' on w.T (K x N, ld K), x.T (K x M, ld K), c.T (N x M, ld N)."""

    def __init__(self, int_type, x: torch.Tensor, w: torch.Tensor, c: np.ndarray):
        (m, k), n = x.shape, w.shape[0]
        self.chars = np.frombuffer(b"TN", np.uint8).copy()
        self.ints = np.array([n, m, k], int_type)
        self.scal = np.array([1.0, 0.0], np.float32)   # alpha, beta
        self.args = (self.chars.ctypes.data, self.chars.ctypes.data + 1, self.ints.ctypes.data,
                     self.ints.itemsize, self.scal.ctypes.data, w.data_ptr(), x.data_ptr(), c.ctypes.data)


def _timed(fn) -> float:
    t0 = time.perf_counter_ns()
    fn()
    return (time.perf_counter_ns() - t0) / 1e3


def probe(shapes=DEFAULT_SHAPES, samples: int = 300, seed: int = 0) -> list[dict]:
    """One row per (shape, BLAS): medians in µs per system and the product's largest difference
    from PyTorch's (0: bitwise equal), on the threads each library has (set_threads)."""
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for name, (sgemm, int_type) in blas_libraries().items():
        product, product_bias_relu = _compiled(sgemm)
        for m, n, k in shapes:
            x, w, b = (torch.randn(s, generator=gen) for s in ((m, k), (n, k), (n,)))
            c = np.empty((m, n), np.float32)
            call = _Call(int_type, x, w, c)
            bias = b.numpy()
            product(*call.args)
            want = F.linear(x, w)
            got = torch.from_numpy(c.copy())
            max_diff = 0.0 if torch.equal(got, want) else (got - want).abs().max().item()
            product_bias_relu(*call.args, c, bias)   # the epilogue: the same f32 add and max as PyTorch's
            if not torch.equal(torch.from_numpy(c), (got + b).relu_()):
                raise AssertionError(f"{name} {m}x{n}x{k}: the epilogue differs from PyTorch's add and ReLU")
            systems = dict(zip(SYSTEMS, (lambda: F.linear(x, w), lambda: product(*call.args),
                                         lambda: F.linear(x, w, b).relu_(),
                                         lambda: product_bias_relu(*call.args, c, bias))))
            times = {s: [] for s in systems}
            for _ in range(samples):
                for s, fn in systems.items():
                    times[s].append(_timed(fn))
            rows.append({"blas": name, "shape": (m, n, k), "max_diff": max_diff,
                         "us": {s: statistics.median(t[samples // 10:]) for s, t in times.items()}})
            progress("gemm probe", f"{name} {m}x{n}x{k}: done")
    return rows


def table_head(labels: tuple, systems: tuple) -> list[str]:
    """A markdown table's header and rule: text columns `labels`, then one numeric column a system."""
    return ["| " + " | ".join((*labels, *systems)) + " |", "|" + " --- |" * len(labels) + " ---: |" * len(systems)]


def markdown(rows: list[dict]) -> str:
    lines = table_head(("BLAS", "M x N x K", "product vs PyTorch's"), SYSTEMS)
    for r in rows:
        check = "bitwise" if r["max_diff"] == 0 else f"max diff {r['max_diff']:.1e}"
        times = " | ".join(f"{r['us'][s]:.1f} µs" for s in SYSTEMS)
        lines.append(f"| {r['blas']} | {'x'.join(map(str, r['shape']))} | {check} | {times} |")
    return "\n".join(lines)


def _sizes(form: str):
    """An argparse type: comma-separated tuples of positive sizes written as `form` (e.g. MxNxK)."""
    n = form.count("x") + 1

    def parse(text: str) -> tuple:
        try:
            got = tuple(tuple(int(v) for v in item.split("x")) for item in text.split(","))
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {form},... (got {text!r})") from None
        if not all(len(t) == n and min(t) > 0 for t in got):
            raise argparse.ArgumentTypeError(f"each item is {n} positive sizes {form} (got {text!r})")
        return got
    return parse


def _forward(args) -> int:
    """--forward: the product inside whole forwards (gemm_probe_forward), through MKL's sgemm_."""
    from . import gemm_probe_forward as fwd
    sgemm = mkl_sgemm()
    if sgemm is None:
        print("MKL's sgemm_ is not exported by this process's libraries", file=sys.stderr)
        return 1
    rows = [r for m in args.forward for r in fwd.probe_model(m, sgemm, args.cells or fwd.DEFAULT_CELLS, args.rounds)]
    print(fwd.markdown(rows))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dvm.tools.gemm_probe", description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=1,
                    help="threads of PyTorch (which MKL's sgemm_ follows) and of OpenBLAS (default 1)")
    ap.add_argument("--samples", type=int, default=300, help="timed calls per system and shape (default 300)")
    ap.add_argument("--shapes", type=_sizes("MxNxK"), default=DEFAULT_SHAPES, help="MxNxK,... (default: a few small ones)")
    ap.add_argument("--forward", type=lambda t: [m for m in t.split(",") if m],
                    help="zoo models (dvm bench models --zoo's names): time the product inside their forwards")
    ap.add_argument("--cells", type=_sizes("BxL"), help="with --forward: batch x length cells (default 1x8,4x8,1x64)")
    ap.add_argument("--rounds", type=int, default=200, help="with --forward: forwards per system and cell (default 200)")
    args = ap.parse_args(argv)
    if args.threads < 1 or args.samples < 1 or args.rounds < 1:
        ap.error("--threads, --samples and --rounds take a positive number")
    if args.forward:
        from .bench_zoo_models import ZOO
        unknown = [m for m in args.forward if m not in ZOO]
        if unknown:
            ap.error(f"--forward: unknown zoo model(s) {', '.join(unknown)}; the zoo: {', '.join(ZOO)}")
    set_threads(args.threads)
    if args.forward:
        return _forward(args)
    rows = probe(args.shapes, args.samples)
    if not rows:
        print("no BLAS sgemm found in this process's libraries", file=sys.stderr)
        return 1
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
