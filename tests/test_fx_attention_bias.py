"""frontend/fx_attention_bias: attention on flattened heads with an additive bias (Bloom's ALiBi
baddbmm) or a 4-D mask runs as one flash call under torch.compile(backend="dvm"), with eager's
results; a causal where-mask runs as is_causal; chains it must not touch are left alone."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from dvm.runtime import counters  # noqa: E402
from helpers import pairwise  # noqa: E402

REWRITES = "torch_attention_as_sdpa"
CAUSAL = "torch_sdpa_causal"

pytestmark = pytest.mark.vm_once


def _run(fn, *args):
    """(compiled result, eager result, {counter: how much it moved})"""
    before = counters.snapshot()
    torch._dynamo.reset()
    with torch.no_grad():
        got = torch.compile(fn, backend="dvm", dynamic=True)(*args)
        want = fn(*args)
    after = counters.snapshot()
    return got, want, {k: after.get(k, 0) - before.get(k, 0) for k in (REWRITES, CAUSAL)}


def _flattened(q, k, v, prep: str):
    """q, k, v [B, H, X, D] as [B * H, X, D]: views ("view"), copies of transposed tensors
    ("copy": as Bloom's split of its fused projection), or computed values ("computed")."""
    B, H, _, D = q.shape
    if prep == "copy":
        q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
    flat = [t.reshape(B * H, -1, D) for t in (q, k, v)]
    return [t + 0.5 for t in flat] if prep == "computed" else flat


def _bloom_like(bias_kind: str, mask_kind: str, fill: str = "-inf", prep: str = "view"):
    """Bloom's attention: baddbmm(alibi, q, k^T) (or bmm) on [B * H, L, D], viewed to [B, H, L, S]
    for the mask, softmax, viewed back, bmm with v, viewed to [B, H, L, D]. (The scale is written
    out: a float read from a closure becomes a graph input under dynamic=True.)"""
    def attention(q, k, v, bias, keep):
        B, H, L, D = q.shape
        q, k, v = _flattened(q, k, v, prep)
        kt = k.transpose(1, 2)
        if bias_kind == "none":
            s = torch.bmm(q, kt) * 0.125
        else:
            s = torch.baddbmm(bias, q, kt, beta=1.0, alpha=0.125)
        s = s.view(B, H, L, -1)
        if mask_kind == "where":   # (0-d tensors of the scores' dtype: Python floats would make f32)
            neg = -3.4028234663852886e+38 if fill == "min" else float("-inf")   # torch.finfo(torch.float32).min
            s = s + torch.where(keep, torch.zeros((), dtype=s.dtype), torch.full((), neg, dtype=s.dtype))
        elif mask_kind == "float":
            s = s + keep
        p = torch.softmax(s, dim=-1)
        out = torch.bmm(p.view(B * H, L, -1), v)
        return out.view(B, H, L, -1).permute(0, 2, 1, 3).reshape(B, L, -1)
    return attention


def _inputs(B, H, L, S, D, bias_kind, mask_kind, dtype, padded=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, n, D, generator=g, dtype=dtype) for n in (L, S, S))
    rows = {"none": 1, "alibi": 1, "rows": L, "shared": 1}[bias_kind]
    bias = torch.randn(1 if bias_kind == "shared" else B * H, rows, S, generator=g, dtype=dtype)
    keep = torch.ones(L, S, dtype=torch.bool).tril(S - L).expand(B, 1, L, S).clone()
    if padded:
        keep[0, ..., : S // 2] = False   # a left-padded first sequence (its first rows keep no key)
    if mask_kind == "float":
        keep = torch.where(keep, 0.0, float("-inf")).to(dtype)
    return q, k, v, bias, keep


@pytest.mark.parametrize("bias_kind,mask_kind,fill,dtype,B,H,L,S", pairwise(
    ["none", "alibi", "rows", "shared"], [("none", ""), ("where", "min"), ("where", "-inf"), ("float", "")],
    [torch.float32, torch.float64], [(1, 4, 16, 16), (2, 3, 7, 7), (2, 2, 5, 9)]))
def test_flattened_head_attention_is_one_flash_call(bias_kind, mask_kind, fill, dtype, B, H, L, S):
    fn = _bloom_like(bias_kind, mask_kind, fill)
    got, want, moved = _run(fn, *_inputs(B, H, L, S, 16, bias_kind, mask_kind, dtype))
    torch.testing.assert_close(got, want)
    assert moved[REWRITES] == 1
    if mask_kind == "where" and L == S:   # a causal keep mask: no mask tensor stored
        assert moved[CAUSAL] == 1


@pytest.mark.parametrize("prep", ["copy", "computed"])
def test_flattened_operands_read_where_they_are(prep):
    """q, k, v flattened by a copy (read through it, in their [B, H, X, D] form) or computed on
    [B * H, X, D] (viewed back): one flash call, eager's results."""
    fn = _bloom_like("alibi", "where", "min", prep)
    got, want, moved = _run(fn, *_inputs(2, 3, 9, 9, 16, "alibi", "where", torch.float32))
    torch.testing.assert_close(got, want)
    assert moved == {REWRITES: 1, CAUSAL: 1}


@pytest.mark.parametrize("fill", ["min", "-inf"])
def test_padded_rows_match_eager(fill):
    """A keep mask that is not causal (left padding) runs with bias + the filled mask; rows whose
    keys are all masked: uniform under finfo.min, NaN under -inf, as eager's plain softmax."""
    args = _inputs(2, 2, 8, 8, 16, "alibi", "where", torch.float32, padded=True)
    got, want, moved = _run(_bloom_like("alibi", "where", fill), *args)
    assert moved == {REWRITES: 1, CAUSAL: 0}
    assert torch.isnan(want).any() == (fill == "-inf")
    torch.testing.assert_close(got, want, equal_nan=True)


def test_float_mask_rows_of_neg_inf_are_nan():
    q, k, v, bias, _ = _inputs(1, 2, 5, 6, 8, "alibi", "float", torch.float32)
    mask = torch.zeros(1, 1, 5, 6)
    mask[..., 2, :] = float("-inf")
    got, want, moved = _run(_bloom_like("alibi", "float"), q, k, v, bias, mask)
    assert moved[REWRITES] == 1 and torch.isnan(got[0, 2]).all()
    torch.testing.assert_close(got, want, equal_nan=True)


def test_bloom_runs_its_attention_as_flash_calls():
    """Bloom from the zoo (ALiBi through baddbmm, a causal mask filled with finfo.min): both layers
    rewritten, the causal path taken, eager's logits; with a padded batch too."""
    from dvm.tools.bench_zoo_models import ZOO, inputs
    zm = ZOO["bloom"]
    model = zm.build()
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="dvm", dynamic=True)
    before = counters.snapshot()
    with torch.no_grad():
        for B, L in ((1, 5), (2, 12)):
            kw = inputs(zm, B, L)
            torch.testing.assert_close(compiled(**kw).logits, model(**kw).logits)
        kw = inputs(zm, 2, 12)
        kw["attention_mask"] = torch.ones(2, 12, dtype=torch.long)
        kw["attention_mask"][0, :4] = 0
        torch.testing.assert_close(compiled(**kw).logits, model(**kw).logits)
    after = counters.snapshot()
    assert after.get(REWRITES, 0) - before.get(REWRITES, 0) >= 2
    assert after.get(CAUSAL, 0) > before.get(CAUSAL, 0)


