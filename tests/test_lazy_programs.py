"""dvm.lazy(): random programs of fusable ops (broadcasting, reductions, views, runtime scalars)
with sync points and in-place ops between them give eager's results (Hypothesis). The same
program runs twice on copies of its inputs, eagerly and in a lazy region that records everything;
every tensor it made or wrote, and every value it took out (.item(), .tolist()), must match."""
import math

import pytest

torch = pytest.importorskip("torch")
hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

import dvm  # noqa: E402
from dvm.runtime import counters  # noqa: E402

SIZES = (0, 1, 2, 3, 5, 8, 13)
# exp's relative error is |x| times its argument's absolute error: a sum in another order (DVM's
# tree, PyTorch's loop) differs by an ulp or two, so |x| stays under the float32 rtol's reach
UNARY = {
    "exp": lambda x: torch.exp(x.clamp(-4, 4)), "tanh": torch.tanh, "sigmoid": torch.sigmoid,
    "neg": torch.neg, "abs": torch.abs, "relu": torch.relu, "sin": torch.sin,
    "sqrt": lambda x: torch.sqrt(x.abs()), "log1p": lambda x: torch.log1p(x.abs()),
    "silu": torch.nn.functional.silu, "gelu": torch.nn.functional.gelu,
}
BINARY = {
    "add": torch.add, "mul": torch.mul, "sub": torch.sub, "maximum": torch.maximum,
    "minimum": torch.minimum, "div": lambda a, b: a / (b.abs() + 1),
    "where": lambda a, b: torch.where(a > b, a, b * 0.5),
}
REDUCE = {"sum": lambda x, d: x.sum(d, keepdim=True), "mean": lambda x, d: x.mean(d, keepdim=True),
          "amax": lambda x, d: x.amax(d, keepdim=True), "softmax": lambda x, d: torch.softmax(x, d)}
KINDS = ("unary", "binary", "scalar", "reduce", "view", "inplace", "inplace_view", "sync")


def _fits(small: torch.Size, big: torch.Size) -> bool:
    """small broadcasts to exactly big (an in-place op's other operand)."""
    try:
        return torch.broadcast_shapes(small, big) == big
    except RuntimeError:
        return False


def _interpret(program, inputs, out: list) -> list:
    """Run the program on `inputs` (modified in place by it); the pool of tensors at the end.
    Values taken out of PyTorch are appended to `out`."""
    pool = list(inputs)
    for kind, i, j, name, s in program:
        a, b = pool[i % len(pool)], pool[j % len(pool)]
        if kind == "unary":
            pool.append(UNARY[name](a))
        elif kind == "binary" and _broadcastable(a, b):
            pool.append(BINARY[name](a, b))
        elif kind == "scalar":
            pool.append(a * s + (1.0 - s) if name in UNARY else a - s)
        elif kind == "reduce" and a.dim() and a.numel():
            pool.append(REDUCE[name](a, -1 if s > 0 else 0))
        elif kind == "view" and a.dim() == 2:
            pool.append(a.t().contiguous().t() + 0 if s > 0 else a.unsqueeze(0).expand(2, *a.shape)[1])
        elif kind == "inplace" and _fits(b.shape, a.shape):
            (a.mul_(s).add_(b) if s > 0 else a.clamp_(-2.0, 2.0).sub_(b))
        elif kind == "inplace_view" and a.dim() == 2 and a.shape[0] > 0:
            a[0].add_(s)
        elif kind == "sync":
            if s > 0.5:
                out.append(a.sum().item())
            elif s > 0:
                out.append(a.tolist())
            else:
                dvm.sync()
    return pool


def _broadcastable(a, b) -> bool:
    try:
        torch.broadcast_shapes(a.shape, b.shape)
        return True
    except RuntimeError:
        return False


def _layout(t: torch.Tensor) -> tuple:
    """The strides that matter (a size-1 dimension's stride is arbitrary)."""
    return tuple(st for st, n in zip(t.stride(), t.shape) if n > 1) if t.numel() else ()


def _close(x, y) -> None:
    if isinstance(x, torch.Tensor):
        torch.testing.assert_close(y, x, equal_nan=True)
        assert _layout(y) == _layout(x), f"strides {y.stride()}, eager's {x.stride()}"
    elif isinstance(x, float):
        assert (math.isnan(x) and math.isnan(y)) or y == pytest.approx(x, rel=1e-4, abs=1e-4)
    else:
        torch.testing.assert_close(torch.tensor(y), torch.tensor(x), rtol=1e-4, atol=1e-5, equal_nan=True)


step = st.tuples(st.sampled_from(KINDS), st.integers(0, 50), st.integers(0, 50),
                 st.sampled_from(sorted(UNARY) + sorted(BINARY) + sorted(REDUCE)),
                 st.sampled_from([-1.5, -0.5, 0.25, 0.75, 2.0]))


@st.composite
def programs(draw):
    r, c = draw(st.sampled_from(SIZES)), draw(st.sampled_from(SIZES))
    shapes = draw(st.lists(st.sampled_from([(r, c), (r, 1), (1, c), (c,)]), min_size=1, max_size=3))
    dtype = draw(st.sampled_from([torch.float32, torch.float32, torch.float64]))
    seed = draw(st.integers(0, 2 ** 16))
    prog = draw(st.lists(step, min_size=3, max_size=14))
    fixed = []
    for kind, i, j, name, s in prog:       # the name must fit the kind
        table = {"unary": UNARY, "binary": BINARY, "reduce": REDUCE}.get(kind)
        if table is not None and name not in table:
            name = sorted(table)[hash(name) % len(table)]
        fixed.append((kind, i, j, name, s))
    return shapes, dtype, seed, fixed


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs())
def test_random_programs_match_eager(prog):
    shapes, dtype, seed, program = prog
    gen = torch.Generator().manual_seed(seed)
    inputs = [torch.randn(*s, generator=gen, dtype=dtype) for s in shapes]
    eager_in = [t.clone() for t in inputs]
    lazy_in = [t.clone() for t in inputs]
    want_out, got_out = [], []
    want = _interpret(program, eager_in, want_out)
    fallbacks = {k: v for k, v in counters.snapshot().items() if k.startswith("lazy_fallback")}
    with dvm.lazy(adaptive=False):
        got = _interpret(program, lazy_in, got_out)
    assert {k: v for k, v in counters.snapshot().items() if k.startswith("lazy_fallback")} == fallbacks
    assert len(got) == len(want) and len(got_out) == len(want_out)
    for x, y in zip(want, got):
        _close(x, y)
    for x, y in zip(want_out, got_out):
        _close(x, y)
