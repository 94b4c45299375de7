"""rotate_half of views of one PyTorch value (frontend/fx_rolled_blocks): q and k of one q / k / v
product are rolled by one PyTorch call and their views replayed in the segment; the values are
bitwise those with a roll per view, and both match eager. A rope reads such a roll only where it
is not the flip form in its segment (fx_patterns.ROPE_OF_TORCH_VALUES off, as in the tests
here but the last, which compares the two)."""

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import dvm  # noqa: E402
import dvm.frontend.torch_backend as tb  # noqa: E402
from dvm.frontend import fx_patterns, fx_rolled_blocks  # noqa: E402

pytestmark = [pytest.mark.cpu_vm, pytest.mark.vm_once]   # runs once, on the default (CPU) VM


@pytest.fixture(autouse=True)
def rolled_ropes(monkeypatch):
    """Ropes of PyTorch values read PyTorch's rolls (the flip form only where a test asks)."""
    monkeypatch.setattr(fx_patterns, "ROPE_OF_TORCH_VALUES", False)

LENGTHS = [1, 3, 8, 33]


def _rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class Attention(nn.Module):
    """HF's layout: one q / k / v product (4 query heads, 2 key / value heads of `head`), RoPE on
    q and k; `offset` shifts where q starts in the product (a head's multiple or not)."""

    def __init__(self, head=8, offset=0):
        super().__init__()
        self.head, self.offset = head, offset
        self.qkv = nn.Linear(16, offset + 8 * head, bias=False)
        self.register_buffer("inv_freq", 1.0 / 100 ** (torch.arange(0, head, 2).float() / head))

    def forward(self, x):
        b, n, _ = x.shape
        d, o = self.head, self.offset
        p = self.qkv(x)
        q = p[..., o:o + 4 * d].view(b, n, -1, d).transpose(1, 2)
        k = p[..., o + 4 * d:o + 6 * d].view(b, n, -1, d).transpose(1, 2)
        v = p[..., o + 6 * d:].view(b, n, -1, d).transpose(1, 2)
        freqs = torch.arange(n, dtype=torch.float32)[:, None] * self.inv_freq[None, :]
        emb = torch.cat([freqs, freqs], -1)
        cos, sin = emb.cos(), emb.sin()
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        att = torch.nn.functional.scaled_dot_product_attention(q, k.repeat(1, 2, 1, 1), v.repeat(1, 2, 1, 1),
                                                               is_causal=True)
        return att.transpose(1, 2).reshape(b, n, -1)


def _x(n):
    torch.manual_seed(n)
    return torch.randn(2, n, 16)


def _outputs(model, enabled: bool) -> list:
    old = fx_rolled_blocks.ENABLED
    fx_rolled_blocks.ENABLED = enabled
    try:
        torch._dynamo.reset()
        cm = torch.compile(model, backend="dvm", dynamic=True)
        with torch.no_grad():
            return [cm(_x(n)) for n in LENGTHS]
    finally:
        fx_rolled_blocks.ENABLED = old


def _explain(model) -> str:
    torch._dynamo.reset()
    with torch.no_grad():
        return tb.explain_model(model, _x(5))


@pytest.mark.parametrize("head", [8, 6])
def test_q_and_k_rolled_in_one_call_bitwise_the_rolls_and_eager(head):
    torch.manual_seed(0)
    model = Attention(head).eval()
    before = {k: dvm.counters().get(k, 0) for k in ("torch_rotate_half_block_rolls", "torch_graphs_compiled")}
    on = _outputs(model, True)
    made = {k: dvm.counters().get(k, 0) - v for k, v in before.items()}
    assert made["torch_rotate_half_block_rolls"] == made["torch_graphs_compiled"] > 0   # one for q and k
    off = _outputs(model, False)
    with torch.no_grad():
        for n, a, b in zip(LENGTHS, on, off):
            assert torch.equal(a, b), n
            torch.testing.assert_close(a, model(_x(n)))
    text = _explain(model)
    assert "rotate_half of views of PyTorch values x1: roll_blocks(x)" in text, text
    assert "rotate_half of a PyTorch value" not in text, text


def test_a_slice_that_cuts_a_head_rolls_each_value_alone():
    """q starting 4 elements into the product: its heads are not blocks of the product's last
    axis, so q and k each roll their own slice (two inputs); bitwise the per-view rolls."""
    torch.manual_seed(0)
    model = Attention(8, offset=4).eval()
    on, off = _outputs(model, True), _outputs(model, False)
    with torch.no_grad():
        for n, a, b in zip(LENGTHS, on, off):
            assert torch.equal(a, b), n
            torch.testing.assert_close(a, model(_x(n)))
    assert "rotate_half of views of PyTorch values x2: roll_blocks(x)" in _explain(model)


@pytest.mark.parametrize("head", [8, 6])
def test_rope_of_a_product_is_the_flip_form_bitwise_the_roll(head, monkeypatch):
    """With ROPE_OF_TORCH_VALUES, q's and k's RoPE read the product's halves as a flip view in the
    segment: no roll call, one launch, the same values bit for bit."""
    torch.manual_seed(0)
    model = Attention(head).eval()
    rolled = _outputs(model, True)
    monkeypatch.setattr(fx_patterns, "ROPE_OF_TORCH_VALUES", True)
    before = dvm.counters().get("torch_rotate_half_block_rolls", 0)
    flipped = _outputs(model, True)
    assert dvm.counters().get("torch_rotate_half_block_rolls", 0) == before
    with torch.no_grad():
        for n, a, b in zip(LENGTHS, flipped, rolled):
            assert torch.equal(a, b), n
    text = _explain(model)
    assert "recognized: rope x2" in text and "roll" not in text, text
