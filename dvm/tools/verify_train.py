"""`dvm verify train`: short training runs of tiny models, end to end, against eager and float64.

Each model (a tiny Llama and a tiny Qwen2-MoE built from small configs: random init from a fixed
seed, no downloads) trains for N steps of SGD with momentum on fixed data (a cycle of N_BATCHES
batches of random token ids drawn from the seed, their lengths differing so that the compiled model
sees changing sizes; the model learns them, so the loss falls) under each system:

  eager_f64        the model in float64: the reference
  eager_f32        eager PyTorch, float32
  graph_f32        DVM's ATen graphs (Dynamo + AOTAutograd with DVM's decompositions) run by PyTorch
                   op by op: what DVM compiles, without DVM's kernels
  dvm_f32          torch.compile(model, backend="dvm", dynamic=True)
  *_bf16           the same three under torch.autocast("cpu", torch.bfloat16) (float32 parameters)

The loss is cross-entropy of the next token on float32 logits (float64 in the float64 run:
transformers' own loss would cast the f64 logits to f32). Reported: the loss curves side by side
(table and PNG), each system's relative deviation from the float64 loss per step, and the rules of
the accuracy mode (tools/verify_metrics: PyTorch's same() and the NPU benchmark ratios), DVM
against eager of the same precision and, beside it as the baseline, graph against eager, all
measured against float64: on the loss curve (one vector of N losses) and on the final parameters
(same() per parameter tensor, as PyTorch's benchmark harness applies it; the NPU ratios on all
parameters as one vector, since per tensor they are at noise level: PyTorch's graph alone fails
them on some tensors). A difference that graph shows as well comes from the captured graph, not
from DVM's kernels. SGD, not Adam: Adam's step g / (sqrt(v) + eps) has a sensitivity of lr / eps
(1e5 at lr 1e-3) to gradients near zero, so its parameter differences measure the rounding noise of
a few near-zero gradients (`--optimizer adamw` runs it anyway). Exit 1 if DVM fails a rule.
"""
from __future__ import annotations

import os
import sys
import time

from .bench_common import finish_report, loadavg, machine_info, progress, save_figure

DEFAULT_JSON = os.path.join("bench-results", "verify-train.json")
DEFAULT_MD = os.path.join("bench-results", "verify-train.md")
DEFAULT_PNG = os.path.join("bench-results", "verify-train.png")
MODEL_NAMES = ("llama", "qwen2_moe")
DEFAULT_STEPS = 12
LENGTHS = (32, 24, 40, 17)   # of the N_BATCHES batches
N_BATCHES = len(LENGTHS)
BATCH = 2
OPTIMIZERS = {"sgd": dict(lr=0.05, momentum=0.9), "adamw": dict(lr=1e-3)}
SIZES = {   # hidden, layers, vocab: "bench" is bench_models' size, "small" the test suite's
    "bench": (128, 2, 256),
    "small": (32, 1, 64),
}
PRECISIONS = ("f32", "bf16")
KINDS = ("eager", "graph", "dvm")


def build(name: str, seed: int, size: str = "bench"):
    """The tiny model, random init from `seed` (float32)."""
    import torch
    import transformers
    hidden, layers, vocab = SIZES[size]
    common = dict(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                  vocab_size=vocab, max_position_embeddings=256, use_cache=False)
    if name == "llama":
        cfg, cls = transformers.LlamaConfig(intermediate_size=2 * hidden, **common), transformers.LlamaForCausalLM
    elif name == "qwen2_moe":
        cfg = transformers.Qwen2MoeConfig(intermediate_size=2 * hidden, moe_intermediate_size=hidden // 2,
                                          shared_expert_intermediate_size=hidden, num_experts=4,
                                          num_experts_per_tok=2, **common)
        cls = transformers.Qwen2MoeForCausalLM
    else:
        raise ValueError(f"unknown model {name!r}: {', '.join(MODEL_NAMES)}")
    torch.manual_seed(seed)
    return cls(cfg)


def batch_ids(step: int, seed: int, vocab: int, batch: int = BATCH):
    """The data of a step: batch (step mod N_BATCHES) of the fixed set."""
    import torch
    k = step % N_BATCHES
    return torch.randint(0, vocab, (batch, LENGTHS[k]), generator=torch.Generator().manual_seed(seed * 1000 + k))


class LossModel:
    """model -> the next-token cross-entropy of ids, on float32 logits (float64 ones as they are)."""

    def __init__(self, model):
        self.model = model

    def __call__(self, ids):
        import torch
        import torch.nn.functional as F
        logits = self.model(ids).logits
        if logits.dtype != torch.float64:
            logits = logits.float()
        return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


