"""`dvm verify --model NAME`: every DVM kernel of a tiny Hugging Face model, verified.

The model (tools/bench_models' configs: random weights, fixed seed, no downloads) is converted
to each dtype asked for (float32, bfloat16: `model.to(dtype)`, so every kernel runs in it),
compiled with torch.compile(backend="dvm", dynamic=True) and run, under a verification session
(tools/verify), for a forward pass with labels and its backward at each sequence length: every
forward and backward kernel is checked against eager PyTorch in the same dtype and against
float64, by both rules. Per model and dtype a table (worst kernels first) goes to stdout; JSON and
markdown are written under bench-results/. Exit 1 if a kernel fails a rule (its reproducer is
written to --repro-dir) or could not be verified.
"""
from __future__ import annotations

import os
import sys
import time

from .bench_common import finish_report, loadavg, machine_info, progress

DEFAULT_JSON = os.path.join("bench-results", "verify.json")
DEFAULT_MD = os.path.join("bench-results", "verify.md")
DEFAULT_REPRO_DIR = os.path.join("bench-results", "verify-repros")
DEFAULT_LENGTHS = (17, 40, 64)
DEFAULT_BATCH = 2
DTYPES = ("float32", "bfloat16")


def verify_model(name: str, dtype: str, lengths, batch: int, seed: int, backward: bool,
                 repro_dir: str | None):
    """The VerifyReport of one model in one dtype."""
    import torch

    from . import bench_models
    from .verify import session
    torch._dynamo.reset()
    build, _ = bench_models.MODELS[name]
    model = build(seed).to(getattr(torch, dtype))
    compiled = torch.compile(model, backend="dvm", dynamic=True)
    gen = torch.Generator().manual_seed(seed)
    with session(repro_dir, label=f"{name} {dtype}") as s:
        for length in lengths:
            ids = torch.randint(0, bench_models.VOCAB, (batch, length), generator=gen)
            if backward:
                compiled(ids, labels=ids).loss.backward()
                model.zero_grad(set_to_none=True)
            else:
                with torch.no_grad():
                    compiled(ids)
    return s.report()


def main(models=None, dtypes=None, lengths=None, batch: int = DEFAULT_BATCH, seed: int = 0,
         backward: bool = True, repro_dir: str | None = DEFAULT_REPRO_DIR, json_path: str | None = DEFAULT_JSON,
         md_path: str | None = DEFAULT_MD, out=None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from . import bench_models
    from ..config import config
    out = out or sys.stdout
    models = models or ["llama", "qwen2_moe"]
    dtypes = dtypes or list(DTYPES)
    lengths = tuple(lengths or DEFAULT_LENGTHS)
    report = {"benchmark": "verify", "machine": machine_info(), "loadavg": loadavg(), "vm": config().vm,
              "lengths": list(lengths), "batch": batch, "seed": seed, "backward": backward,
              "runs": [], "failures": []}
    sections = []
    for name in models:
        for dtype in dtypes:
            progress("verify", f"{name} {dtype}: lengths {list(lengths)} x batch {batch}"
                     + (", forward + backward" if backward else ", forward"))
            t0 = time.perf_counter()
            r = verify_model(name, dtype, lengths, batch, seed, backward, repro_dir)
            s = r.summary()
            progress("verify", f"{name} {dtype}: {s['kernels']} kernels, same() {s['same_pass']}, "
                     f"NPU {s['npu_pass']}, {time.perf_counter() - t0:.1f} s")
            report["runs"].append({"model": name, "dtype": dtype, "about": bench_models.MODELS[name][1],
                                   **r.as_json()})
            sections.append(f"### {name}, {dtype}\n\n{r.markdown()}")
            report["failures"] += [f"{name} {dtype} {row['kernel']}: "
                                   + (row["unverified"] or f"same() failed {row['same_failures']}/{row['calls']}, "
                                      f"NPU failed {row['npu_failures']}/{row['calls']}")
                                   + (f" (reproducer {row['repro']})" if row["repro"] else "")
                                   for row in r.failures()]
    text = _summary(report) + "\n\n" + "\n\n".join(sections)
    return finish_report(report, text, None, json_path, md_path, None, out, "kernel(s)")


def _summary(report: dict) -> str:
    lines = [f"Verification of every DVM kernel (VM {report['vm']}; lengths {report['lengths']}, batch "
             f"{report['batch']}, {'forward + backward' if report['backward'] else 'forward'}): DVM and eager "
             "PyTorch (same dtype) against float64 from the same inputs", "",
             "| model | dtype | kernels | launches | same() pass | NPU ratios pass | not verified |",
             "|---|---|---|---|---|---|---|"]
    for run in report["runs"]:
        s = run["summary"]
        lines.append(f"| {run['model']} | {run['dtype']} | {s['kernels']} | {s['launches']} | "
                     f"{s['same_pass']}/{s['kernels']} | {s['npu_pass']}/{s['kernels']} | {s['unverified']} |")
    return "\n".join(lines)
