"""The report of `dvm bench lazy` (bench_lazy.py runs it): markdown tables and the PNG plot."""
from __future__ import annotations

from .bench_common import fmt_time, save_figure

ELEMENTWISE_TARGET = 1.5     # DESIGN.md §9: elementwise-heavy chains, medium and large sizes
SLOWDOWN_LIMIT = 0.95        # no case more than 5 % slower than eager


def _x(v: float | None) -> str:
    return "—" if v is None else f"{v:.2f}×"


def _path(per: dict) -> str:
    if not per["flushes"]:
        return "eager (region skipped or nothing recorded)"
    parts = []
    if per["dvm_launches"]:
        parts.append(f"{per['dvm_launches']:.3g} DVM launch(es), {per['dvm_kernels']:.3g} kernel(s)")
    if per["eager_replays"]:
        parts.append(f"{per['eager_replays']:.3g} eager replay(s)")
    return "; ".join(parts) or "no live result"


def _reasons(per: dict) -> str:
    return ", ".join(f"{k} {v:.3g}" for k, v in sorted(per["reasons"].items(), key=lambda kv: -kv[1])) or "—"


def _chain_table(report: dict) -> list:
    lines = ["| case | size | eager | lazy | lazy vs eager | forced | forced vs eager | lazy per call | target |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- | --- |"]
    for row in report["chains"]:
        target = ""
        if row["elementwise"] and row["size_class"] in ("medium", "large"):
            target = f"≥ {ELEMENTWISE_TARGET}×: " + ("met" if row["lazy_speedup"] >= ELEMENTWISE_TARGET else "**missed**")
        if row["lazy_speedup"] < SLOWDOWN_LIMIT:
            target += (", " if target else "") + "**slower than eager by more than 5 %**"
        if "mismatch" in row:
            target += " **MISMATCH**"
        shape = "x".join(map(str, row["shape"]))
        lines.append(f"| {row['case']} | {row['size_class']} {shape} | {fmt_time(row['eager_s'])} | "
                     f"{fmt_time(row['lazy_s'])} | {_x(row['lazy_speedup'])} | {fmt_time(row['forced_s'])} | "
                     f"{_x(row['forced_speedup'])} | {_path(row['lazy_per_call'])} | {target} |")
    return lines


def _summary(report: dict) -> list:
    rows = report["chains"]
    ew = [r for r in rows if r["elementwise"] and r["size_class"] in ("medium", "large")]
    slow = [r for r in rows if r["lazy_speedup"] < SLOWDOWN_LIMIT]
    lines = []
    if ew:
        met = sum(r["lazy_speedup"] >= ELEMENTWISE_TARGET for r in ew)
        lines.append(f"- Elementwise-heavy chains at medium and large sizes ≥ {ELEMENTWISE_TARGET}× eager: "
                     f"{met} of {len(ew)} (lowest {min(r['lazy_speedup'] for r in ew):.2f}×).")
    if rows:
        lines.append(f"- Cases more than 5 % slower than eager: {len(slow)} of {len(rows)}"
                     + (" (" + ", ".join(f"{r['case']} {r['size_class']} {r['lazy_speedup']:.2f}×" for r in slow) + ")"
                        if slow else "") + f"; lowest lazy vs eager {min(r['lazy_speedup'] for r in rows):.2f}×.")
    return lines


def _gen_table(report: dict) -> list:
    lines = ["| model | new tokens | eager tok/s | lazy tok/s | lazy vs eager | forced tok/s | forced vs eager | "
             "flushes / token (lazy) | flushes / token (forced) | forced flush reasons / token | tokens = eager |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |"]
    for g in report["generate"]:
        same = "yes" if g["lazy_equal"] and g["forced_equal"] else "**NO**"
        lines.append(f"| {g['model']} | {g['tokens']} | {g['eager_tokens_per_s']:.1f} | {g['lazy_tokens_per_s']:.1f} | "
                     f"{_x(g['lazy_speedup'])} | {g['forced_tokens_per_s']:.1f} | {_x(g['forced_speedup'])} | "
                     f"{g['lazy_per_token']['flushes']:.2f} | {g['forced_per_token']['flushes']:.2f} | "
                     f"{_reasons(g['forced_per_token'])} | {same} |")
    return lines


