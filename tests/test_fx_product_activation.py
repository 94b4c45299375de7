"""A ReLU or exact GELU of a biased linear (frontend/fx_product_activation) runs inside the
product's call, `_addmm_activation`: bitwise eager's values, no DVM segment for it; the forms it
does not take keep the activation an op of its own and still match eager."""
import copy

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import dvm  # noqa: E402
import dvm.frontend.torch_backend as tb  # noqa: E402
from dvm.frontend import fx_lone_ops, fx_product_activation, gelu_size  # noqa: E402

pytestmark = [pytest.mark.cpu_vm, pytest.mark.vm_once]   # runs once, on the default (CPU) VM


@pytest.fixture(autouse=True)
def _pytorchs_gelu_at_every_size(monkeypatch):
    """The rule itself: its GELU runs as PyTorch's kernel at every size (the run-time choice of the
    VM's GELU for small ones is tests/test_gelu_size.py's)."""
    monkeypatch.setattr(gelu_size, "ENABLED", False)

SIZES = [1, 3, 8, 33, 130]
FUSED = "aten._addmm_activation.default"
ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu}


def _mlp(act, dtype=torch.float32, first_bias=True):
    torch.manual_seed(0)
    w1, b1 = torch.randn(24, 16, dtype=dtype), torch.randn(24, dtype=dtype) if first_bias else None
    w2, b2 = torch.randn(16, 24, dtype=dtype), torch.randn(16, dtype=dtype)

    def f(x):
        return F.linear(act(F.linear(x, w1, b1)), w2, b2)
    return f


def _x(n, dtype=torch.float32, rank=3):
    torch.manual_seed(n)
    return torch.randn(*(2, n, 16)[3 - rank:], dtype=dtype)


def _compiled(f):
    torch._dynamo.reset()
    return torch.compile(f, backend="dvm", dynamic=True)


def _folded() -> int:
    return dvm.counters().get("torch_product_activation_folded", 0)


@pytest.mark.parametrize("act", sorted(ACTIVATIONS))
@pytest.mark.parametrize("rank", [2, 3])
def test_activation_between_linears_is_in_the_product_and_bitwise_eager(act, rank):
    f = _mlp(ACTIVATIONS[act])
    before = _folded()
    cf = _compiled(f)
    with torch.no_grad():
        for n in SIZES:
            assert torch.equal(cf(_x(n, rank=rank)), f(_x(n, rank=rank))), n
    assert _folded() > before
    text = tb.explain_model(f, _x(5, rank=rank))
    assert f"cube {FUSED} x1" in text and "0 DVM segment(s)" in text, text


@pytest.mark.parametrize("act", sorted(ACTIVATIONS))
def test_a_product_without_bias_takes_it_too(act):
    f = _mlp(ACTIVATIONS[act], first_bias=False)
    cf = _compiled(f)
    with torch.no_grad():
        for n in SIZES:
            assert torch.equal(cf(_x(n)), f(_x(n))), n
    text = tb.explain_model(f, _x(5))
    assert f"cube {FUSED} x1" in text and "0 DVM segment(s)" in text, text


@pytest.mark.parametrize("act", sorted(ACTIVATIONS))
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("stored_kxm", [False, True])
def test_the_activated_product_and_its_views_are_one_call(act, bias, stored_kxm):
    """view(_addmm_activation(b, view(x), t(w)), ...) is one linear_activation call of the run
    graph (no t, no view calls), for a weight stored (out, in) or (in, out) (GPT-2's Conv1D),
    with and without a bias: bitwise eager."""
    from dvm.frontend.torch_runtime import COMPILED
    torch.manual_seed(0)
    w = torch.randn(16, 24) if stored_kxm else torch.randn(24, 16)
    b, w2 = torch.randn(24), torch.randn(16, 24)

    def f(x):
        flat = x.view(-1, 16)
        h = torch.addmm(b, flat, w) if bias and stored_kxm else flat @ w if stored_kxm else F.linear(x, w, b if bias else None)
        return F.linear(ACTIVATIONS[act](h.view(*x.shape[:-1], 24)), w2)
    cf = _compiled(f)
    with torch.no_grad():
        for n in SIZES:
            assert torch.equal(cf(_x(n)), f(_x(n))), n
    code = next(c for c in reversed(COMPILED) if c.kind == "inference").runner.code
    assert code.count("linear_activation(") == 1 and "torch_Tensor_t" not in code and "view" not in code, code


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("shape", [(5,), (2, 3), (3, 1), (1, 2, 4)])
@pytest.mark.parametrize("strided", [False, True])
def test_linear_activation_is_the_activated_product_between_its_views(dtype, shape, strided):
    """torch_calls.linear_activation (at::linear then the activation in place for a row-major x)
    gives the bits of the call it stands for, `view(_addmm_activation(b, view(x), t(w)), ...)`,
    with and without a bias (beta 0), a weight stored (out, in) or (in, out), ReLU and GELU, for
    row-major x and for an x whose strides need a copy to be flattened."""
    from dvm.frontend.torch_calls import linear_activation
    torch.manual_seed(len(shape))
    k, m = 37, 300
    x = torch.randn(k, *shape, dtype=dtype).movedim(0, -1) if strided else torch.randn(*shape, k, dtype=dtype)
    for stored_kxm, bias, act in [(a, b, c) for a in (False, True) for b in (False, True) for c in ACTIVATIONS]:
        w = torch.randn(k, m, dtype=dtype) if stored_kxm else torch.randn(m, k, dtype=dtype)
        b = torch.randn(m, dtype=dtype) if bias else torch.zeros((), dtype=dtype)
        kwargs = {**({} if bias else {"beta": 0}), **({"use_gelu": True} if act == "gelu" else {})}
        want = torch._addmm_activation(b, x.reshape(-1, k), w if stored_kxm else w.t(), **kwargs)
        got = linear_activation(x, w, b, stored_kxm, **kwargs)
        assert got.shape == (*shape, m) and torch.equal(got, want.view(*shape, m)), (stored_kxm, bias, act)


