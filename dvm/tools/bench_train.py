"""`dvm bench train`: a training step (forward, loss, backward) of the zoo's models on DVM against
eager and Inductor.

For every model of `dvm bench models --zoo` (bench_zoo_models: random init, no downloads) and every
cell (batch, length), the same step in three systems sharing one module and its parameters:

  eager     model.zero_grad(); model(**inputs, labels=...).loss.backward()
  dvm       the same through torch.compile(model, backend="dvm", dynamic=True)
  inductor  the same through torch.compile(model, dynamic=True), warm (its first step, with the
            compile and an empty cache directory, is reported beside it)

The models stay in eval mode: dropout off, so the three compute the same step. Labels are the
input ids (the decoder ids of an encoder-decoder), -100 where an encoder's attention mask pads.
Each system's first step in a cell is checked against eager's: the loss and every parameter's
gradient within the zoo's tolerance (rtol = atol = RTOL). Where a system is outside it, the
step is also taken in float64 (a copy of the model): a system within tolerance of float64 while
eager is not is eager's rounding, reported as such; otherwise a DVM mismatch is a failure (exit 1),
an Inductor one is reported. Then samples of the three interleaved one by one (median per system).
Reported per cell: times, ratios to eager, DVM against Inductor, first steps, the largest gradient
error of each compiled system and DVM's segment launches per step. A size-1 batch is a graph of
its own in both compilers (Dynamo specializes sizes 0 and 1), so each cell's first step can
include a compile. Progress goes to stderr; the markdown to stdout; JSON, markdown and a PNG
under bench-results/.
"""
from __future__ import annotations

import copy
import functools
import os
import sys
import time

from .bench_common import (BenchRun, add_output_options, add_run_options, finish_report, fmt_time,
                           inductor_cache_dir, loadavg, whole_vm)
from .bench_lazy import _rounds, parse_list
from .bench_models import _restore_threads, _set_threads, _warm_dynamo
from .bench_models_run import RTOL
from .bench_zoo import geomean
from .bench_zoo_models import QUICK, ZOO, inputs

DEFAULT_JSON = os.path.join("bench-results", "train.json")
DEFAULT_MD = os.path.join("bench-results", "train.md")
DEFAULT_PNG = os.path.join("bench-results", "train.png")
CELLS = ((1, 64), (4, 256))
QUICK_CELLS = ((1, 64),)
DEFAULT_ROUNDS, QUICK_ROUNDS = 5, 3
MIN_TOTAL_S = 0.25            # samples per system and round: about this long
IGNORE_INDEX = -100           # cross-entropy's label that takes no part in the loss


def step_inputs(zm, b: int, L: int, seed: int) -> dict:
    """The zoo's forward inputs at (b, L) with the labels a training step takes."""
    kw = inputs(zm, b, L, seed)
    labels = (kw["decoder_input_ids"] if zm.seq2seq else kw["input_ids"]).clone()
    if zm.encoder and not zm.seq2seq:
        labels[kw["attention_mask"] == 0] = IGNORE_INDEX
    return {**kw, "labels": labels}


def make_step(fn, model, kw: dict):
    """One training step of fn (the model or a compiled form of it), returning the loss; the
    gradients are left in the model's parameters."""
    def step():
        model.zero_grad(set_to_none=True)
        loss = fn(**kw).loss
        loss.backward()
        return loss
    return step


def gradients(model) -> list:
    return [None if p.grad is None else p.grad.detach().clone() for p in model.parameters()]


def mismatch(loss, grads: list, want_loss, want_grads: list, rtol: float = RTOL, atol: float = RTOL):
    """(largest gradient error, "" or what is outside rtol / atol of eager's loss and gradients)."""
    import torch
    worst, bad = 0.0, []
    if not torch.allclose(loss.detach().double(), want_loss.detach().double(), rtol=rtol, atol=atol):
        bad.append(f"loss {float(loss):.6g} vs {float(want_loss):.6g}")
    for i, (g, w) in enumerate(zip(grads, want_grads)):
        if (g is None) != (w is None):
            bad.append(f"parameter {i}: gradient {'missing' if g is None else 'unexpected'}")
            continue
        if g is None:
            continue
        g, w = g.double(), w.double()      # (the float64 reference among them)
        err = (g - w).abs()
        worst = max(worst, float(err.max()) if err.numel() else 0.0)
        if not bool((err <= atol + rtol * w.abs()).all()):
            bad.append(f"parameter {i} {tuple(w.shape)}: max abs err {float(err.max()):.3g}")
    return worst, "; ".join(bad[:3])


