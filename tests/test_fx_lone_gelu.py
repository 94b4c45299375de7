"""The planner's lone exact GELU (frontend/fx_lone_gelu): a float32 GELU that would be a
segment of its own (with views of its result) runs as PyTorch's kernel, bitwise eager's; a GELU
fused with anything, the tanh form and other dtypes stay in DVM."""

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import dvm.frontend.torch_backend as tb  # noqa: E402
from dvm.frontend import fx_lone_gelu, gelu_size  # noqa: E402

pytestmark = [pytest.mark.cpu_vm, pytest.mark.vm_once]   # runs once, on the default (CPU) VM


@pytest.fixture(autouse=True)
def _pytorchs_gelu_at_every_size(monkeypatch):
    """The rule itself: its GELU runs as PyTorch's kernel at every size (the run-time choice of the
    VM's GELU for small ones is tests/test_gelu_size.py's)."""
    monkeypatch.setattr(gelu_size, "ENABLED", False)

SIZES = [1, 3, 8, 33, 130]


def _mlp(act):
    """The GELU of a graph input: of a linear's result it would go into the product's call
    (fx_product_activation)."""
    w2, b2 = torch.randn(24, 16), torch.randn(24)

    def f(x):
        return F.linear(act(x), w2, b2)
    return f


def _args(n):
    torch.manual_seed(n)
    return (torch.randn(2, n, 16),)


def test_lone_gelu_of_an_input_is_pytorchs_and_bitwise_eager():
    f = _mlp(F.gelu)
    for n in SIZES:
        torch._dynamo.reset()
        cf = torch.compile(f, backend="dvm", dynamic=True)
        x = _args(n)
        with torch.no_grad():
            assert torch.equal(cf(*x), f(*x)), n
    text = tb.explain_model(f, *_args(5))
    assert fx_lone_gelu.REASON in text and "aten.gelu.default x1" in text
    assert "0 DVM segment(s)" in text


def test_views_of_the_gelu_go_with_it():
    def f(x):
        return F.gelu(x).reshape(-1, 4).t()
    for n in SIZES:
        x = torch.randn(n, 8)
        torch._dynamo.reset()
        got = torch.compile(f, backend="dvm", dynamic=True)(x)
        assert torch.equal(got, f(x)), n
    assert fx_lone_gelu.REASON in tb.explain_model(f, torch.randn(5, 8))


@pytest.mark.parametrize("name,fn,dtype", [
    ("fused with a product", lambda x: F.gelu(x) * x, torch.float32),
    ("tanh form", lambda x: F.gelu(x, approximate="tanh"), torch.float32),
    ("float64", F.gelu, torch.float64),
    ("bfloat16", F.gelu, torch.bfloat16),
])
def test_other_gelus_stay_in_dvm(name, fn, dtype):
    def f(x):
        return fn(x.to(dtype) if dtype != torch.float32 else x)
    text = tb.explain_model(f, torch.randn(6, 8))
    assert fx_lone_gelu.REASON not in text, name
    assert "1 DVM segment(s)" in text, name
    for n in SIZES:
        x = torch.randn(n, 8)
        torch._dynamo.reset()
        torch.testing.assert_close(torch.compile(f, backend="dvm", dynamic=True)(x), f(x))


def test_switched_off_the_gelu_is_a_segment_of_its_own(monkeypatch):
    monkeypatch.setattr(fx_lone_gelu, "ENABLED", False)
    f = _mlp(F.gelu)
    text = tb.explain_model(f, *_args(5))
    assert fx_lone_gelu.REASON not in text and "1 DVM segment(s)" in text
    for n in SIZES:
        x = _args(n)
        torch._dynamo.reset()
        with torch.no_grad():
            torch.testing.assert_close(torch.compile(f, backend="dvm", dynamic=True)(*x), f(*x))
