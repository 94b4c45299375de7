"""The report of `dvm bench ops` (bench_ops.py runs the cases): the markdown tables and the PNG plot
of a report dict, and the names of its baselines."""
from __future__ import annotations


import numpy as np

from .bench_common import fmt_time, save_figure

BASELINES = ("reference_vm", "numpy", "torch_eager", "torch_native", "numexpr",
             "inductor_static", "inductor_dynamic", "copy")
LABELS = {"dvm": "DVM", "reference_vm": "reference VM", "numpy": "NumPy", "torch_eager": "torch eager",
          "torch_native": "torch native", "numexpr": "numexpr", "inductor_static": "Inductor static",
          "inductor_dynamic": "Inductor dynamic", "copy": "copy"}


def _shape_str(shape: tuple) -> str:
    return "x".join(str(d) for d in shape)


def _fmt_bytes(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n} B"


def _cell(b: dict) -> str:
    st = b.get("status")
    if st == "ok":
        r = b.get("ratio_to_dvm")
        return f"{fmt_time(b['median_s'])} ({r:.2f}×)" if r is not None else fmt_time(b["median_s"])
    if st in ("mismatch", "error"):
        return f"**{st.upper()}**"
    if st == "n/a":
        return "n/a"
    return "not run" if b.get("note", "").startswith("not run") else "skipped"


