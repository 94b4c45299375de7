"""Scatters written in place (frontend/fx_reinplace): a scatter, or a nest of them (a nested
assignment), whose root is an earlier scatter's result or a graph input the graph updates writes
into it when no value sharing the root's memory is read after it but by the nest; otherwise it
stays out of place. Random programs of scatters and readers give the same values rewritten or
not (Hypothesis); a loop that fills a tensor step by step, nested assignments and a cache's
index_copy_ into inputs, through torch.compile, give eager's values and inputs. Scatters into a
fresh base that only they read: test_fx_reinplace_fresh."""

import pytest

torch = pytest.importorskip("torch")
import torch.fx as fx  # noqa: E402
from hypothesis import given, settings, strategies as st  # noqa: E402

from dvm.frontend import fx_reinplace  # noqa: E402
from dvm.runtime import counters  # noqa: E402

pytestmark = [pytest.mark.cpu_vm, pytest.mark.vm_once]   # runs once, on the default (CPU) VM
aten = torch.ops.aten
ROWS, COLS = 6, 5


def _module(build) -> fx.GraphModule:
    g = fx.Graph()
    base, value = g.placeholder("base"), g.placeholder("value")
    g.output(build(g, base, value))
    return fx.GraphModule(torch.nn.Module(), g)


def _rewritten(build) -> tuple[fx.GraphModule, fx.GraphModule, int]:
    plain, rewritten = _module(build), _module(build)
    done = fx_reinplace.rewrite(rewritten.graph)
    rewritten.recompile()
    return plain, rewritten, done


def _same_values(plain, rewritten) -> None:
    base, value = torch.randn(ROWS, COLS), torch.randn(COLS)
    want = plain(base.clone(), value)
    kept = base.clone()
    got = rewritten(base, value)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(base, kept)   # the graph input itself is never written


def _chain(g, x, v, n):
    for i in range(n):
        x = g.call_function(aten.select_scatter.default, (x, v, 0, i))
    return x


def test_a_chain_writes_all_but_its_first_scatter_in_place():
    """The first scatter's base is a graph input: it copies once; the rest write into its result."""
    plain, rewritten, done = _rewritten(lambda g, x, v: _chain(g, x, v, 4))
    assert done == 3
    targets = [n.target for n in rewritten.graph.nodes if n.op == "call_function"]
    assert targets == [aten.select_scatter.default] + [fx_reinplace.select_into] * 3
    _same_values(plain, rewritten)


def test_a_reader_before_the_scatter_with_a_fresh_result_allows_it():
    def build(g, x, v):
        s0 = _chain(g, x, v, 1)
        doubled = g.call_function(aten.mul.Tensor, (s0, 2))
        s1 = g.call_function(aten.select_scatter.default, (s0, v, 0, 1))
        return s1, doubled
    plain, rewritten, done = _rewritten(build)
    assert done == 1
    _same_values(plain, rewritten)


def _held(how: str):
    """Two scatters where the first one's value is still held after the second: read after it,
    through a view taken before it (it would see the write), or returned."""
    def build(g, x, v):
        s0 = _chain(g, x, v, 1)
        row = g.call_function(aten.select.int, (s0, 0, 1)) if how == "view" else s0
        s1 = g.call_function(aten.select_scatter.default, (s0, v, 0, 1))
        return (s1, s0) if how == "returned" else (s1, g.call_function(aten.mul.Tensor, (row, 2)))
    return build


@pytest.mark.parametrize("how", ["read after", "view", "returned"])
def test_a_base_held_after_the_scatter_keeps_it_out_of_place(how):
    plain, rewritten, done = _rewritten(_held(how))
    assert done == 0
    _same_values(plain, rewritten)


def test_slices_index_put_and_index_copy_write_in_place():
    def build(g, x, v):
        s0 = g.call_function(aten.slice_scatter.default, (x, g.call_function(aten.mul.Tensor, (x, 3)), 0, 0, ROWS))
        rows = g.call_function(aten.slice.Tensor, (s0, 0, 1, 3))
        s1 = g.call_function(aten.slice_scatter.default, (s0, g.call_function(aten.neg.default, (rows,)), 0, 2, 4))
        idx = g.call_function(aten.arange.start, (0, 2), {"dtype": torch.int64})
        s2 = g.call_function(aten.index_put.default, (s1, [idx], v, True))
        s3 = g.call_function(aten.index_copy.default, (s2, 0, idx, g.call_function(aten.expand.default, (v, [2, COLS]))))
        return g.call_function(aten.slice_scatter.default, (s3, rows, 0, 4, 6))
    plain, rewritten, done = _rewritten(build)
    # s1 reads a view of s0 (rows, read again at the end): s1 stays out of place; s2, s3 and the last write in place
    assert done == 3
    _same_values(plain, rewritten)