def judge(loss, grads: list, want_loss, want_grads: list, exact) -> tuple:
    """(largest gradient error against eager, "" or what is outside tolerance of eager's, whether
    that is eager's rounding: the system within tolerance of exact() (the float64 step, asked for
    only here) while eager is not)."""
    worst, why = mismatch(loss, grads, want_loss, want_grads)
    if not why:
        return worst, "", False
    ref = exact()
    return worst, why, not mismatch(loss, grads, *ref)[1] and bool(mismatch(want_loss, want_grads, *ref)[1])


def float64_step(model, kw: dict) -> tuple:
    """(loss, gradients) of the step taken in float64 on a copy of the model (what the model casts
    to float32 itself, as HF's loss does, stays so): the reference that tells eager's rounding from
    a system's error."""
    m = copy.deepcopy(model).double()
    loss = make_step(m, m, kw)()
    return loss, gradients(m)


def _segment_launches() -> int:
    from dvm.runtime import counters
    return counters.snapshot().get("torch_segment_launches", 0)


class _Run(BenchRun):
    bench = "train"

    def model(self, name: str, cells, inductor: bool) -> dict:
        import torch
        zm = ZOO[name]
        model = zm.build()
        self.log(f"{name}: {zm.what}")
        torch._dynamo.reset()
        fns = {"dvm": torch.compile(model, backend="dvm", dynamic=True)}
        if inductor:
            fns["inductor"] = torch.compile(model, dynamic=True)
        try:
            with inductor_cache_dir("dvm-bench-train-inductor-"):
                return {"what": zm.what, "cells": [self.cell(name, zm, model, fns, b, L) for b, L in cells]}
        finally:
            torch._dynamo.reset()

    def cell(self, name: str, zm, model, fns: dict, b: int, L: int) -> dict:
        kw = step_inputs(zm, b, L, self.seed)
        steps = {"eager": make_step(model, model, kw)}
        steps.update({s: make_step(fn, model, kw) for s, fn in fns.items()})
        out: dict = {"batch": b, "length": L, "first_step_s": {}, "grad_err": {}}
        label = f"{name} b={b} L={L}"
        want = steps["eager"]()
        want_grads = gradients(model)
        exact = functools.cache(lambda: float64_step(model, kw))   # taken where a system needs it
        for system in fns:
            t0 = time.perf_counter()
            try:
                loss = steps[system]()
            except Exception as e:  # noqa: BLE001 - reported, the run goes on
                out.setdefault("errors", {})[system] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                if system == "dvm":
                    self.failures.append(f"{label}: {out['errors'][system]}")
                steps.pop(system)
                continue
            out["first_step_s"][system] = time.perf_counter() - t0
            out["grad_err"][system], why, eagers = judge(loss, gradients(model), want, want_grads, exact)
            if why:
                out.setdefault("eager_off_float64" if eagers else "mismatches", {})[system] = why
            if why and not eagers and system == "dvm":
                self.failures.append(f"{label}: DVM outside tolerance: {why}")
        if "dvm" in steps:
            before = _segment_launches()
            steps["dvm"]()
            out["dvm_launches_per_step"] = _segment_launches() - before
        out["seconds"] = _rounds(steps, self.rounds, MIN_TOTAL_S)
        t = out["seconds"]
        line = f"{label}: eager {fmt_time(t['eager'])}"
        for system in ("dvm", "inductor"):
            if system in t:
                out[f"{system}_x"] = t["eager"] / t[system]
                line += f", {system} {fmt_time(t[system])} ({out[f'{system}_x']:.2f}x)"
        self.log(line)
        return out


def summary(models: dict) -> dict:
    cells = [dict(c, model=m) for m, r in models.items() for c in r.get("cells", ())]
    dvm_x = [c["dvm_x"] for c in cells if "dvm_x" in c]
    both = [c for c in cells if "dvm_x" in c and "inductor_x" in c]
    return {"cells": len(cells), "dvm_geomean_x": geomean(dvm_x),
            "inductor_geomean_x": geomean(c["inductor_x"] for c in both),
            "dvm_vs_inductor_geomean": geomean(c["dvm_x"] / c["inductor_x"] for c in both),
            "dvm_min_x": min(dvm_x) if dvm_x else None,
            "below_eager": sum(1 for x in dvm_x if x < 1.0)}


