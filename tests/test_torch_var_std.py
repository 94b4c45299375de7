"""var, std, var_mean and std_mean under torch.compile(backend="dvm") (frontend/aten_decomp): eager's
values for random shapes, reduced dims, corrections, keepdim, dtypes and special values
(Hypothesis), fused with no fallback; their gradients; a 0-d input stays PyTorch's op."""

import pytest

torch = pytest.importorskip("torch")

from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

import dvm.frontend.torch_backend  # noqa: E402,F401
from dvm.runtime import counters  # noqa: E402
from helpers import new_fallbacks  # noqa: E402

pytestmark = [pytest.mark.cpu_vm, pytest.mark.vm_once]   # runs once, on the default (CPU) VM

OPS = {
    "var": lambda x, dim, c, k: torch.var(x, dim, correction=c, keepdim=k),
    "std": lambda x, dim, c, k: torch.std(x, dim, correction=c, keepdim=k),
    "var_mean": lambda x, dim, c, k: torch.var_mean(x, dim, correction=c, keepdim=k),
    "std_mean": lambda x, dim, c, k: torch.std_mean(x, dim, correction=c, keepdim=k),
}
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16, "f64": torch.float64}
SPECIALS = (float("nan"), float("inf"), float("-inf"), -0.0, 1e4)


@st.composite
def cases(draw):
    shape = tuple(draw(st.lists(st.integers(1, 40), min_size=1, max_size=3)))
    axes = draw(st.one_of(st.none(), st.lists(st.integers(-len(shape), len(shape) - 1), min_size=1,
                                                max_size=len(shape), unique_by=lambda a: a % len(shape))))
    return (shape, axes, draw(st.sampled_from([0, 1, 2, 0.5])), draw(st.booleans()),
            draw(st.sampled_from(sorted(OPS))), draw(st.sampled_from(sorted(DTYPES))), draw(st.booleans()),
            draw(st.integers(0, 2 ** 16)))


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_matches_eager(case):
    shape, axes, correction, keepdim, op, dtype, specials, seed = case
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=g) * 3 + 1).to(DTYPES[dtype])
    if specials:
        flat = x.view(-1)
        for i, v in enumerate(SPECIALS[:flat.numel()]):
            flat[(i * 7919) % flat.numel()] = v

    def f(t):
        return OPS[op](t, axes, correction, keepdim)
    torch._dynamo.reset()
    before = counters.snapshot()
    got, want = torch.compile(f, backend="dvm", dynamic=False)(x), f(x)
    if op.endswith("_mean") and x.isinf().any():   # the mean is torch.mean's (aten_decomp), not Welford's
        dims = list(range(x.dim())) if axes is None else axes
        wide = torch.float64 if x.dtype == torch.float64 else torch.float32
        want = (want[0], x.to(wide).mean(dims, keepdim=keepdim).to(x.dtype))
    torch.testing.assert_close(got, want, equal_nan=True)
    assert not new_fallbacks(before), (case, new_fallbacks(before))


def test_sizes_change_under_one_graph():
    """dynamic=True: the count N - correction follows the size (0 and negative: eager's NaN / inf)."""
    def f(x):
        return torch.std(x, 0, keepdim=True), torch.var(x, -1, correction=3)
    torch._dynamo.reset()
    cf = torch.compile(f, backend="dvm", dynamic=True)
    for n in (2, 3, 7, 64, 1):
        x = torch.randn(n, 5)
        torch.testing.assert_close(cf(x), f(x), equal_nan=True, msg=lambda m: f"n={n}: {m}")


def test_standardized_columns_and_gradient():
    """(x - mean) / std over the first axis, forward and backward as eager."""
    def f(x):
        return ((x - x.mean(0, keepdim=True)) / x.std(0, keepdim=True)).square().mean() + x.var(1).sum()
    torch._dynamo.reset()
    cf = torch.compile(f, backend="dvm", dynamic=False)
    x = torch.randn(300, 24, requires_grad=True)
    y = x.detach().clone().requires_grad_(True)
    torch.testing.assert_close(cf(x), f(y))
    cf(x).backward()
    f(y).backward()
    torch.testing.assert_close(x.grad, y.grad)


def test_zero_dim_input_keeps_the_op():
    def f(x):
        return torch.var(x) + 1
    torch._dynamo.reset()
    x = torch.tensor(2.5)
    torch.testing.assert_close(torch.compile(f, backend="dvm")(x), f(x), equal_nan=True)


def test_recorded_by_lazy_mode():
    """Inside dvm.lazy() var and std are recorded (their parts fused with the ops around them), not
    run by PyTorch: a LayerNorm written with x.var equals eager's."""
    import dvm

    def f(x):
        return (x - x.mean(-1, keepdim=True)) * torch.rsqrt(x.var(-1, keepdim=True) + 1e-5) + x.std(0)
    x = torch.randn(300, 64)
    before = counters.snapshot()
    with dvm.lazy(adaptive=False):   # (recorded whatever their size)
        y = f(x)
    recorded = counters.snapshot().get("lazy_ops_recorded", 0) - before.get("lazy_ops_recorded", 0)
    torch.testing.assert_close(y, f(x))
    assert recorded >= 15, recorded   # the 5 ops around them record 5
