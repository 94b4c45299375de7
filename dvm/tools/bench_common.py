"""Helpers shared by the `dvm bench` benchmarks: machine description, load average, progress
lines on stderr, JSON output, a median-of-repeats wall-clock timer, and Inductor's cache directory
set for a block."""
from __future__ import annotations

import contextlib
import gc
import json
import math
import os
import platform
import shutil
import sys
import tempfile
import time
from typing import Callable

import numpy as np

import dvm
from dvm import config as dvm_config

YOUNG_GENERATIONS = 1   # gc.collect(1): generations 0 and 1, not the long-lived objects
INDUCTOR_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"


def machine_info() -> dict:
    model = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 0
    return {"cpu": model, "cores": cores, "python": platform.python_version(),
            "numpy": np.__version__, "dvm": dvm.__version__, "platform": platform.platform()}


def set_vm_threads(n: int) -> str | None:
    """Make the CPU VM use n threads (DVM_NUM_THREADS, re-read); returns the previous value of
    the variable (None: unset) for restore_vm_threads. The VM runs its own thread pool, sized by
    this variable alone, so a benchmark that gives its baselines n threads gives DVM the same."""
    old = os.environ.get("DVM_NUM_THREADS")
    os.environ["DVM_NUM_THREADS"] = str(n)
    dvm_config.reload()
    return old


def restore_vm_threads(old: str | None) -> None:
    if old is None:
        os.environ.pop("DVM_NUM_THREADS", None)
    else:
        os.environ["DVM_NUM_THREADS"] = old
    dvm_config.reload()


def whole_vm(bench: str, quiet: bool = False) -> None:
    """Wait until the CPU VM's fast paths are loaded (on a cold machine they compile in the
    background while programs run on the generic paths): benchmarks time the whole VM."""
    if dvm_config.config().vm != "cpu":
        return
    from dvm.vm import cpu
    if not cpu.fast_ready():
        progress(bench, "waiting for the CPU VM's fast paths (compiling in the background) ...", quiet)
    cpu.warm_up(wait_fast=True)


def vm_extra() -> dict:
    """The CPU VM's thread count (the reports record it)."""
    if dvm_config.config().vm != "cpu":
        return {"dvm_threads": dvm_config.config().threads}
    from dvm.vm import cpu
    return {"dvm_threads": cpu.threads()}


def loadavg() -> float | None:
    """The 1-minute load average (other processes inflate timings: it is recorded)."""
    try:
        return round(os.getloadavg()[0], 2)
    except (OSError, AttributeError):
        return None


def progress(bench: str, msg: str, quiet: bool = False) -> None:
    """One progress line on stderr, `[dvm bench NAME] msg`."""
    if not quiet:
        print(f"[dvm bench {bench}] {msg}", file=sys.stderr, flush=True)


class BenchRun:
    """A benchmark run's settings, its failures so far and its progress lines (`bench`: the
    benchmark's name in them); a benchmark subclasses it with its cases."""
    bench = ""

    def __init__(self, rounds: int, seed: int, quiet: bool):
        self.rounds, self.seed, self.quiet = rounds, seed, quiet
        self.failures: list = []

    def log(self, msg: str) -> None:
        progress(self.bench, msg, self.quiet)

    def report(self, started: float, load, threads: int, **results) -> dict:
        """The run's JSON report: what ran where (started: its time.time(), load: loadavg() then),
        then `results`, then the failures."""
        import torch
        return {"benchmark": self.bench, "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                "seconds": round(time.time() - started, 1), "vm": dvm_config.config().vm, "threads": threads,
                "rounds": self.rounds, "seed": self.seed, "machine": machine_info(),
                "versions": {"torch": torch.__version__, **vm_extra()},
                "loadavg_1min": {"start": load, "end": loadavg()}, **results, "failures": self.failures}


def write_json(path: str, report: dict) -> None:
    d = os.path.dirname(path)
    if d:
        os.makedirs(d, exist_ok=True)
    with open(path, "w") as f:
        json.dump(report, f, indent=2, allow_nan=False)
        f.write("\n")


def read_report(path: str | None, benchmark: str, out) -> dict | None:
    """The JSON report of `benchmark` a previous run left at path (write_json), or None: no path,
    no file, or another benchmark's. An unreadable file is named on `out`, not fatal."""
    if not path or not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            report = json.load(f)
    except (OSError, ValueError) as e:
        print(f"not comparing with {path}: {e}", file=out)
        return None
    return report if isinstance(report, dict) and report.get("benchmark") == benchmark else None


def write_text(path: str, text: str) -> None:
    d = os.path.dirname(path)
    if d:
        os.makedirs(d, exist_ok=True)
    with open(path, "w") as f:
        f.write(text if text.endswith("\n") else text + "\n")