def test_bfloat16_relu_is_bitwise_eager():
    f = _mlp(F.relu, torch.bfloat16)
    cf = _compiled(f)
    with torch.no_grad():
        for n in SIZES:
            x = _x(n, torch.bfloat16)
            assert torch.equal(cf(x), f(x)), n
    assert FUSED in tb.explain_model(f, _x(5, torch.bfloat16))


def test_activation_fused_with_more_leaves_those_a_segment():
    torch.manual_seed(0)
    w, b = torch.randn(24, 16), torch.randn(24)

    def f(x):
        return F.relu(F.linear(x, w, b)) * 0.5 + 1.0
    cf = _compiled(f)
    with torch.no_grad():
        for n in SIZES:
            torch.testing.assert_close(cf(_x(n)), f(_x(n)))
    text = tb.explain_model(f, _x(5))
    assert FUSED in text and "1 DVM segment(s)" in text, text


@pytest.mark.parametrize("name,f", [
    ("tanh GELU", _mlp(lambda h: F.gelu(h, approximate="tanh"))),
    ("product read twice", lambda x: (lambda h: F.relu(h) + h)(F.linear(x, *_mlp_weights()))),
    ("product returned", lambda x: (lambda h: (F.relu(h), h))(F.linear(x, *_mlp_weights()))),
    ("a slice between", lambda x: F.relu(F.linear(x, *_mlp_weights())[..., 1:])),
])
def test_other_forms_keep_the_activation(name, f):
    text = tb.explain_model(f, _x(5))
    assert FUSED not in text, name
    cf = _compiled(f)
    with torch.no_grad():
        for n in SIZES:
            torch.testing.assert_close(cf(_x(n)), f(_x(n)))


def _mlp_weights():
    torch.manual_seed(1)
    return torch.randn(24, 16), torch.randn(24)


class MLP(torch.nn.Module):
    def __init__(self, act):
        super().__init__()
        self.up, self.down, self.act = torch.nn.Linear(16, 24), torch.nn.Linear(24, 16), act

    def forward(self, x):
        return self.down(self.act(self.up(x)))


@pytest.mark.parametrize("act", sorted(ACTIVATIONS))
def test_training_step_gradients_match_eager(act):
    """ReLU folds in the forward graph (the backward reads its result); GELU's backward reads the
    product, so that graph keeps both ops. Gradients match eager's either way."""
    torch.manual_seed(0)
    model = MLP(ACTIVATIONS[act])
    twin = copy.deepcopy(model)
    cm = _compiled(twin)
    for n in (3, 8, 33):
        x = _x(n)
        model(x).square().sum().backward()
        cm(x).square().sum().backward()
        for p, q in zip(model.parameters(), twin.parameters()):
            torch.testing.assert_close(q.grad, p.grad)
            p.grad = q.grad = None


def test_switched_off_the_activation_is_a_segment(monkeypatch):
    monkeypatch.setattr(fx_product_activation, "ENABLED", False)
    monkeypatch.setattr(fx_lone_ops, "ENABLED", False)   # (else a ReLU alone would be PyTorch's)
    f = _mlp(F.relu)
    text = tb.explain_model(f, _x(5))
    assert FUSED not in text and "1 DVM segment(s)" in text
    cf = _compiled(f)
    with torch.no_grad():
        for n in SIZES:
            torch.testing.assert_close(cf(_x(n)), f(_x(n)))
