"""The report of `dvm bench models --zoo` (bench_zoo.run's dict): markdown tables and a PNG of
the speed-ups over eager, cell by cell (model x threads x batch x length)."""
from __future__ import annotations

import numpy as np

from .bench_common import fmt_time, save_figure

TARGET_CELL, TARGET_GEOMEAN = 1.0, 1.3


def _x(v) -> str:
    return "—" if v is None else f"{v:.2f}×"


def _us(v) -> str:
    return "—" if v is None else f"{v * 1e6:.0f}"


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(head) + " |", "| " + " | ".join(["---"] + ["---:"] * (len(head) - 1)) + " |"] + \
        ["| " + " | ".join(r) + " |" for r in rows]


def _cells(r: dict) -> list[dict]:
    return r.get("cells", [])


def _geo(xs) -> float | None:
    xs = [x for x in xs if x and x > 0]
    return float(np.exp(np.mean(np.log(xs)))) if xs else None


def _first(r: dict) -> dict:
    return next(iter(r["per_threads"].values()))


def model_rows(report: dict) -> list[list[str]]:
    rows = []
    for m, r in report["models"].items():
        if "error" in r:
            rows.append([m, f"**FAILED**: {r['error'][:80]}"] + ["—"] * 9)
            continue
        cs = _cells(r)
        worst = min(cs, key=lambda c: c["dvm_x"])
        pt = _first(r)
        fw, comp = pt["dvm_forward"], pt["compile"]
        err = max((p["compile"]["dvm"]["max_abs_err"] or 0.0) for p in r["per_threads"].values())
        host = pt["host_s"]
        cold = comp.get("inductor_cold", {}).get("first_call_s")
        rows.append([m, f"{_x(_geo(c['dvm_x'] for c in cs))} ({_x(_geo(c.get('dvm_x_min') for c in cs))})",
                     f"{_x(worst['dvm_x'])} (t{worst['threads']} b{worst['batch']} L{worst['length']})",
                     f"{_x(_geo(c['inductor_x'] for c in cs))} ({_x(_geo(c.get('inductor_x_min') for c in cs))})",
                     _x(_geo(c["inductor"] / c["dvm"] for c in cs)),
                     f"{err:.1g}", f"{fw.get('segments', '—')} / {fw.get('cube_ops', '—')} / {fw.get('fallback_ops', '—')} "
                     f"({fw.get('size_only_segments', 0)} / {fw.get('size_only_fallback_ops', 0)})",
                     f"{_us(host.get('eager'))} / {_us(host.get('inductor'))} / {_us(host.get('dvm'))}",
                     f"{fmt_time(cold)} / {fmt_time(comp['inductor_warm']['first_call_s'])} / "
                     f"{fmt_time(comp['dvm']['first_call_s'])}",
                     f"{comp['inductor_warm']['graphs']} / {comp['dvm']['graphs']}"])
    return rows


MODEL_HEAD = ["model", "DVM × eager (geomean; of fastest calls)", "DVM × eager (worst cell)",
              "Inductor × eager (geomean; of fastest calls)",
              "DVM × Inductor (geomean)", "DVM max abs err",
              "DVM launches / matmuls / fallbacks per forward (launches / fallbacks run once per size)",
              "fixed cost per forward, µs: eager / Inductor / DVM", "first call: Inductor cold / warm / DVM",
              "graphs: Inductor / DVM"]


def cell_rows(report: dict) -> list[list[str]]:
    rows = []
    for m, r in report["models"].items():
        for t in report["threads"]:
            for b in report["batches"]:
                at = {c["length"]: c for c in _cells(r) if c["threads"] == t and c["batch"] == b}
                if not at:
                    continue
                rows.append([f"{m} t{t} b{b}"] + [
                    f"{_x(at[L]['dvm_x'])} / {_x(at[L]['inductor_x'])} ({at[L]['eager'] * 1e3:.3g} ms)"
                    if L in at else "—" for L in report["lengths"]])
    return rows


def _miss_reason(report: dict, c: dict) -> str:
    r = report["models"][c["model"]]
    pt = r["per_threads"][str(c["threads"])]
    cell = next(x for x in _cells(r) if all(x[k] == c[k] for k in ("threads", "batch", "length")))
    host, fw = pt["host_s"], pt["dvm_forward"]
    gap = cell["dvm"] - cell["eager"]
    parts = [f"DVM {cell['dvm'] * 1e3:.3g} ms vs eager {cell['eager'] * 1e3:.3g} ms (+{gap * 1e6:.0f} µs)"]
    if host.get("dvm") is not None and host.get("eager") is not None:
        parts.append(f"fixed cost per forward DVM {_us(host['dvm'])} µs vs eager {_us(host['eager'])} µs")
    parts.append(f"{fw.get('fallback_ops', 0)} fallbacks ({', '.join(list(fw.get('fallbacks', {}))[:3])})")
    return "; ".join(parts)


