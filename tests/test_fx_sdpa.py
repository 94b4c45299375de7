"""The run-time causal-mask check of frontend/fx_sdpa: the exact check, and attention under
torch.compile(backend="dvm") equal to eager on both paths (causal mask / any other mask)."""
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

from dvm.frontend import fx_sdpa  # noqa: E402
from dvm.runtime import counters  # noqa: E402

pytestmark = pytest.mark.vm_once


def _tril(B, L):
    return torch.ones(L, L, dtype=torch.bool).tril().expand(B, 1, L, L).contiguous()


@pytest.mark.parametrize("L", [1, 2, 3, 5, 8, 17, 64, 600])   # 600: over _BYTES_CHECK_MAX
@pytest.mark.parametrize("B", [1, 3])
def test_causal_mask_is_recognized_exactly(B, L):
    assert fx_sdpa.is_causal_mask(_tril(B, L), L, L)
    for b, i, j in {(0, 0, 0), (B - 1, L - 1, L - 1), (B - 1, L - 1, 0), (0, L // 2, min((L + 1) // 2, L - 1))}:
        keep = _tril(B, L)
        keep[b, 0, i, j] = not bool(keep[b, 0, i, j])
        assert not fx_sdpa.is_causal_mask(keep, L, L), (b, i, j)


def test_causal_mask_check_needs_square_matching_sizes():
    keep = _tril(1, 4)
    assert not fx_sdpa.is_causal_mask(keep, 4, 5)
    assert not fx_sdpa.is_causal_mask(keep, 3, 3)
    assert not fx_sdpa.is_causal_mask(keep.float(), 4, 4)
    assert fx_sdpa.is_causal_mask(_tril(1, 4)[:, :, :, :], 4, 4)
    # a non-contiguous (broadcast) mask is checked on its values
    assert fx_sdpa.is_causal_mask(torch.ones(6, 6, dtype=torch.bool).tril().expand(2, 4, 6, 6), 6, 6)


def test_causal_mask_memo_follows_in_place_changes():
    keep = _tril(1, 9)
    assert fx_sdpa.is_causal_mask(keep, 9, 9)
    keep[0, 0, 0, 5] = True              # bumps the version counter: checked again
    assert not fx_sdpa.is_causal_mask(keep, 9, 9)


def test_keep_kind_is_one_remembered_fact_that_follows_in_place_changes():
    keep = _tril(2, 6)
    assert fx_sdpa.keep_kind(keep, 6, 6) == fx_sdpa.keep_kind(keep, 6, 6) == "causal"
    keep[1, 0, 0, 1] = True              # query 0 keeps key 1: not causal
    assert fx_sdpa.keep_kind(keep, 6, 6) == "masked"
    keep.fill_(True)
    assert fx_sdpa.keep_kind(keep, 6, 6) == "every key"
    padding = torch.ones(2, 1, 1, 6, dtype=torch.bool)
    padding[1, ..., 4:] = False          # an encoder's padding mask, broadcast over the queries
    assert fx_sdpa.keep_kind(padding.expand(2, 1, 6, 6), 6, 6) == "masked"
    big = torch.ones(2, 1, 1, 600, dtype=torch.bool)   # over _BYTES_CHECK_MAX: the row-loop path
    big[1, ..., 400:] = False
    assert fx_sdpa.keep_kind(big.expand(2, 1, 600, 600).contiguous(), 600, 600) == "masked"
    tri = _tril(2, 600)
    tri[1, 0, 599, 3] = False
    assert fx_sdpa.keep_kind(tri, 600, 600) == "masked"
    assert fx_sdpa.keep_kind(torch.ones(1, 1, 1, 1, dtype=torch.bool), 1, 1) == "causal"



def _kind_by_definition(keep, L, S):
    causal = keep.dim() >= 2 and L == S and L > 0 and tuple(keep.shape[-2:]) == (L, S) and \
        bool(torch.equal(keep, torch.ones(L, S, dtype=torch.bool).tril().expand(keep.shape)))
    return "causal" if causal else "every key" if bool(keep.all()) else "masked"


@settings(max_examples=200, deadline=None)
@given(B=st.integers(1, 3), L=st.integers(0, 9), S=st.integers(0, 9), start=st.sampled_from(["tril", "ones", "zeros"]),
       flips=st.lists(st.tuples(st.integers(0, 2), st.integers(0, 8), st.integers(0, 8)), max_size=3),
       broadcast=st.booleans())
def test_keep_kind_of_fresh_masks_is_the_definition(B, L, S, start, flips, broadcast):
    """A mask seen for the first time (one NumPy read decides most kinds) against the kind by its
    definition, over causal masks, all-kept and all-dropped ones, a few entries flipped, and
    padding masks broadcast over the queries."""
    if broadcast:   # an encoder's padding mask: [B, 1, 1, S] expanded over L queries
        row = torch.ones(B, 1, 1, S, dtype=torch.bool)
        for b, _, j in flips:
            if b < B and j < S:
                row[b, ..., j] = False
        keep = row.expand(B, 1, L, S)
    else:
        keep = {"tril": torch.ones(L, S, dtype=torch.bool).tril(), "ones": torch.ones(L, S, dtype=torch.bool),
                "zeros": torch.zeros(L, S, dtype=torch.bool)}[start].expand(B, 1, L, S).contiguous()
        for b, i, j in flips:
            if b < B and i < L and j < S:
                keep[b, 0, i, j] = not keep[b, 0, i, j]
    assert fx_sdpa.keep_kind(keep, L, S) == _kind_by_definition(keep, L, S)
    assert fx_sdpa.keep_kind(keep.float(), L, S) == "masked"   # (only a bool mask is read)

def test_keep_kind_reads_a_true_stored_as_any_nonzero_byte():
    """A bool mask viewed from bytes may hold a True as 2: it keeps the key (as PyTorch's ops
    read it), but its bytes are not the causal pattern's, so such a mask is used as given."""
    ones = torch.full((1, 1, 4, 4), 2, dtype=torch.uint8).view(torch.bool)
    assert fx_sdpa.keep_kind(ones, 4, 4) == "every key"
    tri = (torch.ones(4, 4, dtype=torch.uint8).tril() * 2).expand(1, 1, 4, 4).contiguous().view(torch.bool)
    assert fx_sdpa.keep_kind(tri, 4, 4) == "masked"
    q, k, v = (torch.randn(1, 2, 4, 8) for _ in range(3))
    fn = torch.compile(_attention, backend="dvm", dynamic=True)
    torch.testing.assert_close(fn(q, k, v, tri), _attention(q, k, v, tri))


def _attention(q, k, v, keep):
    mask = torch.where(keep, 0.0, float("-inf"))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def test_compiled_attention_matches_eager_on_both_paths():
    torch._dynamo.reset()
    fn = torch.compile(_attention, backend="dvm", dynamic=True)
    before = counters.snapshot()
    for L in (2, 7, 33):
        q, k, v = (torch.randn(2, 3, L, 8) for _ in range(3))
        causal = _tril(2, L)
        torch.testing.assert_close(fn(q, k, v, causal), _attention(q, k, v, causal))
        other = causal.clone()
        other[1, 0, L - 1, 0] = False    # a padding-like hole: the mask is used as given
        torch.testing.assert_close(fn(q, k, v, other), _attention(q, k, v, other))
    after = counters.snapshot()
    assert after.get("torch_sdpa_causal", 0) - before.get("torch_sdpa_causal", 0) == 3
    assert after.get("torch_sdpa_masked", 0) - before.get("torch_sdpa_masked", 0) == 3


def test_a_mask_keeping_every_key_runs_unmasked():
    """A padding mask without padding (every entry True, as an encoder's unpadded batch): sdpa runs
    with no mask, bitwise eager's masked result (the mask's zeros add nothing); a mask with a hole
    runs masked, its additive form made once per mask and version."""
    torch._dynamo.reset()
    fn = torch.compile(_attention, backend="dvm", dynamic=True)
    before = counters.snapshot()
    for L in (3, 17):
        q, k, v = (torch.randn(2, 3, L, 8) for _ in range(3))
        keep = torch.ones(2, 1, L, L, dtype=torch.bool)
        torch.testing.assert_close(fn(q, k, v, keep), _attention(q, k, v, keep), rtol=0, atol=0)
        keep[1, 0, 0, L - 1] = False
        torch.testing.assert_close(fn(q, k, v, keep), _attention(q, k, v, keep))
    after = counters.snapshot()
    assert after.get("torch_sdpa_unmasked", 0) - before.get("torch_sdpa_unmasked", 0) == 2
    assert after.get("torch_sdpa_masked", 0) - before.get("torch_sdpa_masked", 0) == 2
    keep = torch.ones(1, 1, 4, 4, dtype=torch.bool)
    assert fx_sdpa.keeps_every_key(keep)
    mask = fx_sdpa.additive_mask(keep, torch.float32)
    assert fx_sdpa.additive_mask(keep, torch.float32) is mask and not mask.any()
    assert fx_sdpa.additive_mask(keep, torch.float64).dtype == torch.float64
    keep[0, 0, 1, 2] = False   # bumps the version counter: both facts found again
    assert not fx_sdpa.keeps_every_key(keep)
    assert fx_sdpa.additive_mask(keep, torch.float32)[0, 0, 1, 2] == -math.inf


@pytest.mark.cpu_vm   # runs its graph on the default (CPU) VM
def test_rewrite_leaves_other_masks_alone():
    """A where that is not (keep, 0, -inf) keeps the plain sdpa with its mask."""
    def biased(q, k, v, keep):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=torch.where(keep, 0.5, -math.inf))
    torch._dynamo.reset()
    fn = torch.compile(biased, backend="dvm", dynamic=True)
    before = counters.snapshot()
    q, k, v = (torch.randn(1, 2, 5, 8) for _ in range(3))
    torch.testing.assert_close(fn(q, k, v, _tril(1, 5)), biased(q, k, v, _tril(1, 5)))
    after = counters.snapshot()
    assert after.get("torch_sdpa_causal", 0) == before.get("torch_sdpa_causal", 0)
    assert after.get("torch_sdpa_masked", 0) == before.get("torch_sdpa_masked", 0)


def _repeat_kv(x, rep):   # as Hugging Face's models write it
    b, h, s, d = x.shape
    return x[:, :, None, :, :].expand(b, h, rep, s, d).reshape(b, h * rep, s, d)


def _grouped(q, k, v, keep, rep):
    mask = torch.where(keep, 0.0, float("-inf"))
    return F.scaled_dot_product_attention(q, _repeat_kv(k, rep), _repeat_kv(v, rep), attn_mask=mask)


@pytest.mark.cpu_vm
@pytest.mark.parametrize("rep", [2, 3])
def test_repeated_keys_and_values_are_passed_grouped(rep):
    """sdpa(q, repeat_kv(k), repeat_kv(v)) runs as sdpa(q, k, v) (the kernel groups the heads):
    bitwise eager's result on both mask paths, k and v transposed views as the models pass them.
    With gradients the copies are saved for the backward: no rewrite, gradients match."""
    torch._dynamo.reset()
    fn = torch.compile(_grouped, backend="dvm", dynamic=True)
    before = counters.snapshot().get("torch_sdpa_grouped_kv", 0)
    for B, L in ((1, 6), (2, 9)):
        q = torch.randn(B, 2 * rep, L, 8)
        k, v = (torch.randn(B, L, 2, 8).transpose(1, 2) for _ in range(2))
        for keep in (_tril(B, L), torch.rand(B, 1, L, L) > 0.2):
            keep[..., 0] = True   # no fully masked row
            torch.testing.assert_close(fn(q, k, v, keep, rep), _grouped(q, k, v, keep, rep), rtol=0, atol=0)
    assert counters.snapshot().get("torch_sdpa_grouped_kv", 0) > before
    torch._dynamo.reset()
    q, k, v = (torch.randn(1, 2 * rep if i == 0 else 2, 5, 8, requires_grad=True) for i in range(3))
    keep = _tril(1, 5)
    got = torch.autograd.grad(torch.compile(_grouped, backend="dvm", dynamic=True)(q, k, v, keep, rep).sum(), (q, k, v))
    want = torch.autograd.grad(_grouped(q, k, v, keep, rep).sum(), (q, k, v))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)


