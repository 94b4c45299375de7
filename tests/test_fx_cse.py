"""Common subexpressions (frontend/fx_cse): a value an ATen graph computes again, which is stored
anyway (a product or attention reads it), is read from its first computation; against eager, and
against the same graph with the rewrite off. The model here (T5's relative position bias) also
covers frontend/fx_const_layout (its own unit tests: test_fx_const_layout.py)."""

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import dvm  # noqa: E402
from dvm.frontend import fx_const_layout, fx_cse  # noqa: E402
from dvm.frontend.torch_runtime import COMPILED  # noqa: E402

pytestmark = [pytest.mark.cpu_vm, pytest.mark.vm_once]   # runs once, on the default (CPU) VM

LENGTHS = [1, 5, 16]


class RelativeBiasLayers(nn.Module):
    """T5's pattern: a relative position bias of [1, heads, L, L] that every layer adds to the
    padding mask again, `where(keep, bias, min)`, before its attention (here with a scaled bias
    added too: one segment, not a lone where)."""

    def __init__(self, dim=16, heads=2, layers=3):
        super().__init__()
        self.heads = heads
        self.bias = nn.Embedding(32, heads)
        self.qkv = nn.ModuleList(nn.Linear(dim, 3 * dim) for _ in range(layers))

    def forward(self, x, keep):
        b, n, _ = x.shape
        pos = torch.arange(n)
        rel = (pos[None, :] - pos[:, None]).clamp(-15, 16) + 15
        bias = self.bias(rel).permute(2, 0, 1)[None]
        for lin in self.qkv:
            mask = torch.where(keep[:, None, None, :], bias, torch.finfo(x.dtype).min) + 0.5 * bias
            q, k, v = lin(x).view(b, n, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
            att = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            x = x + att.transpose(1, 2).reshape(b, n, -1)
        return x


def _inputs(n, seed=0):
    torch.manual_seed(seed)
    keep = torch.ones(2, n, dtype=torch.bool)
    keep[1, n // 2 + 1:] = False
    return torch.randn(2, n, 16), keep


def _run(model, switch, enabled: bool):
    """The compiled model's results per length and its graph's segment count, with the rewrite
    `switch` (a module with ENABLED) on or off."""
    torch._dynamo.reset()
    switch.ENABLED = enabled
    try:
        cm = torch.compile(model, backend="dvm", dynamic=True)
        with torch.no_grad():
            got = {n: cm(*_inputs(n)) for n in LENGTHS}
        return got, len(COMPILED[-1].segments)
    finally:
        switch.ENABLED = True


# (the rewrite, its counter, the least count over LENGTHS' graphs)
REWRITES = [(fx_cse, "torch_common_subexpressions", 2),          # the second and third layers' masks
            (fx_const_layout, "torch_size_consts_reordered", 2)]   # the bias, once per size


@pytest.mark.parametrize("switch, counter, least", REWRITES, ids=["cse", "const_layout"])
def test_relative_bias_layers_match_eager_and_the_rewrite_off(switch, counter, least):
    torch.manual_seed(0)
    model = RelativeBiasLayers().eval()
    before = dvm.counters().get(counter, 0)
    got, segments = _run(model, switch, True)
    done = dvm.counters().get(counter, 0) - before
    off, segments_off = _run(model, switch, False)
    with torch.no_grad():
        for n in LENGTHS:
            torch.testing.assert_close(got[n], model(*_inputs(n)))
            torch.testing.assert_close(got[n], off[n])
    assert done >= least
    if switch is fx_cse:
        assert segments < segments_off   # the repeated masks' segments are gone


def test_returned_values_stay_distinct_tensors():
    def f(x, w):
        a, b = torch.exp(x * 2), torch.exp(x * 2)
        return a, b, a @ w + b @ w

    x, w = torch.randn(4, 8), torch.randn(8, 3)
    torch._dynamo.reset()
    a, b, s = torch.compile(f, backend="dvm", dynamic=True)(x, w)
    ea, eb, es = f(x, w)
    torch.testing.assert_close(s, es)
    assert a.data_ptr() != b.data_ptr()
    a.add_(1)
    torch.testing.assert_close(b, eb)   # writing one result leaves the other as eager does


def test_random_draws_are_not_merged():
    def f(x, w):
        return torch.rand_like(x) @ w, torch.rand_like(x) @ w

    torch._dynamo.reset()
    r1, r2 = torch.compile(f, backend="dvm", dynamic=True)(torch.randn(4, 8), torch.randn(8, 3))
    assert not torch.equal(r1, r2)


def test_an_update_between_equal_reads_is_respected():
    def f(x, w):
        a = torch.where(x > 0, x, 0.0) @ w
        x.add_(1)
        return a, torch.where(x > 0, x, 0.0) @ w

    x, w = torch.randn(4, 8), torch.randn(8, 3)
    x_eager = x.clone()
    torch._dynamo.reset()
    got = torch.compile(f, backend="dvm", dynamic=True)(x, w)
    want = f(x_eager, w)
    for g, e in zip(got, want):
        torch.testing.assert_close(g, e)
    torch.testing.assert_close(x, x_eager)


def test_constants_are_compared_with_their_types():
    canon: dict = {}
    keys = {fx_cse._key(v, canon) for v in (0.0, -0.0, 0, False, 1, 1.0, True)}
    assert len(keys) == 7
