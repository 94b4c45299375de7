"""Scatters into a fresh base (frontend/fx_reinplace._fresh_base): a scatter whose base is an ATen
op's fresh result or a DVM segment's result owning its memory, read by that scatter alone, writes
into it; a graph input, a base read elsewhere, or one with given strides keeps the copy. Random
programs of scatter kinds, bases and readers give the same values either way (Hypothesis); a
loss's gradient through torch.compile gives eager's."""

import pytest

torch = pytest.importorskip("torch")
import torch.fx as fx  # noqa: E402
from hypothesis import given, settings, strategies as st  # noqa: E402

from dvm.frontend import fx_reinplace  # noqa: E402
from dvm.runtime import counters  # noqa: E402

pytestmark = [pytest.mark.cpu_vm, pytest.mark.vm_once]   # runs once, on the default (CPU) VM
aten = torch.ops.aten
ROWS, COLS = 6, 5


# index-wise scatters of a fresh base: (target, its arguments after the base, given the index
# tensor `idx` (ROWS x 1, within 0..COLS-1), the column index `cols` (2 of them) and the source
# `src` (ROWS x COLS; its first two columns `src2`)
FRESH_SCATTERS = {
    "scatter.value": (aten.scatter.value, lambda idx, cols, src, src2: (1, idx, -1.0)),
    "scatter.src": (aten.scatter.src, lambda idx, cols, src, src2: (1, idx, src)),
    "scatter_add": (aten.scatter_add.default, lambda idx, cols, src, src2: (1, idx, src)),
    "scatter_reduce": (aten.scatter_reduce.two, lambda idx, cols, src, src2: (1, idx, src, "amax")),
    "index_add": (aten.index_add.default, lambda idx, cols, src, src2: (1, cols, src2)),
    "index_fill": (aten.index_fill.int_Scalar, lambda idx, cols, src, src2: (1, cols, 3.5)),
}
BASES = ("zeros", "mul", "input")
BASE_READERS = ("none", "view before", "read after", "returned")


def _fresh_scatter_graph(kind: str, base_kind: str, reader: str) -> fx.GraphModule:
    """x (ROWS x COLS), v (COLS): base from x (a fresh op's result, or x itself), one scatter of
    `kind` into it, and a reader of the base (or none); returns the scatter's value and the reader's."""
    g = fx.Graph()
    x, v = g.placeholder("base"), g.placeholder("value")
    target, rest = FRESH_SCATTERS.get(kind, (aten.select_scatter.default, None))
    if base_kind == "zeros":
        base = g.call_function(aten.zeros_like.default, (x,))
    else:
        base = g.call_function(aten.mul.Tensor, (x, 2)) if base_kind == "mul" else x
    src = g.call_function(aten.add.Tensor, (g.call_function(aten.expand.default, (v, [ROWS, COLS])), 1))
    idx = g.call_function(aten.remainder.Scalar, (g.call_function(aten.arange.default, (ROWS,), {"dtype": torch.int64}),
                                                  COLS))
    cols = g.call_function(aten.arange.start, (1, 3), {"dtype": torch.int64})
    view = g.call_function(aten.select.int, (base, 0, 1)) if reader == "view before" else None
    if kind == "select_scatter":
        src_arg = g.call_function(aten.select.int, (src, 1, 0))
        y = g.call_function(target, (base, src_arg, 1, 2))
    else:
        src2 = g.call_function(aten.slice.Tensor, (src, 1, 0, 2))
        y = g.call_function(target, (base, *rest(g.call_function(aten.unsqueeze.default, (idx, 1)), cols, src, src2)))
    outs = [y]
    if view is not None:
        outs.append(g.call_function(aten.mul.Tensor, (view, 3)))
    elif reader == "read after":
        outs.append(g.call_function(aten.add.Tensor, (base, 1)))
    elif reader == "returned":
        outs.append(base)
    g.output(tuple(outs))
    return fx.GraphModule(torch.nn.Module(), g)


@settings(max_examples=60, deadline=None)
@given(kind=st.sampled_from([*sorted(FRESH_SCATTERS), "select_scatter"]), base_kind=st.sampled_from(BASES),
       reader=st.sampled_from(BASE_READERS))
