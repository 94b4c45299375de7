"""The accuracy verification mode: every DVM kernel launch of the torch backend checked against
PyTorch eager in the same dtype and against float64, as it runs.

A VerifySession is installed as the segment runtime's observer (frontend/torch_segment.VERIFY).
After each launch of a segment (one Program: the segment's vector kernels, sequence-stacked) it
recomputes the segment's outputs from the same input tensors twice with PyTorch (tools/
verify_eval): in the graph's dtypes (eager) and in float64, measures DVM's and eager's results
against the float64 one and applies both verdict rules (tools/verify_metrics). A kernel is
reported once, over all of its launches: its worst launch's metrics, and how many launches failed
each rule. The first failing launch of a kernel writes a reproducer (tools/verify_repro) that
`dvm repro FILE` replays on every VM.

Entry points: `dvm.verify(model_or_fn, *inputs)` (returns a VerifyReport), `with session():`,
`DVM_VERIFY=1` (a process-wide session from the first segment compiled; the summary is printed
on stderr at exit and written, with the reproducers, to DVM_DUMP_DIR or ./dvm-verify), and
`dvm verify --model NAME` (tools/verify_models).
"""
from __future__ import annotations

import atexit
import contextlib
import math
import os
import re
import sys
import threading
from dataclasses import dataclass, field

import numpy as np
import torch

from ..codegen.encoder import NeedsCopy
from ..config import config
from ..frontend import torch_segment
from ..frontend.torch_launch import to_numpy
from ..frontend.torch_runtime import COMPILED
from ..graph.symbolic import evaluate
from ..runtime import counters
from ..runtime.compiled import as_buffer
from . import verify_repro
from .verify_eval import SegmentEval
from .verify_metrics import badness, compare

DEFAULT_DIR = "dvm-verify"


@dataclass
class KernelRecord:
    """One segment (one Program, one VM launch per call) over all its verified calls."""
    runner: object
    name: str
    ops: dict = field(default_factory=dict)
    calls: int = 0
    same_failures: int = 0
    npu_failures: int = 0
    worst: list = field(default_factory=list)     # comparisons (one per output) of the worst call
    worst_badness: float = -1.0
    worst_sizes: dict = field(default_factory=dict)
    repro: str | None = None
    unverified: str | None = None

    @property
    def passed(self) -> bool:
        return self.unverified is None and self.same_failures == 0 and self.npu_failures == 0

    def row(self) -> dict:
        worst = max(self.worst, key=badness) if self.worst else None
        return {"kernel": self.name, "vector_kernels": self.runner.n_kernels, "ops": self.ops,
                "calls": self.calls, "same_failures": self.same_failures, "npu_failures": self.npu_failures,
                "passed": self.passed, "unverified": self.unverified, "repro": self.repro,
                "sizes": self.worst_sizes, "outputs": self.worst, "worst_output": worst}


