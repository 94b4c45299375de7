"""Sibling linears (frontend/fx_sibling_linears): linears of one input in an inference graph run
as one product with their weights concatenated (remembered while unchanged), sliced into each
result; against eager, and against the same graph with the rewrite off."""

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import dvm  # noqa: E402
import dvm.frontend.torch_backend as tb  # noqa: E402
from dvm.config import reload  # noqa: E402
from dvm.frontend import fx_sibling_linears  # noqa: E402

pytestmark = [pytest.mark.cpu_vm, pytest.mark.vm_once]   # runs once, on the default (CPU) VM

LENGTHS = [1, 3, 8, 33]


class Block(nn.Module):
    """q, k, v of one input (unequal widths, with biases) and gate / up of another (none)."""

    def __init__(self, dim=16):
        super().__init__()
        self.q, self.k, self.v = nn.Linear(dim, dim), nn.Linear(dim, dim // 2), nn.Linear(dim, dim // 2)
        self.gate, self.up = nn.Linear(dim, 2 * dim, bias=False), nn.Linear(dim, 2 * dim, bias=False)
        self.down = nn.Linear(2 * dim, dim, bias=False)

    def forward(self, x):
        b, n, _ = x.shape
        q = self.q(x).view(b, n, 2, -1).transpose(1, 2)
        k = self.k(x).view(b, n, 2, -1).transpose(1, 2)
        v = self.v(x).view(b, n, 2, -1).transpose(1, 2)
        att = torch.softmax(q[..., :4] @ k.transpose(-1, -2), -1) @ v
        h = att.transpose(1, 2).reshape(b, n, -1).repeat(1, 1, 2) + x
        return self.down(F.silu(self.gate(h)) * self.up(h))


def _x(n, seed=0):
    torch.manual_seed(seed)
    return torch.randn(2, n, 16)


def _compiled(model):
    torch._dynamo.reset()
    return torch.compile(model, backend="dvm", dynamic=True)


def test_sibling_linears_match_eager_and_the_rewrite_off():
    torch.manual_seed(0)
    model = Block().eval()
    before = dvm.counters().get("torch_sibling_linears", 0)
    cm = _compiled(model)
    with torch.no_grad():
        got = {n: cm(_x(n)) for n in LENGTHS}
        for n in LENGTHS:
            torch.testing.assert_close(got[n], model(_x(n)))
    merged = dvm.counters().get("torch_sibling_linears", 0) - before
    assert merged > 0 and merged % 5 == 0   # q, k, v and gate, up in each graph compiled
    fx_sibling_linears.ENABLED = False
    try:
        cm = _compiled(model)
        with torch.no_grad():
            for n in LENGTHS:
                torch.testing.assert_close(got[n], cm(_x(n)))
    finally:
        fx_sibling_linears.ENABLED = True


def test_explain_names_the_concatenation():
    torch.manual_seed(0)
    model = Block().eval()
    torch._dynamo.reset()   # (Dynamo would reuse another Block's graph)
    with torch.no_grad():
        text = tb.explain_model(model, _x(5))
    assert "dvm.concat_weights x1" in text and fx_sibling_linears.REASON in text   # one step for all groups
    assert "torch_sibling_weights_concatenated=3" in text   # the weights of each group, q / k / v's biases


def test_weights_updated_in_place_are_concatenated_again():
    torch.manual_seed(1)
    model = Block().eval()
    cm = _compiled(model)
    with torch.no_grad():
        cm(_x(8))
        made = dvm.counters().get("torch_sibling_weights_concatenated", 0)
        cm(_x(8, 1))
        assert dvm.counters().get("torch_sibling_weights_concatenated", 0) == made   # remembered
        model.k.weight.add_(0.5)
        torch.testing.assert_close(cm(_x(8, 2)), model(_x(8, 2)))
        assert dvm.counters().get("torch_sibling_weights_concatenated", 0) == made + 1   # q / k / v's only
        model.up.weight.mul_(-1.0)
        torch.testing.assert_close(cm(_x(8, 2)), model(_x(8, 2)))
        model.load_state_dict(Block().state_dict())
        torch.testing.assert_close(cm(_x(8, 3)), model(_x(8, 3)))
    assert dvm.counters().get("torch_sibling_weights_stale", 0) >= 2


class Merged(nn.Module):
    """Results whose views need their own contiguous layout: a merge of the sliced axis."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(16, 8), nn.Linear(16, 8)

    def forward(self, x):
        return torch.tanh(self.a(x).view(x.shape[0], -1)) + self.b(x).view(x.shape[0], -1)


class Returned(nn.Module):
    """Results the graph returns: eager's (contiguous) tensors."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(16, 8), nn.Linear(16, 8)

    def forward(self, x):
        return self.a(x), self.b(x).transpose(0, 1)


@pytest.mark.parametrize("cls, counter", [(Merged, "torch_sibling_linears_views_kept"), (Returned, None)])
def test_groups_that_would_change_a_layout_stay_separate(cls, counter):
    torch.manual_seed(2)
    model = cls().eval()
    before = dict(dvm.counters())
    cm = _compiled(model)
    with torch.no_grad():
        for n in LENGTHS[1:]:   # (at one token, Merged's view is taken on the slices: merged)
            got, want = cm(_x(n)), model(_x(n))
            torch.testing.assert_close(got, want)
            for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
                assert g.stride() == w.stride()
    after = dvm.counters()
    assert after.get("torch_sibling_linears", 0) == before.get("torch_sibling_linears", 0)
    if counter:
        assert after.get(counter, 0) > before.get(counter, 0)


def test_training_graphs_are_left_alone():
    torch.manual_seed(3)
    model, ref = Block(), Block()
    ref.load_state_dict(model.state_dict())
    before = dvm.counters().get("torch_sibling_linears", 0)
    cm = _compiled(model)
    cm(_x(8)).square().sum().backward()
    ref(_x(8)).square().sum().backward()
    for p, r in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, r.grad)
    assert dvm.counters().get("torch_sibling_linears", 0) == before


