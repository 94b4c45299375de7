"""The interleaved rotate of RoPE (GPT-J's rotate_every_two, frontend/fx_rotate_pairs): of a
PyTorch value it is computed whole by rotate_pairs and the products applying it stay one kernel;
the values are bitwise those of the ops planned one by one, and match eager."""

import pytest

torch = pytest.importorskip("torch")
from hypothesis import given, settings, strategies as st  # noqa: E402
from torch import nn  # noqa: E402

import dvm  # noqa: E402
import dvm.frontend.torch_backend as tb  # noqa: E402
from dvm.frontend import fx_rotate_pairs  # noqa: E402
from dvm.frontend.fx_rotate_pairs import rotate_pairs  # noqa: E402

pytestmark = [pytest.mark.cpu_vm, pytest.mark.vm_once]   # runs once, on the default (CPU) VM

LENGTHS = [1, 3, 8, 33]
PAIRS_LINE = "interleaved rotate (pairs swapped) of a PyTorch value"


def _every_two(x, negs=(True, False)):
    """stack((±x[..., 1::2], ±x[..., ::2]), -1).flatten(-2), as GPT-J writes it."""
    odd, even = x[..., 1::2], x[..., ::2]
    return torch.stack((-odd if negs[0] else odd, -even if negs[1] else even), dim=-1).flatten(-2)


class Attention(nn.Module):
    """HF's layout: q / k / v projections viewed as heads and transposed, interleaved RoPE on the
    first `rotary` dims of q and k (GPT-J's partial rotary), causal attention."""

    def __init__(self, head=8, rotary=8):
        super().__init__()
        self.head, self.rotary = head, rotary
        self.qkv = nn.Linear(16, 3 * 2 * head, bias=False)
        self.register_buffer("inv_freq", 1.0 / 100 ** (torch.arange(0, rotary, 2).float() / rotary))

    def _rope(self, x, cos, sin):
        r = self.rotary
        rot = x[..., :r] * cos + _every_two(x[..., :r]) * sin
        return rot if r == x.shape[-1] else torch.cat((rot, x[..., r:]), -1)

    def forward(self, x):
        b, n, _ = x.shape
        q, k, v = (t.view(b, n, 2, self.head).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
        freqs = torch.arange(n, dtype=torch.float32)[:, None] * self.inv_freq[None, :]
        emb = torch.repeat_interleave(freqs, 2, -1)
        cos, sin = emb.cos(), emb.sin()
        q, k = self._rope(q, cos, sin), self._rope(k, cos, sin)
        att = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return att.transpose(1, 2).reshape(b, n, -1)


def _x(n, batch=2):
    torch.manual_seed(n)
    return torch.randn(batch, n, 16)


def _compiled(fn, enabled: bool):
    """fn compiled with the rule on or off (the rule is read when a graph is compiled)."""
    torch._dynamo.reset()
    cf = torch.compile(fn, backend="dvm", dynamic=True)

    def call(*args):
        old, fx_rotate_pairs.ENABLED = fx_rotate_pairs.ENABLED, enabled
        try:
            return cf(*args)
        finally:
            fx_rotate_pairs.ENABLED = old
    return call


@pytest.mark.parametrize("rotary", [8, 4])
def test_rope_bitwise_the_ops_one_by_one_and_eager(rotary):
    torch.manual_seed(0)
    model = Attention(8, rotary).eval()
    before = dvm.counters().get("torch_rotate_pairs", 0)
    with torch.no_grad():
        on = _compiled(model, True)
        got = [on(_x(n)) for n in LENGTHS]
        assert dvm.counters().get("torch_rotate_pairs", 0) > before
        off = _compiled(model, False)
        for n, a in zip(LENGTHS, got):
            assert torch.equal(a, off(_x(n))), n
            torch.testing.assert_close(a, model(_x(n)))
    torch._dynamo.reset()
    with torch.no_grad():
        text = tb.explain_model(model, _x(5))
    assert f"{PAIRS_LINE} x2: rotate_pairs(x)" in text, text   # q and k, in one segment
    assert "fallback aten.stack" not in text and "pytorch aten.stack" not in text, text


def test_other_signs_and_a_dvm_value():
    """Either element of a pair negated (or neither); a rotate of a DVM value is planned op by op."""
    def fn(x, sin, cos):
        y = x * 0.5
        return (_every_two(x, (False, True)) * sin, _every_two(x, (False, False)) + cos,
                y * cos + _every_two(y) * sin)
    for n in (1, 5, 16):
        torch.manual_seed(n)
        x, sin, cos = torch.randn(2, n, 3, 12).transpose(1, 2), torch.randn(n, 12), torch.randn(n, 12)
        for a, b in zip(_compiled(fn, True)(x, sin, cos), fn(x, sin, cos)):
            torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_training_gradients_match_eager():
    torch.manual_seed(0)
    model = Attention(8, 4)
    twin = Attention(8, 4)
    twin.load_state_dict(model.state_dict())
    torch._dynamo.reset()
    cm = torch.compile(model, backend="dvm", dynamic=True)
    for n in (3, 9):
        x = _x(n)
        cm(x).square().sum().backward()
        twin(x).square().sum().backward()
    torch.testing.assert_close(model.qkv.weight.grad, twin.qkv.weight.grad)


def test_accuracy_verification_reads_the_rotated_input(tmp_path):
    """dvm.verify re-evaluates the segment from x, recovered from rotate_pairs(x)."""
    def fn(x, sin, cos):
        return x * cos + _every_two(x) * sin
    torch.manual_seed(0)
    x, sin, cos = torch.randn(1, 7, 4, 16).transpose(1, 2), torch.randn(7, 16), torch.randn(7, 16)
    torch._dynamo.reset()
    report = dvm.verify(fn, x, sin, cos, repro_dir=str(tmp_path))
    assert report.rows and report.passed, report.markdown()
    torch.testing.assert_close(report.output, fn(x, sin, cos))


@settings(max_examples=60, deadline=None)
@given(lead=st.lists(st.integers(0, 4), min_size=0, max_size=3), pairs=st.integers(1, 6),
       negs=st.tuples(st.booleans(), st.booleans()),
       dtype=st.sampled_from([torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int32]),
       layout=st.sampled_from(["contiguous", "transposed", "sliced"]))
def test_rotate_pairs_is_the_stack(lead, pairs, negs, dtype, layout):
    shape = (*lead, 2 * pairs)
    base = (torch.randn(*shape, 3) * 100).to(dtype)
    x = base[..., 0]                                # sliced: a non-dense view
    if layout == "contiguous":
        x = x.contiguous()
    elif layout == "transposed" and x.ndim >= 3:
        x = x.contiguous().transpose(0, 1)
    want = _every_two(x, negs)
    got = rotate_pairs(x, negs)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert torch.equal(got, want)
    assert torch.equal(rotate_pairs(got, negs[::-1]), x)   # its own inverse, signs swapped
