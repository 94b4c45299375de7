"""The verification mode's metrics and rules (dvm.tools.verify_metrics): the same() rule agrees
with PyTorch's own torch._dynamo.utils.same; the metrics measure what they say."""
import math

import pytest

torch = pytest.importorskip("torch")
from torch._dynamo.utils import same as torch_same  # noqa: E402

from dvm.tools import verify_metrics as M  # noqa: E402

pytestmark = pytest.mark.vm_once


def _quiet(*args, **kwargs):
    pass


def _cases():
    """(eager, dvm, fp64) triples around same()'s decision boundary: sizes below and above
    1000 elements, f32 and bf16, DVM's error from 0.5x to 6x eager's."""
    g = torch.Generator().manual_seed(0)
    out = []
    for numel in (7, 999, 1000, 4096):
        for dtype in (torch.float32, torch.bfloat16):
            ref = torch.randn(numel, generator=g, dtype=torch.float64)
            noise = torch.randn(numel, generator=g, dtype=torch.float64)
            eager = (ref + 1e-3 * noise).to(dtype)
            for scale in (0.5, 1.0, 1.9, 2.1, 2.9, 3.1, 6.0):
                dvm = (ref + scale * 1e-3 * torch.randn(numel, generator=g, dtype=torch.float64)).to(dtype)
                out.append((eager, dvm, ref))
    return out


def test_same_rule_agrees_with_pytorch():
    verdicts = []
    for eager, dvm, ref in _cases():
        ours = M.same_rule(eager, dvm, ref)
        tol = ours["tol"]
        theirs = torch_same(eager, dvm, fp64_ref=ref, tol=tol, equal_nan=True, log_error=_quiet)
        assert ours["pass"] == theirs, (dvm.dtype, dvm.numel(), ours)
        verdicts.append(ours["pass"])
    assert any(verdicts) and not all(verdicts)   # both sides of the boundary were exercised


def test_same_multiplier_per_dtype_and_size():
    assert M.same_multiplier(torch.float32, 999, 1e-4) == 3.0
    assert M.same_multiplier(torch.float32, 1000, 1e-4) == 2.0
    assert M.same_multiplier(torch.bfloat16, 1000, 1e-3) == 3.0
    assert M.same_multiplier(torch.float32, 5000, 2e-2) == 3.0


def test_metrics_of_an_exact_result_are_zero():
    ref = torch.arange(-50, 51, dtype=torch.float64) / 4     # exact in float32
    m = M.metrics(ref.to(torch.float32), ref, torch.float32)
    assert m.max_abs == 0 and m.rmse == 0 and m.max_rel == 0 and m.cosine == pytest.approx(1.0)
    assert m.over_1e3 == 0 and m.nonfinite == 0


def test_metrics_measure_a_known_error():
    ref = torch.full((1000,), 2.0, dtype=torch.float64)
    actual = ref.clone()
    actual[:10] = 2.01                       # 1 % of the elements off by 0.5 %
    m = M.metrics(actual, ref, torch.float32)
    assert m.max_abs == pytest.approx(0.01)
    assert m.max_rel == pytest.approx(0.005)
    assert m.mean_rel == pytest.approx(0.005 * 10 / 1000)
    assert m.rmse == pytest.approx(math.sqrt(10 * 1e-4 / 1000))
    assert m.over_1e3 == pytest.approx(0.01)


def test_small_values_are_judged_by_absolute_error():
    ref = torch.tensor([1e-8, 1.0, -2e-7, 3.0], dtype=torch.float64)   # two below f32's small value 1e-6
    actual = ref.clone()
    actual[0] += 5e-9                        # > small-value atol 1e-9: an error
    actual[2] += 5e-10                       # < atol: not one
    m = M.metrics(actual, ref, torch.float32)
    assert m.n_small == 2 and m.small_err == 0.5
    assert m.max_rel == 0.0                  # relative errors only over the normal values


def test_nonfinite_mismatches_are_counted():
    ref = torch.tensor([1.0, math.inf, math.nan, -math.inf], dtype=torch.float64)
    actual = torch.tensor([1.0, math.inf, math.nan, math.inf], dtype=torch.float64)
    assert M.metrics(actual, ref, torch.float32).nonfinite == 1


def test_npu_ratios_floor_at_one_rounding():
    ref = torch.linspace(1, 2, 100, dtype=torch.float64)
    exact = M.metrics(ref, ref, torch.float32)
    rounded = M.metrics(ref.to(torch.float32), ref, torch.float32)
    ratios = M.npu_ratios(rounded, exact, torch.float32)   # eager exact, DVM correctly rounded
    assert all(r <= 1.0 for r in ratios.values())
    off = M.metrics(ref * (1 + 1e-4), ref, torch.float32)
    assert M.npu_ratios(off, rounded, torch.float32)["rmse"] > 100


def test_compare_catches_a_wrong_result_by_both_rules():
    g = torch.Generator().manual_seed(1)
    ref = torch.randn(4096, generator=g, dtype=torch.float64)
    eager = ref.to(torch.float32)
    wrong = (ref * 1.001).to(torch.float32)
    c = M.compare(wrong, eager, ref)
    assert not c["same"] and not c["npu"]
    ok = M.compare(eager.clone(), eager, ref)
    assert ok["same"] and ok["npu"]


def test_accumulating_outputs_use_the_accumulative_small_value():
    ref = torch.tensor([3e-4, -2e-4, 5.0], dtype=torch.float64)
    eager = (ref + torch.tensor([1e-12, 1e-12, 0.0], dtype=torch.float64)).to(torch.float32)
    dvm = (ref + torch.tensor([4e-12, -4e-12, 0.0], dtype=torch.float64)).to(torch.float32)
    plain = M.compare(dvm, eager, ref)
    summed = M.compare(dvm, eager, ref, accumulating=True)
    assert summed["dvm"]["n_small"] == 2 and plain["dvm"]["n_small"] == 0
    assert summed["npu"]


def test_integer_results_are_exact():
    a = torch.tensor([1, 2, 3])
    assert M.compare(a, a.clone(), a.to(torch.float64))["npu"]
    c = M.compare(torch.tensor([1, 2, 4]), a, a.to(torch.float64))
    assert not c["same"] and c["mismatch_dvm"] == 1