@pytest.mark.cpu_vm
def test_repeated_keys_and_values_with_a_strided_last_dim_keep_their_copies():
    """Keys and values whose last dim is not contiguous (a convolution over time, transposed) stay
    repeated: the flash kernel, called directly, needs a unit last stride, which repeat_kv's copy
    gives it (passed grouped, the result was wrong)."""
    torch._dynamo.reset()
    fn = torch.compile(_grouped, backend="dvm", dynamic=True)
    before = counters.snapshot().get("torch_sdpa_grouped_kv", 0)
    for B, L in ((1, 6), (2, 9)):
        q = torch.randn(B, 4, L, 8)
        k, v = (torch.randn(B, 2, 8, L).transpose(2, 3) for _ in range(2))   # stride(-1) == L
        keep = torch.rand(B, 1, L, L) > 0.2
        keep[..., 0] = True
        torch.testing.assert_close(fn(q, k, v, keep, 2), _grouped(q, k, v, keep, 2), rtol=0, atol=0)
    assert counters.snapshot().get("torch_sdpa_grouped_kv", 0) == before


class _ScaledQueryAttention(torch.nn.Module):
    """OPT's attention shape: the query projection times a float attribute, then views and sdpa."""

    def __init__(self, scaling, scale=None, heads=4, dim=64):
        super().__init__()
        self.q, self.k, self.v = (torch.nn.Linear(dim, dim) for _ in range(3))
        self.scaling, self.scale, self.heads = scaling, scale, heads

    def forward(self, h):
        b, t, d = h.shape

        def split(x):
            return x.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        q = self.q(h) * self.scaling
        return F.scaled_dot_product_attention(split(q), split(self.k(h)), split(self.v(h)), is_causal=True,
                                              scale=self.scale)


