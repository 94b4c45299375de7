"""`dvm fuzz programs`: mutate valid Programs and check the verifier's promise on every mutant.

Each mutant (fuzz_mutate) is verified; what the verifier accepts runs on every VM asked for, with
canary bytes around every buffer, and each VM's outputs are compared with the reference VM's
(fuzz_run). Mutants run in worker processes, so a crash (a segfault in compiled code) or a hang
is counted, not fatal: the parent sees which mutant its worker was running, counts it, and starts
a new worker after it. The report: mutants, rejected, ran correctly, skipped, crashed, hung,
canary touches, mismatches, errors, and the verifier's time per Program (worst case over the
run, over Programs under 4 K words, and the worst mutants timed again alone with a cold cache, so
that a descheduled process is not mistaken for the verifier's cost).
"""
from __future__ import annotations

import multiprocessing as mp
import os
import sys
import time
from dataclasses import dataclass, field

import numpy as np

KINDS = ("rejected", "ran", "zerodiv", "skipped", "canary", "mismatch", "error")
SMALL_WORDS = 4096           # "Programs under 4 K words": the verifier's budget is 1 ms for those
WORST_KEPT = 32              # slowest verifications per worker chunk; the slowest RETIMED of all are timed again
HANG_S = 60.0                # a mutant that runs longer than this is killed and counted as hung
CHUNK = 2000                 # mutants a worker takes at a time
RETIME_REPEATS = 5
RETIMED = 64                 # slowest mutants of the run timed again (and a quarter as many of the sample)
SAMPLED = 20_000             # mutants (evenly spread over the run) verified again alone, cold
# shared per-worker state (int64 slots): the counts of KINDS, then
_MAX_NS, _MAX_SMALL_NS, _SUM_NS, _CURRENT = range(len(KINDS), len(KINDS) + 4)
_WORST = len(KINDS) + 4      # WORST_KEPT pairs (ns, index)
_HIST = _WORST + 2 * WORST_KEPT   # verify times: HIST_BINS counts, bin b holding [2**(b-1), 2**b) ns
HIST_BINS = 40
_SLOTS = _HIST + HIST_BINS


@dataclass
class Report:
    mutants: int = 0
    counts: dict = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    crashed: list = field(default_factory=list)    # mutant indices whose worker died
    hung: list = field(default_factory=list)
    failures: list = field(default_factory=list)   # (index, kind, detail, base, mutation)
    verify_hist: list = field(default_factory=lambda: [0] * HIST_BINS)
    verify_max_us: float = 0.0
    verify_max_small_us: float = 0.0
    verify_mean_us: float = 0.0
    worst: list = field(default_factory=list)      # (ns, index) of the slowest verifications
    retimed: list = field(default_factory=list)    # (index, words, best of RETIME_REPEATS in us)
    sampled: list = field(default_factory=list)    # (index, words, us) of SAMPLED mutants, cold, once
    seconds: float = 0.0

    def ok(self) -> bool:
        return not (self.crashed or self.hung or any(self.counts[k] for k in ("canary", "mismatch", "error")))


def _worker(seed: int, start: int, end: int, vms: tuple, state, conn, crash_at: int) -> None:
    """Run mutants [start, end) of the run `seed`, keeping counts in `state` (shared memory, so
    they survive a crash) and sending failures' details through `conn`."""
    from . import fuzz_corpus, fuzz_mutate, fuzz_run
    corpus = fuzz_corpus.build_corpus()
    worst: list = []
    for i in range(start, end):
        state[_CURRENT] = i
        try:
            base, words, desc = fuzz_mutate.mutant(corpus, seed, i)
        except Exception as e:  # noqa: BLE001 - the harness's own bug: reported, never a crash
            state[KINDS.index("error")] += 1
            conn.send((i, "error", f"making the mutant raised {type(e).__name__}: {e}", "?", "?"))
            continue
        if i == crash_at:   # the harness's own check: a crash must be counted, not fatal
            os.abort()
        out = fuzz_run.run_mutant(words, base.inputs, vms, np.random.default_rng([seed, i, 1]))
        state[KINDS.index(out.kind)] += 1
        state[_SUM_NS] += out.verify_ns
        state[_HIST + min(HIST_BINS - 1, out.verify_ns.bit_length())] += 1
        state[_MAX_NS] = max(state[_MAX_NS], out.verify_ns)
        if out.words < SMALL_WORDS:
            state[_MAX_SMALL_NS] = max(state[_MAX_SMALL_NS], out.verify_ns)
        if out.kind in fuzz_run.FAILURES:
            conn.send((i, out.kind, out.detail, base.name, desc))
        if len(worst) < WORST_KEPT or out.verify_ns > worst[-1][0]:
            worst = sorted(worst + [(out.verify_ns, i)], reverse=True)[:WORST_KEPT]
            for j, (ns, idx) in enumerate(worst):
                state[_WORST + 2 * j], state[_WORST + 2 * j + 1] = ns, idx
    conn.send(None)


