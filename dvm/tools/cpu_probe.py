"""Measurements for the CPU VM (not a test). Usage:

    python -m dvm.tools.cpu_probe [ulp] [speed] [tiles] [startup]

ulp      max / mean ULP error of the f32 math ops vs a float64 reference (rounded to f32)
speed    tanh(exp(a*b)+a)*b on 16M f32, row softmax 4096x1024, vs NumPy / torch eager; copy bandwidth
tiles    the chain and softmax with other TILE_ELEMS values (monkeypatched, encoder file untouched)
startup  first call in a fresh process (warm numba disk cache)
"""
from __future__ import annotations

import math
import os
import subprocess
import sys
import time

import numpy as np

import dvm
from dvm.codegen.verifier import check_buffers, verify
from dvm.graph.dtypes import DType
from dvm.graph.ops import OP_TABLE
from dvm.runtime.compiled import as_buffer
from dvm.vm import cpu


def _prepare(kfn, *arrays):
    layout = verify(kfn.program(*arrays))
    ref = kfn(*arrays) if max(a.size for a in arrays) <= 1 << 16 else None
    outs = []
    for info in layout.args[len(arrays):]:
        outs.append(np.empty(info.numel, DType(info.dtype).np_dtype))
    bufs = [as_buffer(a)[0] for a in arrays] + outs
    check_buffers(layout, bufs)
    return layout, bufs, ref


def _best(fn, reps=7):
    fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return min(ts)


def ulp() -> None:
    rng = np.random.default_rng(0)
    ranges = {"exp": (-87, 88), "exp2": (-126, 127), "expm1": (-20, 20), "log": (1e-30, 1e30),
              "log2": (1e-30, 1e30), "log1p": (-0.999, 1e6), "tanh": (-10, 10), "sigmoid": (-30, 30),
              "erf": (-5, 5), "gelu": (-5, 10), "gelu_tanh": (-5, 10), "silu": (-20, 20),
              "sin": (-1e4, 1e4), "cos": (-1e4, 1e4), "rsqrt": (1e-30, 1e30), "sqrt": (0, 1e30),
              "reciprocal": (-1e30, 1e30), "pow": (0.01, 100)}
    print(f"{'op':11s} {'max ulp':>8s} {'mean ulp':>9s}  worst x")
    for name, (lo, hi) in ranges.items():
        if lo > 0 and hi / lo > 1e3:
            x = np.exp(rng.uniform(math.log(lo), math.log(hi), 1 << 20)).astype(np.float32)
        else:
            x = rng.uniform(lo, hi, 1 << 20).astype(np.float32)
        x[:4096] = np.linspace(max(lo, -1), min(hi, 1), 4096, dtype=np.float32)   # dense near 0
        if name == "pow":
            y = rng.uniform(-8, 8, x.size).astype(np.float32)

            @dvm.kernel
            def kern(k, a, b):
                return k.store(k.pow(k.load(a), k.load(b)))
            args = (x, y)
            want = OP_TABLE[name].ref(x.astype(np.float64), y.astype(np.float64))
        else:
            def body(k, a, name=name):
                v = k.load(a)
                return k.store(k.gelu(v, approximate="tanh") if name == "gelu_tanh" else getattr(k, name)(v))
            kern = dvm.kernel(lambda k, a: body(k, a))
            args = (x,)
            want = OP_TABLE[name].ref(x.astype(np.float64))
        layout, bufs, _ = _prepare(kern, *args)
        cpu.run(layout, bufs)
        got = bufs[-1].astype(np.float64)
        w32 = want.astype(np.float32)
        spacing = np.spacing(np.abs(w32)).astype(np.float64)
        spacing = np.maximum(spacing, np.float64(np.finfo(np.float32).smallest_subnormal))
        finite = np.isfinite(want) & np.isfinite(w32)
        err = np.where(finite, np.abs(got - want) / spacing, 0.0)
        err = np.where(np.isnan(want) != np.isnan(got), np.inf, err)
        bad = ~finite & (w32.astype(np.float64) != got) & ~(np.isnan(got) & np.isnan(want))
        err = np.where(bad, np.inf, err)
        i = int(np.argmax(err))
        print(f"{name:11s} {err.max():8.2f} {err.mean():9.3f}  {x[i]!r}")


