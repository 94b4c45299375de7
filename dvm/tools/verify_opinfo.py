"""PyTorch's OpInfo samples through torch.compile(backend="dvm"), against eager, as Inductor's
OpInfo test (test/inductor/test_torchinductor_opinfo.py) runs them through Inductor.

For each selected op of PyTorch's op_db (unary, binary, reduction, norm and activation ops: OPS)
and each dtype (float32, bfloat16, float16), the op's sample inputs (`op.sample_inputs`, the
random state seeded per op and dtype) run eagerly and compiled (dynamic=True); results are
compared with torch.testing.assert_close's default tolerances for the dtype, NaNs equal. The test
suite runs a fixed subset: the first DEFAULT_SAMPLES samples per op and dtype, and the samples of
EXPECTED; `dvm verify opinfo --full` runs every sample (1635 with the selection below; on a 2-core
host about 6 minutes), `--samples N` the first N.

A result outside the tolerance is either listed in EXPECTED, or a failure. Every listed difference
is checked with the verification mode: its decision is MORE_ACCURATE, keep DVM's result (DVM
rounds once, to the result's dtype, where eager rounds an intermediate to the narrow dtype too;
docs/DECISIONS.md): the sample passes when DVM's error against float64 is no larger than eager's,
in max abs error and in RMSE, on that sample.
"""
from __future__ import annotations

import sys
import time

from .bench_common import finish_report, loadavg, machine_info, progress

DTYPES = ("float32", "bfloat16", "float16")
DEFAULT_SAMPLES = 1
OPS = {
    "unary": ("abs", "neg", "exp", "exp2", "expm1", "log", "log2", "log1p", "sqrt", "rsqrt", "reciprocal", "sin",
              "cos", "tanh", "sigmoid", "erf", "floor", "ceil", "round", "trunc", "sign", "square", "logical_not",
              "isnan", "isinf", "isfinite"),
    "binary": ("add", "sub", "mul", "rsub", "div.no_rounding_mode", "div.trunc_rounding", "div.floor_rounding",
               "true_divide", "maximum", "minimum", "max.binary", "min.binary", "clamp_min", "clamp_max",
               "remainder", "floor_divide", "pow", "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or",
               "logical_xor"),
    "reduction": ("sum", "mean", "prod", "amax", "amin", "argmax", "argmin", "var", "std"),
    "norm": ("softmax", "log_softmax", "nn.functional.softmin", "nn.functional.layer_norm", "nn.functional.rms_norm"),
    "activation": ("nn.functional.relu", "nn.functional.silu", "nn.functional.gelu", "nn.functional.elu",
                   "nn.functional.leaky_relu", "nn.functional.hardtanh", "nn.functional.relu6",
                   "nn.functional.softplus", "nn.functional.tanhshrink", "nn.functional.logsigmoid"),
}
MORE_ACCURATE = "keep DVM's result (no less accurate than eager's)"
_ALPHA = "a + alpha * b: eager rounds alpha * b to float16 first, DVM rounds the sum once (-21.984 where f64 " \
         "gives -21.978 and eager -21.969)"
_TRUNC = "eager rounds the quotient to the narrow dtype before truncating (17.99 -> 18 -> 18); DVM truncates " \
         "the float32 quotient (17), which is float64's answer"
_LOGSM = "eager rounds x - max and the log-sum to the narrow dtype; DVM keeps them in float32 (bf16 " \
         "worst element: DVM -12.81, eager -12.75, f64 -12.785)"
_LOGSM16 = "eager rounds x - max and the log-sum to float16, DVM keeps them in float32: results an ulp apart " \
           "with the same max error against f64 (0.0037) and DVM's RMSE equal or lower"
_TANHSHRINK = "x - tanh(x): eager rounds tanh(x) to bfloat16 before the subtraction, which cancels; DVM " \
              "subtracts in float32 (same max error against f64, RMSE 0.00163 vs 0.00164)"
