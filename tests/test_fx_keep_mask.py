"""frontend/fx_keep_mask: a padding mask's float form is one row per batch entry expanded, with the
values of the plain where at every index, and attention on it (the flash kernel, the math, a
compiled encoder-style attention) is bitwise attention on the plain mask."""
import math

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

from dvm.frontend import fx_keep_mask  # noqa: E402
from dvm.frontend.fx_attention_math import SDPA_CALL, math_attention  # noqa: E402
from dvm.runtime import counters  # noqa: E402

pytestmark = pytest.mark.vm_once


def _padding(B, L, S, hole=False):
    """keep [B, 1, L, S]: entry b keeps its first S - (b + 1) S / (2 B) keys on every query row
    (hole: one entry off, so that its rows do not repeat)."""
    keep = torch.ones(B, 1, L, S, dtype=torch.bool)
    for b in range(B):
        keep[b, :, :, S - (b + 1) * S // (2 * B):] = False
    if hole:
        keep[B - 1, 0, L // 2, 0] = False
    return keep


def _where(keep, fill, dtype):
    return torch.where(keep, torch.zeros((), dtype=dtype), torch.full((), fill, dtype=dtype))


@pytest.mark.parametrize("B, L, S", [(4, 128, 128), (2, 300, 301), (1, 256, 512), (3, 64, 344)])
@pytest.mark.parametrize("hole", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_filled_mask_has_the_plain_wheres_values(B, L, S, hole, dtype):
    keep = _padding(B, L, S, hole)
    mask = fx_keep_mask.filled_mask(keep, -math.inf, dtype)
    assert mask.dtype == dtype and torch.equal(mask, _where(keep, -math.inf, dtype))
    assert (mask.stride(-2) == 0) == (not hole)   # one row, expanded: a padding mask
    assert fx_keep_mask.filled_mask(keep, -math.inf, dtype) is mask   # once per version
    keep[0, 0, 0, 0] = False     # (a new version: found again, no longer a repeated row)
    again = fx_keep_mask.filled_mask(keep, -math.inf, dtype)
    assert again.stride(-2) != 0 and torch.equal(again, _where(keep, -math.inf, dtype))


def test_small_or_other_masks_take_the_plain_where():
    small = _padding(2, 16, 16)   # under ROW_MASK_MIN_ENTRIES
    assert small.numel() < fx_keep_mask.ROW_MASK_MIN_ENTRIES
    assert fx_keep_mask.filled_mask(small, -math.inf, torch.float32).stride(-2) != 0
    expanded = _padding(2, 1, 512).expand(2, 1, 512, 512)   # (already a view of one row: kept so)
    assert fx_keep_mask._rows_repeat(expanded)
    assert not fx_keep_mask._rows_repeat(_padding(2, 256, 512).float())


@pytest.mark.parametrize("B, L, S", [(4, 128, 128), (2, 256, 200)])
def test_attention_on_it_is_bitwise_attention_on_the_plain_mask(B, L, S):
    torch.manual_seed(B)
    q, k, v = torch.randn(B, 4, L, 32), torch.randn(B, 4, S, 32), torch.randn(B, 4, S, 32)
    keep = _padding(B, L, S)
    mask, plain = fx_keep_mask.filled_mask(keep, -math.inf, torch.float32), _where(keep, -math.inf, torch.float32)
    assert mask.stride(-2) == 0
    assert torch.equal(SDPA_CALL(q, k, v, attn_mask=mask)[0], SDPA_CALL(q, k, v, attn_mask=plain)[0])
    assert torch.equal(math_attention(q, k, v, None, "plain", mask), math_attention(q, k, v, None, "plain", plain))


def _attention(q, k, v, keep):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=torch.where(keep, 0.0, float("-inf")))


@pytest.mark.cpu_vm   # runs its graph on the default (CPU) VM
def test_compiled_padded_attention_matches_eager():
    torch._dynamo.reset()
    fn = torch.compile(_attention, backend="dvm", dynamic=True)
    before = counters.snapshot()
    for L, hole in ((128, False), (256, False), (256, True)):
        q, k, v = (torch.randn(4, 2, L, 16) for _ in range(3))
        keep = _padding(4, L, L, hole)
        torch.testing.assert_close(fn(q, k, v, keep), _attention(q, k, v, keep))
    after = counters.snapshot()
    assert after.get("torch_sdpa_masked", 0) - before.get("torch_sdpa_masked", 0) == 3
