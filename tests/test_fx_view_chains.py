"""Chains of views as one call (frontend/fx_view_chains): the folded call gives the chain's own
view (the same storage, sizes, strides and offset) on its first call and on the remembered
path after it (as_strided, or a reinterpretation where only pure readers read it); chains that
copy, inputs that require grad, many sizes, offsets and dtypes stay right. The attention case
against eager."""

import operator

import pytest

torch = pytest.importorskip("torch")
import torch.fx as fx  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from hypothesis import example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import dvm  # noqa: E402
import dvm.frontend.torch_backend as tb  # noqa: E402
from dvm.frontend import fx_view_chains  # noqa: E402
from dvm.frontend.torch_calls import _slice, _view_or_reshape  # noqa: E402

pytestmark = [pytest.mark.cpu_vm, pytest.mark.vm_once]   # runs once, on the default (CPU) VM


def _module(build) -> fx.GraphModule:
    """A run-graph-like module: build(g, x, n) adds calls to g and returns the output node."""
    g = fx.Graph()
    x, n = g.placeholder("x"), g.placeholder("n")
    g.output(build(g, x, n))
    return fx.GraphModule(torch.nn.Module(), g)


def _v_heads(g, x, n):
    """HF's v: the last third of a fused q / k / v product, split into heads, heads first."""
    s = g.call_function(_slice, (x, 2, 16, 24))
    v = g.call_function(_view_or_reshape, (s, [1, n, -1, 4]))
    return g.call_function(torch.Tensor.transpose, (v, 1, 2))