def _flat(q, k, v):
    return (t.flatten(0, 1) for t in (q, k, v))


def _scores_returned(q, k, v, bias, keep):
    q, k, v = _flat(q, k, v)
    s = torch.baddbmm(bias, q, k.transpose(1, 2), beta=1.0, alpha=0.5).view(1, 2, q.shape[1], -1)
    p = torch.softmax(s + torch.where(keep, 0.0, float("-inf")), dim=-1)
    return torch.bmm(p.view(2, q.shape[1], -1), v).view(1, 2, q.shape[1], -1), p


def _beta_two(q, k, v, bias, keep):
    q, k, v = _flat(q, k, v)
    s = torch.baddbmm(bias, q, k.transpose(1, 2), beta=2.0, alpha=0.5).view(1, 2, q.shape[1], -1)
    p = torch.softmax(s, dim=-1)
    return torch.bmm(p.view(2, q.shape[1], -1), v).view(1, 2, q.shape[1], -1)


def _other_dim(q, k, v, bias, keep):
    q, k, v = _flat(q, k, v)
    s = torch.baddbmm(bias, q, k.transpose(1, 2)).view(1, 2, q.shape[1], -1)
    p = torch.softmax(s, dim=-2)
    return torch.bmm(p.view(2, q.shape[1], -1), v).view(1, 2, q.shape[1], -1)