# (op, dtype) -> (decision, reason, sample indices): the differences from eager the full run found
# (dvm verify opinfo --full), each decided; the test suite runs these samples
EXPECTED: dict = {
    ("add", "float16"): (MORE_ACCURATE, _ALPHA, (10,)),
    ("sub", "float16"): (MORE_ACCURATE, _ALPHA, (10,)),
    ("div.trunc_rounding", "bfloat16"): (MORE_ACCURATE, _TRUNC, (4, 5, 6, 7)),
    ("div.trunc_rounding", "float16"): (MORE_ACCURATE, _TRUNC, (6, 7)),
    ("log_softmax", "bfloat16"): (MORE_ACCURATE, _LOGSM, (2, 3, 4)),
    ("log_softmax", "float16"): (MORE_ACCURATE, _LOGSM16, (2, 3, 4)),
    ("nn.functional.tanhshrink", "bfloat16"): (MORE_ACCURATE, _TANHSHRINK, (0,)),
}


def op_name(op) -> str:
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


def selected(names=None) -> list:
    """The OpInfos of OPS (or of `names`), in OPS' order."""
    from torch.testing._internal.common_methods_invocations import op_db
    wanted = list(names) if names else [n for group in OPS.values() for n in group]
    by_name = {op_name(op): op for op in op_db}
    missing = [n for n in wanted if n not in by_name]
    if missing:
        raise ValueError(f"not in op_db: {', '.join(missing)}")
    return [by_name[n] for n in wanted]


def samples(op, dtype, limit: int | None, extra=()) -> list:
    """(index, sample) of the op's first `limit` sample inputs (all: None) and of those whose
    index is in `extra`, drawn from a fixed seed."""
    import torch
    if dtype not in op.supported_dtypes("cpu"):
        return []
    torch.manual_seed(0)
    last = None if limit is None else max([limit - 1, *extra])
    out = []
    for i, s in enumerate(op.sample_inputs("cpu", dtype, requires_grad=False)):
        if limit is None or i < limit or i in extra:
            out.append((i, s))
        if last is not None and i >= last:
            break
    return out


def suite_samples(op, dtype: str) -> list:
    """The test suite's fixed subset for op and dtype (a torch dtype's name)."""
    import torch
    extra = EXPECTED.get((op_name(op), dtype), (None, None, ()))[2]
    return samples(op, getattr(torch, dtype), DEFAULT_SAMPLES, extra)


def as_function(op, sample):
    """(fn, tensors): fn(*tensors) is op applied to the sample; its other arguments are constants."""
    import torch
    from torch.utils import _pytree as pytree
    leaves, spec = pytree.tree_flatten((sample.input, sample.args, sample.kwargs))
    slots = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]

    def fn(*tensors):
        vals = list(leaves)
        for i, t in zip(slots, tensors):
            vals[i] = t
        x, args, kwargs = pytree.tree_unflatten(vals, spec)
        return op(x, *args, **kwargs)
    return fn, [leaves[i] for i in slots]


def run_sample(op, dtype, sample) -> dict:
    """Eager against torch.compile(backend="dvm", dynamic=True) on one sample."""
    import torch

    from ..frontend import fx_lone_ops
    from ..runtime import counters
    fn, tensors = as_function(op, sample)
    want = fn(*tensors)
    torch._dynamo.reset()
    before = counters.snapshot().get("torch_segment_launches", 0)
    # DVM's own lowering of the op: alone, a cheap one would run as PyTorch's (fx_lone_ops)
    saved, fx_lone_ops.ENABLED = fx_lone_ops.ENABLED, False
    try:
        got = torch.compile(fn, backend="dvm", dynamic=True)(*tensors)
    finally:
        fx_lone_ops.ENABLED = saved
    on_dvm = counters.snapshot().get("torch_segment_launches", 0) > before
    try:
        torch.testing.assert_close(got, want, equal_nan=True)
        return {"status": "match", "on_dvm": on_dvm}
    except AssertionError as e:
        return {"status": "differs", "on_dvm": on_dvm, "message": " ".join(str(e).split())[:300],
                "shapes": [list(t.shape) for t in tensors], "accuracy": accuracy(fn, tensors)}