READERS = ("fresh", "view", "late", "returned", "none")


@settings(max_examples=60, deadline=None)
@given(steps=st.lists(st.tuples(st.sampled_from(["select", "slice"]), st.integers(0, ROWS - 1),
                                st.sampled_from(READERS)), min_size=1, max_size=8))
def test_random_scatter_programs_keep_their_values(steps):
    """Chains of row and slice writes with readers of each step's value: fresh results, views
    read at the end, readers placed after the next write, returned values; same values either way."""
    def build(g, x, v):
        outs, late = [], []
        for kind, i, reader in steps:
            if kind == "select":
                y = g.call_function(aten.select_scatter.default, (x, v, 0, i))
            else:
                src = g.call_function(aten.expand.default, (v, [ROWS - i, COLS]))
                y = g.call_function(aten.slice_scatter.default, (x, src, 0, i, ROWS))
            for pending in late:
                outs.append(g.call_function(aten.mul.Tensor, (pending, 2)))
            late = []
            if reader == "fresh":
                outs.append(g.call_function(aten.add.Tensor, (y, 1)))
            elif reader == "view":
                outs.append(g.call_function(aten.select.int, (y, 0, (i + 1) % ROWS)))
            elif reader == "late":
                late.append(y)
            elif reader == "returned":
                outs.append(y)
            x = y
        return (x, *outs, *[g.call_function(aten.mul.Tensor, (p, 2)) for p in late])
    plain, rewritten, _ = _rewritten(build)
    base, value = torch.randn(ROWS, COLS), torch.randn(COLS)
    want = [t.clone() for t in plain(base.clone(), value)]
    got = [t.clone() for t in rewritten(base.clone(), value)]
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)


def test_a_loop_filling_a_tensor_step_by_step_matches_eager():
    """RWKV's CPU scan in small: out[:, t] = f(state, x[:, t]) for each t, through torch.compile:
    eager's values at two lengths, every write in place (the first into the zeros, a fresh
    result nothing else reads), shown by describe()."""
    from dvm.frontend import torch_backend as tb

    def scan(x):
        out = torch.zeros_like(x)
        state = torch.zeros_like(x[:, 0])
        for t in range(x.shape[1]):
            state = state * 0.9 + torch.tanh(x[:, t])
            out[:, t] = state / (1 + state.abs())
        return out, state

    torch._dynamo.reset()
    compiled = torch.compile(scan, backend="dvm")
    for length in (5, 9):
        x = torch.randn(3, length, 16)
        before = counters.snapshot().get("torch_scatters_in_place", 0)
        got = compiled(x)
        torch.testing.assert_close(got, scan(x))
        assert counters.snapshot().get("torch_scatters_in_place", 0) - before == length
        assert f"scatters written into their bases: {length}" in tb.COMPILED[-1].describe()
        torch.testing.assert_close(compiled(x), scan(x))   # the remembered launches, the same values



END = 2 ** 63 - 1   # functionalization's slice end for "to the end"


def _input_module(build) -> fx.GraphModule:
    """A graph that updates its input `base` (AOTAutograd's `copy_(base, final)` at its end)."""
    g = fx.Graph()
    base, value = g.placeholder("base"), g.placeholder("value")
    final, *outs = build(g, base, value)
    g.call_function(aten.copy_.default, (base, final))
    g.output((g.call_function(aten.mul.Tensor, (final, 2)), *outs))
    return fx.GraphModule(torch.nn.Module(), g)


def _input_rewritten(build, value_shape=(ROWS - 1, COLS, COLS - 2)) -> tuple[int, list]:
    """(scatters written in place, call targets after) of build's input-updating graph, checked
    to give the plain graph's outputs and to leave its input as the plain graph does."""
    plain, rewritten = _input_module(build), _input_module(build)
    done = fx_reinplace.rewrite(rewritten.graph)
    rewritten.recompile()
    base, value = torch.randn(ROWS, COLS, COLS), torch.randn(value_shape)
    want_base, got_base = base.clone(), base.clone()
    want, got = plain(want_base, value), rewritten(got_base, value)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)
    torch.testing.assert_close(got_base, want_base)
    return done, [n.target for n in rewritten.graph.nodes if n.op == "call_function"]


def _nested(g, x, v):
    """x[1:, :, 2:] = v as functionalization writes it: v into the region of the view x[1:],
    which is then written into x; and a row of x read before it."""
    rows = g.call_function(aten.slice.Tensor, (x, 0, 1, END))
    whole = g.call_function(aten.slice_scatter.default, (rows, v, 2, 2, END))
    inner = g.call_function(aten.slice_scatter.default, (rows, whole, 1, 0, END))   # (all of dim 1)
    return g.call_function(aten.slice_scatter.default, (x, inner, 0, 1, END))