def test_scatters_of_a_fresh_base_read_by_them_alone_write_into_it(kind, base_kind, reader):
    """An index-wise scatter (scatter, scatter_add, index_add, index_fill; a select_scatter too)
    writes into its base when the base is a fresh op's result that nothing else reads; a graph
    input, or a base read elsewhere (a view taken before, a reader after, returned), keeps the
    copy. The same values either way, and the input is never written."""
    plain, rewritten = _fresh_scatter_graph(kind, base_kind, reader), _fresh_scatter_graph(kind, base_kind, reader)
    done = fx_reinplace.rewrite(rewritten.graph)
    rewritten.recompile()
    assert done == (base_kind != "input" and reader == "none")
    x, v = torch.randn(ROWS, COLS), torch.randn(COLS)
    kept = x.clone()
    want = plain(x.clone(), v)
    got = rewritten(x, v)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)
    torch.testing.assert_close(x, kept)


def test_a_gather_gradient_scatters_into_the_segment_result_through_torch_compile():
    """A gathered log-probability's backward fills zeros of tokens x classes (a DVM segment's
    result) and scatter-adds the targets' entries: written into that result, not a copy of it;
    eager's gradients at two sizes."""
    from dvm.frontend import torch_backend as tb

    head = torch.nn.Linear(16, 40)

    def step(x, target):
        head.zero_grad(set_to_none=True)
        logp = torch.nn.functional.log_softmax(head(x).float(), -1)
        loss = -(logp.gather(1, target[:, None]) * 0.5).sum()
        loss.backward()
        return loss.detach(), head.weight.grad.clone(), head.bias.grad.clone()

    torch._dynamo.reset()
    compiled = torch.compile(step, backend="dvm", dynamic=True)
    before = counters.snapshot().get("torch_scatters_in_place", 0)   # (counted as a graph compiles)
    for tokens in (6, 11):
        x, target = torch.randn(tokens, 16), torch.randint(0, 40, (tokens,))
        want = step(x, target)
        got = compiled(x, target)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b)
    assert counters.snapshot().get("torch_scatters_in_place", 0) > before
    assert any("scatters written into their bases" in g.describe() for g in tb.COMPILED if g.kind == "backward")


def test_a_segment_result_owns_its_memory_only_where_no_other_result_shares_it():
    """SegmentRunner.owns_result: results as (passed-on input, launch output, permutation): one
    launch output read as two results (a value and its view) is owned by neither; an input passed
    on, a segment that updates inputs, or an index past the results, by nothing."""
    from types import SimpleNamespace

    from dvm.frontend.torch_segment import SegmentRunner
    results = [(False, 0, None), (False, 1, None), (False, 1, (1, 0)), (True, 0, None)]
    runner = SimpleNamespace(writes=[], results=results)
    assert [SegmentRunner.owns_result(runner, i) for i in range(5)] == [True, False, False, False, False]
    runner.writes = [(0, 0, None)]
    assert not SegmentRunner.owns_result(runner, 0)


def test_a_base_with_given_strides_keeps_its_scatter_out_of_place():
    """empty_strided may give elements one location (a zero stride): scatter_ rejects such a
    tensor, the functional scatter copies it dense first; so it stays a copy."""
    g = fx.Graph()
    x = g.placeholder("base")
    g.placeholder("value")
    base = g.call_function(aten.empty_strided.default, ([ROWS, COLS], [0, 1]))
    idx = g.call_function(aten.unsqueeze.default, (g.call_function(aten.remainder.Scalar, (
        g.call_function(aten.arange.default, (ROWS,), {"dtype": torch.int64}), COLS)), 1))
    filled = g.call_function(aten.scatter.value, (base, 1, idx, 1.0))
    g.output((g.call_function(aten.mul.Tensor, (filled, x)),))
    module = fx.GraphModule(torch.nn.Module(), g)
    assert fx_reinplace.rewrite(module.graph) == 0
    module.recompile()
    assert module(torch.randn(ROWS, COLS), torch.randn(COLS))[0].shape == (ROWS, COLS)
    with pytest.raises(RuntimeError):
        torch.empty_strided((ROWS, COLS), (0, 1)).scatter_(1, torch.zeros(ROWS, 1, dtype=torch.int64), 1.0)