def _same_view(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.shape == want.shape and got.stride() == want.stride()
    assert got.storage_offset() == want.storage_offset()
    assert got.untyped_storage().data_ptr() == want.untyped_storage().data_ptr()
    assert torch.equal(got, want)


def _folded(build) -> tuple[fx.GraphModule, fx.GraphModule, int]:
    plain, folded = _module(build), _module(build)
    _, removed = fx_view_chains.fold(folded.graph)
    folded.recompile()
    return plain, folded, removed


def test_a_chain_is_one_call_and_the_same_view():
    plain, folded, removed = _folded(_v_heads)
    assert removed == 2
    calls = [n for n in folded.graph.nodes if n.op == "call_function"]
    assert len(calls) == 1 and calls[0].target.__name__ == "view_chain"
    for length in (3, 5, 3, 3, 8):   # first calls, then the remembered view
        x = torch.randn(1, length, 24)
        _same_view(folded(x, length), plain(x, length))


def test_a_value_read_twice_ends_the_chain():
    def build(g, x, n):
        s = g.call_function(_slice, (x, 2, 16, 24))
        v = g.call_function(_view_or_reshape, (s, [1, n, -1, 4]))
        t = g.call_function(torch.Tensor.transpose, (v, 1, 2))
        return (t, g.call_function(torch.Tensor.unsqueeze, (v, 0)))
    plain, folded, removed = _folded(build)
    assert removed == 1   # slice + view; the view's two readers stay calls
    x = torch.randn(1, 6, 24)
    for _ in range(3):
        for got, want in zip(folded(x, 6), plain(x, 6)):
            _same_view(got, want)


def test_a_reshape_that_copies_runs_its_chain_every_time():
    def build(g, x, n):
        t = g.call_function(torch.Tensor.transpose, (x, 1, 2))
        return g.call_function(_view_or_reshape, (t, [n, -1]))
    plain, folded, removed = _folded(build)
    assert removed == 1
    x = torch.randn(2, 3, 4)
    outs = [folded(x, 2) for _ in range(3)]
    for got in outs:
        assert torch.equal(got, plain(x, 2))
        assert got.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
    x.add_(1.0)   # a copy does not follow its input
    assert not torch.equal(outs[0], plain(x, 2))
    assert torch.equal(folded(x, 2), plain(x, 2))


def test_an_input_that_requires_grad_keeps_its_autograd_chain():
    plain, folded, _ = _folded(_v_heads)
    x = torch.randn(1, 4, 24, requires_grad=True)
    for _ in range(3):
        got = folded(x, 4)
        assert type(got.grad_fn).__name__ == type(plain(x, 4).grad_fn).__name__
    got.sum().backward()
    want = torch.zeros(1, 4, 24)
    want[..., 16:] = 1.0
    assert torch.equal(x.grad, want)


def test_the_last_view_is_taken_again_only_at_its_offset_sizes_and_values():
    plain, folded, _ = _folded(_v_heads)
    base = torch.randn(400)
    for offset, length, dtype in [(0, 3, None), (0, 3, None), (24, 3, None), (24, 3, None), (0, 4, None),
                                  (0, 3, None), (0, 3, torch.float64), (0, 3, None)]:
        x = base[offset:offset + length * 24].view(1, length, 24)
        x = x if dtype is None else x.to(dtype)
        _same_view(folded(x, length), plain(x, length))


def test_a_view_read_only_by_pure_readers_is_reinterpreted(monkeypatch):
    """Read only by calls that neither write nor return it, the remembered view is a plain tensor
    on the same memory (no autograd view); read by anything else (here: a graph output), it is an
    as_strided view of its input, as with REINTERPRET off."""
    seen = []

    def reader(t):   # a pure reader for this test: it records what it is given
        seen.append(t)
        return t.sum()
    monkeypatch.setattr(fx_view_chains, "PURE_READERS", fx_view_chains.PURE_READERS | {reader})
    plain, folded, _ = _folded(lambda g, x, n: g.call_function(reader, (_v_heads(g, x, n),)))
    for length in (3, 5, 5, 5, 3, 3):
        x = torch.randn(1, length, 24)
        seen.clear()
        assert torch.equal(folded(x, length), plain(x, length))
        _same_view(*seen)
    assert seen[0]._base is None and seen[1]._base is x
    _, as_output, _ = _folded(_v_heads)
    monkeypatch.setattr(fx_view_chains, "REINTERPRET", False)
    _, switched_off, _ = _folded(lambda g, x, n: g.call_function(reader, (_v_heads(g, x, n),)))
    for _ in range(3):
        seen.clear()
        switched_off(x, 3)
        assert as_output(x, 3)._base is x
    assert seen[0]._base is x


def test_the_memo_is_bounded_and_stays_right(monkeypatch):
    monkeypatch.setattr(fx_view_chains, "_MEMO_MAX", 3)
    plain, folded, _ = _folded(_v_heads)
    for length in [1, 2, 3, 4, 5, 1, 2, 6, 1, 7, 2]:
        x = torch.randn(1, length, 24)
        _same_view(folded(x, length), plain(x, length))


def test_switched_off_nothing_is_folded(monkeypatch):
    monkeypatch.setattr(fx_view_chains, "ENABLED", False)
    _, folded, removed = _folded(_v_heads)
    assert removed == 0
    assert sum(n.op == "call_function" for n in folded.graph.nodes) == 3


_STEPS = st.lists(st.sampled_from(["t01", "t12", "unsq", "sq", "sel", "sl", "slstep", "flat", "exp"]),
                  min_size=2, max_size=6)


def _step(g, y, kind, shape):
    """One view call on y of fake shape `shape` (a list, updated) or None where it does not apply."""
    nd = len(shape)
    if kind in ("t01", "t12") and nd >= 2 + (kind == "t12"):
        a = 0 if kind == "t01" else 1
        shape[a], shape[a + 1] = shape[a + 1], shape[a]
        return g.call_function(torch.Tensor.transpose, (y, a, a + 1))
    if kind == "unsq" and nd < 5:
        shape.insert(1, 1)
        return g.call_function(torch.Tensor.unsqueeze, (y, 1))
    if kind == "sq" and nd >= 2 and shape[1] == 1:
        shape.pop(1)
        return g.call_function(torch.Tensor.squeeze, (y, 1))
    if kind == "sel" and nd >= 2:
        shape.pop(0)
        return g.call_function(torch.Tensor.select, (y, 0, -1))
    if kind in ("sl", "slstep") and nd >= 1:
        step = 2 if kind == "slstep" else 1
        shape[-1] = len(range(1, shape[-1], step))
        return g.call_function(_slice, (y, nd - 1, 1, 2 ** 63 - 1, step))
    if kind == "flat" and nd >= 2:
        shape[-2:] = [shape[-2] * shape[-1]]
        return g.call_function(_view_or_reshape, (y, [*shape[:-1], -1]))
    if kind == "exp" and nd >= 1 and shape[0] == 1:
        shape[0] = 3
        return g.call_function(torch.Tensor.expand, (y, [3, *[-1] * (nd - 1)]))
    return None


@settings(max_examples=60, deadline=None)
@example(steps=["sl", "t12", "t01", "sel"], dims=[1, 1, 1], perm=[0, 1, 2], offset=0)   # select of an empty axis
@given(steps=_STEPS, dims=st.lists(st.integers(1, 5), min_size=3, max_size=3),
       perm=st.permutations([0, 1, 2]), offset=st.integers(0, 3))
def test_random_chains_give_the_chains_view(steps, dims, perm, offset):
    def build(g, x, n):
        y, shape = x, [dims[i] for i in perm]
        for kind in steps:
            y = _step(g, y, kind, shape) or y
        return y
    plain, folded, _ = _folded(build)
    base = torch.randn(offset + dims[0] * dims[1] * dims[2])
    x = base[offset:].view(dims).permute(perm)     # strided, offset into its storage
    for _ in range(3):
        try:
            want = plain(x, 0)
        except (RuntimeError, IndexError) as e:   # a view these sizes or strides do not allow
            with pytest.raises(type(e)):          # (a select of an empty axis): raised alike
                folded(x, 0)
            return
        got = folded(x, 0)
        if want.untyped_storage().data_ptr() == x.untyped_storage().data_ptr():
            _same_view(got, want)
        else:
            assert torch.equal(got, want)


def test_attention_views_against_eager():
    torch.manual_seed(0)
    heads, d = 4, 8
    w, wo = torch.randn(3 * heads * d, 32) * 0.1, torch.randn(32, heads * d) * 0.1

    def f(x):
        b, n, _ = x.shape
        q, k, v = F.linear(x, w).split(heads * d, dim=-1)
        q, k, v = (t.view(b, n, heads, d).transpose(1, 2) for t in (q, k, v))
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return F.linear(o.transpose(1, 2).reshape(b, n, heads * d), wo)
    before = dvm.counters().get("torch_view_chain_calls_removed", 0)
    torch._dynamo.reset()
    cf = torch.compile(f, backend="dvm", dynamic=True)
    with torch.no_grad():
        for n in (3, 9, 9, 9, 17, 3):
            x = torch.randn(2, n, 32)
            torch.testing.assert_close(cf(x), f(x))
    assert dvm.counters().get("torch_view_chain_calls_removed", 0) > before
    torch._dynamo.reset()
    assert "chain(s) taken as one call each" in tb.explain_model(f, torch.randn(2, 5, 32))


def test_a_slice_to_its_inputs_own_sizes_is_no_call():
    """HF's `hidden[:, slice(-logits_to_keep, None)]` with logits_to_keep=0 keeps every position."""
    torch.manual_seed(0)
    w = torch.randn(16, 8)

    def f(x, keep: int = 0):
        return F.linear(torch.tanh(x)[:, slice(-keep, None)], w)
    before = dvm.counters().get("torch_identity_views", 0)
    torch._dynamo.reset()
    cf = torch.compile(f, backend="dvm", dynamic=True)
    with torch.no_grad():
        for n in (3, 7, 11):
            x = torch.randn(2, n, 8)
            torch.testing.assert_close(cf(x), f(x))
            torch.testing.assert_close(cf(x, 2), f(x, 2))
    assert dvm.counters().get("torch_identity_views", 0) > before


def test_an_argument_that_cannot_be_a_key_runs_the_chain():
    def build(g, x, n):
        t = g.call_function(torch.Tensor.transpose, (x, 0, 1))
        return g.call_function(torch.Tensor.view, (t, n))
    _, folded, removed = _folded(build)
    assert removed == 1
    x = torch.randn(4, 1, 6)
    for _ in range(2):
        got = folded(x, [6, 4])   # a list value: not hashable
        _same_view(got, x.transpose(0, 1).view([6, 4]))


def _split_heads(split, args, pieces):
    """build(g, x, n): `split(x, *args)`'s pieces, each viewed [1, n, -1, 2] and heads first (HF's
    q / k / v after a fused product), as the graph's outputs."""
    def build(g, x, n):
        s = g.call_function(split, (x, *args))
        outs = []
        for i in range(pieces):
            p = g.call_function(operator.getitem, (s, i))
            v = g.call_function(_view_or_reshape, (p, [1, n, -1, 2]))
            outs.append(g.call_function(torch.Tensor.transpose, (v, 1, 2)))
        return tuple(outs)
    return build


@pytest.mark.parametrize("split, args, width, pieces", [
    (torch.ops.aten.split.Tensor, (8, 2), 24, 3),
    (torch.ops.aten.split.Tensor, (8, -1), 20, 3),               # a shorter last piece
    (torch.ops.aten.split.Tensor, (4,), 12, 3),                  # dim 0 by default
    (torch.Tensor.split_with_sizes, ([4, 12, 8], 2), 24, 3),
    (torch.Tensor.split_with_sizes, ([6, 2], -1), 8, 2),   # a negative dim
])
def test_a_splits_pieces_head_their_chains(split, args, width, pieces):
    """The split call goes; each piece is the split's own view, first call and remembered."""
    plain, folded, removed = _folded(_split_heads(split, args, pieces))
    assert removed == 1 + 2 * pieces + pieces - 1   # the split, each chain's views, the chains but one
    targets = [n.target for n in folded.graph.nodes if n.op == "call_function"]
    assert split not in targets and targets.count(operator.getitem) == pieces and len(targets) == pieces + 1
    for length in (2, 4, 2, 2, 6):
        dim0 = width if args == (4,) else 1   # (the dim-0 case splits the first axis)
        x = torch.randn(width, length, 1).transpose(0, 2).contiguous().transpose(0, 2) if dim0 > 1 else \
            torch.randn(1, length, width)   # (strided along the split axis)
        try:
            want = plain(x, length)
        except RuntimeError as e:
            with pytest.raises(type(e)):
                folded(x, length)
            continue
        for got, w in zip(folded(x, length), want):
            if w.untyped_storage().data_ptr() == x.untyped_storage().data_ptr():
                _same_view(got, w)
            else:   # (a reshape that copied)
                assert torch.equal(got, w)


def test_unbinds_pieces_head_their_chains():
    def build(g, x, n):
        s = g.call_function(torch.ops.aten.unbind.int, (x, 1))
        return tuple(g.call_function(torch.Tensor.transpose, (g.call_function(operator.getitem, (s, i)), 0, 1))
                     for i in range(3))
    plain, folded, removed = _folded(build)
    assert removed == 1 + 3 + 2   # the unbind; each piece's getitem and transpose as one call; 3 chains in one
    x = torch.randn(5, 3, 4, 2)
    for _ in range(3):
        for got, want in zip(folded(x, 0), plain(x, 0)):
            _same_view(got, want)


def test_a_split_with_a_piece_read_otherwise_stays():
    def build(g, x, n):
        s = g.call_function(torch.ops.aten.split.Tensor, (x, 8, 2))
        a, b = (g.call_function(operator.getitem, (s, i)) for i in range(2))
        return g.call_function(torch.Tensor.transpose, (a, 1, 2)), g.call_function(torch.neg, (b,))
    plain, folded, removed = _folded(build)
    assert removed == 0
    assert torch.ops.aten.split.Tensor in [n.target for n in folded.graph.nodes]
    x = torch.randn(1, 3, 16)
    for got, want in zip(folded(x, 3), plain(x, 3)):
        assert torch.equal(got, want)


def test_a_split_that_does_not_add_up_raises_as_split_does():
    plain, folded, _ = _folded(_split_heads(torch.Tensor.split_with_sizes, ([4, 4], 2), 2))
    x = torch.randn(1, 2, 12)
    with pytest.raises(RuntimeError):
        plain(x, 2)
    with pytest.raises(RuntimeError):
        folded(x, 2)


def test_a_split_with_one_piece_read_is_that_piece():
    """One piece read (GPT-NeoX's v, after q and k went to a segment): a narrow, not a split; it
    ends the chain of views before the split."""
    def build(g, x, n):
        t = g.call_function(torch.Tensor.transpose, (x, 0, 1))
        s = g.call_function(torch.ops.aten.split.Tensor, (t, 8, 2))
        v = g.call_function(operator.getitem, (s, 2))
        return g.call_function(torch.neg, (v,)), v
    plain, folded, removed = _folded(build)
    targets = [n.target for n in folded.graph.nodes if n.op == "call_function"]
    assert torch.ops.aten.split.Tensor not in targets and operator.getitem not in targets
    assert removed == 2   # the split; the transpose and the piece as one call
    for length in (3, 5, 3):
        x = torch.randn(length, 2, 20)   # pieces of 8, 8 and 4
        got, want = folded(x, length), plain(x, length)
        assert torch.equal(got[0], want[0])
        _same_view(got[1], want[1])


def test_a_piece_taken_by_a_negative_index_keeps_the_split():
    def build(g, x, n):
        s = g.call_function(torch.ops.aten.split.Tensor, (x, 8, 2))
        return g.call_function(torch.Tensor.transpose, (g.call_function(operator.getitem, (s, -1)), 1, 2))
    plain, folded, removed = _folded(build)
    assert torch.ops.aten.split.Tensor in [n.target for n in folded.graph.nodes]
    x = torch.randn(1, 3, 20)
    for _ in range(2):
        _same_view(folded(x, 3), plain(x, 3))