class VerifySession:
    """The observer the segment runtime calls after each launch (see the module doc). It keeps
    the segments it saw alive (their records refer to them) for as long as it lives; launches
    are verified one at a time (a lock)."""

    def __init__(self, repro_dir: str | None = DEFAULT_DIR, label: str = ""):
        self.repro_dir, self.label = repro_dir, label
        self.records: dict[int, KernelRecord] = {}
        self._evals: dict[int, SegmentEval] = {}
        self._graphs: dict[int, str] = {}
        self._lock = threading.RLock()

    def __call__(self, runner, env: dict, tensors, outs) -> None:
        with self._lock:
            rec = self._record(runner)
            try:
                self._check(rec, runner, env, tensors, outs)
            except Exception as e:  # noqa: BLE001 - reported per kernel, never a failed run
                rec.unverified = f"{type(e).__name__}: {e}"
                counters.bump("verify_unverified")

    def _record(self, runner) -> KernelRecord:
        rec = self.records.get(id(runner))
        if rec is None:
            rec = self.records[id(runner)] = KernelRecord(runner, self._name(runner))
        return rec

    def _name(self, runner) -> str:
        """'<graph kind>#<n>/seg<i>': the n-th ATen graph this session saw, its i-th segment."""
        for g in reversed(COMPILED):
            for i, s in enumerate(g.segments):
                if s is runner:
                    label = self._graphs.setdefault(id(g), f"{g.kind}#{len(self._graphs)}")
                    return f"{label}/seg{i}"
        return f"segment@{id(runner):x}"

    def _check(self, rec: KernelRecord, runner, env: dict, tensors, outs) -> None:
        ev = self._evals.get(id(runner))
        if ev is None:
            ev = self._evals[id(runner)] = SegmentEval(runner)
        eager = ev.run(env, tensors, f64=False)
        if not rec.ops:
            rec.ops = {k: v for k, v in ev.ops.most_common() if k != "getitem"}
        ref = ev.run(env, tensors, f64=True)
        comps = []
        for (_, fxn), d, e, r in zip(ev.outputs, ev.dvm_values(outs), eager, ref):
            c = compare(d, e, r, ev.accumulating(fxn))
            c["output"] = fxn.name
            comps.append(c)
        rec.calls += 1
        counters.bump("verify_launches")
        same_ok, npu_ok = all(c["same"] for c in comps), all(c["npu"] for c in comps)
        rec.same_failures += not same_ok
        rec.npu_failures += not npu_ok
        bad = max((badness(c) for c in comps), default=0.0)
        if bad > rec.worst_badness:
            rec.worst, rec.worst_badness, rec.worst_sizes = comps, bad, dict(env)
        if not (same_ok and npu_ok):
            counters.bump("verify_failures")
            if rec.repro is None and self.repro_dir:
                rec.repro = self._write_repro(rec, ev, runner, env, tensors, outs, eager, ref)

    def _write_repro(self, rec, ev, runner, env, tensors, outs, eager, ref) -> str:
        prog, bufs = launch_program(runner, env, tensors)
        graph = runner.graph
        outputs = [(tuple(int(evaluate(d, env)) for d in o.shape), o.dtype.np_dtype) for o in graph.outputs]
        workspaces = [(int(np.prod([evaluate(d, env) for d in w.shape], dtype=np.int64)), w.dtype.np_dtype)
                      for w in graph.plan.workspaces]
        expected, eager_k, captured = {}, {}, {}
        for (k, _), e, r in zip(ev.outputs, eager, ref):
            if k in expected:
                continue
            inv = ev.perms[k]   # the launch's output k is stored in its own order
            perm = None if inv is None else tuple(inv.index(i) for i in range(len(inv)))
            expected[k] = _np(r if perm is None else r.permute(perm))
            eager_k[k] = _np(e if perm is None else e.permute(perm))
            captured[k] = _np(outs[k])
        safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{self.label}-{rec.name}" if self.label else rec.name)
        path = os.path.join(self.repro_dir, f"{safe}-{prog.digest}.npz")
        accumulating = {str(k): ev.accumulating(fxn) for k, fxn in ev.outputs}
        meta = {"kernel": rec.name, "label": self.label, "ops": rec.ops, "vm": config().vm,
                "sizes": {k: int(v) for k, v in env.items()}, "accumulating": accumulating}
        counters.bump("verify_repros")
        return verify_repro.write(path, prog, bufs, outputs, workspaces, expected, eager_k, captured, meta)

    # -- the report -----------------------------------------------------------------------------
    def report(self) -> "VerifyReport":
        with self._lock:
            recs = sorted(self.records.values(), key=lambda r: (r.passed, -r.worst_badness))
            return VerifyReport([r.row() for r in recs], self.label)


def _np(t: torch.Tensor) -> np.ndarray:
    return np.ascontiguousarray(to_numpy(t.detach().contiguous()))