class _Slot:
    """One worker process and its shared state."""

    def __init__(self, ctx, seed, start, end, vms, crash_at):
        self.state = ctx.Array("q", _SLOTS, lock=False)
        for j in range(WORST_KEPT):
            self.state[_WORST + 2 * j + 1] = -1
        self.recv, send = ctx.Pipe(duplex=False)
        self.start, self.end = start, end
        self.proc = ctx.Process(target=_worker, args=(seed, start, end, vms, self.state, send, crash_at), daemon=True)
        self.proc.start()
        send.close()
        self.last_index, self.since = -1, time.monotonic()


def _harvest(slot: _Slot, report: Report) -> None:
    s = slot.state
    for k, kind in enumerate(KINDS):
        report.counts[kind] += s[k]
    report.verify_max_us = max(report.verify_max_us, s[_MAX_NS] / 1e3)
    report.verify_max_small_us = max(report.verify_max_small_us, s[_MAX_SMALL_NS] / 1e3)
    report.verify_mean_us += s[_SUM_NS] / 1e3   # a sum until run() divides it
    report.worst += [(s[_WORST + 2 * j], s[_WORST + 2 * j + 1]) for j in range(WORST_KEPT)
                     if s[_WORST + 2 * j + 1] >= 0]
    for b in range(HIST_BINS):
        report.verify_hist[b] += s[_HIST + b]


def quantile_us(hist: list[int], q: float) -> float:
    """An upper bound of the q-quantile of the verify times (the upper edge of its bin), in us."""
    total, seen = sum(hist), 0
    for b, n in enumerate(hist):
        seen += n
        if total and seen >= q * total:
            return 2 ** b / 1e3
    return 0.0