def run(models=None, cells=CELLS, rounds: int = DEFAULT_ROUNDS, seed: int = 0, threads: int = 2,
        inductor: bool = True, quiet: bool = False) -> dict:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers

    import dvm
    import dvm.frontend.torch_backend  # noqa: F401  (registers backend "dvm")
    models = list(models or ZOO)
    r = _Run(rounds, seed, quiet)
    t0, load = time.time(), loadavg()
    whole_vm("train", quiet)
    old = _set_threads(threads)
    results, warm_s = {}, None
    try:
        r.log(f"models {','.join(models)}; cells {['x'.join(map(str, c)) for c in cells]}; threads {threads}; "
              f"rounds {rounds}; VM {dvm.config.config().vm}; Inductor {'on' if inductor else 'off'}; "
              f"1-min load {load}")
        warm_s = _warm_dynamo()
        for name in models:
            try:
                results[name] = r.model(name, cells, inductor)
            except Exception as e:  # noqa: BLE001 - a failing model is reported, the others still run
                msg = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                r.log(f"{name}: FAILED: {msg}")
                results[name] = {"what": ZOO[name].what, "error": msg}
                r.failures.append(f"{name}: {msg}")
    finally:
        _restore_threads(old)
    return r.report(t0, load, threads, cells=[list(c) for c in cells], inductor=inductor, dynamo_warmup_s=warm_s,
                    transformers=transformers.__version__, models=results, summary=summary(results))


def _x(c: dict, system: str) -> str:
    return f"{c[f'{system}_x']:.2f}×" if f"{system}_x" in c else "—"


def _err(c: dict, system: str) -> str:
    return f"{c['grad_err'][system]:.2g}" if system in c["grad_err"] else "—"


def markdown(report: dict) -> str:
    s = report["summary"]
    g = {k: "—" if s[k] is None else f"{s[k]:.2f}×" for k in ("dvm_geomean_x", "inductor_geomean_x",
                                                              "dvm_vs_inductor_geomean", "dvm_min_x")}
    lines = [f"## dvm bench train ({report['date']})", "",
             f"{report['machine']['cpu']}, {report['machine']['cores']} cores; torch {report['versions']['torch']}, "
             f"transformers {report['transformers']}; VM {report['vm']}; {report['threads']} threads; median of "
             f"samples interleaved one by one (--rounds {report['rounds']}); 1-min load "
             f"{report['loadavg_1min']['start']} → {report['loadavg_1min']['end']}.", "",
             "A training step (zero_grad, forward with labels, backward; eval mode: no dropout) of the zoo's "
             "models; ratios are eager time / system time (> 1: faster than eager). *grad err*: the largest "
             "absolute gradient difference from eager's (*outside tolerance*: a gradient or the loss beyond "
             f"rtol = atol = {RTOL:g} of eager's; *within float64's, eager not*: so, but the system is within "
             "that of the step taken in float64 and eager is not: eager's rounding).", "",
             f"**{s['cells']} cells: DVM {g['dvm_geomean_x']} eager (geomean; lowest {g['dvm_min_x']}, "
             f"{s['below_eager']} below eager), Inductor {g['inductor_geomean_x']}; DVM {g['dvm_vs_inductor_geomean']} "
             f"Inductor's speed.**", "",
             "| model | batch x length | eager | DVM | Inductor | DVM vs eager | Inductor vs eager | "
             "first step DVM / Inductor | grad err DVM / Inductor | DVM launches per step |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- | --- | ---: |"]
    for name, r in report["models"].items():
        if "error" in r:
            lines.append(f"| {name} | FAILED: {r['error'][:100]} |||||||||")
            continue
        for c in r["cells"]:
            t, f = c["seconds"], c["first_step_s"]
            errs = "; ".join([f"{k} failed" for k in c.get("errors", {})] +
                             [f"{k} outside tolerance" for k in c.get("mismatches", {})] +
                             [f"{k} within float64's, eager not" for k in c.get("eager_off_float64", {})])
                             # (the JSON says how)
            lines.append(f"| {name} | {c['batch']}x{c['length']} | {fmt_time(t['eager'])} | {fmt_time(t.get('dvm'))} | "
                         f"{fmt_time(t.get('inductor'))} | {_x(c, 'dvm')} | {_x(c, 'inductor')} | "
                         f"{fmt_time(f.get('dvm'))} / {fmt_time(f.get('inductor'))} | "
                         f"{_err(c, 'dvm')} / {_err(c, 'inductor')}"
                         f"{' (' + errs + ')' if errs else ''} | {c.get('dvm_launches_per_step', '-')} |")
    return "\n".join(lines) + "\n"


