"""Segment outputs in PyTorch's memory order where that costs no kernel (torch_segment.TORCH_ORDER):
HF's RoPE on transposed heads returns eager's strides, attention's output then reshapes as a
view, and the values match eager and the row-major order; Mamba2's masked segment sum is one
kernel stored in eager's order."""

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import dvm.frontend.torch_backend as tb  # noqa: E402
from dvm.frontend import torch_segment  # noqa: E402

pytestmark = [pytest.mark.cpu_vm, pytest.mark.vm_once]   # runs once, on the default (CPU) VM


@pytest.fixture
def order():
    """Sets TORCH_ORDER for one test's compiles and restores it."""
    saved = torch_segment.TORCH_ORDER

    def use(value):
        torch_segment.TORCH_ORDER = value
        torch._dynamo.reset()
    yield use
    torch_segment.TORCH_ORDER = saved
    torch._dynamo.reset()


HEADS, D = 4, 8


def _rotate_half(x):
    return torch.cat((-x[..., D // 2:], x[..., :D // 2]), dim=-1)


def _rope(x, w, cos, sin):
    b, n, _ = x.shape
    q = F.linear(x, w).view(b, n, HEADS, D).transpose(1, 2)
    return q * cos + _rotate_half(q) * sin


def _inputs(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, n, 32, generator=g)
    cos, sin = (torch.randn(1, 1, n, D, generator=g) for _ in range(2))
    return x, cos, sin


def _against_eager(order, f, mode: str, lengths) -> dict:
    """f compiled under TORCH_ORDER `mode` and run at each length against eager: {length: (DVM's
    result, eager's)}."""
    order(mode)
    cf = torch.compile(f, backend="dvm", dynamic=True)
    out = {}
    with torch.no_grad():
        for n in lengths:
            args = _inputs(n, n)
            out[n] = cf(*args), f(*args)
            torch.testing.assert_close(*out[n])
    return out


def test_rope_output_has_eager_strides(order):
    w = torch.randn(HEADS * D, 32) * 0.1
    f = lambda x, cos, sin: _rope(x, w, cos, sin)   # noqa: E731
    results = {mode: _against_eager(order, f, mode, (3, 9, 9, 17)) for mode in ("never", "free")}
    for n in (3, 9, 17):
        got, want = results["free"][n]
        assert torch.equal(results["never"][n][0], got) and got.stride() == want.stride()
        assert results["never"][n][0].stride() != want.stride()   # (row-major)
    order("free")
    text = tb.explain_model(f, *_inputs(5))
    # one kernel, in the heads' memory order (the halves of each head: [2, D / 2], fx_patterns)
    assert "1 vector kernel(s)" in text and ", 4, 2, 4) reduce []" in text


def test_quick_path_allocates_outputs_in_eager_order(order):
    """From the third call with the same sizes the segment takes its quick path, which allocates
    its outputs in PyTorch's order (no permute afterwards): eager's strides and values, a fresh
    tensor each call."""
    from dvm.frontend.torch_runtime import COMPILED
    order("free")
    w = torch.randn(HEADS * D, 32) * 0.1
    cf = torch.compile(lambda x, cos, sin: _rope(x, w, cos, sin), backend="dvm", dynamic=True)
    args = _inputs(9, 1)
    with torch.no_grad():
        want = _rope(*args[:1], w, *args[1:])
        outs = [cf(*args) for _ in range(4)]
    segment = next(s for s in COMPILED[-1].segments if s._perms is not None)
    assert segment._quick is not None
    for got in outs:
        torch.testing.assert_close(got, want)
        assert got.stride() == want.stride()
    assert len({o.data_ptr() for o in outs}) == len(outs)


def test_attention_after_rope_matches_eager(order):
    """q and k through RoPE, attention, its output back to (b, n, heads * d) and projected: eager's
    values in both orders (in PyTorch's order the final reshape is a view, as in eager)."""
    torch.manual_seed(0)
    wq, wk, wv, wo = (torch.randn(HEADS * D, 32) * 0.1 for _ in range(4))

    def f(x, cos, sin):
        b, n, _ = x.shape
        q, k = _rope(x, wq, cos, sin), _rope(x, wk, cos, sin)
        v = F.linear(x, wv).view(b, n, HEADS, D).transpose(1, 2)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return F.linear(o.transpose(1, 2).reshape(b, n, HEADS * D), wo)
    for mode in ("free", "never"):
        _against_eager(order, f, mode, (4, 11, 11, 2))


def _segment_sum_decay(cs, tril, g6):
    """Mamba2's chunked scan as HF's torch_forward writes it (FalconH1, Bamba, Zamba2): exp of a
    masked segment sum (heads first), times decay factors read heads-last, for a product over
    the heads (a bmm in eager, whose operand is then a view)."""
    h, c = cs.shape[1], cs.shape[-1]
    seg = torch.exp(cs.masked_fill(~tril, -torch.inf))                    # (1, h, 1, c, c)
    decay = g6.permute(3, 4, 1, 5, 0, 2).reshape(1, 1, c, c, h)            # heads last, a view
    m = decay * seg.permute(0, 2, 3, 4, 1)                                # (1, 1, c, c, h)
    return m.unsqueeze(-1).permute(0, 1, 2, 4, 5, 3).permute(3, 2, 5, 0, 1, 4).reshape(h, c, c)


def test_masked_segment_sum_is_one_kernel_in_eager_order(order):
    """The product is computed and stored in the heads' memory order, PyTorch's: one kernel (no
    copy of the permuted decay view, none of the product), eager's values and strides."""
    order("free")
    cf = torch.compile(_segment_sum_decay, backend="dvm", dynamic=True)
    with torch.no_grad():
        for c in (4, 9, 9, 16):
            g = torch.Generator().manual_seed(c)
            args = (torch.randn(1, 3, 1, c, c, generator=g), torch.ones(c, c, dtype=torch.bool).tril(),
                    torch.randn(3, c, 1, 1, 1, c, generator=g))
            got, want = cf(*args), _segment_sum_decay(*args)
            torch.testing.assert_close(got, want)
            assert got.stride() == want.stride()
    text = tb.explain_model(_segment_sum_decay, *args)
    assert "1 vector kernel(s)" in text