def graph_backend():
    """DVM's front half (Dynamo, AOTAutograd with DVM's decompositions) with PyTorch running the
    graphs op by op: the `graph` system."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._dynamo.backends.debugging import boxed_nop

    from ..frontend.aten_table import decompositions
    from ..frontend.torch_backend import specialize_untensorifiable_floats
    aot = aot_autograd(fw_compiler=boxed_nop, bw_compiler=boxed_nop, inference_compiler=boxed_nop,
                       decompositions=decompositions())

    def graph_eager(gm, example_inputs, **kwargs):
        return aot(gm, specialize_untensorifiable_floats(gm, example_inputs), **kwargs)
    return graph_eager


def compiled_loss(kind: str, model):
    """The loss function of a system kind: eager, graph or dvm."""
    import torch
    loss = LossModel(model)
    if kind == "eager":
        return loss
    return torch.compile(loss, backend="dvm" if kind == "dvm" else graph_backend(), dynamic=True)


def train(name: str, system: str, steps: int, seed: int, size: str = "bench", optimizer: str = "sgd") -> dict:
    """{"losses": [float] per step, "params": {name: tensor}} of one system's run."""
    import torch
    torch._dynamo.reset()
    model = build(name, seed, size)
    kind, precision = system.split("_")
    if precision == "f64":
        model = model.double()
        if getattr(model.config, "_experts_implementation", None) is not None:
            model.config._experts_implementation = "eager"   # grouped_mm has no float64 CPU kernel
    model.train()
    opt_cls = torch.optim.SGD if optimizer == "sgd" else torch.optim.AdamW
    opt = opt_cls(model.parameters(), **OPTIMIZERS[optimizer])
    fn = compiled_loss(kind, model)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16")
    vocab = SIZES[size][2]
    losses = []
    for step in range(steps):
        ids = batch_ids(step, seed, vocab)
        with autocast:
            loss = fn(ids)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    return {"losses": losses, "params": {k: v.detach().clone() for k, v in model.named_parameters()}}


def rules(runs: dict, kind: str, precision: str) -> dict:
    """The accuracy rules for system `kind` against eager in `precision`, both against
    eager_f64: on the loss curve, per parameter tensor (same()) and on all parameters (NPU)."""
    import torch

    from .verify_metrics import compare
    ref, eager, res = runs["eager_f64"], runs[f"eager_{precision}"], runs[f"{kind}_{precision}"]
    curve = compare(torch.tensor(res["losses"], dtype=torch.float32),
                    torch.tensor(eager["losses"], dtype=torch.float32),
                    torch.tensor(ref["losses"], dtype=torch.float64))
    names = list(ref["params"])
    per = {k: compare(res["params"][k], eager["params"][k], ref["params"][k]) for k in names}
    flat = compare(*(torch.cat([r["params"][k].reshape(-1) for k in names]) for r in (res, eager, ref)))
    same_ok = sum(c["same"] for c in per.values())
    return {"loss_curve": curve, "params": per, "all_params": flat, "n_params": len(names),
            "params_same_pass": same_ok, "params_npu_pass_per_tensor": sum(c["npu"] for c in per.values()),
            "passed": curve["same"] and curve["npu"] and same_ok == len(names) and flat["npu"]}


def deviation(losses: list, ref: list) -> list:
    return [abs(a - r) / abs(r) if r else abs(a - r) for a, r in zip(losses, ref)]


