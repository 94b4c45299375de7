"""`dvm bench ops --device cuda`: fused kernels on a CUDA GPU, side by side in one run: PyTorch eager
(the composite), PyTorch's native softmax / LayerNorm / RMSNorm, Inductor (torch.compile,
dynamic=True; its compile cold, with an empty cache, and warm, after a dynamo reset) and the
GPU VM's two tiers (the interpreter; the structure's specialised kernel after its bitwise check),
as shares of the device's copy bandwidth (bytes read + written / time, against a large
device-to-device copy measured in the same run). Also: host time of the first call of a new
shape (DVM vs Inductor), Triton compiles of the VM across those shapes, and the compiled VM's
registers and spills as the device loaded them. Device times are medians of
triton.testing.do_bench (CUDA events).
"""
from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
import time

import numpy as np

from .bench_common import fmt_time, loadavg, progress, write_json, write_text

DEFAULT_JSON = "bench-results/gpu_ops.json"
DEFAULT_MD = "bench-results/gpu_ops.md"
CHAIN_SIZES = {"quick": (1 << 20, 1 << 24), "full": (1 << 16, 1 << 20, 1 << 24, 1 << 26)}
NORM_SHAPES = {"quick": ((4096, 4096),), "full": ((1024, 1024), (4096, 4096), (256, 16384))}
NEW_SHAPES = 20
HOST_ELEMENTS, HOST_CALLS = 4096, 2000   # chain8's host time per call: tiny inputs, back-to-back calls
COPY_BYTES = 1 << 30


def require_cuda() -> str | None:
    """Why the GPU benchmarks cannot run here (None: they can)."""
    try:
        import torch
    except ImportError:
        return "PyTorch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA device is present (torch.cuda.is_available() is False)"
    if importlib.util.find_spec("triton") is None:
        return "Triton is not installed: pip install '.[gpu]'"
    if os.environ.get("TRITON_INTERPRET") == "1":
        return "TRITON_INTERPRET=1 is set: unset it to time the GPU"
    return None


def _bench(fn) -> float:
    import triton.testing
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e-3