def _calibration(cal: dict) -> list:
    lines = ["| ops | " + " | ".join(f"2^{lg}" for lg in cal["log2_numel"]) + " | crossover (elements) |",
             "| --- | " + " | ".join("---:" for _ in cal["log2_numel"]) + " | ---: |"]
    for k in cal["ops"]:
        sp = cal["speedup"][str(k)]
        lines.append(f"| {k} | " + " | ".join(_x(sp[str(lg)]) for lg in cal["log2_numel"]) +
                     f" | {cal['crossover'][str(k)] or 'none'} |")
    return lines


def markdown(report: dict) -> str:
    m = report["machine"]
    out = [f"## dvm bench lazy ({report['date']})", "",
           f"{m['cpu']}, {m['cores']} cores; torch {report['versions']['torch']}; VM {report['vm']}; "
           f"{report['threads']} threads (torch and the VM); median of samples interleaved one by one "
           f"(--rounds {report['rounds']}); "
           f"1-min load {report['loadavg_1min']['start']} → {report['loadavg_1min']['end']}.", "",
           "eager: the function as written; lazy: decorated with `dvm.lazy` (adaptive, the default); "
           "forced: `dvm.lazy(adaptive=False)` (everything recorded and fused). Ratios are eager time / "
           "lazy time (> 1: lazy is faster).", ""]
    if report["chains"]:
        out += _summary(report) + [""] + _chain_table(report) + [""]
    if report["generate"]:
        out += ["Greedy `generate()` (KV cache on) inside `with dvm.lazy():` against eager, tokens per second "
                "(prompt of 32 tokens, prefill included):", ""] + _gen_table(report) + [""]
    if report.get("calibration"):
        cal = report["calibration"]
        out += ["Calibration: chains of k elementwise ops on 1-D tensors, forced lazy vs eager (the crossover: "
                "the smallest size from which lazy is at least as fast at every larger size):", ""]
        out += _calibration(cal) + [""]
        rec = cal["recording"]
        out += [f"Recording cost per op (slope of 8- and 32-op chains, {rec['numel']} elements; "
                "bench_lazy_probes):", "", "| " + " | ".join(rec["us_per_op"]) + " |",
                "| " + " | ".join("---:" for _ in rec["us_per_op"]) + " |",
                "| " + " | ".join(f"{v:.2f} us" for v in rec["us_per_op"].values()) + " |", ""]
    return "\n".join(out)


def plot(report: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = report["chains"]
    fig, axes = plt.subplots(1, 2 if report["generate"] else 1, figsize=(13, 4.5), squeeze=False,
                             gridspec_kw={"width_ratios": [3, 1]} if report["generate"] else None)
    ax = axes[0][0]
    labels = [f"{r['case']}\n{r['size_class']}" for r in rows]
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [r["lazy_speedup"] for r in rows], 0.4, label="lazy (adaptive)")
    ax.bar([x + 0.2 for x in xs], [r["forced_speedup"] for r in rows], 0.4, label="forced (adaptive=False)")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.axhline(ELEMENTWISE_TARGET, color="g", lw=0.8, ls="--", label=f"{ELEMENTWISE_TARGET}× target")
    ax.set_xticks(list(xs))
    ax.set_xticklabels(labels, fontsize=7, rotation=90)
    ax.set_yscale("log")
    ax.set_ylabel("eager time / lazy time")
    ax.set_title("dvm.lazy() chains vs eager")
    ax.legend(fontsize=8)
    if report["generate"]:
        ax2 = axes[0][1]
        gens = report["generate"]
        gx = range(len(gens))
        ax2.bar([x - 0.2 for x in gx], [g["lazy_speedup"] for g in gens], 0.4, label="lazy")
        ax2.bar([x + 0.2 for x in gx], [g["forced_speedup"] for g in gens], 0.4, label="forced")
        ax2.axhline(1.0, color="k", lw=0.8)
        ax2.set_xticks(list(gx))
        ax2.set_xticklabels([g["model"] for g in gens], fontsize=8)
        ax2.set_title("generate() tokens/s vs eager")
        ax2.legend(fontsize=8)
    save_figure(fig, path)
