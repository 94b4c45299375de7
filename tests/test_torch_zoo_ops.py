"""ATen ops the model zoo (`dvm bench models --zoo`) reaches that DVM lowers itself: _safe_softmax
(rows hidden by a mask give 0), true_divide; and a size symbol that may be negative refused with
its reason (never clamped to 0)."""

import pytest

torch = pytest.importorskip("torch")

import dvm.frontend.torch_backend  # noqa: E402,F401
from dvm.frontend.aten_table import Unsupported  # noqa: E402
from dvm.frontend.fx_syms import _lower_bound  # noqa: E402
from dvm.runtime import counters  # noqa: E402

pytestmark = [pytest.mark.cpu_vm, pytest.mark.vm_once]   # runs once, on the default (CPU) VM


def _run(fn, make, sizes):
    torch._dynamo.reset()
    before = counters.snapshot()
    cf = torch.compile(fn, backend="dvm", dynamic=True)
    for n in sizes:
        args = make(n)
        torch.testing.assert_close(cf(*args), fn(*args), msg=lambda m: f"size {n}: {m}")
    after = counters.snapshot()
    return {k: v - before.get(k, 0) for k, v in after.items() if k.startswith("fallback:") and v != before.get(k, 0)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_safe_softmax_hidden_rows_are_zero(dtype):
    def f(x, mask):
        return torch.ops.aten._safe_softmax(x.masked_fill(mask, float("-inf")), -1) * 2

    def make(n):
        g = torch.Generator().manual_seed(n)
        x = torch.randn(3, n, 7, generator=g).to(dtype)
        mask = torch.rand(3, n, 7, generator=g) > 0.6
        mask[1, n // 2, :] = True      # a row hidden whole
        return x, mask
    fallbacks = _run(f, make, [2, 5, 33])
    assert not any("_safe_softmax" in k for k in fallbacks), fallbacks


def test_safe_softmax_dtype_argument():
    def f(x):
        return torch.ops.aten._safe_softmax(x, 1, dtype=torch.float32)
    _run(f, lambda n: (torch.randn(2, n, dtype=torch.bfloat16),), [3, 17])


def test_true_divide():
    def f(x, y):
        return torch.true_divide(x, y) + torch.true_divide(x, 3)
    fallbacks = _run(f, lambda n: (torch.randn(n, 4), torch.randn(n, 4).abs() + 0.5), [2, 9, 40])
    assert not any("true_divide" in k for k in fallbacks), fallbacks


def test_negative_size_symbol_refused_with_reason():
    from torch.utils._sympy.numbers import int_oo
    from torch.utils._sympy.value_ranges import ValueRanges
    assert _lower_bound("s0", None) == 0
    assert _lower_bound("s0", ValueRanges(2, int_oo)) == 2
    for rng in (ValueRanges(-int_oo, 0), ValueRanges(-3, 5)):
        with pytest.raises(Unsupported, match="may be negative"):
            _lower_bound("s1", rng)


def test_zeros_ones_arange_start_in_segments():
    def f(x):
        n = x.shape[0]
        pos = torch.arange(2, n + 2)                     # BART's learned positions start at 2
        odd = torch.arange(1, 2 * n + 1, 2)
        return x * torch.ones(n, 3) + torch.zeros(n, 3) + (pos + odd)[:, None], pos, odd
    fallbacks = _run(f, lambda n: (torch.randn(n, 3),), [2, 7, 30])
    assert not any(k.split(":")[1] in ("aten.zeros.default", "aten.ones.default", "aten.arange.start",
                                       "aten.arange.start_step") for k in fallbacks), fallbacks


def test_arange_start_float_runs_through_pytorch():
    def f(x):
        return x + torch.arange(0.5, x.shape[0] + 0.5)
    fallbacks = _run(f, lambda n: (torch.randn(n),), [3, 9])
    assert any(k.startswith("fallback:aten.arange.start:") for k in fallbacks), fallbacks


def test_lift_fresh_copy_of_a_constant():
    def f(x):
        return x * torch.tensor([1.0, -2.0, 0.5]) + 1
    fallbacks = _run(f, lambda n: (torch.randn(n, 3),), [2, 11])
    assert not any("lift_fresh_copy" in k for k in fallbacks), fallbacks
