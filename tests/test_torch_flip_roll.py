"""flip, roll, F.pad (constant, reflect, replicate) and the gradient of a slice under
torch.compile(backend="dvm") (frontend/aten_views): eager's values and gradients for random shapes,
axes, shifts, pads and dtypes, fixed and changing sizes (Hypothesis), with no fallback op."""

import pytest

torch = pytest.importorskip("torch")

from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

import dvm.frontend.torch_backend  # noqa: E402,F401
from dvm.runtime import counters  # noqa: E402
from helpers import new_fallbacks  # noqa: E402

pytestmark = [pytest.mark.cpu_vm, pytest.mark.vm_once]   # runs once, on the default (CPU) VM

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "i64": torch.int64}


@st.composite
def cases(draw):
    rank = draw(st.integers(1, 3))
    shapes = draw(st.lists(st.lists(st.integers(1, 12), min_size=rank, max_size=rank), min_size=1, max_size=3))
    axes = draw(st.lists(st.integers(-rank, rank - 1), min_size=1, max_size=rank, unique_by=lambda a: a % rank))
    shifts = draw(st.lists(st.integers(-15, 15), min_size=len(axes), max_size=len(axes)))
    return dict(shapes=[tuple(s) for s in shapes], axes=axes, shifts=shifts, op=draw(st.sampled_from(
        ["flip", "roll", "roll_flat", "slice_grad", "pad"])), pads=draw(st.lists(st.integers(-1, 3), min_size=2,
                                                                               max_size=2 * rank)), dtype=draw(st.sampled_from(sorted(DTYPES))),
        dynamic=draw(st.booleans()), seed=draw(st.integers(0, 2 ** 16)))


def _fn(case):
    axes, shifts = case["axes"], case["shifts"]
    ops = {"flip": lambda x: x.flip(axes) * 2 + x,   # (one rounding in bf16, as eager)
           "roll": lambda x: x.roll(shifts, axes) - x,
           "roll_flat": lambda x: torch.roll(x * 2, shifts[0]),
           "slice_grad": lambda x: x[_part(x.dim(), axes[0], shifts[0])] * 2,
           "pad": lambda x: torch.nn.functional.pad(x * 2, _pads(x.shape, case["pads"]), value=shifts[0])}
    return ops[case["op"]]


def _pads(shape, pads) -> list:
    """pads (from the last axis back) with crops only of axes of 3 or more"""
    pads = pads[:len(pads) // 2 * 2]
    return [p if p >= 0 or shape[-1 - i // 2] >= 3 else 0 for i, p in enumerate(pads)]


def _part(rank: int, axis: int, shift: int) -> tuple:
    """x[..., 1:, ...] (shift > 0) or x[..., :-1, ...] along axis"""
    index = [slice(None)] * rank
    index[axis] = slice(1, None) if shift > 0 else slice(None, -1)
    return tuple(index)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_matches_eager(case):
    fn = _fn(case)
    dtype = DTYPES[case["dtype"]]
    torch._dynamo.reset()
    before = counters.snapshot()
    cf = torch.compile(fn, backend="dvm", dynamic=case["dynamic"])
    g = torch.Generator().manual_seed(case["seed"])
    for shape in case["shapes"]:
        x = (torch.randn(shape, generator=g) * 4).to(dtype)
        grad = dtype.is_floating_point
        xs = [x.clone().requires_grad_(grad) for _ in range(2)]
        got, want = cf(xs[0]), fn(xs[1])
        torch.testing.assert_close(got, want, msg=lambda m: f"{shape}: {m}")
        if grad:
            weights = (torch.arange(want.numel()) % 5 - 2).view(want.shape).to(dtype)   # (exact products)
            for out, t in zip((got, want), xs):
                (out * weights).sum().backward()
            torch.testing.assert_close(xs[0].grad, xs[1].grad, msg=lambda m: f"{shape} gradient: {m}")
    fallbacks = {k for k in new_fallbacks(before) if not (case["dynamic"] and "may be negative" in k)}
    assert not fallbacks, (case, fallbacks)   # (dynamic=True may make a shift or a negative pad a symbol, which
    #                                           DVM's sizes (never negative) cannot hold: that op stays PyTorch's)


def test_language_model_shift_gradient_is_a_concat():
    """logits[:, :-1]'s gradient: the slice's gradient and a zero column (a concat), no fallback."""
    def f(x):
        return (x[:, :-1].float().log_softmax(-1) * 2).sum()
    x = torch.randn(2, 9, 17, requires_grad=True)
    y = x.detach().clone().requires_grad_(True)
    torch._dynamo.reset()
    before = counters.snapshot()
    torch.compile(f, backend="dvm", dynamic=True)(x).backward()
    f(y).backward()
    torch.testing.assert_close(x.grad, y.grad)
    assert not x.grad[:, -1].any()
    assert not new_fallbacks(before), new_fallbacks(before)


class _Padded(torch.nn.Module):
    def __init__(self, pad: torch.nn.Module):
        super().__init__()
        self.pad = pad

    def forward(self, x):
        return self.pad(x * 2) + 1


@pytest.mark.parametrize("mode", ["Reflection", "Replication"])
@pytest.mark.parametrize("dynamic", [False, True])
def test_reflection_and_replication_pads(mode, dynamic):
    """nn.ReflectionPad / nn.ReplicationPad over 1, 2 and 3 axes (mirrored slices or the edge
    repeated, concatenated): eager's values with no fallback, and eager's gradients. (Pads a module
    holds are constants under dynamic=True; a closure's ints would be symbols of either sign.)"""
    pads = {1: (2, 1), 2: (1, 3, 2, 0), 3: (1, 1, 0, 2, 1, 0)}
    for axes, pad in pads.items():
        model = _Padded(getattr(torch.nn, f"{mode}Pad{axes}d")(pad))
        torch._dynamo.reset()
        cf = torch.compile(model, backend="dvm", dynamic=dynamic)
        for size in (4, 6):
            x = torch.randn((2, 3) + (size,) * axes, generator=torch.Generator().manual_seed(size))
            before = counters.snapshot()
            with torch.no_grad():
                torch.testing.assert_close(cf(x), model(x))
            assert not new_fallbacks(before), (axes, size, new_fallbacks(before))
            xs = [x.clone().requires_grad_(True) for _ in range(2)]
            for fn, t in ((cf, xs[0]), (model, xs[1])):
                out = fn(t)
                (out * torch.arange(out.numel()).view(out.shape).remainder(5)).sum().backward()
            torch.testing.assert_close(xs[0].grad, xs[1].grad)