def run(mutants: int, seed: int = 0, vms: tuple = ("reference",), workers: int = 2, crash_at: int = -1,
        quiet: bool = False) -> Report:
    """Fuzz `mutants` mutants with `workers` processes."""
    ctx = mp.get_context("spawn")
    report = Report(mutants=mutants)
    todo = [(a, min(a + CHUNK, mutants)) for a in range(0, mutants, CHUNK)]
    running: list[_Slot] = []
    t0, shown = time.monotonic(), 0
    while todo or running:
        while todo and len(running) < workers:
            running.append(_Slot(ctx, seed, *todo.pop(0), vms, crash_at))
        time.sleep(0.05)
        for slot in list(running):
            _drain(slot, report)
            done = not slot.proc.is_alive()
            if not done and _stuck(slot):
                slot.proc.kill()
                slot.proc.join()
                report.hung.append(int(slot.state[_CURRENT]))
                done = True
            elif done and slot.proc.exitcode != 0:
                report.crashed.append(int(slot.state[_CURRENT]))
            if done:
                _drain(slot, report)
                _harvest(slot, report)
                running.remove(slot)
                if slot.proc.exitcode != 0 and int(slot.state[_CURRENT]) + 1 < slot.end:
                    todo.insert(0, (int(slot.state[_CURRENT]) + 1, slot.end))   # the rest of the chunk
        finished = sum(report.counts.values()) + len(report.crashed) + len(report.hung)
        if not quiet and finished >= shown + max(mutants // 20, 1):
            shown = finished
            print(f"[dvm fuzz programs] {finished}/{mutants} mutants, {time.monotonic() - t0:.0f} s", file=sys.stderr,
                  flush=True)
    report.seconds = time.monotonic() - t0
    report.verify_mean_us /= max(sum(report.counts.values()), 1)
    report.worst = sorted(report.worst, reverse=True)[:RETIMED]
    step = max(1, mutants // SAMPLED)
    report.sampled = retime(range(0, mutants, step), seed, repeats=1)
    slowest_sampled = sorted(report.sampled, key=lambda r: -r[2])[:RETIMED // 4]
    report.retimed = retime(sorted({i for _, i in report.worst} | {i for i, _, _ in slowest_sampled}), seed)
    return report


def _drain(slot: _Slot, report: Report) -> None:
    while slot.recv.poll():
        try:
            msg = slot.recv.recv()
        except (EOFError, OSError):
            return
        if msg is not None:
            report.failures.append(msg)


def _stuck(slot: _Slot) -> bool:
    """The worker has been on one mutant for more than HANG_S."""
    current = int(slot.state[_CURRENT])
    if current != slot.last_index:
        slot.last_index, slot.since = current, time.monotonic()
        return False
    return time.monotonic() - slot.since > HANG_S


def retime(indices, seed: int, repeats: int = RETIME_REPEATS) -> list[tuple[int, int, float]]:
    """Verify each of these mutants again in this process, with no VM running beside it and the
    verifier's caches cleared each time: (index, words, best of `repeats` in microseconds), what
    the verifier costs without a busy machine's stalls."""
    import dvm
    from ..codegen import verifier_stream
    from ..codegen.program import Program
    from . import fuzz_corpus, fuzz_mutate
    corpus = fuzz_corpus.build_corpus()
    for s in corpus:   # the process's first verifications pay for lazy imports and first calls
        dvm.verify(Program(s.program.words))
    out = []
    for i in indices:
        _, words, _ = fuzz_mutate.mutant(corpus, seed, i)
        best = None
        for _ in range(repeats):
            verifier_stream.STREAMS.clear()
            prog = Program(words)
            t0 = time.perf_counter_ns()
            try:
                dvm.verify(prog)
            except dvm.VerifyError:
                pass
            ns = time.perf_counter_ns() - t0
            best = ns if best is None else min(best, ns)
        out.append((i, len(words), best / 1e3))
    return out


def markdown(report: Report, vms: tuple, seed: int, workers: int) -> str:
    c = report.counts
    lines = [f"`dvm fuzz programs --mutants {report.mutants} --seed {seed} --vms {','.join(vms)} "
             f"--workers {workers}`: {report.seconds:.0f} s", "",
             "| mutants | rejected | ran correctly | zerodiv (data) | skipped (too big to run) | crashed | hung | "
             "canary touched | differ from reference | other errors |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
             f"| {report.mutants} | {c['rejected']} | {c['ran']} | {c['zerodiv']} | {c['skipped']} | "
             f"{len(report.crashed)} | {len(report.hung)} | {c['canary']} | {c['mismatch']} | {c['error']} |", "",
             f"Verifier time per Program: mean {report.verify_mean_us:.1f} us; p99 < "
             f"{quantile_us(report.verify_hist, 0.99):.0f} us, p99.99 < {quantile_us(report.verify_hist, 0.9999):.0f} us; "
             f"worst {report.verify_max_us:.0f} us (Programs under {SMALL_WORDS} words: worst "
             f"{report.verify_max_small_us:.0f} us), as timed in the run, stalls of a busy machine included."]
    if report.sampled:
        times = sorted(t for _, _, t in report.sampled)
        small = [t for _, n, t in report.sampled if n < SMALL_WORDS]
        lines.append(f"{len(times)} mutants spread over the run, verified again alone with cold caches: p50 "
                     f"{times[len(times) // 2]:.0f} us, p99 {times[int(len(times) * 0.99)]:.0f} us, worst {times[-1]:.0f} us"
                     + (f" (under {SMALL_WORDS} words: worst {max(small):.0f} us)" if small else "") + ".")
    if report.retimed:
        small = [t for _, n, t in report.retimed if n < SMALL_WORDS]
        lines.append(f"The {len(report.retimed)} slowest (in the run or in the sample), verified again alone with cold "
                     f"caches (best of "
                     f"{RETIME_REPEATS}): worst {max(t for _, _, t in report.retimed):.0f} us"
                     + (f", under {SMALL_WORDS} words {max(small):.0f} us" if small else "") + ".")
    for i in report.crashed:
        lines.append(f"- crashed: mutant {i} (replay: dvm fuzz programs --seed {seed} --replay {i})")
    for i in report.hung:
        lines.append(f"- hung: mutant {i}")
    for i, kind, detail, base, desc in report.failures[:50]:
        lines.append(f"- {kind}: mutant {i} of {base} ({desc}): {detail}")
    return "\n".join(lines)


def replay(index: int, seed: int, vms: tuple) -> str:
    """What mutant `index` of the run `seed` is and what happens to it (in this process)."""
    from . import fuzz_corpus, fuzz_mutate, fuzz_run
    corpus = fuzz_corpus.build_corpus()
    base, words, desc = fuzz_mutate.mutant(corpus, seed, index)
    out = fuzz_run.run_mutant(words, base.inputs, vms, np.random.default_rng([seed, index, 1]))
    return f"mutant {index} of {base.name}: {desc}\n{len(words)} words; {out.kind}" + \
        (f": {out.detail}" if out.detail else "") + f" (verify {out.verify_ns / 1e3:.1f} us)"
