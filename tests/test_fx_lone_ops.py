"""The planner's lone cheap ops (frontend/fx_lone_ops): a segment of one elementwise op without
transcendental math (arithmetic, comparisons, selects, casts, copies) of PyTorch values, with views
of its result, runs as PyTorch's op, bitwise eager's; fused ops, transcendental ops and reductions
stay in DVM; switched off, the op is a segment of its own with the same values."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

import dvm.frontend.torch_backend as tb  # noqa: E402
from dvm.frontend import fx_lone_ops  # noqa: E402

pytestmark = [pytest.mark.cpu_vm, pytest.mark.vm_once]   # runs once, on the default (CPU) VM

SIZES = [1, 3, 8, 33, 130]

LONE = {   # name -> (function, input maker for n)
    "add": (lambda x: x + 1.5, lambda n: (torch.randn(n, 8),)),
    "mul broadcast": (lambda x, y: x * y[:, :1], lambda n: (torch.randn(n, 8), torch.randn(n, 8))),
    "floor_divide int64": (lambda i: torch.floor_divide(i, 3), lambda n: (torch.randint(-50, 50, (n, 4)),)),
    "int64 to float32": (lambda i: i.to(torch.float32), lambda n: (torch.randint(-50, 50, (n, 4)),)),
    "where": (lambda m, x, y: torch.where(m, x, y),
              lambda n: (torch.randn(n, 5) > 0, torch.randn(n, 5), torch.randn(5))),
    "transposing copy": (lambda x: x.transpose(1, 2).contiguous().view(x.shape[0], x.shape[2], -1),
                         lambda n: (torch.randn(2, 3, n, 4),)),
    "comparison": (lambda x: x.t() >= 0.25, lambda n: (torch.randn(n, 6),)),
    "bfloat16 sub": (lambda x, y: x - y, lambda n: (torch.randn(n, 8, dtype=torch.bfloat16),
                                                    torch.randn(8, dtype=torch.bfloat16))),
}


def _compiled(f):
    torch._dynamo.reset()
    return torch.compile(f, backend="dvm", dynamic=True)


@pytest.mark.parametrize("name", list(LONE))
def test_a_lone_cheap_op_is_pytorchs_and_bitwise_eager(name):
    f, make = LONE[name]
    cf = _compiled(f)
    for n in SIZES:
        args = make(n)
        assert torch.equal(cf(*args), f(*args)), (name, n)
    text = tb.explain_model(f, *make(5))
    assert fx_lone_ops.REASON in text and "0 DVM segment(s)" in text, text


def test_views_of_the_op_go_with_it():
    def f(x):
        return (x * 2.0).reshape(-1, 4).t()
    cf = _compiled(f)
    for n in SIZES:
        x = torch.randn(n, 8)
        got = cf(x)
        assert torch.equal(got, f(x)) and got.stride() == f(x).stride(), n
    assert fx_lone_ops.REASON in tb.explain_model(f, torch.randn(5, 8))


@pytest.mark.parametrize("name,fn", [
    ("two ops fused", lambda x: x * 2.0 + 1.0),
    ("transcendental", torch.sigmoid),
    ("reduction", lambda x: torch.softmax(x, -1)),
    ("an op of a value the segment computes", lambda x: torch.exp(x).to(torch.float64)),
])
def test_other_segments_stay_in_dvm(name, fn):
    text = tb.explain_model(fn, torch.randn(6, 8))
    assert fx_lone_ops.REASON not in text, name
    assert "1 DVM segment(s)" in text, name
    cf = _compiled(fn)
    for n in SIZES:
        x = torch.randn(n, 8)
        torch.testing.assert_close(cf(x), fn(x))


def test_a_cheap_op_between_pytorch_steps_keeps_the_graph_order():
    w = torch.randn(8, 8)

    def f(x):
        h = torch.nn.functional.linear(x, w)
        k = torch.topk(h, 3).indices // 2      # PyTorch's topk, a lone floor_divide, PyTorch's gather
        return torch.gather(h, 1, k)
    cf = _compiled(f)
    for n in SIZES:
        x = torch.randn(n, 8)
        assert torch.equal(cf(x), f(x)), n
    text = tb.explain_model(f, torch.randn(5, 8))
    assert fx_lone_ops.REASON in text and "0 DVM segment(s)" in text, text


def test_switched_off_the_op_is_a_segment_of_its_own(monkeypatch):
    monkeypatch.setattr(fx_lone_ops, "ENABLED", False)
    for name, (f, make) in LONE.items():
        text = tb.explain_model(f, *make(5))
        assert fx_lone_ops.REASON not in text and "1 DVM segment(s)" in text, name
        cf = _compiled(f)
        for n in SIZES:
            args = make(n)
            torch.testing.assert_close(cf(*args), f(*args))


_DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.int32, torch.int64]


@settings(max_examples=25, deadline=None)
@given(st.sampled_from(_DTYPES), st.lists(st.integers(1, 9), min_size=1, max_size=3),
       st.booleans(), st.sampled_from(["add", "mul", "maximum", "ne"]))
def test_strided_operands_of_any_dtype_match_eager_bitwise(dtype, shape, transpose, op):
    a = (torch.randn(shape) * 10).to(dtype)
    b = (torch.randn(shape[-1]) * 10).to(dtype)
    if transpose and a.dim() > 1:
        a = a.transpose(0, -1).contiguous().transpose(0, -1)   # same sizes, column-major strides
    fn = {"add": torch.add, "mul": torch.mul, "maximum": torch.maximum, "ne": torch.ne}[op]

    def f(x, y):
        return fn(x, y)
    got = _compiled(f)(a, b)
    want = f(a, b)
    assert got.dtype == want.dtype and torch.equal(got, want)
    assert got.stride() == want.stride()