@pytest.mark.parametrize("scale", [None, 1.0, 0.3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_scaled_query_folds_into_the_attention_scale(scale, dtype):
    """sdpa(q * c) runs as sdpa(q, scale=c * scale): no product over the query, eager's results
    within the dtype's assert_close tolerances, for c a float Dynamo passes as a tensor."""
    torch.manual_seed(0)
    mod = _ScaledQueryAttention(16 ** -0.5, scale).to(dtype).eval()
    torch._dynamo.reset()
    fn = torch.compile(mod, backend="dvm", dynamic=True)
    before = counters.snapshot().get("torch_sdpa_query_scale_folded", 0)
    with torch.no_grad():
        for t in (5, 9, 33):
            h = torch.randn(2, t, 64, dtype=dtype)
            torch.testing.assert_close(fn(h), mod(h))
    if dtype == torch.bfloat16:
        return   # (the bf16 product is computed in f32 and rounded back: not folded, still eager's values)
    assert counters.snapshot().get("torch_sdpa_query_scale_folded", 0) > before
    from dvm.frontend.torch_runtime import COMPILED
    assert "mul" not in COMPILED[-1].describe()       # no segment left for the product


def test_query_scale_rounds_as_the_conversions_do():
    s = torch.tensor(1 / 3, dtype=torch.float64)
    as_f32 = float(torch.tensor(1 / 3, dtype=torch.float32))
    assert fx_sdpa.query_scale(s, (torch.float32,), 2.0) == as_f32 * 2.0
    assert fx_sdpa.query_scale(s, (torch.float64, torch.bfloat16), 1.0) == float(torch.tensor(1 / 3).bfloat16())
    assert fx_sdpa.query_scale(s, (), 0.5) == (1 / 3) * 0.5


def test_a_scaled_query_read_elsewhere_is_left_alone():
    def fn(q, k, v, c):
        qs = q * c
        return F.scaled_dot_product_attention(qs, k, v), qs.sum()
    q, k, v = (torch.randn(1, 2, 7, 8) for _ in range(3))
    torch._dynamo.reset()
    before = counters.snapshot().get("torch_sdpa_query_scale_folded", 0)
    got = torch.compile(fn, backend="dvm", dynamic=True)(q, k, v, 0.5)
    torch.testing.assert_close(got, fn(q, k, v, 0.5))
    assert counters.snapshot().get("torch_sdpa_query_scale_folded", 0) == before
