"""`dvm bench optim`: a compiled optimizer step, `torch.compile(optimizer.step)`, on DVM against
eager and Inductor.

torch.optim's Adam, AdamW and SGD (momentum, Nesterov), each with its single-tensor loop
(foreach=False, PyTorch's default for CPU parameters) and its multi-tensor form (foreach=True),
over a model-like parameter list (two matrices and two vectors) at the small / medium / large
shapes of `dvm bench ops`. Systems, side by side, their samples interleaved one by one (the
median per system is reported):

  eager     optimizer.step as PyTorch runs it
  dvm       torch.compile(optimizer.step, backend="dvm")
  inductor  torch.compile(optimizer.step) (warm; its first call is reported beside it)

Every case is first checked: three steps of each compiled system from the same parameters and
gradients as eager's, parameters and optimizer state compared with assert_close's defaults; a
DVM mismatch is a failure (exit 1). Reported per case: times, ratios to eager, first calls,
DVM launches per step, and the parameter / state updates per step DVM copied in after its
launch rather than storing them into the tensors (torch_input_updates_copied).
Progress goes to stderr; the markdown to stdout; JSON, markdown and a PNG under bench-results/.
"""
from __future__ import annotations

import os
import sys
import time

from .bench_common import (BenchRun, add_output_options, add_run_options, finish_report, fmt_time, loadavg,
                           restore_vm_threads, set_vm_threads, whole_vm)
from .bench_lazy import _rounds, parse_list

DEFAULT_JSON = os.path.join("bench-results", "optim.json")
DEFAULT_MD = os.path.join("bench-results", "optim.md")
DEFAULT_PNG = os.path.join("bench-results", "optim.png")
SIZE_ORDER = ("small", "medium", "large")
OPTIMIZERS = ("adam", "adamw", "sgd")
DEFAULT_ROUNDS, QUICK_ROUNDS = 7, 3
CHECK_STEPS = 3
SYSTEMS = ("eager", "dvm", "inductor")
MIN_TOTAL_S = 0.05            # samples per system and round: about this long


def _make(name: str, params: list, foreach: bool):
    import torch
    if name == "adam":
        return torch.optim.Adam(params, lr=1e-3, foreach=foreach)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01, foreach=foreach)
    return torch.optim.SGD(params, lr=1e-2, momentum=0.9, nesterov=True, foreach=foreach)


def _params(rows: int, cols: int, seed: int) -> list:
    import torch
    gen = torch.Generator().manual_seed(seed)
    params = [torch.nn.Parameter(torch.randn(s, generator=gen)) for s in ((rows, cols), (cols,), (rows, cols), (cols,))]
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen) * 0.01
    return params


def _counts() -> dict:
    from dvm.runtime import counters
    snap = counters.snapshot()
    return {k: snap.get(k, 0) for k in ("torch_segment_launches", "torch_input_updates_copied")}


class _Run(BenchRun):
    bench = "optim"

    def case(self, name: str, foreach: bool, size: str, shape: tuple) -> dict:
        import torch
        torch._dynamo.reset()
        label = f"{name} foreach={foreach} {shape[0]}x{shape[1]}"
        steps, opts, first = {}, {}, {}
        for system in SYSTEMS:
            params = _params(*shape, self.seed)
            opts[system] = (params, _make(name, params, foreach))
            step = opts[system][1].step
            steps[system] = step if system == "eager" else \
                torch.compile(step, backend="dvm" if system == "dvm" else "inductor")
        out = {"optimizer": name, "foreach": foreach, "size": size, "shape": list(shape)}
        try:
            for system, step in steps.items():
                t0 = time.perf_counter()
                step()
                first[system] = time.perf_counter() - t0
                for _ in range(CHECK_STEPS - 1):
                    step()
            for system in ("dvm", "inductor"):
                self._check(label, system, opts["eager"], opts[system])
            before = _counts()
            steps["dvm"]()
            after = _counts()
            out["per_step"] = {k: after[k] - before[k] for k in after}
            out["seconds"] = _rounds(steps, self.rounds, MIN_TOTAL_S)
            out["first_call_s"] = first
        except Exception as e:  # noqa: BLE001 - reported, the run goes on
            out["error"] = f"{type(e).__name__}: {e}"
            self.failures.append(f"{label}: {out['error']}")
        t = out.get("seconds", {})
        if t:
            self.log(f"{label}: eager {fmt_time(t['eager'])}, dvm {fmt_time(t['dvm'])} "
                     f"({t['eager'] / t['dvm']:.2f}x), inductor {fmt_time(t['inductor'])}")
        return out

    def _check(self, label: str, system: str, want: tuple, got: tuple) -> None:
        import torch
        (wp, wopt), (gp, gopt) = want, got
        for a, b in zip(wp, gp):
            torch.testing.assert_close(b, a, msg=lambda m: f"{label}: {system} parameters: {m}")
            for key, v in wopt.state[a].items():
                torch.testing.assert_close(gopt.state[b][key], v, msg=lambda m: f"{label}: {system} {key}: {m}")


def run(sizes=SIZE_ORDER, optimizers=OPTIMIZERS, rounds: int = DEFAULT_ROUNDS, seed: int = 0, threads: int = 2,
        quiet: bool = False) -> dict:
    import torch

    import dvm
    from .bench_ops import SIZES
    old_threads, old_vm = torch.get_num_threads(), set_vm_threads(threads)
    whole_vm("optim")
    torch.set_num_threads(threads)
    r = _Run(rounds, seed, quiet)
    t0, load = time.time(), loadavg()
    cases = []
    try:
        r.log(f"VM {dvm.config.config().vm}; threads {threads}; rounds {rounds}; 1-min load {load}")
        for size in sizes:
            for shape in SIZES[size]:
                for name in optimizers:
                    for foreach in (False, True):
                        cases.append(r.case(name, foreach, size, tuple(shape)))
    finally:
        torch.set_num_threads(old_threads)
        restore_vm_threads(old_vm)
    return r.report(t0, load, threads, cases=cases)


