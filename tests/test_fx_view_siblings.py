"""The chains of views of one value as one call (frontend/fx_view_chains, SIBLINGS): attention's
q, k and v of one product become one call whose getitems take the views apart, each the chain's
own view on the first call and on the remembered path; a group where one chain copies, a chain
whose value comes later, and views read by pure readers (reinterpreted) stay right."""

import operator

import pytest

torch = pytest.importorskip("torch")
from dvm.frontend import fx_view_chains  # noqa: E402
from dvm.frontend.torch_calls import _slice, _view_or_reshape  # noqa: E402

from test_fx_view_chains import _folded, _same_view  # noqa: E402

pytestmark = [pytest.mark.cpu_vm, pytest.mark.vm_once]   # runs once, on the default (CPU) VM


def _heads_of_thirds(g, x, n):
    """q, k and v: each third of a fused product split into heads, heads first (three chains of x)."""
    outs = []
    for i in range(3):
        s = g.call_function(_slice, (x, 2, 8 * i, 8 * i + 8))
        v = g.call_function(_view_or_reshape, (s, [1, n, -1, 4]))
        outs.append(g.call_function(torch.Tensor.transpose, (v, 1, 2)))
    return tuple(outs)


def test_the_chains_of_one_value_are_one_call(monkeypatch):
    """q, k, v of one product: one call (its values once), getitems taking its views apart; each
    the chain's own view on the first call and on the remembered path; with SIBLINGS off, a call
    per chain."""
    plain, folded, removed = _folded(_heads_of_thirds)
    assert removed == 3 * 2 + 2
    calls = [n for n in folded.graph.nodes if n.op == "call_function" and n.target is not operator.getitem]
    assert len(calls) == 1 and len(calls[0].args) == 2   # x and n (n once for the three chains)
    for length in (3, 5, 3, 3, 8, 8):
        x = torch.randn(1, length, 24)
        for got, want in zip(folded(x, length), plain(x, length)):
            _same_view(got, want)
    monkeypatch.setattr(fx_view_chains, "SIBLINGS", False)
    _, apart, removed = _folded(_heads_of_thirds)
    assert removed == 3 * 2 and sum(n.op == "call_function" for n in apart.graph.nodes) == 3


def test_chains_of_one_value_where_one_copies_stay_right():
    """A reshape that must copy (a transposed input) in one chain of a group: every call runs the
    chains (nothing remembered), the copy is fresh each time, the views are x's own."""
    def build(g, x, n):
        a = g.call_function(torch.Tensor.transpose, (x, 1, 2))
        b = g.call_function(torch.Tensor.unsqueeze, (g.call_function(torch.Tensor.transpose, (x, 0, 1)), 0))
        return (g.call_function(_view_or_reshape, (a, [n, -1])), b)
    plain, folded, removed = _folded(build)
    assert removed == 1 + 1 + 1
    x = torch.randn(2, 3, 4)
    first = folded(x, 2)[0]
    for _ in range(3):
        (copied, view), (want_copy, want_view) = folded(x, 2), plain(x, 2)
        assert torch.equal(copied, want_copy) and copied.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
        _same_view(view, want_view)
    x.add_(1.0)
    assert not torch.equal(first, plain(x, 2)[0]) and torch.equal(folded(x, 2)[0], plain(x, 2)[0])


def test_a_chain_whose_value_comes_later_stays_apart():
    """A chain reading a value computed after the first chain of the same input is not merged
    into a call placed before that value."""
    def build(g, x, n):
        a = g.call_function(torch.Tensor.unsqueeze, (g.call_function(torch.Tensor.transpose, (x, 0, 1)), 0))
        m = g.call_function(operator.add, (n, 1))
        b = g.call_function(torch.Tensor.transpose, (g.call_function(_view_or_reshape, (x, [m, -1])), 0, 1))
        return a, b
    plain, folded, removed = _folded(build)
    assert removed == 2
    assert not any(n.target is operator.getitem for n in folded.graph.nodes if n.op == "call_function")
    x = torch.randn(3, 4)
    for _ in range(3):
        for got, want in zip(folded(x, 2), plain(x, 2)):
            _same_view(got, want)


def test_the_chains_of_one_value_read_by_pure_readers_are_reinterpreted(monkeypatch):
    """q, k, v read only by a pure reader: the one call's remembered views are reinterpretations
    (no autograd view of x), each the chain's own view; one of them also a graph output: that one
    an as_strided view, the others still reinterpreted."""
    seen = []

    def reader(*ts):   # a pure reader for this test: it records what it is given
        seen.append(ts)
        return sum(t.sum() for t in ts)
    monkeypatch.setattr(fx_view_chains, "PURE_READERS", fx_view_chains.PURE_READERS | {reader})

    def read_all(g, x, n):
        return g.call_function(reader, _heads_of_thirds(g, x, n))

    def read_all_return_q(g, x, n):
        q, k, v = _heads_of_thirds(g, x, n)
        return g.call_function(reader, (q, k, v)), q
    for build, returned in ((read_all, ()), (read_all_return_q, (0,))):
        plain, folded, _ = _folded(build)
        for length in (3, 5, 5, 5):
            x = torch.randn(1, length, 24)
            seen.clear()
            got_out, want_out = folded(x, length), plain(x, length)
            assert torch.equal(got_out[0] if returned else got_out, want_out[0] if returned else want_out)
            for got, want in zip(*seen):
                _same_view(got, want)
        assert [t._base is x for t in seen[0]] == [i in returned for i in range(3)]
