"""F.interpolate under the DVM backend (frontend/fx_interpolate): one call of PyTorch's own
upsampling kernel, not its decomposition into index tensors and `_unsafe_index` gathers (which
ran as PyTorch calls, several times eager's time); eager's bits, at every size of a dynamic graph,
and eager's gradients through it (its backward kernel); a call the rewrite does not take keeps the
decomposition and eager's values."""
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import dvm  # noqa: E402

pytestmark = [pytest.mark.cpu_vm, pytest.mark.vm_once]

# (mode, keyword arguments, input shape at the first call, at the second); float factors: an int
# in a closure's dict is a symbolic int under dynamic=True, which PyTorch's upsampling refuses
# (a graph break in Dynamo, whatever the backend)
CASES = [
    ("bilinear", dict(scale_factor=4.0, align_corners=False), (1, 3, 8, 8), (2, 3, 5, 7)),
    ("bilinear", dict(size=(13, 9), align_corners=True), (1, 4, 6, 6), (1, 4, 9, 5)),
    ("bilinear", dict(scale_factor=0.5, antialias=True), (1, 2, 12, 10), (1, 2, 9, 17)),
    ("bicubic", dict(size=(11, 13), align_corners=False), (2, 3, 7, 5), (1, 3, 4, 9)),
    ("bicubic", dict(scale_factor=1.7, recompute_scale_factor=True), (1, 2, 6, 8), (1, 2, 5, 5)),
    ("nearest", dict(scale_factor=2.0), (1, 3, 5, 6), (3, 3, 7, 2)),
    ("nearest", dict(size=10), (2, 5, 7), (2, 5, 3)),
    ("nearest-exact", dict(scale_factor=(1.5, 2.5)), (1, 2, 4, 6), (1, 2, 7, 3)),
    ("linear", dict(size=17, align_corners=True), (2, 3, 9), (2, 3, 4)),
    ("trilinear", dict(scale_factor=1.5), (1, 2, 3, 4, 5), (1, 2, 5, 2, 3)),
]


def _fresh(fn):
    torch._dynamo.reset()
    dvm.reset_counters()
    return dvm.compile(fn)


@pytest.mark.parametrize("mode, kw, first, second", CASES)
def test_interpolate_is_pytorchs_kernel_bit_for_bit(mode, kw, first, second):
    def fn(x):
        return F.interpolate(x * 2.0, mode=mode, **kw) + 1.0

    compiled = _fresh(fn)
    torch.manual_seed(0)
    with torch.no_grad():
        for shape in (first, second):
            x = torch.randn(shape)
            want, got = fn(x), compiled(x)
            assert got.shape == want.shape and got.stride() == want.stride()
            assert torch.equal(got, want), (mode, kw, shape)
    counts = dvm.counters()   # one call a graph (a size-1 dim at the first call: two graphs)
    assert counts.get("torch_interpolate_native") == counts["torch_dynamo_graphs"]
    assert not any("unsafe_index" in k for k in counts), counts


def test_channels_last_input_keeps_its_layout():
    """The native kernel writes a channels-last input's result channels-last: the custom op's
    shape says so too, so the segment after it reads the strides it gets."""
    def fn(x):
        return F.interpolate(x, scale_factor=3.0, mode="bilinear").relu()

    compiled = _fresh(fn)
    x = torch.randn(2, 8, 5, 6).to(memory_format=torch.channels_last)
    with torch.no_grad():
        want, got = fn(x), compiled(x)
    assert got.is_contiguous(memory_format=torch.channels_last) == want.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(got, want)