def markdown(report: dict) -> str:
    lines = [f"## dvm bench optim ({report['date']})", "",
             f"{report['machine']['cpu']}, {report['machine']['cores']} cores; torch {report['versions']['torch']}; "
             f"VM {report['vm']}; {report['threads']} threads; median of samples interleaved one by one "
             f"(--rounds {report['rounds']}); 1-min load {report['loadavg_1min']['start']} → "
             f"{report['loadavg_1min']['end']}.", "",
             "`torch.compile(optimizer.step)` on DVM and Inductor against eager; ratios are eager time / "
             "system time (> 1: faster than eager). Parameters: two matrices and two vectors of the shape's "
             "columns. *copied*: state updates per step copied in after DVM's launch (0-d step counters).", "",
             "| optimizer | foreach | shape | eager | DVM | Inductor | DVM vs eager | Inductor vs eager | "
             "first call DVM / Inductor | DVM launches / copied per step |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | --- | --- |"]
    for c in report["cases"]:
        shape = "x".join(map(str, c["shape"]))
        if "error" in c:
            lines.append(f"| {c['optimizer']} | {c['foreach']} | {shape} | FAILED: {c['error'][:80]} |||||||")
            continue
        t, f, p = c["seconds"], c["first_call_s"], c["per_step"]
        lines.append(f"| {c['optimizer']} | {c['foreach']} | {shape} | {fmt_time(t['eager'])} | {fmt_time(t['dvm'])} | "
                     f"{fmt_time(t['inductor'])} | {t['eager'] / t['dvm']:.2f}× | {t['eager'] / t['inductor']:.2f}× | "
                     f"{fmt_time(f['dvm'])} / {fmt_time(f['inductor'])} | "
                     f"{p['torch_segment_launches']} / {p['torch_input_updates_copied']} |")
    return "\n".join(lines) + "\n"


def plot(report: dict, path: str) -> None:
    from .bench_common import ratio_bars
    ok = [c for c in report["cases"] if "seconds" in c]
    ratio_bars(path, [f"{c['optimizer']}{' fe' if c['foreach'] else ''} {c['shape'][0]}x{c['shape'][1]}" for c in ok],
               {s: [c["seconds"]["eager"] / c["seconds"][s] for c in ok] for s in ("dvm", "inductor")},
               "torch.compile(optimizer.step): DVM and Inductor vs eager")


def main(sizes=None, optimizers=None, rounds=None, seed: int = 0, threads: int = 2, quick: bool = False,
         json_path=DEFAULT_JSON, md_path=DEFAULT_MD, png_path=DEFAULT_PNG) -> int:
    report = run(sizes=sizes or (["small", "medium"] if quick else list(SIZE_ORDER)),
                 optimizers=optimizers or list(OPTIMIZERS),
                 rounds=rounds or (QUICK_ROUNDS if quick else DEFAULT_ROUNDS), seed=seed, threads=threads)
    return finish_report(report, markdown(report), plot, json_path, md_path, png_path, sys.stdout, "case(s)")


def _command(args) -> int:
    from .cli import EXIT_USAGE, _at_least_one, _err, _path
    try:
        sizes = parse_list(args.sizes, "size class", SIZE_ORDER) if args.sizes else None
        optimizers = parse_list(args.optimizers, "optimizer", OPTIMIZERS) if args.optimizers else None
    except ValueError as e:
        _err(str(e))
        return EXIT_USAGE
    if not _at_least_one(args, "rounds", "threads"):
        return EXIT_USAGE
    return main(sizes=sizes, optimizers=optimizers, rounds=args.rounds, seed=args.seed, threads=args.threads,
                quick=args.quick, json_path=_path(args.json), md_path=_path(args.md), png_path=_path(args.png))


def add_parser(bsub) -> None:
    """Register `dvm bench optim` under `dvm bench` (tools/cli.py)."""
    bo = bsub.add_parser("optim", help="torch.compile(optimizer.step) on DVM vs eager and Inductor",
                         description="torch.optim Adam, AdamW and SGD (momentum), foreach off and on, over two "
                                     "matrices and two vectors at the small / medium / large shapes of `dvm bench "
                                     "ops`: eager, torch.compile(step, backend='dvm') and Inductor side by side in "
                                     "interleaved samples; every compiled step checked against eager first (exit "
                                     "1 on a DVM mismatch). Progress on stderr.")
    bo.add_argument("--sizes", default=None, metavar="LIST",
                    help=f"comma-separated size classes from {','.join(SIZE_ORDER)} (default all; small,medium "
                         "with --quick)")
    bo.add_argument("--optimizers", default=None, metavar="LIST",
                    help=f"comma-separated optimizers from {','.join(OPTIMIZERS)} (default all)")
    add_run_options(bo, f"timing rounds (default {DEFAULT_ROUNDS}; {QUICK_ROUNDS} with --quick)",
                    "a short run: small and medium sizes, fewer rounds",
                    "random seed for parameters and gradients (default 0)")
    add_output_options(bo, ("--json", DEFAULT_JSON, "the results as JSON"),
                       ("--md", DEFAULT_MD, "the markdown table"), ("--png", DEFAULT_PNG, "the plot (PNG)"))
    bo.set_defaults(func=_command)