def save_figure(fig, path: str) -> None:
    """Lay out a matplotlib figure, write it to `path` (its folder made if missing) and close it."""
    import matplotlib.pyplot as plt
    fig.tight_layout()
    d = os.path.dirname(path)
    if d:
        os.makedirs(d, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


def restore_env(name: str, old: str | None) -> None:
    """Set environment variable `name` back to `old` (unset where it was None)."""
    if old is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = old


@contextlib.contextmanager
def inductor_cache_dir(prefix: str):
    """An empty Inductor cache directory (TORCHINDUCTOR_CACHE_DIR) for the block: Inductor's first
    compiles there are cold; afterwards the directory is removed and the variable restored."""
    old, path = os.environ.get(INDUCTOR_CACHE_ENV), tempfile.mkdtemp(prefix=prefix)
    os.environ[INDUCTOR_CACHE_ENV] = path
    try:
        yield path
    finally:
        restore_env(INDUCTOR_CACHE_ENV, old)
        shutil.rmtree(path, ignore_errors=True)


def ratio_bars(path: str, labels: list[str], ratios: dict[str, list[float]], title: str,
               width: float = 0.5) -> None:
    """A bar chart of each system's speed-up over eager per case (ratios: system -> one ratio per
    label, 0 where it did not run), the 1.0 line drawn, written to path."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(max(6, width * len(labels)), 4))
    bar = 0.8 / max(len(ratios), 1)
    for i, (system, ys) in enumerate(ratios.items()):
        ax.bar([x + bar * i for x in range(len(labels))], ys, bar, label=system)
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_xticks([x + bar * (len(ratios) - 1) / 2 for x in range(len(labels))])
    ax.set_xticklabels(labels, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("× eager (higher is faster)")
    ax.set_title(title)
    ax.legend()
    save_figure(fig, path)


def finish_report(report: dict, text: str, plot: Callable[[dict, str], None], json_path: str | None,
                  md_path: str | None, png_path: str | None, out, failed_what: str) -> int:
    """Print the markdown, write JSON / markdown / PNG where asked, list DVM failures.
    Returns the exit code: 1 when DVM failed anywhere."""
    print(text, file=out)
    if json_path:
        write_json(json_path, report)
        print(f"wrote {json_path}", file=out)
    if md_path:
        write_text(md_path, text)
        print(f"wrote {md_path}", file=out)
    if png_path:
        plot(report, png_path)
        print(f"wrote {png_path}", file=out)
    if report["failures"]:
        print(f"\nDVM FAILED in {len(report['failures'])} {failed_what}:", file=out)
        for f in report["failures"]:
            print(f"  {f}", file=out)
        return 1
    return 0


def percentiles(samples_ns: list[int]) -> dict:
    """Nearest-rank p50 / p99, max and mean of nanosecond samples, in microseconds."""
    s = sorted(samples_ns)
    n = len(s)

    def rank(q: float) -> float:
        return s[min(n - 1, max(0, math.ceil(q * n) - 1))] / 1e3
    return {"p50": rank(0.50), "p99": rank(0.99), "max": s[-1] / 1e3, "mean": sum(s) / n / 1e3, "n": n}


def time_call(fn: Callable[[], object], repeat: int, min_total_s: float = 0.05,
              min_sample_s: float = 20e-6, warmup: int = 2, max_samples: int = 1000) -> dict:
    """Median wall-clock seconds per call of `fn()`.

    `warmup` untimed calls and up to 5 calibration calls; then samples of `number` back-to-back calls each, `number` chosen so
    that a sample lasts at least `min_sample_s` (timer overhead well under 1 %), and at least
    `repeat` samples, more for short calls until about `min_total_s` of timing (at most
    `max_samples`). Short samples and the median keep one descheduled call (another process on
    the machine, an OpenMP thread waiting for a busy core) from polluting the result. Timed with
    time.perf_counter, the garbage collector disabled; the young generations (where the warm-up
    calls' garbage is) are collected first. A full collection would walk every object PyTorch
    and the test runner hold, 0.1-0.5 s a call, for no steadier timing. Returns {"median_s",
    "min_s", "max_s", "number", "samples"}."""
    for _ in range(warmup):
        fn()
    clock = time.perf_counter
    gc.collect(YOUNG_GENERATIONS)
    gc.disable()
    try:
        one = math.inf   # calibrate on the fastest of a few calls: one stalled call must not
        spent = 0.0      # shrink the sample count
        for _ in range(5):
            t0 = clock()
            fn()
            dt = clock() - t0
            one, spent = min(one, dt), spent + dt
            if spent > min_total_s:
                break
        one = max(one, 1e-9)
        number = max(1, min(100_000, int(math.ceil(min_sample_s / one))))
        n = max(1, repeat, min(max_samples, int(min_total_s / (number * one))))
        samples = []
        for _ in range(n):
            t0 = clock()
            for _ in range(number):
                fn()
            samples.append((clock() - t0) / number)
    finally:
        gc.enable()
    samples.sort()
    n = len(samples)
    median = samples[n // 2] if n % 2 else 0.5 * (samples[n // 2 - 1] + samples[n // 2])
    return {"median_s": median, "min_s": samples[0], "max_s": samples[-1], "number": number, "samples": n}


def fmt_time(seconds: float | None) -> str:
    """A time with a unit that keeps 3 significant digits: 812 ns, 41.2 us, 3.07 ms, 1.25 s."""
    if seconds is None:
        return "—"
    for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "us"), (1e-9, "ns")):
        if seconds >= scale or unit == "ns":
            v = seconds / scale
            return f"{v:.3g} {unit}" if v < 1000 else f"{v:.0f} {unit}"
    return f"{seconds:.3g} s"  # pragma: no cover


def add_run_options(parser, rounds_help: str, quick_help: str, seed_help: str) -> None:
    """The options bench optim, train and lazy share: --rounds (None: the benchmark's default, its
    quick one with --quick), --threads (2), --quick and --seed (0)."""
    parser.add_argument("--rounds", type=int, default=None, metavar="N", help=rounds_help)
    parser.add_argument("--threads", type=int, default=2, metavar="N", help="torch and DVM CPU VM threads (default 2)")
    parser.add_argument("--quick", action="store_true", help=quick_help)
    parser.add_argument("--seed", type=int, default=0, help=seed_help)


def add_output_options(parser, *outputs: tuple[str, str, str]) -> None:
    """The output-file options of a benchmark: (flag, default path, what the file holds) each;
    '' or '-' writes none."""
    for flag, default, what in outputs:
        parser.add_argument(flag, default=default, metavar="PATH",
                            help=f"where to write {what} (default {default}; '-' for none)")