def copy_bandwidth() -> float:
    """Bytes read + written per second of a large device-to-device copy."""
    import torch
    src = torch.empty(COPY_BYTES // 4, dtype=torch.float32, device="cuda").uniform_()
    dst = torch.empty_like(src)
    return 2 * COPY_BYTES / _bench(lambda: dst.copy_(src))


# --- the cases: (name, composite, native or None, DVM kernel, inputs) ------------------------------
def _cases(quick: bool):
    import torch
    import torch.nn.functional as F

    from . import bench_gpu_cases as c
    mode = "quick" if quick else "full"
    out = []
    for dt in (torch.float32, torch.bfloat16):
        name = str(dt).replace("torch.", "")
        for n in CHAIN_SIZES[mode]:
            def make(n=n, dt=dt):
                return (torch.randn(n, dtype=dt, device="cuda"), torch.randn(n, dtype=dt, device="cuda"))
            out.append((f"chain8 {name} {n}", c.torch_chain8, None, c.chain8, make))
        for rows, cols in NORM_SHAPES[mode]:
            def x_of(rows=rows, cols=cols, dt=dt):
                return torch.randn(rows, cols, dtype=dt, device="cuda")

            def w_of(cols=cols, dt=dt):
                return torch.rand(cols, dtype=dt, device="cuda") + 0.5
            out.append((f"softmax {name} {rows}x{cols}", c.torch_softmax, lambda x: F.softmax(x, -1), c.softmax,
                        lambda x_of=x_of: (x_of(),)))
            out.append((f"layernorm {name} {rows}x{cols}", c.torch_layer_norm,
                        lambda x, w, b: F.layer_norm(x, x.shape[-1:], w, b, 1e-5), c.layer_norm,
                        lambda x_of=x_of, w_of=w_of: (x_of(), w_of(), w_of() - 1.0)))
            out.append((f"rmsnorm {name} {rows}x{cols}", c.torch_rms_norm,
                        lambda x, w: F.rms_norm(x, x.shape[-1:], w, 1e-6), c.rms_norm,
                        lambda x_of=x_of, w_of=w_of: (x_of(), w_of())))
    return out


# --- systems ---------------------------------------------------------------------------------------
def _inductor(fn, args) -> tuple[object, float, float]:
    """(compiled fn, cold compile s, warm compile s): the first call with an empty Inductor cache,
    then again after torch._dynamo.reset() with that cache on disk."""
    import torch
    t0 = time.perf_counter()
    compiled = torch.compile(fn, dynamic=True)
    compiled(*args)
    torch.cuda.synchronize()
    cold = time.perf_counter() - t0
    torch._dynamo.reset()
    t0 = time.perf_counter()
    compiled = torch.compile(fn, dynamic=True)
    compiled(*args)
    torch.cuda.synchronize()
    return compiled, cold, time.perf_counter() - t0


def _dvm_tiers(kfn, args) -> dict:
    """Seconds per call on the interpreter and on the specialised kernel (after its check)."""
    import torch

    import dvm
    from ..frontend.gpu_arrays import kernel_program
    from ..vm import registry
    gpu = registry.get("gpu")
    out = {"dvm_interp": _bench(lambda: kfn(*args))}
    layout = dvm.verify(kernel_program(kfn, args))
    states = gpu.specialise_now(layout)
    kfn(*args)                       # the bitwise check; trusted from here on
    torch.cuda.synchronize()
    from ..vm.gpu import specialize, tiered
    after = [tiered.MANAGER.tier(specialize.structure_key(kl)).state for kl in layout.kernels]
    out["tiers"] = after if states else []
    if all(s == tiered.TRUSTED for s in after):
        out["dvm_specialised"] = _bench(lambda: kfn(*args))
    return out


def _new_shapes(kfn, inductor_fn, rng) -> dict:
    """Host time of the first call at NEW_SHAPES new sizes (no synchronization: the launch path),
    DVM and Inductor (dynamic=True, already compiled), and the VM's compiled binaries around it."""
    import torch

    from ..vm import registry
    gpu = registry.get("gpu")
    before = gpu.compiled_variants()
    sizes = sorted(set(int(s) for s in rng.integers(1 << 16, 1 << 20, NEW_SHAPES)))
    host = {"dvm": [], "inductor": []}
    for n in sizes:
        x, y = (torch.randn(n, device="cuda") for _ in range(2))
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        kfn(x, y)
        host["dvm"].append(time.perf_counter() - t0)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        inductor_fn(x, y)
        host["inductor"].append(time.perf_counter() - t0)
        torch.cuda.synchronize()
    return {"sizes": len(sizes), "dvm_host_s_median": float(np.median(host["dvm"])),
            "inductor_host_s_median": float(np.median(host["inductor"])),
            "vm_binaries_before": before, "vm_binaries_after": gpu.compiled_variants()}


def _host_per_call(fns: dict, args, calls: int = HOST_CALLS) -> dict:
    """Wall time per call of each fn over `calls` back-to-back calls on tiny inputs (the device
    work is a few microseconds: the host's launch path sets the pace), synchronized at the end."""
    import torch
    out = {}
    for name, fn in fns.items():
        fn(*args)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn(*args)
        torch.cuda.synchronize()
        out[name] = (time.perf_counter() - t0) / calls
    return out


def _registers() -> list[dict]:
    """Registers and spills of the VM's binaries as loaded on the device."""
    from ..vm.gpu import interp
    out = []
    for cache in getattr(interp.vm_kernel, "device_caches", {}).values():
        for kernel in cache[0].values():
            out.append({"n_regs": getattr(kernel, "n_regs", None), "n_spills": getattr(kernel, "n_spills", None),
                        "shared": getattr(getattr(kernel, "metadata", None), "shared", None)})
    return out


def run(quick: bool = False, seed: int = 0, inductor: bool = True) -> dict:
    import torch
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="dvm-inductor-"))
    bw = copy_bandwidth()
    progress("ops", f"copy bandwidth {bw / 1e12:.2f} TB/s on {torch.cuda.get_device_name()}")
    rows, failures = [], []
    for name, composite, native, kfn, make in _cases(quick):
        args = make()
        nbytes = sum(a.numel() * a.element_size() for a in args) + args[0].numel() * args[0].element_size()
        row = {"case": name, "bytes": nbytes}
        want = composite(*args)
        try:
            got = kfn(*args)
            torch.testing.assert_close(got.float(), want.float(), rtol=2e-2 if want.dtype == torch.bfloat16 else 1e-4,
                                       atol=2e-2 if want.dtype == torch.bfloat16 else 1e-4)
            row.update(_dvm_tiers(kfn, args))
        except Exception as e:  # reported, never hidden: the run goes on and exits 1
            failures.append(f"{name}: {type(e).__name__}: {e}")
        row["eager"] = _bench(lambda: composite(*args))
        if native is not None:
            row["native"] = _bench(lambda: native(*args))
        if inductor:
            fn, cold, warm = _inductor(composite, args)
            row.update(inductor=_bench(lambda: fn(*args)), inductor_compile_cold_s=cold, inductor_compile_warm_s=warm)
        for key in ("eager", "native", "inductor", "dvm_interp", "dvm_specialised"):
            if key in row:
                row[f"{key}_of_copy"] = nbytes / row[key] / bw
        rows.append(row)
        progress("ops", f"{name}: " + ", ".join(f"{k} {fmt_time(row[k])}" for k in
                                                ("eager", "native", "inductor", "dvm_interp", "dvm_specialised")
                                                if k in row))
    extra = {}
    if inductor:
        from .bench_gpu_cases import chain8, torch_chain8
        fn, _, _ = _inductor(torch_chain8, (torch.randn(4096, device="cuda"), torch.randn(4096, device="cuda")))
        extra["new_shapes"] = _new_shapes(chain8, fn, rng)
        tiny = (torch.randn(HOST_ELEMENTS, device="cuda"), torch.randn(HOST_ELEMENTS, device="cuda"))
        extra["host_per_call"] = _host_per_call({"eager": torch_chain8, "inductor": fn, "dvm": chain8}, tiny)
    from ..runtime import counters
    from ..config import config
    return {"benchmark": "gpu_ops", "device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "gpu_vector": config().gpu_vector,
            "triton": __import__("triton").__version__, "copy_bytes_per_s": bw, "loadavg": loadavg(),
            "rows": rows, "registers": _registers(), "counters": {k: v for k, v in counters.snapshot().items()
                                                                   if k.startswith("gpu_")},
            "failures": failures, **extra}