def markdown(report: dict) -> str:
    m = report["machine"]
    lines = [
        "# dvm bench ops",
        "",
        f"VM: **{report['vm']}** (DVM_VM). {report['date']}; {m['cpu']}, {m['cores']} cores; threads "
        f"{report['threads']} (torch, numexpr, DVM); float32 (bfloat16: the `_bf16` cases); median of at least "
        f"{report['repeat']} samples; 1-min load "
        f"{report['loadavg_1min']['start']} at start, {report['loadavg_1min']['end']} at end; "
        f"{report['seconds']:.0f} s in all.",
        "",
        "Each cell: the baseline's time per call, and in parentheses its ratio to DVM "
        "(baseline time / DVM time: **> 1 means DVM is faster**). *GB/s*: bytes read + written "
        "(inputs + output, each once) per second; *% copy*: DVM's bandwidth as a fraction of the "
        "copy's (np.copyto of the same bytes into a preallocated buffer, the two 2048 bytes apart "
        "modulo 4096 so that 4K aliasing does not slow the copy; every kernel and baseline "
        "allocates its output, the copy does not; DVM's outputs of 1 MiB and more come from its buffer "
        "pool, re-used once the previous result is dropped, so they skip the page faults that fresh "
        "memory costs the others: DVM_POOL_MB=0 turns it off). *n/a*: no such baseline for this case (see the "
        "JSON notes); *skipped*: the reference VM runs shapes of at most "
        f"{report['reference_vm_max_numel']:,} elements; *not run*: Inductor off (--no-inductor / --quick).",
    ]
    load = max([v for v in report["loadavg_1min"].values() if v is not None], default=None)
    if load is not None and m["cores"] and load > 0.5 * m["cores"]:
        lines += ["", f"**Warning: the machine was busy** (1-min load average up to {load} on {m['cores']} "
                      "cores): other processes compete for the cores, and multi-threaded baselines "
                      "(PyTorch with several threads) can stall for a scheduler quantum (~10 ms) per "
                      "parallel region. Compare with `--threads 1`, or re-run on an idle machine."]
    by_shape: dict[tuple, list] = {}
    for row in report["results"]:
        by_shape.setdefault(tuple(row["shape"]), []).append(row)
    cols = ["reference_vm", "numpy", "torch_eager", "torch_native", "numexpr",
            "inductor_static", "inductor_dynamic"]
    for shape, rows in by_shape.items():
        numel = rows[0]["numel"]
        lines += ["", f"## {_shape_str(shape)} ({numel:,} elements, {rows[0]['size_class']})", "",
                  "| case | bytes | DVM | DVM GB/s | % copy | " + " | ".join(LABELS[c] for c in cols) + " | copy |",
                  "| --- | ---: | ---: | ---: | ---: | " + " | ".join("---:" for _ in cols) + " | ---: |"]
        for row in rows:
            d = row["dvm"]
            if d.get("status") == "ok":
                dv = [fmt_time(d["median_s"]), f"{d['gbps']:.2f}", f"{100 * d['copy_fraction']:.3g} %"]
            elif d.get("status") == "skipped":
                dv = [d["note"], "—", "—"]
            else:
                dv = [f"**{d.get('status', '?').upper()}**", "—", "—"]
            cells = [_cell(row["baselines"].get(c, {"status": "skipped"})) for c in cols]
            cp = row["baselines"]["copy"]
            lines.append(f"| {row['case']} | {_fmt_bytes(row['bytes'])} | " + " | ".join(dv) + " | "
                         + " | ".join(cells) + f" | {fmt_time(cp['median_s'])} ({row['copy_gbps']:.1f} GB/s) |")
    if report["inductor"]:
        lines += ["", "## Inductor compile time (seconds; first call after torch._dynamo.reset())", "",
                  f"Cache: {report['inductor_cache']}. *cold*: the first compile of this function and shape "
                  "in the run; *warm*: compiling it again after torch._dynamo.reset(), with Inductor's "
                  "caches warm. Each (case, shape, mode) is compiled fresh; dynamic=True would reuse its "
                  "graph for other shapes.", ""]
        fic = report.get("inductor_first_compile_in_process")
        if fic:
            lines += [f"First Inductor compile in the process (includes Dynamo/Inductor start-up): "
                      f"**{fic['seconds']:.1f} s** ({fic['case']} {_shape_str(fic['shape'])}, {fic['mode']}).", ""]
        lines += ["| case | shape | static cold | static warm | dynamic cold | dynamic warm |",
                  "| --- | --- | ---: | ---: | ---: | ---: |"]
        for row in report["results"]:
            c = row["inductor_compile_s"]
            vals = []
            for mode in ("static", "dynamic"):
                x = c.get(mode)
                vals += [f"{x['first_s']:.2f}", f"{x['warm_s']:.2f}"] if x else ["—", "—"]
            lines.append(f"| {row['case']} | {_shape_str(row['shape'])} | " + " | ".join(vals) + " |")
    lo = report["launch_overhead"]
    lines += ["", "## Cached launch overhead (1-element tensor, Python call → results)", "",
              "| what | median per call |", "| --- | ---: |"]
    for k, v in lo.items():
        if isinstance(v, dict):
            lines.append(f"| {v['what']} | {v['median_us']:.2f} us |")
    lines += ["", f"Budget (DESIGN.md §9): ≤ {lo['budget_us']:g} us; DVM add_one "
              f"{'within' if lo['dvm_within_budget'] else '**MISSES**'} it; DVM / torch eager = "
              f"{lo['dvm_vs_torch']:.2f}."]
    lines += _changes_lines(report.get("changes_vs_previous"))
    if report["failures"]:
        lines += ["", "## Failures", ""] + [f"- {f}" for f in report["failures"]]
    return "\n".join(lines)


MOVED_FACTOR = 1.5   # a DVM time this many times slower or faster than the previous run's is listed


def _dvm_s(row: dict | None) -> float | None:
    d = row.get("dvm") if row else None
    return d.get("median_s") if d and d.get("status") == "ok" else None


def _copy_s(row: dict) -> float | None:
    c = row.get("baselines", {}).get("copy", {})
    return c.get("median_s") if c.get("status") == "ok" else None