def plot(report: dict, path: str) -> None:
    from .bench_common import ratio_bars
    cells = [(m, c) for m, r in report["models"].items() for c in r.get("cells", ())]
    ratio_bars(path, [f"{m} {c['batch']}x{c['length']}" for m, c in cells],
               {s: [c.get(f"{s}_x", 0) for _, c in cells] for s in ("dvm", "inductor")},
               "Training step (forward + backward): DVM and Inductor vs eager", width=0.45)


def parse_cells(text: str) -> list:
    """'1x64,4x256' -> [(1, 64), (4, 256)] (ValueError on anything else)."""
    cells = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        b, _, L = part.partition("x")
        if not (b.isdigit() and L.isdigit() and int(b) > 0 and int(L) > 0):
            raise ValueError(f"cell {part!r}: BATCHxLENGTH with positive integers, e.g. 4x256")
        cells.append((int(b), int(L)))
    if not cells:
        raise ValueError("--cells: no cell given")
    return cells


def main(models=None, cells=None, rounds=None, seed: int = 0, threads: int = 2, inductor: bool = True,
         quick: bool = False, json_path=DEFAULT_JSON, md_path=DEFAULT_MD, png_path=DEFAULT_PNG, out=None) -> int:
    report = run(models=models or (list(QUICK) if quick else None), cells=cells or (QUICK_CELLS if quick else CELLS),
                 rounds=rounds or (QUICK_ROUNDS if quick else DEFAULT_ROUNDS), seed=seed, threads=threads,
                 inductor=inductor)
    return finish_report(report, markdown(report), plot, json_path, md_path, png_path, out or sys.stdout, "cell(s)")


def _command(args) -> int:
    from .cli import EXIT_USAGE, _at_least_one, _err, _path
    try:
        models = parse_list(args.models, "model", list(ZOO)) if args.models else None
        cells = parse_cells(args.cells) if args.cells else None
    except ValueError as e:
        _err(str(e))
        return EXIT_USAGE
    if not _at_least_one(args, "rounds", "threads"):
        return EXIT_USAGE
    return main(models=models, cells=cells, rounds=args.rounds, seed=args.seed, threads=args.threads,
                inductor=args.inductor, quick=args.quick, json_path=_path(args.json), md_path=_path(args.md),
                png_path=_path(args.png))


def add_parser(bsub) -> None:
    """Register `dvm bench train` under `dvm bench` (tools/cli.py)."""
    bt = bsub.add_parser("train", help="a training step of the zoo's models: DVM vs eager and Inductor",
                         description="Forward, loss and backward of the `dvm bench models --zoo` models (random "
                                     "init, eval mode) at a few batch x length cells: eager, torch.compile(model, "
                                     "backend='dvm', dynamic=True) and Inductor (dynamic=True, warm; its first "
                                     "step beside it) in interleaved samples; every compiled step's loss and "
                                     "gradients checked against eager's first (exit 1 on a DVM mismatch). "
                                     "Progress on stderr.")
    bt.add_argument("--models", default=None, metavar="LIST",
                    help=f"comma-separated zoo models (default all; {','.join(QUICK)} with --quick)")
    bt.add_argument("--cells", default=None, metavar="LIST",
                    help="comma-separated BATCHxLENGTH cells (default "
                         f"{','.join('x'.join(map(str, c)) for c in CELLS)}; "
                         f"{','.join('x'.join(map(str, c)) for c in QUICK_CELLS)} with --quick)")
    bt.add_argument("--no-inductor", dest="inductor", action="store_false",
                    help="leave Inductor out (its training compile takes 10-60 s a model on 2 cores)")
    add_run_options(bt, f"timing rounds (default {DEFAULT_ROUNDS}; {QUICK_ROUNDS} with --quick)",
                    f"a short run: {','.join(QUICK)}, one cell, fewer rounds",
                    "random seed for the token ids (default 0)")
    add_output_options(bt, ("--json", DEFAULT_JSON, "the results as JSON"),
                       ("--md", DEFAULT_MD, "the markdown table"), ("--png", DEFAULT_PNG, "the plot (PNG)"))
    bt.set_defaults(func=_command)
