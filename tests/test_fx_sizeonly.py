"""Values that depend on sizes only (frontend/fx_sizeonly): computed once per size tuple under
torch.compile(backend="dvm"), equal to eager, never shared with what the caller gets back, never
remembered when random, bounded."""

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

from dvm.frontend import fx_sizeonly, torch_runtime  # noqa: E402
from dvm.frontend.torch_runtime import COMPILED  # noqa: E402
from dvm.runtime import counters  # noqa: E402

pytestmark = pytest.mark.vm_once


def _count(name: str) -> int:
    return counters.snapshot().get(name, 0)


def _masked(x):
    """x [n, n] plus HF-style mask arithmetic built from n alone: positions, a packed-sequence
    cumsum and a causal keep mask."""
    n = x.shape[0]
    pos = torch.arange(n)
    packed = (torch.diff(pos, prepend=pos[:1] - 1) != 1).cumsum(-1)
    keep = (pos[None, :] <= pos[:, None]) & (packed[None, :] == packed[:, None])
    return torch.where(keep, x, -1.0) * pos.float()


def test_size_only_values_are_computed_once_per_size():
    torch._dynamo.reset()
    fn = torch.compile(_masked, backend="dvm", dynamic=True)
    for n in (5, 7):   # (two sizes first: a dynamic graph)
        fn(torch.randn(n, n))
    graph = COMPILED[-1]
    assert graph.consts is not None and graph.consts.n_steps >= 3
    computed, hits = _count("torch_size_consts_computed"), _count("torch_size_consts_hits")
    for n in (5, 9, 5, 9, 7):
        x = torch.randn(n, n)
        torch.testing.assert_close(fn(x), _masked(x), rtol=0, atol=0)
    assert _count("torch_size_consts_computed") - computed == 1   # only 9 is new
    assert _count("torch_size_consts_hits") - hits == 4
    assert "size-only values" in graph.describe()


def test_disabled_gives_the_same_values(monkeypatch):
    monkeypatch.setattr(fx_sizeonly, "ENABLED", False)
    torch._dynamo.reset()
    fn = torch.compile(_masked, backend="dvm", dynamic=True)
    for n in (5, 7, 6):
        x = torch.randn(n, n)
        torch.testing.assert_close(fn(x), _masked(x), rtol=0, atol=0)
    assert COMPILED[-1].consts is None


def _returns_views(x):
    a = torch.arange(x.shape[0]).float()
    b = a * 2                      # size-only, and only read inside the graph
    return x + b, a.view(-1, 1), a[1:]


def test_outputs_never_share_memory_with_remembered_values():
    """The caller may write into what it gets back: a size-only value that is (a view of) an
    output is computed at every call, whatever the caller did to the last one."""
    torch._dynamo.reset()
    fn = torch.compile(_returns_views, backend="dvm", dynamic=True)
    for n in (4, 6, 4, 6, 4):
        x = torch.randn(n)
        got = fn(x)
        for g, e in zip(got, _returns_views(x)):
            torch.testing.assert_close(g, e, rtol=0, atol=0)
        got[1].add_(100.0)         # the caller writes into the outputs
        got[2].mul_(-1.0)
    assert COMPILED[-1].consts is not None   # b is remembered, a is not


def test_random_values_are_never_remembered():
    def noisy(x):
        return x + torch.rand(x.shape[0])

    torch._dynamo.reset()
    fn = torch.compile(noisy, backend="dvm", dynamic=True)
    x = torch.zeros(5)
    fn(torch.zeros(3))
    assert not torch.equal(fn(x), fn(x))
    assert COMPILED[-1].consts is None


def test_remembered_values_are_bounded(monkeypatch):
    torch._dynamo.reset()
    fn = torch.compile(_masked, backend="dvm", dynamic=True)
    fn(torch.randn(3, 3)), fn(torch.randn(4, 4))
    consts = COMPILED[-1].consts
    monkeypatch.setattr(fx_sizeonly, "MAX_ENTRIES", 3)
    for n in range(5, 12):
        x = torch.randn(n, n)
        torch.testing.assert_close(fn(x), _masked(x), rtol=0, atol=0)
        assert len(consts._cache) <= 3
    monkeypatch.setattr(fx_sizeonly, "MAX_BYTES", 64)   # a 12 x 12 mask is more: not kept
    x = torch.randn(12, 12)
    torch.testing.assert_close(fn(x), _masked(x), rtol=0, atol=0)
    assert len(consts._cache) <= 3 and all(k[0] != 12 for k in consts._cache)