def compare(previous: dict, report: dict, factor: float = MOVED_FACTOR) -> dict:
    """The cases whose DVM time moved by `factor` or more since `previous` (an earlier report of the
    same VM and thread count), each with both runs' copy time (the machine's own speed moves that
    too). A slowdown nobody looked for shows up here, run after run."""
    if (previous.get("vm"), previous.get("threads")) != (report["vm"], report["threads"]):
        return {"previous_date": previous.get("date"), "skipped": "a different VM or thread count"}
    old = {(r.get("case"), tuple(r.get("shape", ()))): r for r in previous.get("results", [])}
    moved = []
    for row in report["results"]:
        before = old.get((row["case"], tuple(row["shape"])))
        t0, t1 = _dvm_s(before), _dvm_s(row)
        if t0 and t1 and max(t1 / t0, t0 / t1) >= factor:
            moved.append({"case": row["case"], "shape": row["shape"], "before_s": t0, "after_s": t1,
                          "copy_before_s": _copy_s(before), "copy_after_s": _copy_s(row)})
    return {"previous_date": previous.get("date"), "factor": factor, "moved": moved}


def _changes_lines(changes: dict | None) -> list[str]:
    if not changes:
        return []
    lines = ["", "## DVM against the previous run", "", f"Previous run: {changes['previous_date']}."]
    if "skipped" in changes:
        return lines + [f"Not compared: {changes['skipped']}."]
    if not changes["moved"]:
        return lines + [f"No DVM time moved by {changes['factor']:g}x or more."]
    lines += ["", f"DVM times that moved by {changes['factor']:g}x or more (after / before above 1: slower now):", "",
              "| case | shape | before | after | after / before | copy before → after |",
              "| --- | --- | ---: | ---: | ---: | ---: |"]
    for m in changes["moved"]:
        copy = " → ".join(fmt_time(c) if c else "—" for c in (m["copy_before_s"], m["copy_after_s"]))
        lines.append(f"| {m['case']} | {_shape_str(m['shape'])} | {fmt_time(m['before_s'])} | "
                     f"{fmt_time(m['after_s'])} | {m['after_s'] / m['before_s']:.2f} | {copy} |")
    return lines


def plot(report: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_shape: dict[tuple, list] = {}
    for row in report["results"]:
        by_shape.setdefault(tuple(row["shape"]), []).append(row)
    series = ["dvm"] + [b for b in BASELINES if b != "copy"]
    colors = dict(zip(series, plt.get_cmap("tab10").colors))
    fig, axes = plt.subplots(len(by_shape), 1, figsize=(16, 3.6 * max(1, len(by_shape))), squeeze=False)
    handles: dict = {}
    for ax, (shape, rows) in zip(axes[:, 0], by_shape.items()):
        x = np.arange(len(rows))
        width = 0.8 / len(series)
        for j, s in enumerate(series):
            vals = []
            for row in rows:
                e = row["dvm"] if s == "dvm" else row["baselines"].get(s, {})
                vals.append((e.get("gbps") or 0.0) if e.get("status") == "ok" else 0.0)
            if any(vals):
                handles[s] = ax.bar(x + (j - len(series) / 2 + 0.5) * width, vals, width, color=colors[s])
        copy = [row["copy_gbps"] for row in rows]
        handles["copy"] = ax.hlines(copy, x - 0.45, x + 0.45, colors="k", linestyles="dashed")
        lo = min(v for row in rows for v in [row["dvm"].get("gbps")] +
                 [b.get("gbps") for b in row["baselines"].values()] if v) * 0.5
        for i, row in enumerate(rows):
            if row["dvm"].get("status") != "ok":
                ax.text(x[i] - 0.4 + 0.4 / len(series), lo * 1.1,
                        "DVM " + row["dvm"].get("note", row["dvm"].get("status", ""))[:28],
                        rotation=90, ha="center", va="bottom", fontsize=7)
        ax.set_yscale("log")
        ax.set_ylim(bottom=lo)
        ax.set_xticks(x, [row["case"] for row in rows])
        ax.set_ylabel("GB/s (read + written)")
        ax.set_title(f"{_shape_str(shape)} ({rows[0]['numel']:,} elements) — DVM on the "
                     f"{report['vm']} VM; higher is faster")
        ax.grid(axis="y", alpha=0.3)
    order = [s for s in series + ["copy"] if s in handles]
    axes[0, 0].legend([handles[s] for s in order],
                      [LABELS[s] + (" (roofline)" if s == "copy" else "") for s in order],
                      loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8)
    save_figure(fig, path)
