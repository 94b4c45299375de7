"""`dvm bench ab`: the speed of two checkouts of this project side by side, in one run.

A is BASE (e.g. a checkout of the commit before a change), B the other checkout (by default the
one this `dvm` was imported from). Each round runs, for each checkout in turn (A then B, then B
then A in the next round, and so on), one fresh Python process per suite: bench_ab_child.py,
executed by path with PYTHONPATH=<checkout> in a neutral working directory, imports THAT
checkout's `dvm`, waits for its whole CPU VM and times every case (the median of several
samples). Per case and checkout the best (lowest) of the rounds' medians is kept: the round least
disturbed by the rest of the machine; and the median of the rounds' medians beside it: a process
may run at one of two speeds for its whole life, and a best of few rounds then picks one
process's luck. The report is a table per suite (case, A, B, B/A of the best, B/A of the medians,
and "slower" / "faster" where both ratios are beyond 1 +- the threshold on the same side), the
list of the cases that moved, JSON and markdown. Progress goes to stderr, the tables to stdout.
Exit 0 whatever the numbers say (a benchmark, not a test); 1 if a checkout's process failed; 2
for bad arguments.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .bench_ab_child import MODEL_NAMES, ZOO_BATCHES, ZOO_DTYPE, ZOO_DTYPES, ZOO_LENGTHS, ZOO_THREADS
from .bench_common import add_output_options, finish_report, loadavg, machine_info, progress
from .bench_ops_cases import CASE_NAMES
from .bench_train import CELLS as TRAIN_CELLS
from .bench_zoo_models import ZOO

CHILD = Path(__file__).with_name("bench_ab_child.py")
DEFAULT_JSON = os.path.join("bench-results", "ab.json")
DEFAULT_MD = os.path.join("bench-results", "ab.md")
DEFAULT_ROUNDS = 5
DEFAULT_THRESHOLD = 0.10
SUITE_NAMES = {"ops": CASE_NAMES, "models": MODEL_NAMES, "zoo": tuple(ZOO), "train": tuple(ZOO)}   # --cases
ALL_SUITES = ("ops", "models")   # --suite all (the zoo and train take ~10x as long: asked for by name)
GIT_TIMEOUT_S = 30
US = 1e6
LABELS = ("A", "B")
EXIT_FAIL, EXIT_USAGE = 1, 2


class ChildFailed(RuntimeError):
    """A checkout's measuring process exited non-zero or reported the wrong `dvm`."""


def say(msg: str) -> None:
    progress("ab", msg)


def _error(msg: str) -> None:
    print(f"dvm: error: {msg}", file=sys.stderr)


# -- arguments ----------------------------------------------------------------------------------
def this_checkout() -> str:
    """The checkout (the folder holding dvm/) this `dvm` was imported from."""
    import dvm
    return os.path.dirname(os.path.dirname(os.path.abspath(dvm.__file__)))


def check_checkout(path: str, what: str) -> str:
    """The absolute path of a checkout with dvm/ in it; ValueError otherwise."""
    full = os.path.abspath(path)
    if not os.path.isdir(full):
        raise ValueError(f"{what} {path!r} is not a directory")
    if not os.path.isfile(os.path.join(full, "dvm", "__init__.py")):
        raise ValueError(f"{what} {path!r} is not a checkout of this project: it has no dvm/__init__.py")
    return full


def parse_suites(suite: str, filters: list[str]) -> list[str]:
    """The suites to run: `suite` (ops, models, zoo, train or all) less those --cases selects nothing in;
    ValueError when nothing is left."""
    chosen = list(ALL_SUITES) if suite == "all" else [suite]
    kept = [s for s in chosen if not filters or any(f in n for f in filters for n in SUITE_NAMES[s])]
    if not kept:
        raise ValueError(f"--cases {','.join(filters)} matches no case of suite {suite} "
                         f"(cases: {', '.join(n for s in chosen for n in SUITE_NAMES[s])})")
    for s in chosen:
        if s not in kept:
            say(f"suite {s}: no case matches --cases {','.join(filters)}; skipped")
    return kept


