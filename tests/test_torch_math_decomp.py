"""sinh, cosh, log10, hypot, nan_to_num and sgn under torch.compile(backend="dvm")
(frontend/aten_decomp_math): eager's values over dtypes, magnitudes up to and past the overflow
edge and special values (Hypothesis), with no fallback op; gradients; integer inputs keep
PyTorch's kernel."""

import math

import pytest

torch = pytest.importorskip("torch")

from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

import dvm.frontend.torch_backend  # noqa: E402,F401
from dvm.runtime import counters  # noqa: E402
from helpers import new_fallbacks  # noqa: E402

pytestmark = [pytest.mark.cpu_vm, pytest.mark.vm_once]   # runs once, on the default (CPU) VM

OPS = {
    "sinh": lambda x, y: torch.sinh(x), "cosh": lambda x, y: torch.cosh(x),
    "log10": lambda x, y: torch.log10(x), "hypot": torch.hypot,
    "nan_to_num": lambda x, y: torch.nan_to_num(x), "nan_to_num_values": lambda x, y: torch.nan_to_num(x, 1.5, 7.0, -3.0),
    "sgn": lambda x, y: torch.sgn(x),
}
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16, "f64": torch.float64}
SPECIALS = (float("nan"), float("inf"), float("-inf"), 0.0, -0.0, 1e-30, 88.9, -89.3, 710.2, 1e300)


def _eager(op, fn, x, y):
    """eager's values; below the overflow edge of sinh and cosh (~89.4 in float32, ~710.5 in float64)
    where eager's vectorized loop is inf from ~88.7 / ~709.8 on (its scalar loop finite: eager
    differs from itself there), Python's math function rounded to the dtype"""
    want = fn(x, y)
    if op in ("sinh", "cosh"):
        exact = [_finite_or_inf(getattr(math, op), v) for v in x.double().view(-1).tolist()]
        exact = torch.tensor(exact, dtype=torch.float64).view(x.shape).to(x.dtype)
        want = torch.where(want.isinf() & exact.isfinite(), exact, want)
    return want


def _finite_or_inf(f, v: float) -> float:
    try:
        return f(v)
    except OverflowError:
        return math.copysign(math.inf, v) if f is math.sinh else math.inf


def _values(shape, scale, dtype, specials, g):
    x = torch.randn(shape, generator=g, dtype=torch.float64) * scale
    if specials:
        flat = x.view(-1)
        for i, v in enumerate(SPECIALS[:flat.numel()]):
            flat[(i * 7919) % flat.numel()] = v
    return x.to(dtype)


@st.composite
def cases(draw):
    return dict(op=draw(st.sampled_from(sorted(OPS))), dtype=draw(st.sampled_from(sorted(DTYPES))),
                shape=tuple(draw(st.lists(st.integers(1, 30), min_size=1, max_size=2))),
                scale=draw(st.sampled_from([1.0, 8.0, 60.0, 500.0, 1e20])), specials=draw(st.booleans()),
                seed=draw(st.integers(0, 2 ** 16)))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_matches_eager(case):
    g = torch.Generator().manual_seed(case["seed"])
    dtype = DTYPES[case["dtype"]]
    x = _values(case["shape"], case["scale"], dtype, case["specials"], g)
    y = _values(case["shape"][-1:], case["scale"], dtype, False, g)
    fn = OPS[case["op"]]
    torch._dynamo.reset()
    before = counters.snapshot()
    got = torch.compile(fn, backend="dvm", dynamic=False)(x, y)
    torch.testing.assert_close(got, _eager(case["op"], fn, x, y), equal_nan=True)
    assert not new_fallbacks(before), (case, new_fallbacks(before))


@pytest.mark.parametrize("name", ["sinh", "cosh", "log10", "hypot", "nan_to_num"])
def test_gradients_under_changing_sizes(name):
    fn = OPS[name]
    torch._dynamo.reset()
    cf = torch.compile(fn, backend="dvm", dynamic=True)
    for n in (7, 12, 40):
        g = torch.Generator().manual_seed(n)
        x = torch.randn(n, 5, generator=g) * 3
        if name == "log10":
            x = x.abs() + 0.1
        y = torch.randn(5, generator=g)
        xs = [x.clone().requires_grad_(True) for _ in range(2)]
        got, want = cf(xs[0], y), fn(xs[1], y)
        torch.testing.assert_close(got, want)
        got.sum().backward()
        want.sum().backward()
        torch.testing.assert_close(xs[0].grad, xs[1].grad)


def test_integer_inputs_keep_pytorch_kernels():
    x = torch.arange(-4, 5)
    torch._dynamo.reset()
    for fn in (torch.sinh, torch.log10, torch.nan_to_num):
        torch.testing.assert_close(torch.compile(fn, backend="dvm")(x), fn(x), equal_nan=True)
