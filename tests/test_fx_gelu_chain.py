"""A GELU written out as arithmetic (frontend/fx_gelu_chain) runs as the VM's one GELU op: the
forms models use, against eager (assert_close defaults); other functions of the same ops are left
alone; a global math.pi is specialized so GPT-2's form is seen (torch_backend._math_constant)."""

import math

import pytest

torch = pytest.importorskip("torch")

import dvm  # noqa: E402
from dvm.frontend import fx_gelu_chain  # noqa: E402
from dvm.runtime import counters  # noqa: E402

pytestmark = [pytest.mark.cpu_vm, pytest.mark.vm_once]   # runs once, on the default (CPU) VM


def new_gelu(x):      # GPT-2, Phi, CodeGen (transformers' NewGELUActivation)
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def bloom_gelu(x):    # BLOOM's bloom_gelu_forward
    return x * 0.5 * (1.0 + torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x)))


def fast_gelu(x):     # transformers' FastGELUActivation
    return 0.5 * x * (1.0 + torch.tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x)))


def erf_gelu(x):      # the exact GELU written out
    return x * 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))


def not_a_gelu(x):    # the same ops, another coefficient
    return 0.5 * x * (1.0 + torch.tanh(0.7978845608 * (x + 0.05 * x ** 3)))


def _compare(fn, dtype=torch.float32, sizes=(3, 17, 300)):
    torch._dynamo.reset()
    cf = torch.compile(fn, backend="dvm", dynamic=True)
    for n in sizes:
        torch.manual_seed(n)
        x = (torch.randn(n, 33) * 4).to(dtype)
        b = torch.randn(33).to(dtype)
        got = cf(x, b)
        # bf16: DVM computes in f32 and rounds once; eager rounds each of the chain's steps
        want = fn(x.float(), b.float()).to(dtype) if dtype != torch.float32 else fn(x, b)
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("act", [new_gelu, bloom_gelu, fast_gelu, erf_gelu], ids=lambda f: f.__name__)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_written_out_gelus_are_one_op_and_match_eager(act, dtype):
    kind = "gelu (written out)" if act is erf_gelu else "gelu_tanh (written out)"
    counters.reset()
    _compare(lambda x, b: act(x + b) * 2, dtype)
    assert counters.snapshot().get(f"torch_pattern:{kind}", 0) >= 1, counters.snapshot()
    text = dvm.explain(act, torch.randn(8, 16))
    assert f"recognized: {kind}" in text and "tanh" not in text.split("ops:")[1].split("\n")[0], text


def test_other_functions_of_the_same_ops_are_left_as_they_are():
    counters.reset()
    _compare(lambda x, b: not_a_gelu(x + b))
    assert not [k for k in counters.snapshot() if k.startswith("torch_pattern:gelu")]


def test_a_step_read_elsewhere_is_still_computed():
    """tanh's value is an output too: it stays a node of its own, the GELU is still one op."""
    def f(x, b):
        x = x + b
        t = torch.tanh(0.7978845608 * (x + 0.044715 * x ** 3))
        return 0.5 * x * (1.0 + t), t
    _compare(f)


def test_switched_off_the_chain_is_lowered_op_by_op(monkeypatch):
    monkeypatch.setattr(fx_gelu_chain, "ENABLED", False)
    counters.reset()
    _compare(lambda x, b: new_gelu(x + b))
    assert not [k for k in counters.snapshot() if k.startswith("torch_pattern:gelu")]


def test_training_gradients_through_a_written_out_gelu():
    torch.manual_seed(0)
    lin = torch.nn.Linear(12, 12)
    x = torch.randn(7, 12)
    torch._dynamo.reset()
    cf = torch.compile(lambda x: new_gelu(lin(x)).sum(), backend="dvm", dynamic=True)
    cf(x).backward()
    got = lin.weight.grad.clone()
    lin.weight.grad = None
    new_gelu(lin(x)).sum().backward()
    torch.testing.assert_close(got, lin.weight.grad)


def test_math_pi_is_specialized_and_a_changed_float_attribute_is_not():
    """math.pi read by the model is a constant under a guard (the chain's coefficient folds into
    a number); a float attribute feeding only arithmetic stays an input (no recompile)."""
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.eps = 1e-5

        def forward(self, x):
            return new_gelu(x) + self.eps
    m = M()
    torch._dynamo.reset()
    counters.reset()
    cm = torch.compile(m, backend="dvm", dynamic=True)
    for n, eps in ((5, 1e-5), (9, 0.5), (17, 2.0)):
        m.eps = eps
        x = torch.randn(n, 8)
        torch.testing.assert_close(cm(x), m(x))
    snap = counters.snapshot()
    assert snap.get("torch_dynamo_graphs", 0) == 1 and snap.get("torch_float_inputs_specialized", 0) == 1, snap
