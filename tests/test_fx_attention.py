"""frontend/fx_attention: attention written as matmul, softmax, matmul runs as one flash call under
torch.compile(backend="dvm"), with eager's results; chains it must not touch are left alone."""
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from dvm.runtime import counters  # noqa: E402
from helpers import pairwise  # noqa: E402

REWRITES = "torch_attention_as_sdpa"

pytestmark = pytest.mark.vm_once


def _compiled(fn):
    torch._dynamo.reset()
    return torch.compile(fn, backend="dvm", dynamic=True)


def _run(fn, *args):
    """(compiled result, eager result, rewrites counted)"""
    before = counters.snapshot().get(REWRITES, 0)
    with torch.no_grad():
        got = _compiled(fn)(*args)
        want = fn(*args)
    return got, want, counters.snapshot().get(REWRITES, 0) - before


def _attention(scale: str, masked: bool):
    def attention(q, k, v, mask):
        s = q @ k.transpose(-2, -1)
        if scale == "div":
            s = s / math.sqrt(32)
        elif scale == "mul":
            s = s * 0.125
        if masked:
            s = s + mask
        p = torch.softmax(s, dim=-1)
        return (p @ v).transpose(1, 2).reshape(q.shape[0], q.shape[2], -1)
    return attention


def _causal(B, L, S, dtype):
    keep = torch.ones(L, S, dtype=torch.bool).tril(S - L)
    return torch.where(keep, 0.0, float("-inf")).to(dtype).expand(B, 1, L, S).contiguous()


@pytest.mark.parametrize("scale,masked,dtype,B,H,L,S", pairwise(
    ["div", "mul", "none"], [False, True], [torch.float32, torch.float64],
    [(1, 4, 16, 16), (2, 3, 7, 7), (3, 2, 5, 9), (1, 2, 1, 33)]))
def test_written_out_attention_is_one_flash_call(scale, masked, dtype, B, H, L, S):
    g = torch.Generator().manual_seed(B * 100 + L)
    q, k, v = (torch.randn(B, H, n, 32, generator=g).to(dtype) for n in (L, S, S))
    mask = _causal(B, L, S, dtype)
    got, want, n = _run(_attention(scale, masked), q, k, v, mask)
    assert n == 1
    torch.testing.assert_close(got, want)


class _AttributeScaled(torch.nn.Module):
    """Attention scaled by a float attribute, which Dynamo passes as a 0-d tensor graph input."""
    def __init__(self, scale: float, divide: bool):
        super().__init__()
        self.scale, self.divide = scale, divide

    def forward(self, q, k, v, mask):
        s = q @ k.transpose(-2, -1)
        s = s / self.scale if self.divide else s * self.scale
        return torch.softmax(s + mask, dim=-1) @ v


@pytest.mark.parametrize("divide", [False, True])
def test_a_scale_read_at_run_time_is_the_kernels_scale(divide):
    """A scale held in a float attribute is read at each call (changed between calls here): one
    flash call with its value, eager's results both times."""
    m = _AttributeScaled(0.125, divide)
    q, k, v = (torch.randn(2, 3, 7, 16) for _ in range(3))
    mask = torch.zeros(2, 1, 7, 7)
    mask[..., 5:] = -1e9
    before = counters.snapshot().get(REWRITES, 0)
    compiled = _compiled(m)
    with torch.no_grad():
        for scale in (0.125, 3.0):
            m.scale = scale
            torch.testing.assert_close(compiled(q, k, v, mask), m(q, k, v, mask))
    assert counters.snapshot().get(REWRITES, 0) - before >= 1


def test_half_precision_attention_is_left_alone():
    """In bf16 eager rounds the scores between its steps; the kernel would not (further from
    eager than assert_close's bf16 tolerance)."""
    q, k, v = (torch.randn(1, 2, 8, 32).bfloat16() for _ in range(3))
    got, want, n = _run(_attention("mul", False), q, k, v, None)
    assert n == 0
    torch.testing.assert_close(got, want)