def _encode_for(vm: str) -> tuple:
    """CompiledGraph.program's arguments after sizes and layouts that pick the Program `vm` runs:
    the VM's codegen Target (vm/registry)."""
    from ..vm import registry
    return (registry.get(vm).target,)


def launch_program(runner, env: dict, tensors) -> tuple:
    """The Program a launch of `runner` ran on these tensors and its input buffers (the 1-D
    spans as_buffer gives the VM), found the way the launch path finds it (runtime.compiled)."""
    arrays = [c(t) for c, t in zip(runner.launch.convert, tensors)]
    extra = _encode_for(config().vm)
    for _ in range(len(arrays) + 1):
        bufs, layouts = zip(*[as_buffer(a) for a in arrays]) if arrays else ((), ())
        try:
            return runner.graph.program(env, layouts, *extra), list(bufs)
        except NeedsCopy as e:   # the launch path copies such an input row-major too
            arrays[e.slot] = np.ascontiguousarray(arrays[e.slot])
    raise RuntimeError("no Program for this launch")  # pragma: no cover - NeedsCopy per slot at most


# -- report -------------------------------------------------------------------------------------
def _fmt(v, digits: int = 2) -> str:
    if v is None:
        return "—"
    if isinstance(v, str):
        return v
    if isinstance(v, bool):
        return "pass" if v else "FAIL"
    if isinstance(v, int):
        return str(v)
    if not math.isfinite(v):
        return str(v)
    if v == 0:
        return "0"
    return f"{v:.{digits}e}" if abs(v) < 1e-2 or abs(v) >= 1e4 else f"{v:.{digits + 1}g}"


def ops_text(ops: dict, limit: int = 8) -> str:
    items = [f"{k}x{v}" if v > 1 else k for k, v in ops.items()]
    return ", ".join(items[:limit]) + (f", +{len(items) - limit} more" if len(items) > limit else "")


HEADER = ("| kernel | dtype | calls | DVM max abs | DVM max rel | DVM mean rel | DVM RMSE | DVM cos | DVM >1e-3 "
          "| eager max abs | eager max rel | eager mean rel | eager RMSE | eager >1e-3 "
          "| ratio RMSE | ratio mean rel | ratio max rel | ratio small | same() | NPU | ATen ops |")


def _row_md(r: dict) -> str:
    c = r["worst_output"]
    head = f"| {r['kernel']} ({r['vector_kernels']} vk) "
    if r["unverified"] or c is None:
        return head + f"| — | {r['calls']} | not verified: {r['unverified']} " + "| " * 17 + \
            f"{ops_text(r['ops'])} |"
    same = "pass" if not r["same_failures"] else f"FAIL {r['same_failures']}/{r['calls']}"
    npu = "pass" if not r["npu_failures"] else f"FAIL {r['npu_failures']}/{r['calls']}"
    if c["exact"]:
        cells = [f"{c['mismatch_dvm']} wrong", "", "", "", "", "", f"{c['mismatch_eager']} wrong", "", "", "", "",
                 "", "", "", ""]
    else:
        d, e, q = c["dvm"], c["eager"], c["ratios"]
        cells = [_fmt(d["max_abs"]), _fmt(d["max_rel"]), _fmt(d["mean_rel"]), _fmt(d["rmse"]),
                 f"{float(d['cosine']):.6f}", _fmt(d["over_1e3"]), _fmt(e["max_abs"]), _fmt(e["max_rel"]),
                 _fmt(e["mean_rel"]), _fmt(e["rmse"]), _fmt(e["over_1e3"]),
                 *[_fmt(float(q[k])) for k in ("rmse", "mean_rel", "max_rel", "small_err")]]
    return head + f"| {c['dtype']} | {r['calls']} | " + " | ".join(cells) + f" | {same} | {npu} | {ops_text(r['ops'])} |"


