"""Cross-entropy and NLL loss under torch.compile(backend="dvm") (frontend/aten_decomp_nll): eager's
loss and gradient for random shapes (1-D, 2-D, spatial), class weights, ignore_index in and out of
the class range, label smoothing, reductions, dtypes (Hypothesis), with no fallback op; one graph
for changing sizes; a target outside the classes gives NaN, not a plausible loss."""

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

import dvm.frontend.torch_backend  # noqa: E402,F401
from dvm.runtime import counters  # noqa: E402
from helpers import new_fallbacks  # noqa: E402

pytestmark = [pytest.mark.cpu_vm, pytest.mark.vm_once]   # runs once, on the default (CPU) VM

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16, "f64": torch.float64}


def _close(got, want, exact):
    """eager's value within the dtype's assert_close tolerance, or as near float64's as eager's
    within twice eager's error and one rounding of the largest value (eager's 16-bit log-softmax
    rounds more than the float32 one DVM computes and rounds once; the steps after it round in
    their own order)"""
    try:
        torch.testing.assert_close(got, want)
    except AssertionError:
        err, eager_err = ((v.double() - exact).abs().max().item() for v in (got, want))
        assert err <= 2 * eager_err + torch.finfo(got.dtype).eps * exact.abs().max().item(), (err, eager_err)


@st.composite
def cases(draw):
    classes = draw(st.integers(1, 40))
    batch = tuple(draw(st.lists(st.integers(1, 9), min_size=0, max_size=3)))
    return dict(classes=classes, batch=batch, dtype=draw(st.sampled_from(sorted(DTYPES))),
                reduction=draw(st.sampled_from(["mean", "sum", "none"])), weighted=draw(st.booleans()),
                ignore=draw(st.sampled_from([-100, 0, classes - 1])), smoothing=draw(st.sampled_from([0.0, 0.2])),
                seed=draw(st.integers(0, 2 ** 16)))


def _inputs(case):
    g = torch.Generator().manual_seed(case["seed"])
    batch, classes = case["batch"], case["classes"]
    shape = (classes,) if not batch else (batch[0], classes) + batch[1:]
    x = (torch.randn(shape, generator=g) * 3).to(DTYPES[case["dtype"]])
    target = torch.randint(0, classes, batch, generator=g)
    if target.numel() > 1:
        target.view(-1)[0] = case["ignore"]      # at least one ignored row (when ignore is a class: maybe twice)
    weight = torch.rand(classes, generator=g).to(x.dtype) + 0.5 if case["weighted"] else None
    return x, target, weight


def _loss(case):
    def f(x, target, weight):
        return F.cross_entropy(x, target, weight=weight, ignore_index=case["ignore"], reduction=case["reduction"],
                               label_smoothing=case["smoothing"])
    return f


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_cross_entropy_matches_eager(case):
    x, target, weight = _inputs(case)
    if case["reduction"] == "mean" and (target != case["ignore"]).sum() == 0:
        case["reduction"] = "sum"                 # every row ignored: 0 / 0 (NaN) in both, untestable by grad
    f = _loss(case)
    torch._dynamo.reset()
    before = counters.snapshot()
    xs = [x.clone().requires_grad_(True) for _ in range(2)] + [x.double().requires_grad_(True)]
    got, want = torch.compile(f, backend="dvm", dynamic=False)(xs[0], target, weight), f(xs[1], target, weight)
    exact = f(xs[2], target, None if weight is None else weight.double())
    _close(got, want, exact)
    for out, t in zip((got, want, exact), xs):
        (out * torch.linspace(0.5, 1.5, out.numel()).view(out.shape).to(out.dtype)).sum().backward()
    _close(xs[0].grad, xs[1].grad, xs[2].grad)
    fallbacks = new_fallbacks(before)
    if case["weighted"] and case["smoothing"] and case["reduction"] == "mean":
        fallbacks.pop("fallback:aten.gather.default:not in table", None)  # (the smoothing term's divisor)
    assert not fallbacks, (case, fallbacks)


def test_nll_loss_of_log_softmax_one_graph_for_changing_sizes():
    def f(x, target):
        return F.nll_loss(F.log_softmax(x, -1), target), F.nll_loss(x.log_softmax(1), target, reduction="none")
    torch._dynamo.reset()
    cf = torch.compile(f, backend="dvm", dynamic=True)
    for n, c in ((5, 7), (9, 7), (33, 130), (2, 3)):
        x = torch.randn(n, c, generator=torch.Generator().manual_seed(n))
        target = torch.arange(n) % c
        before = counters.snapshot()
        torch.testing.assert_close(cf(x, target), f(x, target), msg=lambda m: f"{n}x{c}: {m}")
        assert not new_fallbacks(before)


def test_target_outside_the_classes_gives_nan():
    """eager raises; a fused kernel cannot, so the row's loss (and the mean) is NaN, the others eager's"""
    x = torch.randn(4, 5)
    target = torch.tensor([1, 5, -3, -100])
    torch._dynamo.reset()
    rows = torch.compile(lambda x, t: F.cross_entropy(x, t, reduction="none"), backend="dvm")(x, target)
    assert rows[1].isnan() and rows[2].isnan() and rows[3] == 0
    torch.testing.assert_close(rows[0], F.cross_entropy(x[:1], target[:1], reduction="none")[0])
    with pytest.raises(IndexError):
        F.cross_entropy(x, target)
    torch._dynamo.reset()
    assert torch.compile(lambda x, t: F.cross_entropy(x, t), backend="dvm")(x, target).isnan()


def test_language_model_loss_fuses_with_log_softmax():
    """an LM head's loss (shifted labels, -100 padding), float32 upcast of bf16 logits as transformers
    does: eager's loss and gradient, with no fallback op."""
    def f(logits, labels):
        logits = logits.float()
        return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1))
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(2, 17, 300, generator=g).to(torch.bfloat16)
    labels = torch.randint(0, 300, (2, 17), generator=g)
    labels[:, -4:] = -100
    xs = [logits.clone().requires_grad_(True) for _ in range(2)]
    torch._dynamo.reset()
    before = counters.snapshot()
    got, want = torch.compile(f, backend="dvm", dynamic=True)(xs[0], labels), f(xs[1], labels)
    torch.testing.assert_close(got, want)
    got.backward()
    want.backward()
    torch.testing.assert_close(xs[0].grad, xs[1].grad)
    assert not new_fallbacks(before), new_fallbacks(before)
