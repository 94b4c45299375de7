"""Backward ops kept whole (frontend/fx_native_backward): LayerNorm's, softmax's and the exact
GELU's gradients run as PyTorch's kernels, named with their reasons in the backward graph's
report; the tanh GELU's and float64's are decomposed and fused; every gradient matches eager's,
with the rule on and off."""

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

from dvm.frontend import fx_native_backward as nb  # noqa: E402
from dvm.frontend.torch_runtime import CompiledFx  # noqa: E402
from dvm.frontend.torch_backend import COMPILED  # noqa: E402

pytestmark = [pytest.mark.cpu_vm, pytest.mark.vm_once]   # runs once, on the default (CPU) VM
aten = torch.ops.aten
LN, SOFTMAX, GELU = (aten.native_layer_norm_backward.default, aten._softmax_backward_data.default,
                     aten.gelu_backward.default)


def _layer_norm(x, w, b):
    return F.layer_norm(x * 2.0, x.shape[-1:], w, b) + x


def _softmax(x, w, b):
    return (x * w).softmax(-1) * b


def _gelu(approximate):
    def f(x, w, b):   # (GELU of an input: bfloat16's gradient is then eager's, not rounded apart)
        return F.gelu(x, approximate=approximate) * 2.0 + w * b
    return f


def _grads_and_backward(f, dtype, sizes=((2, 5, 24), (3, 7, 24))):
    """Gradients of f's sum under the backend (dynamic sizes) and in eager, at each size, and the
    backward graph the backend compiled last."""
    torch._dynamo.reset()
    cf = torch.compile(f, backend="dvm", dynamic=True)
    for shape in sizes:
        torch.manual_seed(shape[1])
        args = [torch.randn(shape, dtype=dtype), torch.randn(shape[-1], dtype=dtype),
                torch.randn(shape[-1], dtype=dtype)]
        got, want = ([a.clone().requires_grad_() for a in args] for _ in range(2))
        cf(*got).sum().backward()
        f(*want).sum().backward()
        for g, w in zip(got, want):
            torch.testing.assert_close(g.grad, w.grad)
    backward = [g for g in COMPILED if isinstance(g, CompiledFx) and g.kind == "backward"][-1]
    return backward


def _kept(graph) -> dict:
    return {s.node.target: s.reason for s in graph.torch_steps if s.kind == "torch" and s.node.target in nb.REASONS}


@pytest.mark.parametrize("name,f,op,dtype", [
    ("layer_norm", _layer_norm, LN, torch.float32),
    ("layer_norm bfloat16", _layer_norm, LN, torch.bfloat16),
    ("softmax", _softmax, SOFTMAX, torch.float32),
    ("exact gelu", _gelu("none"), GELU, torch.float32),
    ("exact gelu bfloat16", _gelu("none"), GELU, torch.bfloat16),
])
def test_kept_backward_runs_as_pytorchs_kernel_with_its_reason(name, f, op, dtype):
    graph = _grads_and_backward(f, dtype)
    assert _kept(graph) == {op: nb.REASONS[op]}, name
    assert nb.REASONS[op] in graph.describe(), name
    assert not any(s.kind == "fallback" and s.node.target is op for s in graph.torch_steps), name


@pytest.mark.parametrize("name,f,dtype", [
    ("tanh gelu", _gelu("tanh"), torch.float32),
    ("exact gelu float64", _gelu("none"), torch.float64),
])
def test_other_gelu_gradients_are_decomposed_and_fused(name, f, dtype):
    graph = _grads_and_backward(f, dtype)
    assert _kept(graph) == {}, name
    assert graph.segments, name


@pytest.mark.parametrize("f", [_layer_norm, _softmax, _gelu("none")])
def test_rule_off_decomposes_them_all(monkeypatch, f):
    monkeypatch.setattr(nb, "ENABLED", False)
    graph = _grads_and_backward(f, torch.float32)
    assert _kept(graph) == {}
    assert not any(s.node.target in nb.REASONS for s in graph.torch_steps)
