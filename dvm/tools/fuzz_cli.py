"""The `dvm fuzz` commands (wired into tools/cli.py):

    dvm fuzz programs [--mutants N] [--seed S] [--vms reference,cpu] [--workers W] [--replay I]
                      [--json PATH] [--md PATH]
    dvm fuzz shapes [--shapes N] [--programs N] [--json PATH] [--md PATH]
"""
from __future__ import annotations

import os
import sys

DEFAULT_MUTANTS = 20_000
DEFAULT_SHAPES = 100_000
PROGRAMS_JSON = os.path.join("bench-results", "fuzz_programs.json")
PROGRAMS_MD = os.path.join("bench-results", "fuzz_programs.md")
SHAPES_JSON = os.path.join("bench-results", "fuzz_shapes.json")
SHAPES_MD = os.path.join("bench-results", "fuzz_shapes.md")


def _vms(text: str) -> tuple[str, ...]:
    from ..config import VMS
    vms = tuple(v.strip() for v in text.split(",") if v.strip())
    bad = [v for v in vms if v not in VMS]
    if bad or not vms:
        raise ValueError(f"--vms: choose from {', '.join(VMS)}")
    return ("reference",) + tuple(v for v in vms if v != "reference")   # the reference VM is the oracle


def _write(path: str | None, text: str) -> None:
    if path and path != "-":
        from .bench_common import write_text
        write_text(path, text)
        print(f"wrote {path}")


def cmd_programs(args) -> int:
    from . import fuzz_programs
    from .bench_common import loadavg, machine_info, write_json
    try:
        vms = _vms(args.vms)
    except ValueError as e:
        print(f"dvm: error: {e}", file=sys.stderr)
        return 2
    if args.replay is not None:
        print(fuzz_programs.replay(args.replay, args.seed, vms))
        return 0
    if args.mutants < 1 or args.workers < 1:
        print("dvm: error: --mutants and --workers must be at least 1", file=sys.stderr)
        return 2
    load0 = loadavg()
    report = fuzz_programs.run(args.mutants, args.seed, vms, args.workers, crash_at=args.selftest_crash)
    text = fuzz_programs.markdown(report, vms, args.seed, args.workers)
    text += f"\n\nMachine: {machine_info()['cpu']}, load average {load0} at start, {loadavg()} at end."
    print(text)
    if args.json and args.json != "-":
        data = {"benchmark": "fuzz_programs", "seed": args.seed, "vms": list(vms), "workers": args.workers,
                "mutants": report.mutants, "counts": report.counts, "crashed": report.crashed, "hung": report.hung,
                "failures": [list(f) for f in report.failures], "verify_mean_us": report.verify_mean_us,
                "verify_max_us": report.verify_max_us, "verify_max_small_us": report.verify_max_small_us,
                "verify_hist_log2_ns": report.verify_hist,
                "retimed": [list(r) for r in report.retimed], "seconds": report.seconds,
                "sampled_us": sorted(t for _, _, t in report.sampled),
                "machine": machine_info(), "loadavg": [load0, loadavg()]}
        write_json(args.json, data)
        print(f"wrote {args.json}")
    _write(args.md, text)
    expected_crash = args.selftest_crash >= 0 and report.crashed == [args.selftest_crash]
    failed = not report.ok() and not (expected_crash and not report.hung
                                      and not any(report.counts[k] for k in ("canary", "mismatch", "error")))
    return 1 if failed else 0


def cmd_shapes(args) -> int:
    import dvm
    from . import fuzz_shapes
    from .bench_common import machine_info, write_json
    if args.shapes < 2 or args.programs < 2:
        print("dvm: error: --shapes and --programs must be at least 2", file=sys.stderr)
        return 2
    phases = [fuzz_shapes.kernel_phase(args.shapes), fuzz_shapes.verifier_phase(args.programs)]
    caches = {k: v for k, v in dvm.counters().items() if k.startswith("cache_")}
    text = fuzz_shapes.markdown(phases, caches)
    print(text)
    if args.json and args.json != "-":
        write_json(args.json, {"benchmark": "fuzz_shapes", "machine": machine_info(), "caches": caches,
                               "phases": [dict(vars(p), growth_mb=p.growth_mb,
                                               growth_after_warmup_mb=p.growth_after_warmup_mb) for p in phases]})
        print(f"wrote {args.json}")
    _write(args.md, text)
    return 0 if all(p.growth_mb <= fuzz_shapes.BUDGET_MB for p in phases) else 1


def add_parser(sub) -> None:
    f = sub.add_parser("fuzz", help="hostile-input checks: mutated Programs, many distinct shapes",
                       description="Check the verifier's promise (SECURITY.md) under hostile input.")
    fsub = f.add_subparsers(dest="fuzz", metavar="CHECK")
    p = fsub.add_parser("programs", help="mutate valid Programs; run what the verifier accepts on the VMs",
                        description="Mutate valid Programs (bit flips, word swaps, truncation, splices from "
                                    "other Programs, extreme sizes, aimed field edits); verify each; run what "
                                    "the verifier accepts on every VM in --vms with canary bytes around every "
                                    "buffer and compare with the reference VM. Worker processes run the "
                                    "mutants, so a crash or a hang is counted. Exit 1 on any crash, hang, "
                                    "canary touch, differing result or unexpected error.")
    p.add_argument("--mutants", type=int, default=DEFAULT_MUTANTS, metavar="N",
                   help=f"mutants to try (default {DEFAULT_MUTANTS})")
    p.add_argument("--seed", type=int, default=0, help="random seed of the run (default 0)")
    p.add_argument("--vms", default="reference,cpu", metavar="LIST",
                   help="VMs that run accepted mutants; the reference VM is the oracle (default reference,cpu)")
    p.add_argument("--workers", type=int, default=2, metavar="W", help="worker processes (default 2)")
    p.add_argument("--replay", type=int, default=None, metavar="INDEX",
                   help="rebuild mutant INDEX of the run and show what happens to it (in this process)")
    p.add_argument("--selftest-crash", type=int, default=-1, metavar="INDEX",
                   help="the harness's own check: the worker aborts at mutant INDEX, which must be counted "
                        "as crashed while the run goes on")
    p.add_argument("--json", default=PROGRAMS_JSON, metavar="PATH", help=f"JSON report (default {PROGRAMS_JSON}; '-' none)")
    p.add_argument("--md", default=PROGRAMS_MD, metavar="PATH", help=f"markdown report (default {PROGRAMS_MD}; '-' none)")
    p.set_defaults(func=cmd_programs)
    s = fsub.add_parser("shapes", help="many distinct shapes and Programs: resident memory stays flat",
                        description="Run N distinct shapes through @dvm.kernel(dynamic=False) and N distinct "
                                    "Programs through the verifier; report resident memory growth against "
                                    f"the budget (<= {50} MB per phase). Exit 1 over budget.")
    s.add_argument("--shapes", type=int, default=DEFAULT_SHAPES, metavar="N",
                   help=f"distinct shapes through the kernel (default {DEFAULT_SHAPES})")
    s.add_argument("--programs", type=int, default=DEFAULT_SHAPES, metavar="N",
                   help=f"distinct Programs through the verifier (default {DEFAULT_SHAPES})")
    s.add_argument("--json", default=SHAPES_JSON, metavar="PATH", help=f"JSON report (default {SHAPES_JSON}; '-' none)")
    s.add_argument("--md", default=SHAPES_MD, metavar="PATH", help=f"markdown report (default {SHAPES_MD}; '-' none)")
    s.set_defaults(func=cmd_shapes)
    f.set_defaults(func=lambda args: (f.print_help(sys.stderr), 2)[1])
