"""A split of a PyTorch value whose pieces a segment reads, or whose pieces are views: the pieces
are replayed in the segment as slices (fx_segment_lower._replay_piece) or taken as narrows in
view chains (fx_view_chains), and the run graph has no split call; results equal eager's."""

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

from dvm.frontend.torch_runtime import COMPILED  # noqa: E402

pytestmark = [pytest.mark.cpu_vm, pytest.mark.vm_once]   # runs once, on the default (CPU) VM


def _run_graph_code(fn, *args) -> str:
    torch._dynamo.reset()
    COMPILED.clear()
    cf = torch.compile(fn, backend="dvm", dynamic=True)
    with torch.no_grad():
        for scale in (1, 2, 1):   # new sizes (the first argument's rows), then a size seen before
            a = (args[0].repeat(scale, *[1] * (args[0].dim() - 1)), *args[1:])
            torch.testing.assert_close(cf(*a), fn(*a))
    return "\n".join(g.runner.code for g in COMPILED)


def _gated(split):
    def f(x, w):   # an MoE expert's gate and up halves, as split by transformers
        gate, up = split(x @ w)
        return F.silu(gate) * up
    return f


@pytest.mark.parametrize("split", [
    lambda h: h.split(24, dim=-1),
    lambda h: h.chunk(2, dim=-1),
    lambda h: h.split_with_sizes([24, 24], dim=1),
    lambda h: h.view(h.shape[0], 2, 24).unbind(1),
])
def test_pieces_a_segment_reads_are_slices_in_it(split):
    torch.manual_seed(0)
    x, w = torch.randn(5, 16), torch.randn(16, 48)
    code = _run_graph_code(_gated(split), x, w)
    assert "split" not in code and "unbind" not in code, code


def test_uneven_pieces_a_segment_reads():
    torch.manual_seed(0)

    def f(x, w):
        a, b, c = (x @ w).split(20, dim=-1)   # 20, 20 and 8 columns
        return torch.tanh(a[..., :8]) + c * 2, b.exp()
    code = _run_graph_code(f, torch.randn(3, 16), torch.randn(16, 48))
    assert "split" not in code, code


def test_a_split_read_by_views_and_attention():
    """GPT-NeoX's form: q and k go to a segment (RoPE-like products), v straight to attention."""
    torch.manual_seed(0)
    w = torch.randn(32, 96) * 0.2

    def f(x):
        b, n, _ = x.shape
        q, k, v = (x @ w).view(b, n, 4, 24).transpose(1, 2).split(8, dim=-1)
        return F.scaled_dot_product_attention(q.cos(), k.sin(), v, is_causal=True)
    code = _run_graph_code(f, torch.randn(2, 7, 32))
    assert "split" not in code, code


def test_a_split_that_pytorch_also_returns_stays_right():
    torch.manual_seed(0)

    def f(x, w):
        gate, up = (x @ w).split(24, dim=-1)
        return F.silu(gate) * up, gate, up
    _run_graph_code(f, torch.randn(4, 16), torch.randn(16, 48))