def test_multi_query_keys_expanded_in_the_graph_go_in_grouped():
    def mqa(q, k, v):
        kk, vv = k.expand(-1, q.shape[1], -1, -1), v.expand(-1, q.shape[1], -1, -1)
        p = torch.softmax(q @ kk.transpose(2, 3) * 0.2, dim=-1)
        return p @ vv
    q, k, v = torch.randn(2, 4, 9, 16), torch.randn(2, 1, 9, 16), torch.randn(2, 1, 9, 16)
    got, want, n = _run(mqa, q, k, v)
    assert n == 1
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("masked", [False, True])
def test_torch_bmm_attention_on_flattened_heads(masked):
    """fairseq-style attention: torch.bmm on [B * H, L, D] operands, a 3-D mask (rows of masked
    keys included, NaN there as eager's); runs as one flash call with B = 1."""
    q, k, v = torch.randn(6, 7, 16), torch.randn(6, 9, 16), torch.randn(6, 9, 16)
    mask = torch.zeros(1, 7, 9)
    mask[0, 3, :] = float("-inf")
    mask[0, 5, 4:] = float("-inf")

    def attention(q, k, v, mask):
        s = torch.bmm(q * 0.25, k.transpose(1, 2))
        return torch.bmm(torch.softmax(s + mask if masked else s, dim=-1), v)
    got, want, n = _run(attention, q, k, v, mask)
    assert n == 1
    torch.testing.assert_close(got, want, equal_nan=True)


def test_rows_of_masked_keys_stay_nan_with_the_plain_softmax():
    """The flash kernel gives 0 where every key of a row is masked; softmax gives NaN there."""
    q, k, v = torch.randn(1, 2, 5, 8), torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8)
    mask = torch.zeros(1, 1, 5, 6)
    mask[..., 2, :] = float("-inf")
    mask[..., 0, 3:] = float("-inf")
    got, want, n = _run(_attention("mul", True), q, k, v, mask)
    assert n == 1 and torch.isnan(got[0, 2]).all()
    torch.testing.assert_close(got, want, equal_nan=True)


def test_sdpa_math_decomposition_runs_as_the_flash_kernel():
    """Falcon's multi-query attention reaches the ATen graph as PyTorch's math decomposition of
    scaled_dot_product_attention (q and k^T each scaled, _safe_softmax): it runs as one flash
    call, the causal mask as is_causal."""
    from dvm.tools.bench_zoo_models import ZOO, inputs
    zm = ZOO["falcon"]
    model = zm.build()
    before = counters.snapshot()
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="dvm", dynamic=True)
    with torch.no_grad():
        for L in (5, 12):
            kw = inputs(zm, 1, L)
            torch.testing.assert_close(compiled(**kw).logits, model(**kw).logits)
    after = counters.snapshot()
    assert after.get(REWRITES, 0) - before.get(REWRITES, 0) >= 2   # both layers
    assert after.get("torch_sdpa_causal", 0) > before.get("torch_sdpa_causal", 0)


def _scores_returned(q, k, v):
    p = torch.softmax(q @ k.transpose(-2, -1) * 0.5, dim=-1)
    return p @ v, p


def _symbolic_scale(q, k, v):
    return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1) @ v


def _other_dim(q, k, v):
    return torch.softmax(q @ k.transpose(-2, -1), dim=-2) @ v


def _three_dims_scores_twice(q, k, v):
    q, k, v = (t.flatten(0, 1) for t in (q, k, v))
    p = torch.softmax(torch.bmm(q, k.transpose(1, 2)), dim=-1)
    return torch.bmm(p, v), p


@pytest.mark.parametrize("fn", [_scores_returned, _symbolic_scale, _other_dim, _three_dims_scores_twice])
def test_chains_it_must_not_touch_are_left_alone(fn):
    """Scores read twice (output_attentions; also with torch.bmm's 3-D operands), a scale computed
    from a symbolic size, a softmax over another dim: run as written, eager's results."""
    q, k, v = torch.randn(2, 3, 6, 8), torch.randn(2, 3, 6, 8), torch.randn(2, 3, 6, 8)
    got, want, n = _run(fn, q, k, v)
    assert n == 0
    torch.testing.assert_close(got, want)