def split_list(text: str | None) -> list[str]:
    return [s.strip() for s in (text or "").split(",") if s.strip()]


# -- the checkouts' processes -------------------------------------------------------------------
def _git(path: str, *args: str) -> str | None:
    """`git -C path args` without taking the index lock (the checkouts are only read)."""
    try:
        r = subprocess.run(["git", "--no-optional-locks", "-C", path, *args], capture_output=True, text=True,
                           timeout=GIT_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def checkout_info(path: str) -> dict:
    """Path, commit and whether tracked files differ from it (None where git cannot tell)."""
    status = _git(path, "status", "--porcelain", "--untracked-files=no")
    return {"path": path, "commit": _git(path, "rev-parse", "--short", "HEAD"),
            "dirty": None if status is None else bool(status)}


def _child_argv(suite: str, out: str, filters: list[str], sizes: list[str], zoo_dtype: str = ZOO_DTYPE) -> list[str]:
    argv = [sys.executable, str(CHILD), "--suite", suite, "--out", out]
    if suite == "zoo" and zoo_dtype != ZOO_DTYPE:
        argv += ["--zoo-dtype", zoo_dtype]
    if filters:
        argv += ["--cases", ",".join(filters)]
    if sizes and suite == "ops":
        argv += ["--sizes", ",".join(sizes)]
    return argv


def run_child(checkout: str, suite: str, out: str, filters: list[str], sizes: list[str], workdir: str,
              zoo_dtype: str = ZOO_DTYPE) -> dict:
    """One measuring process on `checkout`; its JSON ({"meta", "times"}). Its stderr passes through."""
    env = dict(os.environ, PYTHONPATH=checkout)
    r = subprocess.run(_child_argv(suite, out, filters, sizes, zoo_dtype), env=env, cwd=workdir,
                       stdout=subprocess.DEVNULL)
    if r.returncode != 0:
        raise ChildFailed(f"the {suite} process on {checkout} exited with {r.returncode} (its stderr is above)")
    try:
        with open(out) as f:
            result = json.load(f)
        imported = result["meta"]["dvm_file"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ChildFailed(f"the {suite} process on {checkout} left no readable result in {out}: {e}") from None
    imported = os.path.realpath(imported)
    if not imported.startswith(os.path.join(os.path.realpath(checkout), "dvm") + os.sep):
        raise ChildFailed(f"the {suite} process for {checkout} imported dvm from {imported}, not from the checkout")
    return result


def round_order(r: int) -> tuple[str, ...]:
    """A, B in even rounds, B, A in odd ones (0-based): neither checkout always runs first."""
    return LABELS if r % 2 == 0 else LABELS[::-1]


def run_rounds(paths: dict, suites: list[str], rounds: int, filters: list[str], sizes: list[str],
               zoo_dtype: str = ZOO_DTYPE) -> dict:
    """{"times": {label: [times of round 1, round 2, ...]}, "meta": {label: {suite: its process's meta}},
    "suite_of": {case: suite}}."""
    got: dict = {"times": {label: [{} for _ in range(rounds)] for label in LABELS},
                 "meta": {label: {} for label in LABELS}, "suite_of": {}}
    with tempfile.TemporaryDirectory(prefix="dvm-bench-ab-") as workdir:
        for r in range(rounds):
            for label in round_order(r):
                for suite in suites:
                    say(f"round {r + 1}/{rounds}: {label} {suite} ({paths[label]}) ...")
                    t0 = time.perf_counter()
                    out = os.path.join(workdir, f"{label}_{suite}_{r}.json")
                    res = run_child(paths[label], suite, out, filters, sizes, workdir, zoo_dtype)
                    got["times"][label][r].update(res["times"])
                    got["meta"][label][suite] = res["meta"]
                    got["suite_of"].update(dict.fromkeys(res["times"], suite))
                    say(f"round {r + 1}/{rounds}: {label} {suite}: {len(res['times'])} cases in "
                        f"{time.perf_counter() - t0:.1f} s")
    return got


# -- the comparison (pure) ----------------------------------------------------------------------
def best_of_rounds(per_round: list[dict]) -> dict:
    """Per case, the lowest of the rounds' medians; cases in the order they first appear."""
    best: dict = {}
    for times in per_round:
        for case, t in times.items():
            best[case] = min(best.get(case, t), t)
    return best


def median_of_rounds(per_round: list[dict]) -> dict:
    """Per case, the median of the rounds' medians; cases in the order they first appear."""
    seen: dict = {}
    for times in per_round:
        for case, t in times.items():
            seen.setdefault(case, []).append(t)
    return {case: statistics.median(ts) for case, ts in seen.items()}


def flag(ratio: float | None, threshold: float) -> str:
    """"slower" when B/A > 1 + threshold, "faster" when B/A < 1 - threshold, else ""."""
    if ratio is None:
        return ""
    if ratio > 1 + threshold:
        return "slower"
    return "faster" if ratio < 1 - threshold else ""


def _ratio(ta: float | None, tb: float | None) -> float | None:
    return tb / ta if ta and tb is not None else None


def compare(a: dict, b: dict, threshold: float, a_median: dict | None = None,
            b_median: dict | None = None) -> list[dict]:
    """One row per case of A (then those only B has): both times (None where missing), B/A, flag.
    a, b: each case's best time; with a_median and b_median (each case's median over the rounds)
    also B/A of the medians, and a case is flagged only where both ratios flag it alike."""
    rows = []
    for case in list(a) + [c for c in b if c not in a]:
        ta, tb = a.get(case), b.get(case)
        row = {"case": case, "a_s": ta, "b_s": tb, "ratio": _ratio(ta, tb)}
        row["flag"] = flag(row["ratio"], threshold)
        if a_median is not None and b_median is not None:
            row["median_ratio"] = _ratio(a_median.get(case), b_median.get(case))
            if flag(row["median_ratio"], threshold) != row["flag"]:
                row["flag"] = ""
        rows.append(row)
    return rows


def moved(rows: list[dict]) -> dict:
    """The flagged rows' cases and ratios: {"slower": [[case, ratio], ...], "faster": [...]}, the
    largest moves first."""
    out = {}
    for kind, sign in (("slower", -1), ("faster", 1)):
        hits = [[r["case"], r["ratio"]] for r in rows if r["flag"] == kind]
        out[kind] = sorted(hits, key=lambda h: sign * h[1])
    return out


# -- the report ---------------------------------------------------------------------------------
def _us(t: float | None) -> str:
    if t is None:
        return "—"
    return f"{t * US:.1f}" if t * US < 1000 else f"{t * US:.0f}"


def _describe(label: str, info: dict) -> str:
    commit = info.get("commit") or "no git commit"
    dirty = ", with uncommitted changes" if info.get("dirty") else ""
    return f"{label} = `{info['path']}` ({commit}{dirty})"


def _fmt_ratio(ratio: float | None) -> str:
    return "—" if ratio is None else f"{ratio:.2f}"


def _table(rows: list[dict]) -> list[str]:
    lines = ["| case | A µs | B µs | B/A | B/A of medians | moved |", "| --- | ---: | ---: | ---: | ---: | --- |"]
    for r in rows:
        lines.append(f"| {r['case']} | {_us(r['a_s'])} | {_us(r['b_s'])} | {_fmt_ratio(r['ratio'])} | "
                     f"{_fmt_ratio(r.get('median_ratio'))} | {r['flag']} |")
    return lines


def _moved_lines(report: dict) -> list[str]:
    pct = f"{100 * report['threshold']:.0f} %"
    mv = report["moved"]
    if not mv["slower"] and not mv["faster"]:
        return [f"No case moved by more than {pct}."]
    lines = [f"Moved by more than {pct} (B/A):"]
    for kind in ("slower", "faster"):
        if mv[kind]:
            lines.append(f"- {kind} in B: " + ", ".join(f"{c} {ratio:.2f}" for c, ratio in mv[kind]))
    return lines


def _suite_note(report: dict, suite: str) -> str:
    """VM and threads of the suite's processes, once where A's and B's agree."""
    said = {label: report[label.lower()]["processes"].get(suite, {}) for label in LABELS}
    each = {label: f"VM {m.get('vm')}, {m.get('threads')} thread(s), dvm {m.get('dvm_version')}"
                   + (f", {m['dtype']}" if m.get("dtype") else "") for label, m in said.items()}
    return each["A"] if each["A"] == each["B"] else "; ".join(f"{label}: {v}" for label, v in each.items())


def markdown(report: dict) -> str:
    m, load = report["machine"], report["loadavg_1min"]
    lines = ["## dvm bench ab", "", _describe("A", report["a"]) + "; " + _describe("B", report["b"]) + ".",
             f"Best of {report['rounds']} round(s)' medians per case, and the median of them (order alternating "
             f"A,B / B,A); B/A > 1: B is slower; flagged where both ratios are beyond the threshold; "
             f"{m.get('cpu', '?')}, {m.get('cores', '?')} cores; 1-min load {load['start']} at "
             f"start, {load['end']} at end; {report['seconds']:.0f} s in all.", ""]
    for suite in report["suites"]:
        rows = [r for r in report["results"] if r["suite"] == suite]
        lines += [f"### {suite} ({_suite_note(report, suite)})", "", *_table(rows), ""]
    return "\n".join(lines + _moved_lines(report))


def _rows(got: dict, threshold: float) -> list[dict]:
    times = got["times"]
    rows = compare(best_of_rounds(times["A"]), best_of_rounds(times["B"]), threshold,
                   median_of_rounds(times["A"]), median_of_rounds(times["B"]))
    for r in rows:
        r["suite"] = got["suite_of"][r["case"]]
        for label in LABELS:
            r[f"{label.lower()}_rounds"] = [t[r["case"]] for t in times[label] if r["case"] in t]
    return rows


def run(base: str, other: str, suites: list[str], rounds: int, filters: list[str], sizes: list[str],
        threshold: float, zoo_dtype: str = ZOO_DTYPE) -> dict:
    """Run the rounds and return the report (the JSON's content)."""
    load_start, t0 = loadavg(), time.time()
    got = run_rounds({"A": base, "B": other}, suites, rounds, filters, sizes, zoo_dtype)
    rows = _rows(got, threshold)
    return {"benchmark": "ab", "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "seconds": round(time.time() - t0, 2),
            "a": {**checkout_info(base), "processes": got["meta"]["A"]},
            "b": {**checkout_info(other), "processes": got["meta"]["B"]},
            "suites": suites, "rounds": rounds, "threshold": threshold, "cases": filters, "sizes": sizes,
            "zoo_dtype": zoo_dtype,
            "machine": machine_info(), "loadavg_1min": {"start": load_start, "end": loadavg()},
            "results": rows, "moved": moved(rows), "failures": []}


def _check_numbers(rounds: int, threshold: float) -> None:
    if rounds < 1:
        raise ValueError("--rounds must be at least 1")
    if not 0 < threshold < 1:
        raise ValueError(f"--threshold must be between 0 and 1 (a fraction: 0.10 is 10 %), got {threshold}")


def main(base: str, other: str | None = None, suite: str = "ops", rounds: int = DEFAULT_ROUNDS,
         cases: str | None = None, sizes: list[str] | None = None, threshold: float = DEFAULT_THRESHOLD,
         json_path: str | None = DEFAULT_JSON, md_path: str | None = DEFAULT_MD, out=None,
         zoo_dtype: str = ZOO_DTYPE) -> int:
    """Check the arguments (exit 2 when wrong), run the rounds, print and write the report. Exit 0,
    or 1 when a checkout's process failed."""
    out = out or sys.stdout
    filters = split_list(cases)
    try:
        _check_numbers(rounds, threshold)
        paths = check_checkout(base, "BASE"), check_checkout(other or this_checkout(), "--other")
        suites = parse_suites(suite, filters)
    except ValueError as e:
        _error(str(e))
        return EXIT_USAGE
    say(f"A = {paths[0]}, B = {paths[1]}; suites {', '.join(suites)}; {rounds} round(s)")
    try:
        report = run(*paths, suites, rounds, filters, sizes or [], threshold, zoo_dtype)
    except ChildFailed as e:
        _error(str(e))
        return EXIT_FAIL
    return finish_report(report, markdown(report), None, json_path, md_path, None, out, "checkouts")


def _command(args) -> int:
    from . import bench_ops
    from .cli import _path
    try:
        sizes = bench_ops.parse_sizes(args.sizes) if args.sizes is not None else None
    except ValueError as e:
        _error(str(e))
        return EXIT_USAGE
    return main(args.base, other=args.other, suite=args.suite, rounds=args.rounds, cases=args.cases,
                sizes=sizes, threshold=args.threshold, json_path=_path(args.json), md_path=_path(args.md),
                zoo_dtype=args.zoo_dtype)


def add_parser(bsub) -> None:
    """Register `dvm bench ab` under `dvm bench` (tools/cli.py)."""
    from . import bench_ops
    ba = bsub.add_parser("ab", help="the speed of two checkouts side by side, in one run (before / after a change)",
                         description="Time the `dvm bench ops` kernels (and / or the Llama and Qwen2-MoE models "
                                     "under torch.compile(backend='dvm'), one thread, batch 1 and 3, lengths "
                                     "8-512) of two checkouts of this project in the same run: per round a fresh "
                                     "process per checkout (order alternating A,B / B,A) imports that checkout's "
                                     "dvm and waits for its whole CPU VM; per case the best of the rounds' "
                                     "medians and the median of them. Prints case, A, B, B/A of each and the "
                                     "cases that moved beyond the threshold by both. Progress on stderr. Exit 0 "
                                     "whatever the numbers (1 if a checkout's process fails, 2 for bad "
                                     "arguments).")
    ba.add_argument("base", metavar="BASE", help="checkout A (a folder with dvm/ in it), e.g. the commit before")
    ba.add_argument("--other", default=None, metavar="PATH",
                    help="checkout B (default: the one this dvm was imported from)")
    ba.add_argument("--suite", choices=("ops", "models", "zoo", "train", "all"), default="ops",
                    help="ops: every case x size of `dvm bench ops`; models: llama and qwen2_moe; zoo: the "
                         f"`dvm bench models --zoo` models, {ZOO_THREADS} threads, batch "
                         f"{'/'.join(map(str, ZOO_BATCHES))}, L {'/'.join(map(str, ZOO_LENGTHS))} (about a "
                         "minute a model a round); train: the same models' training steps as `dvm bench "
                         f"train` takes them, cells {','.join(f'{b}x{n}' for b, n in TRAIN_CELLS)}; all: ops "
                         "and models (default ops)")
    ba.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS, metavar="N",
                    help="rounds; each runs both checkouts once (default %(default)s)")
    ba.add_argument("--cases", default=None, metavar="LIST",
                    help="comma-separated substrings; only cases (ops) or models (models, zoo, train) whose name "
                         "contains one (default all)")
    ba.add_argument("--sizes", default=None, metavar="LIST",
                    help=f"ops: comma-separated size classes from {','.join(bench_ops.SIZE_ORDER)} (default all)")
    ba.add_argument("--zoo-dtype", default=ZOO_DTYPE, choices=ZOO_DTYPES,
                    help="zoo: the models' dtype, weights and activations (default %(default)s)")
    ba.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD, metavar="F",
                    help="B/A beyond 1 +- F, of the best and of the medians alike, is flagged slower / faster "
                         "(default %(default)s)")
    add_output_options(ba, ("--json", DEFAULT_JSON, "the results as JSON"),
                       ("--md", DEFAULT_MD, "the markdown table"))
    ba.set_defaults(func=_command)
