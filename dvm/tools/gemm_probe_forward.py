"""Mix kernels inside whole forwards: a compiled model's products computed by MKL's sgemm_ from
compiled code, against its run graph as it is (issue 49's measurement; not a test).

    python -m dvm.tools.gemm_probe --forward bert,gpt_neox [--cells 1x8,4x8,1x64] [--rounds N]

gemm_probe times a product alone; a forward is where a mix kernel would have to pay. Two rewrites
of the run graphs of `torch.compile(model, backend="dvm")` (a zoo model, random init), each the
work a mix kernel would take over, timed against the graphs as built, in one process:
  product:          every F.linear step whose one reader is a DVM segment computes its product
                    with sgemm_ (bias first, as ATen's addmm does) from compiled code, without
                    PyTorch's dispatch; the segment reads it as before.
  product + GELU:   every activated product whose GELU the VM computes (the run graph's
                    linear_activation, small results) is one compiled call: sgemm_, then the VM's
                    own per-lane GELU (jit/mathf_ext.geluf) over it, instead of F.linear and a VM
                    launch.
Rounds alternate the systems in rotating order (one forward each), the graphs as built twice: the
second, against the first, is the noise floor of the ratios. Medians of the rounds. Each
system's forward output is checked bitwise against the graphs' own before timing.
"""
from __future__ import annotations

import statistics
import time

import numpy as np
import torch
from numba import carray, njit

from ..frontend import gelu_size, torch_calls
from ..frontend.torch_launch import _empty_strided_cpu
from ..frontend.torch_runtime import COMPILED
from ..frontend.torch_segment import SegmentRunner
from ..graph.views import contiguous_strides
from ..runtime import counters
from ..vm.cpu.jit.bits import ptr_f32, ptr_i32
from ..vm.cpu.jit.mathf_ext import geluf
from .bench_common import progress
from .bench_zoo_models import ZOO, first_output, inputs
from .gemm_probe import table_head

SYSTEMS = ("as built", "as built, again", "product", "product + GELU")   # (again: the noise floor)
DEFAULT_CELLS = ((1, 8), (4, 8), (1, 64))
_NOW, _, _PRODUCT, _GELU = SYSTEMS
# the scratch words of one call (sgemm's arguments are all addresses): int32 N, M, K at bytes
# 0-11, float32 alpha, beta at 16-23, the transposition characters at 24-25
_INTS, _SCALARS, _TRANS = 0, 16, 24


def _compiled(sgemm):
    """(product, product_gelu): y = x @ w.T (+ bias), w stored (n, k), or (k, n) where kxm, into
    `out`; the second then applies the VM's GELU. Arguments are addresses and sizes."""
    @njit(nogil=True, error_model="numpy")
    def gelu_rows(o, a, n):   # (o never aliases a: the loop vectorizes as the VM's does)
        for i in range(n):
            o[i] = geluf(a[i])

    @njit(nogil=True, error_model="numpy")
    def product(x, w, out, m, n, k, bias, scratch, kxm):
        ints = carray(ptr_i32(scratch + _INTS), 3)
        ints[0], ints[1], ints[2] = n, m, k
        scal = carray(ptr_f32(scratch + _SCALARS), 2)
        scal[0], scal[1] = 1.0, 0.0
        if bias != 0:   # ATen's addmm: the bias rows first, then beta 1
            o, b = carray(ptr_f32(out), m * n), carray(ptr_f32(bias), n)
            for i in range(m):
                o[i * n:(i + 1) * n] = b
            scal[1] = 1.0
        # column-major: out.T (n x m) = op(w) x.T; op 'T' on w stored (n, k) (ld k), 'N' on (k, n) (ld n)
        trans_w, ld_w = (scratch + _TRANS + 1, scratch + _INTS) if kxm else (scratch + _TRANS, scratch + _INTS + 8)
        sgemm(trans_w, scratch + _TRANS + 1, scratch + _INTS, scratch + _INTS + 4, scratch + _INTS + 8,
              scratch + _SCALARS, w, ld_w, x, scratch + _INTS + 8, scratch + _SCALARS + 4, out, scratch + _INTS)

    @njit(nogil=True, error_model="numpy")
    def product_gelu(x, w, out, m, n, k, bias, scratch, kxm):
        tmp = np.empty(m * n, np.float32)
        product(x, w, tmp.ctypes.data, m, n, k, bias, scratch, kxm)
        gelu_rows(carray(ptr_f32(out), m * n), tmp, m * n)
    return product, product_gelu


