"""The run graph's fast callables (frontend/torch_calls) compute what the ATen overloads they
stand for compute: same values, shapes, strides and storage offsets (views stay views)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from dvm.frontend.fx_attention_math import SDPA  # noqa: E402
from dvm.frontend.torch_calls import _SAME_OP, fast_call  # noqa: E402
from dvm.runtime import counters  # noqa: E402

aten = torch.ops.aten
X = torch.arange(2 * 3 * 4, dtype=torch.float32).reshape(2, 3, 4)
M = torch.arange(12, dtype=torch.float32).reshape(3, 4)

CALLS = [
    (aten.t.default, (M,)),
    (aten.unsqueeze.default, (X, -2)),
    (aten.squeeze.dim, (X[:, :1], 1)),
    (aten.transpose.int, (X, 0, 2)),
    (aten.permute.default, (X, [2, 0, 1])),
    (aten.expand.default, (X[:, :1], [2, 5, 4])),
    (aten.select.int, (X, 1, -1)),
    (aten.mm.default, (M, M.t())),
    (aten.bmm.default, (X, X.transpose(1, 2))),
    (aten.neg.default, (X,)),
    (aten.cat.default, ([X, X], -1)),
    (aten.view.default, (X, [6, 4])),
    (aten._unsafe_view.default, (X, [4, -1])),
    (aten.slice.Tensor, (X, -1, 1, 2 ** 63 - 1)),
    (aten.slice.Tensor, (X, 1, -2, 3, 2)),
    (aten.slice.Tensor, (X, 0, 5, 9)),
    (aten.slice.Tensor, (X, 2, None, -1)),
    (aten.slice.Tensor, (X,)),
    (aten.cumsum.default, (torch.tensor([[1, 0, 1, 1]]), 1)),
    (aten.gather.default, (X, 2, torch.tensor([[[3, 0]] * 3] * 2))),
    (aten.index_select.default, (X, 1, torch.tensor([2, 0]))),
    (aten.where.self, (X > 5, X, M)),
    (aten.add.Tensor, (X, M)),
    (aten.add.Tensor, (torch.arange(4), 2.5)),   # a Python number: the same promotion
    (aten.sub.Tensor, (X, 1)),
    (aten.mul.Tensor, (X.transpose(0, 2), 3.0)),
    (aten.div.Tensor, (torch.arange(4), torch.tensor(2))),   # integers: true division
]


def _same(a: torch.Tensor, b: torch.Tensor) -> None:
    assert (a.shape, a.stride(), a.storage_offset(), a.dtype) == (b.shape, b.stride(), b.storage_offset(), b.dtype)
    torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("i", range(len(CALLS)))
def test_fast_call_matches_overload(i):
    op, args = CALLS[i]
    fn = fast_call(op, args, False)
    assert fn is not op or op not in _SAME_OP
    _same(fn(*args), op(*args))


ROUTING = [   # (op, args, kwargs): an MoE's routing ops, tuples of results or keyword arguments
    (aten.sort.default, (torch.tensor([3, 1, 2, 1, 0]),), {}),
    (aten.sort.default, (X.transpose(0, 2), 1, True), {}),
    (aten.topk.default, (X, 2), {}),
    (aten.topk.default, (X, 1, 0, False), {}),
    (aten.histc.default, (torch.tensor([0.0, 3.0, 3.0, 7.0]), 8, 0, 7), {}),
    (aten.index_put.default, (M, [torch.tensor([2, 0])], torch.tensor(9.0)), {}),
    (aten.index_put.default, (M, [torch.tensor([1, 1])], torch.ones(4), True), {}),
    (aten.floor_divide.default, (torch.arange(-4, 4), 3), {}),
    (aten.cumsum.default, (torch.tensor([2, 0, 1]), 0), {"dtype": torch.int32}),
]
_QKV = [torch.randn(1, 2, 5, 8, generator=torch.Generator().manual_seed(i)) for i in range(3)]
KEYWORD_CALLS = [   # (op, args, kwargs): ops whose fast callable takes the op's keywords too
    (aten.clone.default, (X.transpose(0, 2),), {"memory_format": torch.contiguous_format}),
    (aten.clone.default, (X.transpose(0, 2),), {}),   # (the layout preserved)
    (SDPA, tuple(_QKV), {"attn_mask": torch.randn(1, 1, 5, 5), "scale": 0.3}),
    (SDPA, (*_QKV, 0.0, True), {}),
]


@pytest.mark.parametrize("i", range(len(ROUTING) + len(KEYWORD_CALLS)))
def test_routing_and_keyword_calls_match_overload(i):
    op, args, kwargs = (ROUTING + KEYWORD_CALLS)[i]
    fn = fast_call(op, args, bool(kwargs))
    assert fn is not op
    got, want = fn(*args, **kwargs), op(*args, **kwargs)
    for a, b in zip(*((g,) if isinstance(g, torch.Tensor) else tuple(g) for g in (got, want))):
        _same(a, b)


def test_empty_like_keeps_the_overloads_keywords():
    fn = fast_call(aten.empty_like.default, (X,), True)
    assert fn is not aten.empty_like.default
    for kwargs in ({"pin_memory": False}, {"dtype": torch.int32}, {"memory_format": torch.contiguous_format}):
        a, b = fn(X.transpose(0, 2), **kwargs), aten.empty_like.default(X.transpose(0, 2), **kwargs)
        assert (a.shape, a.stride(), a.dtype) == (b.shape, b.stride(), b.dtype)


@pytest.mark.parametrize("args", [(X, [1, 3], 2), (X, [2], 0), (X, [0, 3], 1)])
def test_fast_split_matches_overload(args):
    op = aten.split_with_sizes.default
    fn = fast_call(op, args, False)
    assert fn is not op
    got, want = fn(*args), op(*args)
    assert len(got) == len(want)
    for a, b in zip(got, want):
        _same(a, b)


@pytest.mark.parametrize("op", sorted(_SAME_OP, key=str))
def test_fast_calls_are_named_by_fx(op):
    """FX's code generator can name every fast callable (a method PyTorch overrides in Python,
    as Tensor.split, could not be: the whole graph would run eagerly)."""
    g = torch.fx.Graph()
    x = g.placeholder("x")
    g.output(g.call_function(fast_call(op, (x,), False), (x,)))
    assert "def forward" in torch.fx.GraphModule(torch.nn.Module(), g).code


def test_keyword_arguments_keep_the_overload():
    assert fast_call(aten.expand.default, (X, [2, 3, 4]), True) is aten.expand.default
    assert fast_call(aten.view.default, (X, [6, 4], None), False) is aten.view.default   # not the (x, size) form


def test_index_put_with_none_among_its_indices_keeps_the_overload():
    """torch.index_put refuses None among the indices (a dimension taken whole); the op takes it."""
    args = (X, [None, None, torch.tensor([1, 3])], torch.ones(2, 3, 1), True)
    fn = fast_call(aten.index_put.default, args, False)
    _same(fn(*args), aten.index_put.default(*args))


_GATHERED = [torch.randn(7, 5), torch.randn(7, 3, 4).to(torch.bfloat16), torch.arange(7), torch.randn(7, 5).t(),
             torch.randn(0, 3), torch.randn(7, 5).requires_grad_()]


@pytest.mark.parametrize("x", _GATHERED, ids=["2d", "3d-bf16", "int", "transposed", "empty", "grad"])
@pytest.mark.parametrize("index", [[1, 6, 1], [[0, 2], [6, 6]], [], [-1, 2], [3, 9]],
                         ids=["rows", "2d-index", "none", "negative", "out-of-range"])
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_row_gathers_match_index(x, index, dtype):
    """index_rows (aten.index.Tensor's run-graph call: index_select where it may) gives index's
    values, shape and strides, and its error where index raises one."""
    fn = fast_call(aten.index.Tensor, (x, [None]), False)
    i = torch.tensor(index, dtype=dtype)
    try:
        want = aten.index.Tensor(x, [i])
    except IndexError:
        with pytest.raises(IndexError):
            fn(x, [i])
        return
    _same(fn(x, [i]), want)


def test_other_index_forms_keep_index():
    fn = fast_call(aten.index.Tensor, (X, [None]), False)
    for idx in ([torch.tensor([True, False])], [None, torch.tensor([2, 0])], [torch.tensor([1]), torch.tensor([2])],
                [torch.tensor([[True, False, True]] * 2)], [torch.tensor(1)]):
        _same(fn(X, idx), aten.index.Tensor(X, idx))


def test_view_of_a_non_contiguous_tensor_is_a_counted_copy():
    fn = fast_call(aten.view.default, (X, [2, 12]), False)
    before = counters.snapshot().get("torch_view_copies", 0)
    xt = X.transpose(1, 2)
    _same(fn(xt, [2, 12]), xt.reshape(2, 12))
    assert counters.snapshot().get("torch_view_copies", 0) == before + 1
    split = X.transpose(0, 1)   # (3, 2, 4): splitting its last dim is a view, no copy
    assert fn(split, [3, 2, 2, 2]).data_ptr() == split.data_ptr()


def _folds_in_inference(m: torch.nn.Module, x: torch.Tensor) -> int:
    """Linear folds of m compiled fresh and run on x in inference (its result matches eager's);
    then, in training, the input's gradient matches eager's."""
    import dvm
    torch._dynamo.reset()   # a fresh compile (Dynamo reuses the graph across instances)
    before = counters.snapshot().get("torch_linear_folds", 0)
    with torch.no_grad():
        torch.testing.assert_close(dvm.compile(m)(x), m(x))
    folds = counters.snapshot().get("torch_linear_folds", 0) - before
    xg = x.clone().requires_grad_()
    (g,) = torch.autograd.grad(dvm.compile(m)(xg).sum(), xg)
    (w,) = torch.autograd.grad(m(xg).sum(), xg)
    torch.testing.assert_close(g, w)
    return folds


class _Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(16, 24, bias=False)
        self.b = torch.nn.Linear(24, 8)

    def forward(self, x):
        return self.b(torch.nn.functional.silu(self.a(x))) * 2


@pytest.mark.parametrize("shape", [(3, 5, 16), (7, 16), (1, 1, 16)])
def test_linear_layers_fold_into_one_call(shape):
    """In inference, t + view + mm (addmm with a bias) + view become one F.linear; results match
    eager (silu is DVM's: default tolerances), with and without a bias, 2-D and 3-D. In training
    the flattened input and t(w) are saved for the backward: no fold, gradients still match."""
    torch.manual_seed(0)
    folds = _folds_in_inference(_Mlp(), torch.randn(*shape))
    if len(shape) == 3:
        assert folds == 2


class _OtherLinears(torch.nn.Module):
    """Linear layers as Falcon (x @ w.permute(1, 0)) and GPT-2's Conv1D (addmm with an (in, out)
    weight) write them."""
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(24, 16))
        self.conv_w = torch.nn.Parameter(torch.randn(24, 8))
        self.conv_b = torch.nn.Parameter(torch.randn(8))

    def forward(self, x):
        h = torch.tanh(x @ self.w.permute(1, 0))   # (a ReLU would go into the product)
        flat = torch.addmm(self.conv_b, h.view(-1, h.shape[-1]), self.conv_w)
        return flat.view(h.shape[:-1] + (8,))


@pytest.mark.parametrize("shape", [(3, 5, 16), (1, 1, 16)])
def test_permuted_and_in_out_weights_fold_into_one_call(shape):
    """x @ w.permute(1, 0) and addmm(b, view(x), w) with w stored (in, out) become one F.linear
    call each (the second as linear_kxm: F.linear on w.t()); results match eager; in training
    nothing folds and gradients still match."""
    from dvm.frontend.torch_runtime import COMPILED
    torch.manual_seed(0)
    m = _OtherLinears()
    assert _folds_in_inference(m, torch.randn(*shape)) == 2
    inference = next(c for c in reversed(COMPILED) if c.kind == "inference")
    code = inference.runner.code
    assert "torch.mm" not in code and "torch.addmm" not in code and "permute" not in code, code
    assert "linear_kxm" in code and "torch_Tensor_t" not in code, code   # the (in, out) weight: one call



class _Router(torch.nn.Module):
    """An MoE router's form: the flattened tokens feed the router's linear and the experts."""
    def __init__(self, bias: bool):
        super().__init__()
        self.gate = torch.nn.Linear(16, 4, bias=bias)
        self.up = torch.nn.Parameter(torch.randn(16, 8))

    def forward(self, x):
        flat = x.view(-1, x.shape[-1])
        return torch.softmax(self.gate(flat), -1).amax(-1, keepdim=True) * (torch.tanh(flat) @ self.up)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(3, 5, 16), (7, 16)])
def test_a_2d_products_transposed_weight_folds_into_f_linear(bias, shape):
    """mm(x, t(w)) / addmm(b, x, t(w)) of a 2-D x read elsewhere too (no views around the
    product) is one F.linear: no t() call; results match eager, gradients in training too."""
    from dvm.frontend.torch_runtime import COMPILED
    torch.manual_seed(0)
    assert _folds_in_inference(_Router(bias), torch.randn(*shape)) >= 1
    inference = next(c for c in reversed(COMPILED) if c.kind == "inference")
    code = inference.runner.code
    assert "torch_Tensor_t(" not in code and "torch._C._nn.linear(" in code, code

def _same_shape_views(x, w):
    y = torch.relu(x)
    z = y.view(y.shape).expand(y.shape)   # both to y's own shape: y itself
    return torch.mm(z, w), z.view(z.shape) * 2


def test_views_to_their_own_shape_are_no_calls():
    """A view or expand of a value to its own shape is that value in the run graph (no call,
    counted); results match eager."""
    import dvm
    from dvm.frontend.torch_runtime import COMPILED
    torch._dynamo.reset()
    before = counters.snapshot().get("torch_identity_views", 0)
    with torch.no_grad():
        for n in (3, 5):
            x, w = torch.randn(n, 6), torch.randn(6, 4)
            for got, want in zip(dvm.compile(_same_shape_views)(x, w), _same_shape_views(x, w)):
                torch.testing.assert_close(got, want)
    assert counters.snapshot().get("torch_identity_views", 0) > before
    code = COMPILED[-1].runner.code
    assert "expand" not in code and "view" not in code, code


def _heads(x, w):
    """Views of a linear layer's output and of DVM outputs, two with a transposed traced layout
    (x.transpose(1, 2) * 2 follows its input's memory order in PyTorch)."""
    B, L, D = x.shape
    q = torch.nn.functional.linear(x, w).view(B, L, 2, 4)
    t = (x.transpose(1, 2) * 2).view(B, D, 1, L)
    u = (q.transpose(1, 2) * 3).view(B, 2, L, 2, 2)
    return t, u, torch.mm(q.reshape(-1, 4), w[:4, :4])


@pytest.mark.parametrize("order", ["never", "free"])
def test_views_of_row_major_values_are_plain_views(order, monkeypatch):
    """A view of F.linear's output, of a DVM output stored row-major or of such a view is called
    as Tensor.view, with no is_contiguous test (a view of any other value keeps it: the test
    above); q's view read only by the reshape is merged into it (three views, not four). With
    TORCH_ORDER "free" t and u are stored in PyTorch's order (their permutes move onto the
    loads): their views keep the test, and are views as in eager. Results match eager, no view
    copies."""
    from dvm.frontend import torch_segment
    from dvm.frontend.torch_runtime import COMPILED
    monkeypatch.setattr(torch_segment, "TORCH_ORDER", order)
    torch._dynamo.reset()
    fn = torch.compile(_heads, backend="dvm", dynamic=True)
    w = torch.randn(8, 6)
    before = counters.snapshot().get("torch_view_copies", 0)
    with torch.no_grad():
        for L in (3, 5, 9):
            x = torch.randn(2, L, 6)
            for got, want in zip(fn(x, w), _heads(x, w)):
                torch.testing.assert_close(got, want)
                assert order == "never" or got.stride() == want.stride()
    code = COMPILED[-1].runner.code
    plain = 3 if order == "never" else 1
    assert code.count("torch_Tensor_view(") == plain and code.count("_view_or_reshape(") == 3 - plain, code
    assert "torch_Tensor_view(linear, [-1, 4])" in code, code
    assert counters.snapshot().get("torch_view_copies", 0) == before
    torch._dynamo.reset()


@pytest.mark.parametrize("case", ["ascending", "short", "int64", "odd_width", "transposed", "empty_groups"])
def test_grouped_mm_fallback_runs_native_only_where_it_computes_the_same(case):
    """transformers' grouped_mm_fallback runs as torch._grouped_mm where that gives the same
    (bitwise) result; offsets that stop short of the rows (the fallback leaves those rows zero),
    int64 offsets, and layouts the kernel refuses run the fallback itself: same result always."""
    pytest.importorskip("transformers.integrations.moe")
    op = torch.ops.transformers.grouped_mm_fallback.default
    fn = fast_call(op, (None, None, None), False)
    assert fn is not op
    torch.manual_seed(0)
    n = 5 if case == "odd_width" else 8
    x, w = torch.randn(12, 16), torch.randn(3, 16, n)
    if case == "transposed":
        w = torch.randn(3, n, 16).transpose(1, 2)
    ends = {"short": [2, 5, 9], "empty_groups": [0, 12, 12]}.get(case, [3, 7, 12])
    offs = torch.tensor(ends, dtype=torch.int64 if case == "int64" else torch.int32)
    before = counters.snapshot().get("torch_grouped_mm_native", 0)
    torch.testing.assert_close(fn(x, w, offs), op(x, w, offs), rtol=0, atol=0)
    native = counters.snapshot().get("torch_grouped_mm_native", 0) - before
    assert native == (case in ("ascending", "transposed", "empty_groups"))


def test_the_gradient_of_indexing_a_later_dimension():
    """Its backward is index_put with None for the leading dimensions (Falcon's training step)."""
    import dvm
    torch._dynamo.reset()
    idx = torch.tensor([2, 0, 2])

    def f(x):
        return (x[:, :, idx] * x[:, :, :3]).sum()

    x = torch.randn(2, 3, 4, requires_grad=True)
    want = torch.autograd.grad(f(x), x)[0]
    got = torch.autograd.grad(dvm.compile(f, dynamic=True)(x), x)[0]
    torch.testing.assert_close(got, want)
    torch._dynamo.reset()