def test_size_of_another_tensor():
    """A segmentation head's `interpolate(y, size=x.shape[2:])`: the sizes are a torch.Size node."""
    def fn(x, y):
        return x + F.interpolate(y, size=x.shape[2:], mode="bilinear", align_corners=False)

    compiled = _fresh(fn)
    with torch.no_grad():
        for n in (16, 24):
            x, y = torch.randn(1, 4, n, n), torch.randn(1, 4, n // 4, n // 4)
            assert torch.equal(compiled(x, y), fn(x, y))
    counts = dvm.counters()
    assert counts.get("torch_interpolate_native") == counts["torch_dynamo_graphs"]


@pytest.mark.parametrize("mode, kw, shape", [
    ("bilinear", dict(scale_factor=2.5), (2, 3, 10, 12)), ("nearest", dict(scale_factor=2.0), (2, 3, 10, 12)),
    ("bicubic", dict(size=(11, 13), align_corners=True), (2, 3, 10, 12)),
    ("nearest-exact", dict(size=(7, 9)), (1, 3, 9, 8)),
    ("bilinear", dict(scale_factor=0.5, antialias=True), (1, 3, 14, 12)),
    ("linear", dict(size=17), (2, 3, 9)), ("trilinear", dict(scale_factor=1.5), (1, 3, 5, 6, 4))])
def test_gradients_through_interpolate_are_its_backward_kernels(mode, kw, shape):
    """Eager's gradients (assert_close: the loss's sum of squares is DVM's reduction), the call and
    its backward PyTorch's kernels, at two sizes of a dynamic graph."""
    weight = torch.randn(shape[1:2] + (1,) * (len(shape) - 2))

    def fn(x):
        return (F.interpolate(x * weight, mode=mode, **kw) ** 2).sum()

    compiled = _fresh(fn)
    for n in (0, 1):
        x1 = torch.randn(shape[:2] + tuple(d + n for d in shape[2:]), requires_grad=True)
        x2 = x1.detach().clone().requires_grad_()
        fn(x1).backward()
        compiled(x2).backward()
        torch.testing.assert_close(x2.grad, x1.grad)
    counts = dvm.counters()
    assert counts.get("torch_interpolate_native") == counts["torch_dynamo_graphs"]
    assert not any("unsafe_index" in k for k in counts), counts


def test_a_mode_the_rewrite_does_not_take_stays_and_matches():
    """area is an adaptive average pool (no decomposition to gathers): traced as before, counted."""
    def fn(x):
        return F.interpolate(x, size=(3, 5), mode="area") - 0.5

    compiled = _fresh(fn)
    x = torch.randn(1, 3, 9, 10)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), fn(x))
    assert dvm.counters().get("torch_interpolate_kept") == 1


def test_a_weight_interpolated_to_the_input_size_is_computed_once_per_size():
    """A learned position table resized to the image's patch grid (ViT's interpolate_pos_encoding,
    DINOv2, YOLOS): the call reads a weight and sizes only, so it is a size-only value
    (fx_sizeonly), computed once per size, not at every forward."""
    table = torch.nn.Parameter(torch.randn(1, 8, 4, 4))

    def fn(x):
        return x + F.interpolate(table, size=x.shape[2:], mode="bicubic", align_corners=False)

    compiled = _fresh(fn)
    with torch.no_grad():
        for n in (5, 6, 5, 6, 6):
            x = torch.randn(2, 8, n, n)
            assert torch.equal(compiled(x), fn(x))
    counts = dvm.counters()
    assert counts.get("torch_interpolate_native") == 1
    assert counts.get("torch_size_consts_computed") == 2 and counts.get("torch_size_consts_hits") == 3, counts


@pytest.mark.parametrize("mode, kw, dtype, shapes", [
    ("bilinear", dict(scale_factor=2.0), torch.bfloat16, [(1, 4, 6, 7), (2, 4, 5, 9)]),
    ("nearest", dict(size=(9, 11)), torch.uint8, [(1, 3, 6, 7), (2, 3, 4, 5)]),
    ("trilinear", dict(size=(3, 5, 7)), torch.float16, [(1, 2, 2, 3, 4), (2, 2, 3, 3, 3)]),
    ("bicubic", dict(scale_factor=2.0), torch.float32, [(0, 3, 4, 4), (3, 3, 4, 5)]),   # an empty batch
])
def test_other_dtypes_and_an_empty_batch(mode, kw, dtype, shapes):
    def fn(x):
        return F.interpolate(x, mode=mode, **kw)

    compiled = _fresh(fn)
    with torch.no_grad():
        for shape in shapes:
            x = (torch.randn(shape) * 50 + 100).to(dtype)
            want, got = fn(x), compiled(x)
            assert got.dtype == want.dtype and torch.equal(got, want), (mode, dtype, shape)
    assert dvm.counters().get("torch_interpolate_native") == dvm.counters()["torch_dynamo_graphs"]