def accuracy(fn, tensors) -> dict:
    """DVM's and eager's errors against float64 on this sample (the verification mode)."""
    from .verify import verify
    report = verify(fn, *tensors, repro_dir=None, label="opinfo")
    worst = {"dvm_max_abs": 0.0, "eager_max_abs": 0.0, "dvm_rmse": 0.0, "eager_rmse": 0.0}
    for row in report.rows:
        for c in row["outputs"]:
            if c.get("exact"):
                worst["dvm_max_abs"] = max(worst["dvm_max_abs"], float(c["mismatch_dvm"]))
                worst["eager_max_abs"] = max(worst["eager_max_abs"], float(c["mismatch_eager"]))
                continue
            for who in ("dvm", "eager"):
                worst[f"{who}_max_abs"] = max(worst[f"{who}_max_abs"], float(c[who]["max_abs"]))
                worst[f"{who}_rmse"] = max(worst[f"{who}_rmse"], float(c[who]["rmse"]))
    worst["dvm_not_worse"] = worst["dvm_max_abs"] <= worst["eager_max_abs"] and worst["dvm_rmse"] <= worst["eager_rmse"]
    worst["kernels"] = len(report.rows)
    return worst


def judge(op, dtype: str, result: dict) -> str:
    """'match', 'expected' (a listed difference whose decision holds) or 'FAIL'."""
    if result["status"] == "match":
        return "match"
    decision = EXPECTED.get((op_name(op), dtype))
    if decision is not None and decision[0] == MORE_ACCURATE and result["accuracy"]["dvm_not_worse"]:
        return "expected"
    return "FAIL"


def main(limit: int | None = DEFAULT_SAMPLES, dtypes=None, ops=None, json_path: str | None = None,
         md_path: str | None = None, out=None) -> int:
    """limit: samples per op and dtype (None: all)."""
    import torch
    out = out or sys.stdout
    dtypes = dtypes or list(DTYPES)
    report = {"benchmark": "verify-opinfo", "machine": machine_info(), "loadavg": loadavg(),
              "samples_per_op": limit, "dtypes": dtypes, "cases": [], "failures": []}
    t0 = time.perf_counter()
    for op in selected(ops):
        for dtype in dtypes:
            extra = EXPECTED.get((op_name(op), dtype), (None, None, ()))[2] if limit is not None else ()
            for i, s in samples(op, getattr(torch, dtype), limit, extra):
                r = run_sample(op, dtype, s)
                verdict = judge(op, dtype, r)
                case = {"op": op_name(op), "dtype": dtype, "sample": i, "verdict": verdict, **r}
                report["cases"].append(case)
                if verdict == "FAIL":
                    report["failures"].append(f"{case['op']} {dtype} sample {i}: {r.get('message', '')}")
        progress("verify opinfo", f"{op_name(op)}: {sum(c['op'] == op_name(op) for c in report['cases'])} "
                 f"samples [{time.perf_counter() - t0:.0f} s]")
    return finish_report(report, markdown(report), None, json_path, md_path, None, out, "OpInfo sample(s)")


def markdown(report: dict) -> str:
    cases = report["cases"]
    n_dvm = sum(c["on_dvm"] for c in cases)
    counts = {v: sum(c["verdict"] == v for c in cases) for v in ("match", "expected", "FAIL")}
    lines = [f"OpInfo samples through torch.compile(backend='dvm', dynamic=True) vs eager (assert_close defaults): "
             f"{len(cases)} samples ({n_dvm} ran DVM kernels), {counts['match']} match, {counts['expected']} expected "
             f"differences, {counts['FAIL']} failures; samples per op and dtype: "
             f"{report['samples_per_op'] or 'all'}", ""]
    diffs = [c for c in cases if c["status"] == "differs"]
    if diffs:
        lines += ["| op | dtype | sample | verdict | DVM max abs err vs f64 | eager's | DVM RMSE | eager's | decision |",
                  "|---|---|---:|---|---:|---:|---:|---:|---|"]
        for c in diffs:
            a = c["accuracy"]
            why = EXPECTED.get((c["op"], c["dtype"]), ("—", "not listed", ()))
            lines.append(f"| {c['op']} | {c['dtype']} | {c['sample']} | {c['verdict']} | {a['dvm_max_abs']:.3g} | "
                         f"{a['eager_max_abs']:.3g} | {a['dvm_rmse']:.3g} | {a['eager_rmse']:.3g} | "
                         f"{why[0]}: {why[1]} |")
    return "\n".join(lines)