@pytest.mark.parametrize("spare_mb, merged", [(None, False), (0, False), (2, True)])
def test_the_budget(monkeypatch, spare_mb, merged):
    """DVM_SIBLING_MB: 0 turns it off; a group whose weights (2 x 512 x 256 float32: 1 MiB, and
    two biases) do not fit in what the graphs alive have left is not merged. spare_mb: MiB
    beyond what they hold (under 1 MiB more with 0)."""
    held = -(-fx_sibling_linears._bytes_used[0] // (1 << 20))
    monkeypatch.setenv("DVM_SIBLING_MB", "0" if spare_mb is None else str(held + spare_mb))
    reload()
    try:
        torch.manual_seed(4)
        model = nn.ModuleDict({"a": nn.Linear(256, 512), "b": nn.Linear(256, 512)}).eval()

        def f(x):
            return model["a"](x) * model["b"](x).sigmoid()
        x = torch.randn(3, 256)
        before = dvm.counters().get("torch_sibling_linears", 0)
        with torch.no_grad():
            torch.testing.assert_close(_compiled(f)(x), f(x))
        assert (dvm.counters().get("torch_sibling_linears", 0) > before) == merged
    finally:
        monkeypatch.delenv("DVM_SIBLING_MB")
        reload()


@pytest.mark.parametrize("limit, merged", [(1 << 20, False), (2 << 20, True)])
def test_groups_of_large_weights_stay_separate(monkeypatch, limit, merged):
    """MAX_GROUP_BYTES: a group whose weights and biases (2 x 512 x 256 float32 and two biases:
    just over 1 MiB) exceed it keeps separate products, counted as too wide."""
    monkeypatch.setattr(fx_sibling_linears, "MAX_GROUP_BYTES", limit)
    torch.manual_seed(5)
    model = nn.ModuleDict({"a": nn.Linear(256, 512), "b": nn.Linear(256, 512)}).eval()

    def f(x):
        return model["a"](x) * model["b"](x).sigmoid()
    x = torch.randn(3, 256)
    before = {k: dvm.counters().get(k, 0) for k in ("torch_sibling_linears", "torch_sibling_linears_too_wide")}
    with torch.no_grad():
        torch.testing.assert_close(_compiled(f)(x), f(x))
    made = {k: dvm.counters().get(k, 0) - v for k, v in before.items()}
    assert (made["torch_sibling_linears"] > 0) == merged
    assert (made["torch_sibling_linears_too_wide"] > 0) == (not merged)