def markdown(report: dict) -> str:
    lines = [f"GPU ops on {report['device']} (torch {report['torch']}, Triton {report['triton']}"
             f"{', DVM_GPU_VECTOR=1' if report.get('gpu_vector') else ''}); copy "
             f"roofline {report['copy_bytes_per_s'] / 1e12:.2f} TB/s (bytes read + written). Shares of the "
             "copy bandwidth; times are do_bench medians.", "",
             "| case | eager | native | Inductor | DVM interpreter | DVM specialised | Inductor compile cold / warm |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in report["rows"]:
        def cell(k):
            return f"{r[k + '_of_copy']:.2f} ({fmt_time(r[k])})" if k in r else "—"
        comp = (f"{r['inductor_compile_cold_s']:.1f} / {r['inductor_compile_warm_s']:.1f} s"
                if "inductor_compile_cold_s" in r else "—")
        lines.append(f"| {r['case']} | {cell('eager')} | {cell('native')} | {cell('inductor')} | "
                     f"{cell('dvm_interp')} | {cell('dvm_specialised')} | {comp} |")
    ns = report.get("new_shapes")
    if ns:
        lines += ["", f"New shapes ({ns['sizes']} sizes of chain8 f32): first-call host time DVM "
                      f"{fmt_time(ns['dvm_host_s_median'])}, Inductor dynamic {fmt_time(ns['inductor_host_s_median'])}; "
                      f"VM binaries {ns['vm_binaries_before']} -> {ns['vm_binaries_after']}."]
    host = report.get("host_per_call")
    if host:
        lines += ["", f"Host time per call (chain8 f32, {HOST_ELEMENTS} elements, {HOST_CALLS} calls back to back): "
                      + ", ".join(f"{k} {fmt_time(v)}" for k, v in host.items()) + "."]
    lines += ["", f"VM binaries as loaded: {report['registers']}", f"GPU VM counters: {report['counters']}"]
    return "\n".join(lines)


def bench_main(name: str, run, markdown, quick: bool, seed: int, inductor: bool | None, json_path: str | None,
               md_path: str | None, out) -> int:
    """Run a --device cuda benchmark and write its report: exit 2 without a usable CUDA device,
    1 when DVM failed somewhere (listed), else 0."""
    why = require_cuda()
    if why is not None:
        print(f"dvm bench {name} --device cuda: {why}", file=sys.stderr)
        return 2
    report = run(quick=quick, seed=seed, inductor=True if inductor is None else inductor)
    text = markdown(report)
    print(text, file=out)
    if json_path:
        write_json(json_path, report)
    if md_path:
        write_text(md_path, text)
    for f in report["failures"]:
        print(f"DVM FAILED: {f}", file=out)
    return 1 if report["failures"] else 0


def main(quick: bool = False, seed: int = 0, inductor: bool | None = None, json_path: str | None = DEFAULT_JSON,
         md_path: str | None = DEFAULT_MD, out=sys.stdout) -> int:
    return bench_main("ops", run, markdown, quick, seed, inductor, json_path, md_path, out)