class _Rewrites:
    """The two rewrites' step functions, on while `self.system` names theirs."""

    def __init__(self, sgemm):
        self.product, self.product_gelu = _compiled(sgemm)
        self.scratch = np.zeros(4, np.int64)
        self.scratch.view(np.uint8)[_TRANS:_TRANS + 2] = np.frombuffer(b"TN", np.uint8)
        self.at = self.scratch.ctypes.data
        self.system = _NOW
        self.calls = {_PRODUCT: 0, _GELU: 0}   # the calls each rewrite made (not fallen back)

    def _call(self, fn, x, w, bias, kxm):
        n, k = w.shape[1 if kxm else 0], x.shape[-1]
        shape = (*x.shape[:-1], n)
        out = _empty_strided_cpu(shape, contiguous_strides(shape), torch.float32)   # (as the VM's outputs)
        fn(x.data_ptr(), w.data_ptr(), out.data_ptr(), x.numel() // k, n, k, 0 if bias is None else bias.data_ptr(),
           self.at, kxm)
        return out

    @staticmethod
    def _plain(x, w, bias) -> bool:
        return x.dtype is torch.float32 and w.dtype is torch.float32 and x.is_contiguous() and w.is_contiguous() and \
            x.shape[-1] > 0 and (bias is None or bias.dtype is torch.float32 and bias.is_contiguous())

    def linear(self, x, w, bias=None):
        if self.system == _PRODUCT and self._plain(x, w, bias):
            self.calls[_PRODUCT] += 1
            return self._call(self.product, x, w, bias, False)
        return torch.nn.functional.linear(x, w, bias)

    def linear_activation(self, x, w, bias, kxm=False, **kwargs):
        if self.system == _GELU and kwargs.get("use_gelu") and set(kwargs) <= gelu_size.ACTIVATION_KWARGS and \
                self._plain(x, w, bias) and gelu_size.vm_takes(x, x.numel() // x.shape[-1] * w.shape[1 if kxm else 0]):
            self.calls[_GELU] += 1
            return self._call(self.product_gelu, x, w, None if kwargs.get("beta", 1) == 0 else bias, kxm)
        return torch_calls.linear_activation(x, w, bias, kxm, **kwargs)


def _rewrite(graphs, rw: _Rewrites) -> dict:
    """Point the run graphs' steps at the rewrites' functions; how many steps each takes."""
    counts = {_PRODUCT: 0, _GELU: 0}
    for g in graphs:
        for n in g.runner.graph.nodes:
            if n.op != "call_function":
                continue
            if n.target is torch.nn.functional.linear and len(n.users) == 1 and \
                    isinstance(getattr(next(iter(n.users)).target, "__self__", None), SegmentRunner):
                n.target, counts[_PRODUCT] = rw.linear, counts[_PRODUCT] + 1
            elif n.target is torch_calls.linear_activation:
                n.target, counts[_GELU] = rw.linear_activation, counts[_GELU] + 1
        g.runner.recompile()
        g._forward = g.runner.forward
    return counts


def rewrite_graphs_of(warm_up, sgemm) -> tuple[_Rewrites, dict]:
    """Run warm_up() (which compiles run graphs with DVM), then point those graphs' steps at one
    _Rewrites: it and how many steps each rewrite took."""
    before = counters.snapshot().get("torch_graphs_compiled", 0)
    with torch.no_grad():
        warm_up()
    made = counters.snapshot().get("torch_graphs_compiled", 0) - before   # (COMPILED keeps the recent ones)
    rw = _Rewrites(sgemm)
    return rw, _rewrite(list(COMPILED)[-made:] if made > 0 else [], rw)


def check_bits(rw: _Rewrites, forward, what: str) -> None:
    """forward() (a tensor) bit for bit the same under every system; AssertionError where not."""
    want = None
    with torch.no_grad():
        for system in SYSTEMS:
            rw.system = system
            forward()   # (a new size's first call: encodes)
            got = forward()
            want = got if want is None else want
            if not torch.equal(got, want):
                raise AssertionError(f"{what}: {system} changes the forward's output")
    rw.system = _NOW


def probe_model(name: str, sgemm, cells=DEFAULT_CELLS, rounds: int = 200) -> list[dict]:
    """One row per (batch, length) cell of zoo model `name`: median forward time per system and
    the steps each rewrite took over. Raises AssertionError where a rewrite changes an output bit."""
    zm = ZOO[name]
    torch._dynamo.reset()
    compiled = torch.compile(zm.build(), backend="dvm", dynamic=True)
    # every cell's graph (Dynamo specializes sizes 1) before the rewrite
    rw, counts = rewrite_graphs_of(lambda: [compiled(**inputs(zm, b, L)) for b, L in cells], sgemm)
    rows = []
    for b, L in cells:
        kw = inputs(zm, b, L)
        check_bits(rw, lambda: first_output(compiled(**kw)), f"{name} {b}x{L}")
        times = {s: [] for s in SYSTEMS}
        with torch.no_grad():
            for r in range(rounds):
                for system in SYSTEMS[r % len(SYSTEMS):] + SYSTEMS[:r % len(SYSTEMS)]:
                    rw.system = system
                    t0 = time.perf_counter_ns()
                    compiled(**kw)
                    times[system].append((time.perf_counter_ns() - t0) / 1e3)
        rw.system = _NOW
        rows.append({"model": name, "cell": (b, L), "steps": dict(counts),
                     "us": {s: statistics.median(t) for s, t in times.items()}})
        progress("gemm probe", f"{name} {b}x{L}: done")
    return rows


def markdown(rows: list[dict]) -> str:
    lines = table_head(("model", "batch x length", "steps rewritten (product / product + GELU)"), SYSTEMS)
    for r in rows:
        now = r["us"][_NOW]
        cells = " | ".join(f"{r['us'][s]:.0f} µs ({now / r['us'][s]:.3f}x)" for s in SYSTEMS[1:])
        lines.append(f"| {r['model']} | {r['cell'][0]}x{r['cell'][1]} | {r['steps'][_PRODUCT]} / "
                     f"{r['steps'][_GELU]} | {now:.0f} µs | {cells} |")
    return "\n".join(lines)