def speed(tile_elems=None) -> None:
    import torch
    if tile_elems is not None:
        from dvm.codegen import encoder
        encoder.TILE_ELEMS = tile_elems
    rng = np.random.default_rng(0)
    n = 16 << 20
    a = rng.standard_normal(n).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)

    @dvm.kernel
    def chain(k, a, b):
        a, b = k.load(a), k.load(b)
        return k.store(k.mul(k.tanh(k.add(k.exp(k.mul(a, b)), a)), b))
    layout, bufs, _ = _prepare(chain, a, b)
    kl = layout.kernels[0]
    t_vm = _best(lambda: cpu.run(layout, bufs))
    if tile_elems is None:
        t_np = _best(lambda: np.tanh(np.exp(a * b) + a) * b, 3)
        ta, tb = torch.from_numpy(a), torch.from_numpy(b)
        t_torch = _best(lambda: torch.tanh(torch.exp(ta * tb) + ta) * tb, 3)
        dst = np.empty_like(a)
        t_copy = _best(lambda: np.copyto(dst, a))
        print(f"copy 16M f32: {t_copy * 1e3:.2f} ms = {2 * a.nbytes / t_copy / 1e9:.1f} GB/s (read+write)")
        print(f"chain 16M f32: cpu VM {t_vm * 1e3:.2f} ms ({3 * a.nbytes / t_vm / 1e9:.1f} GB/s), "
              f"numpy {t_np * 1e3:.1f} ms, torch eager {t_torch * 1e3:.1f} ms   tile {kl.bm}x{kl.bn}")
    else:
        print(f"TILE_ELEMS={tile_elems}: chain {t_vm * 1e3:.2f} ms  tile {kl.bm}x{kl.bn}", end="; ")

    x = rng.standard_normal((4096, 1024)).astype(np.float32)

    from ..frontend.library import softmax
    layout, bufs, _ = _prepare(softmax, x)
    kl = layout.kernels[0]
    t_vm = _best(lambda: cpu.run(layout, bufs), 15)
    if tile_elems is None:
        tx = torch.from_numpy(x)
        t_native = _best(lambda: torch.softmax(tx, -1), 15)

        def comp():
            e = torch.exp(tx - tx.amax(-1, keepdim=True))
            return e / e.sum(-1, keepdim=True)
        t_comp = _best(comp, 15)

        def npsm():
            e = np.exp(x - x.max(-1, keepdims=True))
            return e / e.sum(-1, keepdims=True)
        t_np = _best(npsm, 5)
        print(f"softmax 4096x1024 f32: cpu VM {t_vm * 1e3:.2f} ms, torch.softmax {t_native * 1e3:.2f} ms, "
              f"torch composite {t_comp * 1e3:.2f} ms, numpy {t_np * 1e3:.2f} ms   tile {kl.bm}x{kl.bn}")
    else:
        print(f"softmax {t_vm * 1e3:.2f} ms  tile {kl.bm}x{kl.bn}")


def startup() -> None:
    code = ("import time; t0 = time.perf_counter(); import numpy as np, dvm; from dvm.vm import cpu; "
            "from dvm.codegen.verifier import verify; "
            "k = dvm.kernel(lambda k, a: k.store(k.exp(k.load(a)))); x = np.ones(10, np.float32); "
            "L = verify(k.program(x)); t1 = time.perf_counter(); o = np.empty(10, np.float32); "
            "cpu.run(L, [x, o]); t2 = time.perf_counter(); "
            "print(f'import+trace {t1 - t0:.3f} s, first cpu.run {t2 - t1:.3f} s')")
    if os.environ.get("PYTHONDONTWRITEBYTECODE"):
        print("note: PYTHONDONTWRITEBYTECODE is set: a module without a cached .pyc is compiled from source "
              "in every process, where a user's Python caches it once (~0.1 s a process here)")
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        print("fresh process:", out.stdout.strip() or out.stderr[-2000:])


if __name__ == "__main__":
    modes = sys.argv[1:] or ["ulp", "speed", "startup"]
    if "ulp" in modes:
        ulp()
    if "speed" in modes:
        speed()
    if "tiles" in modes:
        for t in (1024, 2048, 4096, 8192, 16384, 32768):
            speed(t)
    if "startup" in modes:
        startup()