def _attention(q, k, v):
    n = q.shape[-2]
    keep = torch.ones(n, n, dtype=torch.bool).tril()
    return F.scaled_dot_product_attention(q, k, v, attn_mask=torch.where(keep, 0.0, float("-inf")))


def test_a_graph_dvm_cannot_compile_runs_rewritten_in_pytorch(monkeypatch):
    """The graph handed back to PyTorch when the backend fails has been rewritten already (sdpa's
    causal mask, size-only nodes moved first): it still generates code and gives eager's values."""
    def fail(*args, **kwargs):
        raise RuntimeError("planner failure for the test")

    monkeypatch.setattr(torch_runtime, "plan", fail)
    torch._dynamo.reset()
    fn = torch.compile(_attention, backend="dvm", dynamic=True)
    before = sum(v for k, v in counters.snapshot().items() if k.startswith("fallback:graph:RuntimeError"))
    for n in (5, 7):
        q, k, v = (torch.randn(1, 2, n, 8) for _ in range(3))
        torch.testing.assert_close(fn(q, k, v), _attention(q, k, v))
    after = sum(v for k, v in counters.snapshot().items() if k.startswith("fallback:graph:RuntimeError"))
    assert after > before


def _padded_keep(x, pad):
    """x [b, 1, n, n] masked by pad [b, n] the way transformers' masking_utils builds a padding
    mask: pad indexed by broadcast batch and key aranges, and-ed with a query-side test."""
    b, n = pad.shape
    batch_idx, kv_idx, q_idx = torch.arange(b), torch.arange(n), torch.arange(n)
    keep = pad[batch_idx[:, None, None, None], kv_idx[None, None, None, :]]
    keep = keep & (q_idx >= 0)[None, None, :, None]
    return torch.where(keep, x, -1.0)


def test_index_positions_stay_in_the_graph_where_the_indexing_is_a_view():
    """Aranges that only index (mask[batch_arange[:, None, ...], kv_arange]) are not size-only
    values: left in the graph, the indexing is a view of the mask inside a segment instead of a
    gather through PyTorch; the query-side test is still computed once per size."""
    torch._dynamo.reset()
    fn = torch.compile(_padded_keep, backend="dvm", dynamic=True)
    for b, n in ((2, 5), (3, 7), (2, 9)):
        x, pad = torch.randn(b, 1, n, n), torch.rand(b, n) > 0.3
        torch.testing.assert_close(fn(x, pad), _padded_keep(x, pad), rtol=0, atol=0)
    graph = COMPILED[-1]
    text = graph.describe()
    assert " 0 fallback op(s)" in text and "index.Tensor" in text
    assert graph.consts is not None    # (q_idx >= 0) is remembered per size


def _first_rows(x, k):
    """x[arange(k)[:, None], arange(cols)]: x[:k] written as transformers' padding-mask indexing,
    with k a size of its own (a batch size passed beside the mask)."""
    return x[torch.arange(k)[:, None], torch.arange(x.shape[1])[None, :]] * 2


def test_an_arange_shorter_than_its_axis_indexes_a_slice():
    """An arange of k over an axis not known to have k entries is x[:k] there: a view inside the
    segment, its bound checked at run time (k past the axis raises, as eager's index does)."""
    torch._dynamo.reset()
    fn = torch.compile(_first_rows, backend="dvm", dynamic=True)
    for n, c, k in ((5, 7, 3), (6, 7, 6), (4, 9, 2), (8, 3, 5)):
        x = torch.randn(n, c)
        torch.testing.assert_close(fn(x, k), _first_rows(x, k), rtol=0, atol=0)
    assert " 0 fallback op(s)" in COMPILED[-1].describe()
    with pytest.raises(Exception):
        fn(torch.randn(3, 7), 5)


