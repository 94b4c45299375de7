"""`dvm bench models --device cuda`: a tiny Llama (random weights, no downloads) on a CUDA GPU over a
stream of sequence lengths, side by side in one run: eager, Inductor (torch.compile dynamic=True:
its cold compile, and the first call of each new length) and DVM (backend="dvm", dynamic=True: the
GPU VM, with tiered specialisation in the background). Per system: first call per new length
(wall, synchronized), steady state per length (do_bench median), max abs error of the logits
against a float32 eager reference (beside eager's own error in the model dtype); for DVM: the VM's
compiled binaries before and after the stream (zero new compiles expected) and the tier counters.
"""
from __future__ import annotations

import os
import sys
import tempfile
import time

import numpy as np

from .bench_common import fmt_time, loadavg, progress
from .bench_gpu import _bench, bench_main

DEFAULT_JSON = "bench-results/gpu_models.json"
DEFAULT_MD = "bench-results/gpu_models.md"
LENGTHS = {"quick": (7, 64, 300, 1024, 2048), "full": None}   # full: N_LENGTHS random lengths in 7..2048
N_LENGTHS = 20
MIN_LENGTH, MAX_LENGTH = 7, 2048
VOCAB = 2048


def _llama(dtype):
    import torch
    import transformers
    cfg = transformers.LlamaConfig(hidden_size=512, intermediate_size=1376, num_hidden_layers=4,
                                   num_attention_heads=8, num_key_value_heads=4, vocab_size=VOCAB,
                                   max_position_embeddings=MAX_LENGTH, use_cache=False)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg).to(device="cuda", dtype=dtype).eval()


def lengths(quick: bool, seed: int) -> list[int]:
    if quick:
        return list(LENGTHS["quick"])
    rng = np.random.default_rng(seed)
    return [MIN_LENGTH, MAX_LENGTH] + [int(v) for v in rng.integers(MIN_LENGTH + 1, MAX_LENGTH, N_LENGTHS - 2)]


def _system(name: str, fn, ids_of, lens, ref) -> dict:
    """First call per new length, steady state per length, max abs error against ref."""
    import torch
    first, steady, err = [], [], 0.0
    with torch.no_grad():
        for L in lens:
            ids = ids_of(L)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = fn(ids).logits
            torch.cuda.synchronize()
            first.append(time.perf_counter() - t0)
            err = max(err, float((out.float() - ref[L]).abs().max()))
        for L in lens:
            ids = ids_of(L)
            steady.append(_bench(lambda: fn(ids)))
    progress("models", f"{name}: first call median {fmt_time(float(np.median(first)))}, steady median "
                       f"{fmt_time(float(np.median(steady)))}, max abs error {err:.3g}")
    return {"first_s": first, "steady_s": steady, "max_abs_err": err}


def run(quick: bool = False, seed: int = 0, inductor: bool = True, dtype_name: str = "bfloat16") -> dict:
    import torch

    import dvm
    from ..runtime import counters
    from ..vm import registry
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="dvm-inductor-"))
    dtype = getattr(torch, dtype_name)
    lens = lengths(quick, seed)
    model = _llama(dtype)
    reference = _llama(torch.float32)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    tokens = torch.randint(0, VOCAB, (1, MAX_LENGTH), device="cuda", generator=gen)

    def ids_of(L):
        return tokens[:, :L]
    with torch.no_grad():
        ref = {L: reference(ids_of(L)).logits.float() for L in lens}
    del reference
    from ..config import config
    report = {"benchmark": "gpu_models", "device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "gpu_vector": config().gpu_vector,
              "dtype": dtype_name, "lengths": lens, "loadavg": loadavg(), "systems": {}, "failures": []}
    report["systems"]["eager"] = _system("eager", model, ids_of, lens, ref)
    if inductor:
        t0 = time.perf_counter()
        ind = torch.compile(model, dynamic=True)
        with torch.no_grad():
            ind(ids_of(lens[0]))
        torch.cuda.synchronize()
        report["inductor_compile_s"] = time.perf_counter() - t0
        report["systems"]["inductor"] = _system("inductor", ind, ids_of, lens, ref)
    gpu = registry.get("gpu")
    t0 = time.perf_counter()
    compiled = dvm.compile(model)
    with torch.no_grad():
        compiled(ids_of(lens[0]))
    torch.cuda.synchronize()
    report["dvm_first_call_s"] = time.perf_counter() - t0
    before = gpu.compiled_variants()
    report["systems"]["dvm"] = _system("dvm", compiled, ids_of, lens, ref)
    report["dvm_vm_binaries"] = [before, gpu.compiled_variants()]
    report["counters"] = {k: v for k, v in counters.snapshot().items() if k.startswith(("gpu_", "fallback"))}
    eager_err = report["systems"]["eager"]["max_abs_err"]
    dvm_err = report["systems"]["dvm"]["max_abs_err"]
    if dvm_err > max(4 * eager_err, 1e-3):
        report["failures"].append(f"DVM's max abs error {dvm_err:.3g} exceeds 4x eager's own {eager_err:.3g}")
    if before is not None and gpu.compiled_variants() != before:
        report["failures"].append(f"the VM compiled during the stream: {before} -> {gpu.compiled_variants()} binaries")
    return report


def markdown(r: dict) -> str:
    lines = [f"Tiny Llama (hidden 512, 4 layers) in {r['dtype']} on {r['device']} (torch {r['torch']}"
             f"{', DVM_GPU_VECTOR=1' if r.get('gpu_vector') else ''}), "
             f"{len(r['lengths'])} lengths {min(r['lengths'])}..{max(r['lengths'])}.", "",
             "| system | first call of a new length (median / max) | steady state (median) | geomean vs eager | "
             "max abs error vs f32 |", "| --- | --- | --- | --- | --- |"]
    eager = np.array(r["systems"]["eager"]["steady_s"])
    for name, s in r["systems"].items():
        st = np.array(s["steady_s"])
        geo = float(np.exp(np.mean(np.log(eager / st))))
        lines.append(f"| {name} | {fmt_time(float(np.median(s['first_s'])))} / {fmt_time(max(s['first_s']))} | "
                     f"{fmt_time(float(np.median(st)))} | {geo:.2f}x | {s['max_abs_err']:.3g} |")
    if "inductor_compile_s" in r:
        lines.append(f"\nInductor's first call (compile, cold cache): {r['inductor_compile_s']:.1f} s; DVM's first "
                     f"call (backend compile, VM load): {r['dvm_first_call_s']:.1f} s.")
    lines.append(f"VM binaries before / after the stream: {r['dvm_vm_binaries']}; counters: {r['counters']}")
    return "\n".join(lines)


def main(quick: bool = False, seed: int = 0, inductor: bool | None = None, json_path: str | None = DEFAULT_JSON,
         md_path: str | None = DEFAULT_MD, out=sys.stdout) -> int:
    return bench_main("models", run, markdown, quick, seed, inductor, json_path, md_path, out)