def test_training_keeps_the_chain_and_eager_gradients():
    """A training graph saves the softmax for the backward: nothing is rewritten."""
    fn = _attention("div", False)
    args = [torch.randn(2, 2, 6, 32, requires_grad=True) for _ in range(3)] + [None]
    before = counters.snapshot().get(REWRITES, 0)
    _compiled(fn)(*args).square().sum().backward()
    got = [a.grad.clone() for a in args[:3]]
    for a in args[:3]:
        a.grad = None
    fn(*args).square().sum().backward()
    assert counters.snapshot().get(REWRITES, 0) == before
    for g, a in zip(got, args[:3]):
        torch.testing.assert_close(g, a.grad)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(B=st.integers(1, 3), H=st.sampled_from([1, 2, 4]), multi_query=st.booleans(), L=st.integers(1, 19),
       S=st.integers(1, 19), D=st.sampled_from([4, 16, 32]), hole_rate=st.sampled_from([0.0, 0.3, 0.9]),
       special=st.sampled_from([None, "nan", "inf"]), seed=st.integers(0, 2 ** 16))
def test_random_attention_matches_eager(B, H, multi_query, L, S, D, hole_rate, special, seed):
    """Shapes, multi-query keys, masks with -inf holes (rows of masked keys included) and NaN or
    infinity in the query: rewritten, eager's results (NaN where eager has NaN)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, L, D, generator=g)
    k, v = (torch.randn(B, 1 if multi_query else H, S, D, generator=g) for _ in range(2))
    if special is not None:
        q[0, 0, (seed % L)] = float(special)
    keep = torch.rand(B, 1, L, S, generator=g) >= hole_rate
    mask = torch.where(keep, 0.0, float("-inf"))

    def attention(q, k, v, mask):
        kk, vv = k.expand(-1, q.shape[1], -1, -1), v.expand(-1, q.shape[1], -1, -1)
        return torch.softmax(q @ kk.transpose(-2, -1) * 0.3 + mask, dim=-1) @ vv
    got, want, n = _run(attention, q, k, v, mask)
    assert n == 1 or min(L, S) == 1   # (a length of 1 is specialized: matmul traces as a product there)
    torch.testing.assert_close(got, want, equal_nan=True)


def _causal_attention(q, k, v, keep):
    s = q @ k.transpose(-2, -1) * 0.25 + torch.where(keep, 0.0, float("-inf"))
    return torch.softmax(s, dim=-1) @ v


@pytest.mark.parametrize("where", ["q", "k", "v"])
@pytest.mark.parametrize("masked", [False, True])
def test_non_finite_inputs_give_eagers_nan(where, masked):
    """A NaN in q, k or v: the flash kernel returns 0 for a query row with a NaN at some shapes and
    skips masked blocks under is_causal (where 0 * NaN gives NaN in the written-out math); the
    rewritten call runs the math then, with eager's NaN (counted)."""
    q, k, v = (torch.randn(1, 2, 5, 8) for _ in range(3))
    {"q": q, "k": k, "v": v}[where][0, 0, -1, 0] = float("nan")
    keep = torch.ones(5, 5, dtype=torch.bool).tril().expand(1, 1, 5, 5)
    fn = _causal_attention if masked else (lambda q, k, v, keep: torch.softmax(q @ k.transpose(-2, -1), -1) @ v)
    before = counters.snapshot().get("torch_attention_math_nonfinite", 0)
    got, want, n = _run(fn, q, k, v, keep)
    assert n == 1 and torch.isnan(want).any()
    assert counters.snapshot().get("torch_attention_math_nonfinite", 0) > before
    torch.testing.assert_close(got, want, equal_nan=True)


@pytest.mark.parametrize("transposed", ["k", "v", "q"])
def test_operands_transposed_in_memory_match_eager(transposed):
    """q, k or v whose last dim is not contiguous (stride(-1) == L): the flash kernel gets them
    with a unit last stride (it computes wrong results otherwise)."""
    def att(q, k, v):
        return torch.softmax(q @ k.transpose(-2, -1) * 0.125, -1) @ v
    torch._dynamo.reset()
    cf = torch.compile(att, backend="dvm", dynamic=True)
    for L in (5, 9):
        q, k, v = (torch.randn(1, 4, 16, L).transpose(2, 3) if name == transposed else torch.randn(1, 4, L, 16)
                   for name in "qkv")
        torch.testing.assert_close(cf(q, k, v), att(q, k, v))