class _Positions(torch.nn.Module):
    """x * cos + pos(arange(n)) * scale: RoPE-style cos from a buffer and a learned position
    table, both read at the positions of a length n (values of sizes and weights)."""

    def __init__(self):
        super().__init__()
        self.pos = torch.nn.Embedding(32, 6)
        self.register_buffer("inv_freq", torch.rand(3), persistent=False)
        self.scale = torch.nn.Parameter(torch.rand(6))

    def forward(self, x):
        t = torch.arange(x.shape[0])
        freqs = torch.outer(t.float(), self.inv_freq)
        return x * torch.cat((freqs, freqs), -1).cos() + self.pos(t) * self.scale


def _check(fn, model, n: int):
    x = torch.randn(n, 6)
    with torch.no_grad():
        torch.testing.assert_close(fn(x), model(x))


def test_weights_read_with_sizes_are_remembered_while_unchanged():
    """In an inference graph, values of sizes and parameters / buffers are computed once per size
    and remembered while each weight is the same tensor with the same version and data pointer:
    an in-place update or a `.data` assignment makes them computed again."""
    torch._dynamo.reset()
    model = _Positions()
    fn = torch.compile(model, backend="dvm", dynamic=True)
    for n in (5, 7):
        _check(fn, model, n)
    graph = COMPILED[-1]
    assert graph.kind == "inference" and graph.consts is not None and graph.consts.n_weights == 3
    assert "reading 3 weight(s)" in graph.describe()
    assert not any(s.node.target is torch.ops.aten.embedding.default for s in graph.torch_steps[graph.n_const_torch_steps:])
    computed, hits, stale = (_count(f"torch_size_consts_{k}") for k in ("computed", "hits", "stale"))
    for n in (5, 9, 5, 9):
        _check(fn, model, n)
    assert (_count("torch_size_consts_computed") - computed, _count("torch_size_consts_hits") - hits) == (1, 3)
    with torch.no_grad():
        model.pos.weight.add_(1.0)          # in place: a new version
    _check(fn, model, 5)
    model.scale.data = torch.rand(6)        # another tensor's memory, same Parameter
    _check(fn, model, 5)
    model.inv_freq = torch.rand(3)          # another buffer
    _check(fn, model, 9)
    _check(fn, model, 9)
    assert _count("torch_size_consts_stale") - stale == 3
    assert _count("torch_size_consts_hits") - hits == 4


def test_weights_of_another_module_are_not_taken_for_the_first_ones():
    torch._dynamo.reset()
    first, second = _Positions(), _Positions()
    fn_first, fn_second = (torch.compile(m, backend="dvm", dynamic=True) for m in (first, second))
    for n in (5, 7, 5):
        _check(fn_first, first, n)
        _check(fn_second, second, n)


def test_weights_without_a_version_counter_are_read_at_every_call():
    """Tensors made under torch.inference_mode have no version counter: nothing read from them is
    remembered (counted), and the values stay right."""
    torch._dynamo.reset()
    with torch.inference_mode():
        model = _Positions()
        fn = torch.compile(model, backend="dvm", dynamic=True)
        before = _count("torch_size_consts_unversioned")
        for n in (5, 7, 5):
            x = torch.randn(n, 6)
            torch.testing.assert_close(fn(x), model(x))
        assert _count("torch_size_consts_unversioned") - before >= 2


def test_training_graphs_read_weights_at_every_call():
    """With gradients, weights are not taken as inputs of remembered values (an optimizer step
    changes them every call); the gradients are eager's."""
    torch._dynamo.reset()
    model = _Positions()
    fn = torch.compile(model, backend="dvm", dynamic=True)
    for n in (5, 7):
        x = torch.randn(n, 6)
        fn(x).sum().backward()
        got = model.pos.weight.grad.clone()
        model.pos.weight.grad = None
        model(x).sum().backward()
        torch.testing.assert_close(got, model.pos.weight.grad)
        model.zero_grad()
    graphs = [g for g in list(COMPILED)[-4:] if g.kind == "forward"]
    assert graphs and all(g.consts is None or g.consts.n_weights == 0 for g in graphs)