class VerifyReport:
    """The kernels a session verified, worst first (failing kernels, then by the largest NPU
    ratio of their worst launch). `passed`: every kernel verified and passing both rules."""

    def __init__(self, rows: list[dict], label: str = ""):
        self.rows, self.label = rows, label
        self.output = None    # the verified call's result (dvm.verify)

    @property
    def passed(self) -> bool:
        return all(r["passed"] for r in self.rows)

    def failures(self) -> list[dict]:
        return [r for r in self.rows if not r["passed"]]

    def summary(self) -> dict:
        n = len(self.rows)
        return {"kernels": n, "launches": sum(r["calls"] for r in self.rows),
                "same_pass": sum(1 for r in self.rows if not r["same_failures"] and not r["unverified"]),
                "npu_pass": sum(1 for r in self.rows if not r["npu_failures"] and not r["unverified"]),
                "unverified": sum(1 for r in self.rows if r["unverified"]),
                "passed": self.passed}

    def markdown(self) -> str:
        s = self.summary()
        title = f"{self.label}: " if self.label else ""
        lines = [f"{title}{s['kernels']} kernels ({s['launches']} launches): same() pass {s['same_pass']}/"
                 f"{s['kernels']}, NPU ratios pass {s['npu_pass']}/{s['kernels']}"
                 + (f", {s['unverified']} not verified" if s["unverified"] else ""), "",
                 HEADER, "|" + "---|" * HEADER.count(" | ") + "---|"]
        lines += [_row_md(r) for r in self.rows]
        repros = [f"- {r['kernel']}: reproducer {r['repro']}" for r in self.rows if r["repro"]]
        return "\n".join(lines + ([""] + repros if repros else []))

    def as_json(self) -> dict:
        return {"label": self.label, "summary": self.summary(), "kernels": self.rows}


# -- sessions -----------------------------------------------------------------------------------
@contextlib.contextmanager
def session(repro_dir: str | None = DEFAULT_DIR, label: str = ""):
    """Verify every segment launch inside the block; yields the VerifySession."""
    s = VerifySession(repro_dir, label)
    prev, torch_segment.VERIFY = torch_segment.VERIFY, s
    try:
        yield s
    finally:
        torch_segment.VERIFY = prev


def verify(model_or_fn, *inputs, repro_dir: str | None = DEFAULT_DIR, label: str = "", **kwargs) -> VerifyReport:
    """Run model_or_fn(*inputs, **kwargs) compiled with the DVM backend (as given when it is
    compiled already, else torch.compile(backend="dvm", dynamic=True)), verifying every kernel
    launch; returns the VerifyReport (its `output`: the call's result)."""
    from torch._dynamo.eval_frame import OptimizedModule

    from ..frontend.torch_backend import compile as dvm_compile
    done = isinstance(model_or_fn, OptimizedModule) or hasattr(model_or_fn, "_torchdynamo_orig_callable")
    compiled = model_or_fn if done else dvm_compile(model_or_fn)
    with session(repro_dir, label) as s:
        out = compiled(*inputs, **kwargs)
    report = s.report()
    report.output = out
    return report


_ENV_SESSION: list = []


def install_from_env() -> VerifySession:
    """DVM_VERIFY=1: one session for the process, its summary written at exit."""
    if _ENV_SESSION:
        return _ENV_SESSION[0]
    folder = config().dump_dir or DEFAULT_DIR
    s = VerifySession(folder, "DVM_VERIFY")
    torch_segment.VERIFY = s
    _ENV_SESSION.append(s)
    atexit.register(_at_exit, s, folder)
    return s


def _at_exit(s: VerifySession, folder: str) -> None:
    from .bench_common import write_json, write_text
    report = s.report()
    text = report.markdown()
    print(text, file=sys.stderr)
    write_json(os.path.join(folder, "verify.json"), report.as_json())
    write_text(os.path.join(folder, "verify.md"), text)
    print(f"dvm verify: wrote {folder}/verify.json and verify.md", file=sys.stderr)


__all__ = ["VerifySession", "VerifyReport", "session", "verify", "install_from_env", "launch_program"]