def test_a_nest_into_an_updated_input_writes_once():
    """x[1:, :, 2:] = v into a graph input the graph updates: v written into x, the outer
    scatters return their bases, and the final copy_ (src now x's memory) does nothing."""
    done, targets = _input_rewritten(lambda g, x, v: (_nested(g, x, v),))
    assert done == 3
    assert targets.count(fx_reinplace.slice_into) == 1 and targets.count(fx_reinplace.updated_base) == 2
    assert fx_reinplace.overwrite in targets and aten.copy_.default not in targets


def test_an_input_the_graph_does_not_update_is_never_written():
    plain, rewritten, done = _rewritten(lambda g, x, v: _chain(g, x, v, 1))
    assert done == 0
    _same_values(plain, rewritten)


def _stale(how: str):
    """A nest into an updated input where the input's old value is still read after it."""
    def build(g, x, v):
        before = g.call_function(aten.select.int, (x, 0, 2))   # a view of x taken before the nest
        final = _nested(g, x, v)
        if how == "view read after":
            return final, g.call_function(aten.mul.Tensor, (before, 3))
        if how == "input read after":
            return final, g.call_function(aten.add.Tensor, (x, 1))
        return final, x    # returned
    return build


@pytest.mark.parametrize("how", ["view read after", "input read after", "returned"])
def test_an_old_value_read_after_the_nest_keeps_it_out_of_place(how):
    done, targets = _input_rewritten(_stale(how))
    assert done == 0 and aten.copy_.default in targets


def test_a_source_in_the_roots_memory_keeps_it_out_of_place():
    """x[1:] = x[:-1] (overlapping memory): a copy first, as functionalization has it."""
    def build(g, x, v):
        src = g.call_function(aten.slice.Tensor, (x, 0, 0, -1))
        return (g.call_function(aten.slice_scatter.default, (x, src, 0, 1, END)),)
    done, _ = _input_rewritten(build)
    assert done == 0


def test_a_root_viewed_through_expand_keeps_it_out_of_place():
    """A scatter into an expanded view: two of its elements are one location, so writing one
    would change the other."""
    def build(g, x, v):
        fresh = g.call_function(aten.select_scatter.default, (x, v, 0, 0))   # (a fresh tensor)
        wide = g.call_function(aten.expand.default, (g.call_function(aten.unsqueeze.default, (fresh, 0)),
                                                      [2, ROWS, COLS]))
        return g.call_function(aten.select_scatter.default, (wide, g.call_function(aten.neg.default, (fresh,)), 0, 0))
    plain, rewritten, done = _rewritten(build)
    assert done == 0
    _same_values(plain, rewritten)


def test_overwrite_skips_the_same_memory_and_copies_overlapping_memory_first():
    x = torch.arange(24.0).reshape(2, 1, 12)
    same = x.as_strided(x.shape, (12, 5, 1))   # the same elements (a size-1 dim's stride differs)
    assert fx_reinplace.overwrite(x, same) is x
    want = x.flip(2).clone()
    fx_reinplace.overwrite(x, x.flip(2))   # reversed onto itself: copied first
    torch.testing.assert_close(x, want)
    y = torch.zeros(2, 1, 12)
    fx_reinplace.overwrite(y, want[:, :, :1])   # broadcast from other memory: copy_ as it is
    torch.testing.assert_close(y, want[:, :, :1].expand(2, 1, 12))


def test_input_updates_through_torch_compile_match_eager():
    """Nested slice assignments and a cache's index_copy_ into graph inputs (Longformer's
    diagonal scores, a static KV cache), through torch.compile: eager's outputs and inputs."""
    def update(buf, cache, v, pos, k):
        buf[:, :-1, :, 2:] = v * 2
        buf[:, -1, :, :3] = v[:, 0, :, :3] + 1
        cache.index_copy_(2, pos, k)
        return buf.sum(-1), cache.mean()

    torch._dynamo.reset()
    compiled = torch.compile(update, backend="dvm", dynamic=True)
    for length in (5, 9):
        args = (torch.randn(2, length, 3, 7), torch.randn(1, 2, 16, 4), torch.randn(2, length - 1, 3, 5),
                torch.tensor([length, length + 1]), torch.randn(1, 2, 2, 4))
        want_args, got_args = [a.clone() for a in args], [a.clone() for a in args]
        with torch.no_grad():
            want = update(*want_args)
            before = counters.snapshot().get("torch_scatters_in_place", 0)
            got = compiled(*got_args)
        torch.testing.assert_close(got, want)
        for a, b in zip(got_args, want_args):
            torch.testing.assert_close(a, b)
        assert counters.snapshot().get("torch_scatters_in_place", 0) > before