def main(models=None, steps: int = DEFAULT_STEPS, precisions=None, seed: int = 0, size: str = "bench",
         optimizer: str = "sgd", kinds=KINDS, verify_kernels: bool = False, repro_dir: str | None = None,
         json_path: str | None = DEFAULT_JSON, md_path: str | None = DEFAULT_MD,
         png_path: str | None = DEFAULT_PNG, out=None) -> int:
    """kinds: the systems besides eager_f64 (eager and dvm at least); verify_kernels: run the dvm
    systems in a verification session (tools/verify) too, every kernel launch of the training
    checked (reproducers of failing ones to repro_dir)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from ..config import config
    from .verify import session
    out = out or sys.stdout
    models = models or list(MODEL_NAMES)
    precisions = precisions or list(PRECISIONS)
    systems = ["eager_f64"] + [f"{k}_{p}" for p in precisions for k in KINDS if k in kinds]
    report = {"benchmark": "verify-train", "machine": machine_info(), "loadavg": loadavg(), "vm": config().vm,
              "steps": steps, "seed": seed, "size": size, "sizes": SIZES[size], "lengths": list(LENGTHS),
              "batch": BATCH, "optimizer": optimizer, "optimizer_args": OPTIMIZERS[optimizer],
              "precisions": precisions, "systems": systems, "models": {}, "failures": []}
    for name in models:
        runs, kernels = {}, {}
        for system in systems:
            t0 = time.perf_counter()
            if verify_kernels and system.startswith("dvm"):
                with session(repro_dir, label=f"{name} {system}") as s:
                    runs[system] = train(name, system, steps, seed, size, optimizer)
                k = kernels[system] = s.report().summary()
                if not k["passed"]:
                    report["failures"].append(f"{name} {system}: kernels {k}")
            else:
                runs[system] = train(name, system, steps, seed, size, optimizer)
            progress("verify train", f"{name} {system}: final loss {runs[system]['losses'][-1]:.6f} "
                     f"({time.perf_counter() - t0:.1f} s)")
        ref = runs["eager_f64"]["losses"]
        entry = {"losses": {s: r["losses"] for s, r in runs.items()}, "kernels": kernels,
                 "deviation": {s: deviation(r["losses"], ref) for s, r in runs.items() if s != "eager_f64"},
                 "rules": {p: {k: rules(runs, k, p) for k in ("graph", "dvm") if k in kinds} for p in precisions}}
        for p in precisions:
            v = entry["rules"][p]["dvm"]
            if not v["passed"]:
                report["failures"].append(
                    f"{name} {p}: loss curve same() {_pf(v['loss_curve']['same'])}, NPU "
                    f"{_pf(v['loss_curve']['npu'])}; parameters same() {v['params_same_pass']}/{v['n_params']}, "
                    f"NPU (all parameters) {_pf(v['all_params']['npu'])}"
                    + (" (graph, without DVM's kernels: the same)"
                       if entry["rules"][p].get("graph", {}).get("passed") is False else ""))
        report["models"][name] = entry
    return finish_report(report, markdown(report), plot, json_path, md_path, png_path, out, "training run(s)")


def _e(x: float) -> str:
    return f"{x:.2e}"


def _pf(ok: bool) -> str:
    return "pass" if ok else "FAIL"


def markdown(report: dict) -> str:
    sysnames = report["systems"]
    args = ", ".join(f"{k} {v}" for k, v in report["optimizer_args"].items())
    lines = [f"`dvm verify train`: {report['steps']} {report['optimizer']} steps ({args}), batch {report['batch']}, "
             f"{len(report['lengths'])} fixed batches of lengths {report['lengths']} in turn, size {report['size']} "
             f"(hidden, layers, vocab = {tuple(report['sizes'])}), seed {report['seed']}, VM {report['vm']}; "
             "bf16 = autocast; graph = DVM's ATen graphs run by PyTorch (no DVM kernels)."]
    for name, m in report["models"].items():
        lines += ["", f"### {name}: loss per step (relative deviation from eager_f64)", "",
                  "| step | " + " | ".join(sysnames) + " |", "|---:|" + "---:|" * len(sysnames)]
        for i in range(report["steps"]):
            cells = [f"{m['losses']['eager_f64'][i]:.7f}"]
            cells += [f"{m['losses'][s][i]:.7f} ({_e(m['deviation'][s][i])})" for s in sysnames[1:]]
            lines.append(f"| {i} | " + " | ".join(cells) + " |")
        lines += ["", "Rules against eager of the same precision, all against eager_f64 (final parameters: same() "
                  "per tensor; NPU ratios on all parameters as one vector, and per tensor for information):", "",
                  "| precision | system | max rel. deviation of the loss | loss curve same() | loss curve NPU | "
                  "params same() | params NPU (all) | RMSE ratio (all) | params NPU per tensor | verdict |",
                  "|---|---|---:|---|---|---:|---|---:|---:|---|"]
        for p, by_kind in m["rules"].items():
            lines.append(f"| {p} | eager | {_e(max(m['deviation'][f'eager_{p}']))} | | | | | | | |")
            for kind, v in by_kind.items():
                c, a = v["loss_curve"], v["all_params"]
                lines.append(f"| {p} | {kind} | {_e(max(m['deviation'][f'{kind}_{p}']))} | {_pf(c['same'])} | "
                             f"{_pf(c['npu'])} | {v['params_same_pass']}/{v['n_params']} | {_pf(a['npu'])} | "
                             f"{float(a['ratios']['rmse']):.3g} | {v['params_npu_pass_per_tensor']}/{v['n_params']} | "
                             f"{_pf(v['passed'])} |")
        for system, k in m.get("kernels", {}).items():
            lines.append(f"\n{system}, every kernel launch verified: {k['kernels']} kernels ({k['launches']} launches), "
                         f"same() pass {k['same_pass']}/{k['kernels']}, NPU ratios pass {k['npu_pass']}/{k['kernels']}"
                         + (f", {k['unverified']} not verified" if k["unverified"] else ""))
    return "\n".join(lines)


STYLES = {"eager_f64": ("k", "-"), "eager_f32": ("tab:blue", "-"), "graph_f32": ("tab:cyan", ":"),
          "dvm_f32": ("tab:orange", "--"), "eager_bf16": ("tab:green", "-"), "graph_bf16": ("tab:olive", ":"),
          "dvm_bf16": ("tab:red", "--")}


def plot(report: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    models = list(report["models"])
    fig, axes = plt.subplots(len(models), 2, figsize=(12, 4 * len(models)), squeeze=False)
    for i, name in enumerate(models):
        m = report["models"][name]
        for s, losses in m["losses"].items():
            color, ls = STYLES[s]
            axes[i, 0].plot(range(len(losses)), losses, color=color, linestyle=ls, marker=".", label=s)
            if s != "eager_f64":
                dev = [max(d, 1e-12) for d in m["deviation"][s]]
                axes[i, 1].plot(range(len(dev)), dev, color=color, linestyle=ls, marker=".", label=s)
        axes[i, 0].set_title(f"{name}: training loss")
        axes[i, 1].set_title(f"{name}: |loss - loss_f64| / loss_f64 (floored at 1e-12)")
        axes[i, 1].set_yscale("log")
        for ax in axes[i]:
            ax.set_xlabel("step")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
    save_figure(fig, path)
