"""Clones of fresh values (frontend/fx_clones): eval-mode dropout's clone of a PyTorch value is
no segment of its own; clones that a caller or a later write could tell apart are kept. Every
case against eager."""

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import dvm  # noqa: E402
import dvm.frontend.torch_backend as tb  # noqa: E402
from dvm.frontend import fx_clones, fx_lone_ops  # noqa: E402

pytestmark = [pytest.mark.cpu_vm, pytest.mark.vm_once]   # runs once, on the default (CPU) VM

SIZES = [1, 3, 8, 33]


def _compiled(f):
    torch._dynamo.reset()
    return torch.compile(f, backend="dvm", dynamic=True)


def _elided() -> int:
    return dvm.counters().get("torch_clones_elided", 0)


def _dropout_between_linears():
    torch.manual_seed(0)
    w1, b1, w2 = torch.randn(24, 16), torch.randn(24), torch.randn(16, 24)

    def f(x):
        return F.linear(F.dropout(F.linear(x, w1, b1), 0.1, training=False), w2)
    return f


def test_eval_dropout_of_a_pytorch_value_is_no_segment():
    f = _dropout_between_linears()
    before = _elided()
    cf = _compiled(f)
    with torch.no_grad():
        for n in SIZES:
            x = torch.randn(2, n, 16)
            torch.testing.assert_close(cf(x), f(x))
    assert _elided() > before
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fx_lone_ops, "ENABLED", False)   # (else a kept clone alone would be PyTorch's)
        torch._dynamo.reset()   # (else Dynamo reuses the graph compiled above)
        on = tb.explain_model(f, torch.randn(2, 5, 16))
        mp.setattr(fx_clones, "ENABLED", False)
        torch._dynamo.reset()
        off = tb.explain_model(f, torch.randn(2, 5, 16))
    segments = [int(t.split(" DVM segment(s)")[0].split()[-1]) for t in (on, off)]
    assert segments[0] < segments[1], (on, off)


def test_a_returned_clone_is_its_own_tensor():
    def f(x):
        y = x * 2
        return y, y.clone()
    cf = _compiled(f)
    for n in SIZES:
        x = torch.randn(n, 5)
        a, b = cf(x)
        torch.testing.assert_close(b, f(x)[1])
        assert a.data_ptr() != b.data_ptr()
        b.add_(1)
        torch.testing.assert_close(a, x * 2)


@pytest.mark.parametrize("name,f", [
    ("clone of a graph input written after", lambda x: (lambda y: (x.add_(1), y * 2)[1])(x.clone())),
    ("clone of a view", lambda x: (x * 2).t().clone() + 1),
    ("contiguous clone of a transpose", lambda x: (x * 2).t().contiguous().view(-1) + 1),
    ("written clone", lambda x: (lambda h: (lambda c: (c.add_(1), h + c)[1])(h.clone()))(x.exp())),
])
def test_clones_that_could_be_told_apart_match_eager(name, f):
    for n in SIZES:
        x, y = torch.randn(n, 6), None
        y = x.clone()
        got = _compiled(f)(x)
        want = f(y)
        torch.testing.assert_close(got, want, msg=name)
        torch.testing.assert_close(x, y, msg=name)   # graph inputs written alike