def markdown(report: dict) -> str:
    m, load, s = report["machine"], report["loadavg_1min"], report["summary"]
    lines = [
        "# dvm bench models --zoo", "",
        f"{report['date']}; {m['cpu']}, {m['cores']} cores; torch {report['versions']['torch']}, transformers "
        f"{report['versions']['transformers']}; DVM VM **{report['vm']}**; 1-min load {load['start']} at start, "
        f"{load['end']} at end; {report['seconds']:.0f} s in all.", "",
        f"Cells: lengths {report['lengths']} × batches {report['batches']} × threads {report['threads']} per model; "
        f"{report.get('dtype', 'float32')}, inference, random weights. Steady state: median per system over rounds of alternating calls "
        "(eager, Inductor dynamic=True warm, DVM) after a warm-up; speed-ups are eager's median over the system's. "
        f"Errors: DVM's output against eager's over every cell (rtol {report['tolerance']['rtol']:g}, atol {report['tolerance']['atol']:g}). "
        "Fixed cost per forward: the intercept at zero tokens of the line through the batch-"
        f"{min(report['batches'])} latencies at the two shortest lengths (Python, guards, argument binding, "
        "allocation, launch overheads).", "",
        f"**Summary over {s['cells']} cells**: DVM {_x(s['dvm_geomean_x'])} eager (geomean; worst {_x(s['dvm_min_x'])}), "
        f"Inductor dynamic=True warm {_x(s['inductor_geomean_x'])} eager; DVM {_x(s['dvm_vs_inductor_geomean'])} "
        f"Inductor. Targets: every cell ≥ {TARGET_CELL:.1f}× eager ({len(s['misses'])} misses), geomean ≥ "
        f"{TARGET_GEOMEAN}× eager and ≥ Inductor's. From each system's fastest call instead of its median "
        f"(the least disturbed call on a busy machine): DVM {_x(s.get('dvm_geomean_x_fastest'))}, Inductor "
        f"{_x(s.get('inductor_geomean_x_fastest'))} eager, {s.get('misses_fastest', '—')} cells below eager.",
    ]
    loads = [v for v in load.values() if v is not None]
    if loads and m["cores"] and max(loads) > 0.5 * m["cores"]:
        lines += ["", f"**Warning: the machine was busy** (1-min load up to {max(loads)} on {m['cores']} cores): "
                      "timings are inflated and noisy; the ratios come from alternating calls."]
    lines += ["", "## Per model", ""] + _table(MODEL_HEAD, model_rows(report))
    lines += ["", "## Cells: DVM × eager / Inductor × eager (eager's latency)", ""]
    lines += _table(["model, threads, batch"] + [f"L={L}" for L in report["lengths"]], cell_rows(report))
    if s["misses"]:
        lines += ["", "## Cells where DVM is slower than eager", ""]
        lines += [f"- {c['model']} t{c['threads']} b{c['batch']} L{c['length']}: {_x(c['dvm_x'])} "
                  f"(fastest calls {_x(c.get('dvm_x_min'))}; Inductor {_x(c['inductor_x'])}): {_miss_reason(report, c)}"
                  for c in s["misses"]]
    lines += ["", "## DVM fallbacks per forward (op: reason ×count)", ""]
    for name, r in report["models"].items():
        if "error" not in r:
            fb = _first(r)["dvm_forward"].get("fallbacks", {})
            lines.append(f"- {name}: " + ("none" if not fb else "; ".join(f"{k} ×{v}" for k, v in fb.items())))
    if report["failures"]:
        lines += ["", "## Failures", ""] + [f"- {f}" for f in report["failures"]]
    return "\n".join(lines)


def plot(report: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import LogNorm

    models = [mm for mm, r in report["models"].items() if "error" not in r]
    keys = [(t, b, L) for t in report["threads"] for b in report["batches"] for L in report["lengths"]]
    fig, axes = plt.subplots(1, 2, figsize=(max(8, 0.55 * len(keys)) * 2, 1.2 + 0.42 * max(1, len(models))),
                             squeeze=False)
    for ax, key, title in ((axes[0, 0], "dvm_x", "DVM × eager"), (axes[0, 1], "inductor_x", "Inductor warm × eager")):
        grid = np.full((len(models), len(keys)), np.nan)
        for i, mm in enumerate(models):
            for c in _cells(report["models"][mm]):
                grid[i, keys.index((c["threads"], c["batch"], c["length"]))] = c[key]
        im = ax.imshow(grid, cmap="RdYlGn", norm=LogNorm(vmin=0.33, vmax=3.0), aspect="auto")
        for i in range(len(models)):
            for j in range(len(keys)):
                if np.isfinite(grid[i, j]):
                    ax.text(j, i, f"{grid[i, j]:.2f}", ha="center", va="center", fontsize=6)
        ax.set_yticks(range(len(models)), models, fontsize=7)
        ax.set_xticks(range(len(keys)), [f"t{t} b{b}\nL{L}" for t, b, L in keys], fontsize=6)
        ax.set_title(title, fontsize=9)
        fig.colorbar(im, ax=ax, fraction=0.03)
    s = report["summary"]
    fig.suptitle(f"dvm bench models --zoo: DVM {_x(s['dvm_geomean_x'])} eager, Inductor "
                 f"{_x(s['inductor_geomean_x'])} (geomeans); {report['machine']['cpu']}, load "
                 f"{report['loadavg_1min']['start']}", fontsize=8)
    save_figure(fig, path)