@pytest.mark.parametrize("fn", [_scores_returned, _beta_two, _other_dim])
def test_chains_it_must_not_touch_are_left_alone(fn):
    """Probabilities read twice, beta other than 1, a softmax over another dim: as written."""
    q, k, v, bias, keep = _inputs(1, 2, 6, 6, 8, "alibi", "where", torch.float32)
    got, want, moved = _run(fn, q, k, v, bias, keep)
    assert moved[REWRITES] == 0
    torch.testing.assert_close(got, want)


def test_half_precision_is_left_alone():
    """bf16: eager rounds the scores between its steps, the kernel keeps f32 (fx_attention's rule)."""
    q, k, v, bias, keep = _inputs(1, 2, 16, 16, 16, "alibi", "where", torch.bfloat16)
    got, want, moved = _run(_bloom_like("alibi", "where"), q, k, v, bias, keep)
    assert moved[REWRITES] == 0
    torch.testing.assert_close(got, want)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(B=st.integers(1, 3), H=st.integers(1, 4), L=st.integers(2, 20), extra=st.integers(0, 6),
       D=st.sampled_from([4, 8, 16]), bias_kind=st.sampled_from(["none", "alibi", "rows", "shared"]),
       mask_kind=st.sampled_from(["none", "where", "float"]), padded=st.booleans(),
       special=st.sampled_from([None, "nan", "inf"]), seed=st.integers(0, 2 ** 16))
def test_random_flattened_attention_matches_eager(B, H, L, extra, D, bias_kind, mask_kind, padded, special, seed):
    S = L + extra
    q, k, v, bias, keep = _inputs(B, H, L, S, D, bias_kind, mask_kind, torch.float32, padded and S >= 2, seed)
    if special is not None:
        q[0, 0, 0, 0] = float(special)
    fn = _bloom_like(bias_kind, mask_kind)
    got, want, moved = _run(fn, q, k, v, bias, keep)
    assert moved[REWRITES] == 1
    torch.testing.assert_close(got, want, equal_nan=True)


@pytest.mark.parametrize("bias_kind,mask_kind", [("none", "none"), ("alibi", "where"), ("rows", "float")])
def test_a_nan_query_gives_eagers_nan(bias_kind, mask_kind):
    """The flash kernel returns 0 for a query row holding a NaN at some shapes (here 2 x 2 without
    a mask): the call runs the math then, with eager's NaN row."""
    q, k, v, bias, keep = _inputs(1, 1, 2, 2, 4, bias_kind, mask_kind, torch.float32)
    q[0, 0, 0, 0] = float("nan")
    got, want, moved = _run(_bloom_like(bias_kind, mask_kind), q, k, v, bias, keep)
    assert moved[REWRITES] == 1 and torch.isnan(want[:, 0]).all()
    torch.testing.assert_close(got, want, equal_nan=True)
