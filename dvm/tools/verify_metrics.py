"""Accuracy metrics and the two verdict rules of the verification mode (tools/verify).

A result `a` (DVM's, or eager PyTorch's in the same dtype) is measured against the float64
reference `r` computed from the same inputs:

  max_abs      max |a - r| over finite elements
  max_rel      max |a - r| / |r| over "normal" elements (finite, |r| >= the dtype's small value)
  mean_rel     the mean of the same
  rmse         sqrt(mean((a - r)^2)) over elements where both are finite
  cosine       cosine similarity of a and r (1 when both are all zero)
  over_1e3     share of elements with |a - r| / max(|r|, small value) > 1e-3 ("one in a thousand")
  small_err    share of small elements (|r| < small value) with |a - r| > the small-value atol
  nonfinite    elements whose NaN / +-inf pattern differs from r's

Two published rules decide whether DVM's error is acceptable next to eager's:

* PyTorch's `same()` (torch/_dynamo/utils.py, the rule of Dynamo's accuracy minifier and
  benchmark harness): pass when allclose(eager, dvm, rtol=tol, atol=tol), else when
  RMSE(dvm vs f64) <= multiplier * RMSE(eager vs f64) + tol / 10, the multiplier 3.0 for
  f16/bf16 results, 2.0 otherwise, 3.0 also for fewer than 1000 elements or tol >= 2e-2
  (`same_rule`; tests/test_verify_metrics.py checks it against torch's own `same`).
* The NPU operator accuracy benchmark ("benchmark comparison" of Ascend's accuracy tools):
  DVM's error over eager's, both against the f64 reference: RMSE ratio <= 1.5, mean relative
  error ratio <= 1.5, max relative error ratio <= 5, small-value error ratio <= 2, with
  small-value thresholds per dtype (`SMALL_VALUE`, `SMALL_VALUE_ATOL`: msprobe's
  StandardConfig). A ratio's terms are floored at one rounding of the dtype (an error below
  the unit roundoff u, or u * max(RMS(r), small value) for the RMSE, or one small element,
  cannot be told from correct rounding), so that an exact eager result does not make the ratio
  infinite. Outputs computed through an additive reduction (sums, means, softmax, norms and
  their gradients: `accumulating`) take the small value of msprobe's accumulative-error
  standard, 1: their elements below 1 in magnitude are judged by absolute error only, as a sum
  of mixed-sign terms that cancels to near zero has a relative error that measures the
  cancellation, not the kernel. Measured: a bias gradient (64 sums of 34 terms) gave DVM / eager
  mean-relative-error ratios from 0.5 to 3 over input draws with DVM's pairwise tree at parity
  on average; an RMSNorm input gradient (x * (g - mean(g * x) ...)) a max-relative-error ratio
  of 7.3 at equal RMSE (ratio 1.0), from one element near zero.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch

# msprobe StandardConfig (Ascend accuracy tools): |golden| below this is a "small value" ...
SMALL_VALUE = {torch.float16: 1e-3, torch.bfloat16: 1e-3, torch.float32: 1e-6, torch.float64: 1e-6}
# ... and for those an absolute error above this counts as an error
SMALL_VALUE_ATOL = {torch.float16: 1e-5, torch.bfloat16: 1e-5, torch.float32: 1e-9, torch.float64: 1e-9}
# msprobe's small value for its accumulative-error standard (reductions), every dtype
ACCUMULATIVE_SMALL_VALUE = 1.0
# unit roundoff 2^-p (p: significand bits): the error of one correct rounding, relative
UNIT_ROUNDOFF = {torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8, torch.float32: 2.0 ** -24,
                 torch.float64: 2.0 ** -53}
# same()'s tol: its default (1e-4) for f32/f64; 1e-3 for f16/bf16, the tolerance PyTorch's
# benchmark harness passes for half-precision runs
SAME_TOL = {torch.float16: 1e-3, torch.bfloat16: 1e-3, torch.float32: 1e-4, torch.float64: 1e-4}
# the NPU accuracy benchmark's ratio limits (DVM's error / eager's error)
NPU_LIMITS = {"rmse": 1.5, "mean_rel": 1.5, "max_rel": 5.0, "small_err": 2.0}
REL_SHARE_LIMIT = 1e-3   # the "one in a thousand" relative error


@dataclass
class Metrics:
    numel: int
    max_abs: float
    max_rel: float
    mean_rel: float
    rmse: float
    cosine: float
    over_1e3: float
    small_err: float
    n_small: int
    nonfinite: int
    ref_rms: float      # RMS of the reference's finite elements (the RMSE floor's scale)
    small_value: float  # |r| below this: a small value

    def as_dict(self) -> dict:
        return {k: _json_float(v) for k, v in asdict(self).items()}


def _json_float(v):
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return v


def is_float(dtype: torch.dtype) -> bool:
    return dtype.is_floating_point


def small_value_of(dtype: torch.dtype, accumulating: bool = False) -> float:
    return ACCUMULATIVE_SMALL_VALUE if accumulating else SMALL_VALUE.get(dtype, SMALL_VALUE[torch.float32])


def metrics(actual: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, accumulating: bool = False) -> Metrics:
    """actual (any float dtype) against ref (float64, same shape); dtype: the result's dtype,
    which picks the small-value thresholds (accumulating: a reduction's result, see above)."""
    a = actual.detach().to(torch.float64).reshape(-1)
    r = ref.detach().to(torch.float64).reshape(-1)
    n = r.numel()
    small_value = small_value_of(dtype, accumulating)
    if n == 0:
        return Metrics(0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0, 0, 0.0, small_value)
    fin_r, fin_a = torch.isfinite(r), torch.isfinite(a)
    nonfinite = int(((fin_r != fin_a) | (~fin_r & ~fin_a & ~((a == r) | (a.isnan() & r.isnan())))).sum())
    both = fin_r & fin_a
    diff = torch.where(both, (a - r).abs(), torch.zeros_like(r))
    small = both & (r.abs() < small_value)
    normal = both & ~small
    rel = diff[normal] / r[normal].abs()
    clamped = diff / r.abs().clamp_min(small_value)
    n_both, n_small = int(both.sum()), int(small.sum())
    rs = r[both]
    norms = float(a[both].norm()) * float(rs.norm())
    cosine = 1.0 if norms == 0.0 and float(diff.max()) == 0.0 else \
        (float((a[both] * rs).sum()) / norms if norms > 0 else 0.0)
    return Metrics(
        numel=n,
        max_abs=float(diff.max()),
        max_rel=float(rel.max()) if rel.numel() else 0.0,
        mean_rel=float(rel.mean()) if rel.numel() else 0.0,
        rmse=math.sqrt(float((diff[both] ** 2).mean())) if n_both else 0.0,
        cosine=cosine,
        over_1e3=float((clamped[both] > REL_SHARE_LIMIT).sum()) / n,
        small_err=float((diff[small] > SMALL_VALUE_ATOL.get(dtype, 1e-9)).sum()) / n_small if n_small else 0.0,
        n_small=n_small,
        nonfinite=nonfinite,
        ref_rms=math.sqrt(float((rs ** 2).mean())) if n_both else 0.0,
        small_value=small_value,
    )


# -- PyTorch's same() ---------------------------------------------------------------------------
def same_multiplier(dtype: torch.dtype, numel: int, tol: float) -> float:
    """The multiplier torch._dynamo.utils.same applies to eager's RMSE (its defaults:
    use_larger_multiplier_for_smaller_tensor and force_max_multiplier off; the 4-d 1x1 case is
    a convolution's and never a DVM result's)."""
    if numel < 1000 or tol >= 2e-2:
        return 3.0
    return 3.0 if dtype in (torch.float16, torch.bfloat16) else 2.0


def same_rule(eager: torch.Tensor, dvm: torch.Tensor, fp64: torch.Tensor, tol: float | None = None) -> dict:
    """PyTorch's same() verdict for a float result, with equal_nan=True (a NaN where eager has
    one is not an error): {"pass", "allclose", "rmse_dvm", "rmse_eager", "multiplier", "tol"}."""
    tol = SAME_TOL.get(dvm.dtype, 1e-4) if tol is None else tol
    out = {"tol": tol, "multiplier": same_multiplier(dvm.dtype, fp64.numel(), tol)}
    out["allclose"] = bool(torch.allclose(eager, dvm, rtol=tol, atol=tol, equal_nan=True))
    f64 = fp64.to(torch.float64)
    out["rmse_dvm"] = _rmse(f64, dvm)
    out["rmse_eager"] = _rmse(f64, eager)
    if out["allclose"]:
        out["pass"] = True
        return out
    bound = out["multiplier"] * out["rmse_eager"] + tol / 10.0
    # same() also passes a result that is finite and close to fp64 where eager has NaNs
    nan_fix = not f64.isnan().any() and not dvm.isnan().any() and eager.isnan().any() and \
        bool(torch.allclose(f64.to(dvm.dtype), dvm, rtol=4e-2, atol=4e-2))
    both_nan = math.isnan(out["rmse_dvm"]) and math.isnan(out["rmse_eager"])
    out["pass"] = bool(out["rmse_dvm"] <= bound or nan_fix or both_nan)
    return out


def _rmse(ref64: torch.Tensor, res: torch.Tensor) -> float:
    if ref64.numel() == 0:
        return 0.0
    return float(torch.sqrt(torch.mean(torch.square(ref64 - res.to(torch.float64)))))


# -- the NPU accuracy benchmark ratios ---------------------------------------------------------
def npu_ratios(dvm: Metrics, eager: Metrics, dtype: torch.dtype) -> dict:
    """DVM's error over eager's for each ratio metric, each term floored at one rounding."""
    u = UNIT_ROUNDOFF.get(dtype, UNIT_ROUNDOFF[torch.float32])
    rmse_floor = u * max(eager.ref_rms, dvm.ref_rms, dvm.small_value)
    small_floor = 1.0 / dvm.n_small if dvm.n_small else 1.0
    return {"rmse": _ratio(dvm.rmse, eager.rmse, rmse_floor),
            "mean_rel": _ratio(dvm.mean_rel, eager.mean_rel, u),
            "max_rel": _ratio(dvm.max_rel, eager.max_rel, u),
            "small_err": _ratio(dvm.small_err, eager.small_err, small_floor)}


def _ratio(x: float, y: float, floor: float) -> float:
    if math.isnan(x):
        return math.inf if not math.isnan(y) else 1.0
    if floor <= 0.0:
        return 1.0 if x <= y else math.inf
    return max(x, floor) / max(y, floor)


def npu_rule(ratios: dict, dvm: Metrics, eager: Metrics) -> bool:
    """Every ratio within its limit, and no more non-finite mismatches than eager's."""
    return all(ratios[k] <= lim for k, lim in NPU_LIMITS.items()) and dvm.nonfinite <= eager.nonfinite


def compare(dvm: torch.Tensor, eager: torch.Tensor, fp64: torch.Tensor, accumulating: bool = False) -> dict:
    """Both results of one output against the f64 reference, and both verdicts (accumulating:
    the output is a reduction's result). Integer and bool results: exact; DVM passes when it
    equals eager or has no more mismatches against the f64 computation than eager."""
    if not is_float(dvm.dtype):
        wrong_dvm = int((dvm != fp64.to(dvm.dtype)).sum())
        wrong_eager = int((eager != fp64.to(eager.dtype)).sum())
        ok = bool(torch.equal(dvm, eager)) or wrong_dvm <= wrong_eager
        return {"dtype": str(dvm.dtype).replace("torch.", ""), "numel": dvm.numel(), "exact": True,
                "mismatch_dvm": wrong_dvm, "mismatch_eager": wrong_eager, "same": ok, "npu": ok}
    m_dvm = metrics(dvm, fp64, dvm.dtype, accumulating)
    m_eager = metrics(eager, fp64, dvm.dtype, accumulating)
    ratios = npu_ratios(m_dvm, m_eager, dvm.dtype)
    same = same_rule(eager, dvm, fp64)
    return {"dtype": str(dvm.dtype).replace("torch.", ""), "numel": dvm.numel(), "exact": False,
            "accumulating": accumulating, "dvm": m_dvm.as_dict(), "eager": m_eager.as_dict(),
            "ratios": {k: _json_float(v) for k, v in ratios.items()},
            "same_detail": {k: _json_float(v) for k, v in same.items()},
            "same": same["pass"], "npu": npu_rule(ratios, m_dvm, m_eager)}


def badness(c: dict) -> float:
    """How bad one comparison is, for sorting (worst first): failures first, then the largest
    NPU ratio."""
    fail = 0.0 if (c["same"] and c["npu"]) else 1e9
    if c.get("exact"):
        return fail + c["mismatch_dvm"]
    return fail + max(float(v) for v in c["ratios"].values())   # ("inf" strings too)
