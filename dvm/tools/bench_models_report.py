"""The report of `dvm bench models` (bench_models.run's dict): markdown tables and the PNG plot.

Steady state is shown twice: each system's own latency per length bucket, and its speed-up over
eager timed side by side (bench_models: every timed call of a compiled system alternates with an
eager call on the same input, so a change in the machine's speed during the run, which is
minutes long on a shared machine, cancels out of that ratio).
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from .bench_common import fmt_time, save_figure
from .bench_models_run import LABELS, SHORT, SYSTEMS


def _t(x) -> str:
    if not isinstance(x, (int, float)):
        return "—"
    return fmt_time(x) if x >= 0 else "-" + fmt_time(-x)   # a difference of noisy times can be < 0


def summary_rows(report: dict, model: str) -> list[list[str]]:
    rows = []
    for name in report["systems"]:
        s = report["models"][model]["systems"].get(name)
        if s is None:
            continue
        if "error" in s:
            rows.append([LABELS[name], f"**FAILED**: {s['error'][:80]}"] + ["—"] * 7)
            continue
        if name == "eager":
            comp = "—"
            graphs = "—"
        else:
            comp = f"{_t(s['backend_compile_first_s'])} / {_t(s['tracing_first_s'])}"
            graphs = f"{s['graphs']} ({s['recompiles']} recompiles)"
            if s["recompile_limit_hit"]:
                graphs += " **limit hit: rest runs eager**"
        err = "—" if s["max_abs_err"] is None else f"{s['max_abs_err']:.2g}" + ("" if s["within_tolerance"] else " **FAIL**")
        extra = "—"
        if name == "dvm" and s.get("dvm", {}).get("main_graph"):
            g = s["dvm"]["main_graph"]
            once = (f" ({g['size_only_segments']} launches and {g.get('size_only_fallback_ops', 0)} fallbacks"
                    " run once per size)"
                    if g.get("size_only_segments") else "")
            extra = (f"{g['vector_kernels']} vector kernels in {g['segments']} launches, {g['cube_ops']} matmuls, "
                     f"{g['fallback_ops']} fallbacks" + once)
        rows.append([LABELS[name], _t(s["first_call_s"]), comp, _t(s["backend_compile_total_s"] if name != "eager" else None),
                     _t(s["stream_total_s"]), graphs, err, extra])
    return rows


SUMMARY_HEAD = ["system", "first call", "its backend compile / tracing+run", "backend compile (stream)",
                "total stream", "graphs compiled", "max abs err vs eager", "DVM kernels"]


def _table(head: list[str], rows: list[list[str]], align=None) -> list[str]:
    align = align or (["---"] + ["---:"] * (len(head) - 1))
    return ["| " + " | ".join(head) + " |", "| " + " | ".join(align) + " |"] + \
           ["| " + " | ".join(r) + " |" for r in rows]


def bucket_head(report: dict) -> list[str]:
    return [f"b={b} L {bk}" for b in report["batches"] for bk in report["buckets"]]


def bucket_rows(report: dict, model: str, key: str, cell: Callable[[float], str], none: str = "—",
                suffix: str = "") -> list[list[str]]:
    """A row per system that has per-bucket values under `key` ("buckets": latencies;
    "speedup_vs_eager": the paired ratios, compiled systems only), each value through `cell`."""
    rows = []
    for name in report["systems"]:
        s = report["models"][model]["systems"].get(name)
        if s is None or "error" in s or not s.get(key):
            continue
        vals = [s[key].get(str(b), {}).get(bk) for b in report["batches"] for bk in report["buckets"]]
        rows.append([LABELS[name] + suffix] + [none if v is None else cell(v) for v in vals])
    return rows


def new_size_extra(s: dict) -> float | None:
    """What a size seen for the first time costs without a compile: the median over the stream's
    calls that compiled no graph (each (batch, length) occurs once in the stream) of the call's
    time minus that shape's steady-state median. For DVM: encoding, verifying and binding the
    Programs of every segment (runtime.compiled.Launch), once per size."""
    steady = {(x["batch"], x["length"]): x["median_s"] for x in s.get("steady", [])}
    extra = [c["s"] - steady[(c["batch"], c["length"])] for c in s.get("calls", [])
             if c["new_graphs"] == 0 and (c["batch"], c["length"]) in steady]
    return float(np.median(extra)) if extra else None


def markdown(report: dict) -> str:
    m = report["machine"]
    load = report["loadavg_1min"]
    lines = [
        "# dvm bench models",
        "",
        f"{report['date']}; {m['cpu']}, {m['cores']} cores; torch {report['versions']['torch']} "
        f"({report['threads']} thread(s): torch and DVM's CPU VM), transformers {report['versions']['transformers']}; DVM VM "
        f"**{report['vm']}**; 1-min load {load['start']} at start, {load['end']} at end; "
        f"{report['seconds']:.0f} s in all.",
        "",
        f"Stream: {len(report['lengths'])} random sequence lengths in 1 … {max(report['lengths'])} "
        f"(1 included) × batch sizes {report['batches']} = {len(report['stream'])} calls per system, in random "
        f"order, inference (eval, no_grad, use_cache=False), float32, random weights. Each system starts "
        f"from a fresh Dynamo state. *first call*: the first call of the stream (compiles included), split "
        f"into the backend's own compile (Inductor: compile_fx_inner; DVM: building CompiledFx) and the rest "
        f"(Dynamo + AOTAutograd tracing + the run). *total stream*: all calls of the stream, compiles "
        f"included. *cold*: a fresh TORCHINDUCTOR_CACHE_DIR and cleared in-memory caches; *warm*: the same "
        f"stream after torch._dynamo.reset() with the caches kept. *max abs err*: logits vs eager over the "
        f"stream (tolerance rtol = atol = {report['tolerance']['rtol']:g}). Dynamo was warmed up on a trivial "
        f"function before any system ({report['dynamo_warmup_s']:.1f} s, not charged).",
    ]
    fi = report.get("inductor_first_compile_in_process")
    if fi:
        lines += ["", f"The first Inductor compile in the process ({fi['model']}, {LABELS[fi['system']]}) "
                      f"also pays Inductor's start-up: first call {_t(fi['first_call_s'])}."]
    loads = [v for v in load.values() if v is not None]
    if loads and m["cores"] and max(loads) > 0.5 * m["cores"]:
        lines += ["", f"**Warning: the machine was busy** (1-min load average up to {max(loads)} on "
                      f"{m['cores']} cores): other processes competed for the cores; timings are inflated "
                      "and noisier than on an idle machine."]
    for model, mr in report["models"].items():
        lines += ["", f"## {model}: {mr['what']}", ""]
        lines += _table(SUMMARY_HEAD, summary_rows(report, model), ["---"] + ["---:"] * 6 + ["---"])
        head = ["system"] + bucket_head(report)
        lines += ["", "Steady-state latency per call (median over the bucket's lengths of each length's "
                      f"median of {report['repeat']} calls after the stream):", ""]
        lines += _table(head, bucket_rows(report, model, "buckets", _t))
        lines += ["", "Speed-up over eager timed side by side (each timed call of the system follows an "
                      "eager call on the same input; median over the bucket's lengths of eager's median / the "
                      "system's; above 1: faster than eager). Unlike the latencies above, measured minutes "
                      "apart, these ratios do not drift with the machine's speed during the run:", ""]
        lines += _table(head, bucket_rows(report, model, "speedup_vs_eager", lambda v: f"{v:.2f}"))
        extras = [(LABELS[n], new_size_extra(mr["systems"][n])) for n in report["systems"]
                  if "error" not in mr["systems"].get(n, {"error": 1})]
        lines += ["", "A size seen for the first time, without a compile (median over the stream's calls "
                      "that compiled no graph of the call's time minus that shape's steady-state median; "
                      "a few hundred microseconds either way is noise): "
                  + "; ".join(f"{name} {_t(v)}" for name, v in extras if v is not None) + "."]
        d = mr["systems"].get("dvm", {})
        if "dvm" in d:
            dv = d["dvm"]
            g = dv.get("main_graph")
            lines += [""]
            if g:
                lines.append(f"DVM graph: {g['segments']} DVM segment(s) (one VM launch each, sequence-stacked), "
                             f"{g['vector_kernels']} vector kernels, {g['cube_ops']} matmuls through PyTorch, "
                             f"{g['fallback_ops']} fallback op(s); backend compile {g['compile_s'] * 1e3:.1f} ms."
                             + (f" Values of sizes only (positions, the causal mask) are computed once per "
                                f"size and remembered: {g['size_only_segments']} of the segments and "
                                f"{g.get('size_only_fallback_ops', 0)} of the fallbacks run only then."
                                if g.get("size_only_segments") else ""))
                for why, k in sorted(g["fallbacks"].items()):
                    lines.append(f"- fallback {why} ×{k}")
                for why, k in sorted(g.get("pytorch_by_plan", {}).items()):
                    lines.append(f"- in PyTorch by plan (not a fallback) {why} ×{k}")
                for kind, k in sorted(g.get("patterns", {}).items()):
                    lines.append(f"- recognized {kind} ×{k} (lowered whole)")
            lines.append(f"DVM graphs compiled: {d['graphs']} (size-1 patterns in the stream: "
                         f"{dv['size1_patterns']}; recompiles beyond Dynamo's size-1 specializations: "
                         f"{dv['recompiles_beyond_size1']}).")
            if dv["graph_fallbacks"]:
                lines.append(f"**Whole graphs fell back to PyTorch**: {dv['graph_fallbacks']}")
        for name in report["systems"]:
            s = mr["systems"].get(name, {})
            if s.get("recompile_limit_hit"):
                lines.append(f"\n**{LABELS[name]}: Dynamo hit its recompile limit**; from then on the frame "
                             f"runs eagerly (no Inductor): {'; '.join(s['recompile_limit_messages'][:2])}")
            if s.get("mismatches"):
                lines.append(f"\n**{LABELS[name]}: outside tolerance**: {'; '.join(s['mismatches'][:3])}")
    if report["failures"]:
        lines += ["", "## Failures", ""] + [f"- {f}" for f in report["failures"]]
    return "\n".join(lines)


def plot(report: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(report["models"])
    batches = report["batches"]
    colors = dict(zip(SYSTEMS, plt.get_cmap("tab10").colors))
    fig, axes = plt.subplots(len(models), len(batches) + 1, figsize=(6 * (len(batches) + 1), 4.2 * len(models)),
                             squeeze=False)
    for i, model in enumerate(models):
        per = report["models"][model]["systems"]
        for j, b in enumerate(batches):
            ax = axes[i, j]
            for name in report["systems"]:
                s = per.get(name, {})
                pts = sorted((x["length"], x["median_s"]) for x in s.get("steady", []) if x["batch"] == b)
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] * 1e3 for p in pts], marker=".", label=LABELS[name],
                            color=colors[name], linestyle="--" if name.endswith("_warm") else "-")
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel("sequence length")
            ax.set_ylabel("steady-state latency (ms)")
            ax.set_title(f"{model}, batch {b}")
            ax.grid(alpha=0.3)
            if j == 0:
                ax.legend(fontsize=7)
        ax = axes[i, -1]
        names = [n for n in report["systems"] if "stream_total_s" in per.get(n, {})]
        vals = [per[n]["stream_total_s"] for n in names]
        comp = [per[n]["backend_compile_total_s"] for n in names]
        x = np.arange(len(names))
        ax.bar(x, vals, color=[colors[n] for n in names])
        ax.bar(x, comp, color="none", edgecolor="k", hatch="//", label="of which backend compile")
        for k, v in enumerate(vals):
            ax.text(k, v, f"{v:.1f} s", ha="center", va="bottom", fontsize=7)
        ax.set_xticks(x, [SHORT[n] for n in names], fontsize=7)
        ax.set_ylabel("total stream time (s)")
        ax.set_title(f"{model}: {len(report['stream'])} calls, compiles included")
        ax.legend(fontsize=7)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(f"dvm bench models — {report['machine']['cpu']}, load {report['loadavg_1min']['start']}", fontsize=9)
    save_figure(fig, path)
