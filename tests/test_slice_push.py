"""Slices of elementwise work moved onto its loads (fusion/slice_push) and reshapes that cannot move
there risen toward the outputs (fusion/reshape_hoist), on both VMs: RoPE's gradient of a computed
value in one kernel, slices through reductions' results and broadcasts, a risen reshape stopping
at a reduction, random slices of random elementwise work and random readers of a merge no load
takes against NumPy (Hypothesis)."""
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dvm.graph import build
from dvm.graph.symbolic import sym
from dvm.runtime.compiled import CompiledGraph

from graph_helpers import ew, f32_input

F32 = np.float32


def _halves_backward(ctx, v, h):
    """HF's rotate_half gradient over [.., 2, h] (fx_patterns): the rows swapped (a flip of the
    size-2 axis), the first negated."""
    flipped = build.slice_view(ctx, v, v.ndim - 2, 1, 2, step=-1)
    first = ew(ctx, "eq", build.iota(v.shape, v.ndim - 2), build.const(0))
    return ew(ctx, "where", first, flipped, ew(ctx, "neg", flipped))


def _np_halves_backward(v):
    f = v[..., ::-1, :]
    return np.where(np.arange(2)[:, None] == 0, f, -f)


def test_rope_gradient_of_a_computed_value_is_one_kernel(vm):
    """k's gradient under GQA: the sum of its query groups (views of one input), times sin, its
    halves swapped, plus the cos term, stored transposed as (b, s, heads, d): one kernel, no
    workspace (the flip moves onto the loads, the merge back to d rises to the output, the
    transpose moves onto the loads with the index turned)."""
    ctx, s = build.ShapeContext(), sym("s")
    b, kv, rep, h = 2, 2, 3, 4
    gq = f32_input((b, kv * rep, s, 2 * h), 0)
    cos, sin = f32_input((b, 1, s, 2 * h), 1), f32_input((b, 1, s, 2 * h), 2)
    groups = build.reshape(ctx, gq, (b, kv, rep, s, 2 * h))
    g = build.reduce(ctx, "sum", groups, 2)
    rows = (b, kv, s, 2, h)
    rot = _halves_backward(ctx, build.reshape(ctx, ew(ctx, "mul", g, sin), rows), h)
    grad = ew(ctx, "add", build.reshape(ctx, rot, (b, kv, s, 2 * h)), ew(ctx, "mul", g, cos))
    out = build.permute(ctx, grad, (0, 2, 1, 3))
    cg = CompiledGraph([gq, cos, sin], [out])
    assert len(cg.plan.groups) == 1 and not cg.plan.workspaces
    rng = np.random.default_rng(0)
    ga = rng.standard_normal((b, kv * rep, 5, 2 * h)).astype(F32)
    ca, sa = (rng.standard_normal((b, 1, 5, 2 * h)).astype(F32) for _ in range(2))
    gs = ga.reshape(b, kv, rep, 5, 2 * h).sum(2, dtype=F32)
    want = _np_halves_backward((gs * sa).reshape(b, kv, 5, 2, h)).reshape(b, kv, 5, 2 * h) + gs * ca
    (got,) = cg.run({"s": 5}, [ga, ca, sa])
    np.testing.assert_allclose(got, want.transpose(0, 2, 1, 3), rtol=1e-6, atol=1e-6)


def test_slices_through_reductions_and_broadcasts(vm):
    """A softmax's halves along its rows (the reductions' results broadcast there: read as they
    are) and its top rows (the reductions sliced as views of the values they store): the slices'
    readers compute the work, and the results are the same."""
    ctx, n = build.ShapeContext(), sym("n")
    x, w = f32_input((n, 8), 0), f32_input((8,), 1)
    e = ew(ctx, "exp", ew(ctx, "sub", x, build.reduce(ctx, "max", x, 1, True)))
    p = ew(ctx, "mul", ew(ctx, "div", e, build.reduce(ctx, "sum", e, 1, True)), w)
    lo, hi = build.slice_view(ctx, p, 1, 0, 4), build.slice_view(ctx, p, 1, 4, 4)
    top = build.slice_view(ctx, p, 0, 0, 2)
    cg = CompiledGraph([x, w], [ew(ctx, "sub", hi, lo), ew(ctx, "neg", top)])
    assert not any(ws.op == "mul" for ws in cg.plan.workspaces)
    rng = np.random.default_rng(1)
    xa, wa = rng.standard_normal((6, 8)).astype(F32), rng.standard_normal(8).astype(F32)
    ea = np.exp(xa - xa.max(1, keepdims=True))
    pa = ea / ea.sum(1, keepdims=True, dtype=F32) * wa
    got_d, got_top = cg.run({"n": 6}, [xa, wa])
    np.testing.assert_allclose(got_d, pa[:, 4:] - pa[:, :4], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got_top, -pa[:2], rtol=1e-5, atol=1e-6)


def test_a_risen_reshape_stops_at_a_reduction(vm):
    """The halves' gradient plus a term, summed over the merged axis: the sum reads the risen
    work through the reshape (stored once, as the halves were before), and the result is the same."""
    ctx, s = build.ShapeContext(), sym("s")
    v, c = f32_input((s, 2, 3), 0), f32_input((s, 6), 1)
    rot = build.reshape(ctx, _halves_backward(ctx, ew(ctx, "exp", v), 3), (s, 6))
    y = build.reduce(ctx, "sum", ew(ctx, "add", rot, c), 1)
    cg = CompiledGraph([v, c], [y])
    assert len(cg.plan.groups) == 2 and len(cg.plan.workspaces) == 1
    rng = np.random.default_rng(2)
    va, ca = rng.standard_normal((4, 2, 3)).astype(F32), rng.standard_normal((4, 6)).astype(F32)
    (got,) = cg.run({"s": 4}, [va, ca])
    want = (_np_halves_backward(np.exp(va)).reshape(4, 6) + ca).sum(1, dtype=F32)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@st.composite
def _cases(draw):
    """Random elementwise work over 1-3 operands (each full or broadcast on random axes, lower
    ranks among them) and a random slice of it: axis, start, length and step (negative ones too)."""
    rank = draw(st.integers(1, 3))
    sizes = [draw(st.sampled_from([1, 2, 5])) for _ in range(rank)]
    operands = []
    for _ in range(draw(st.integers(1, 3))):
        drop = draw(st.integers(0, rank - 1))
        operands.append(tuple(d if draw(st.booleans()) else 1 for d in sizes[drop:]))
    ops = draw(st.lists(st.sampled_from(["add", "mul", "sub", "maximum"]), min_size=len(operands),
                        max_size=len(operands)))
    axis = draw(st.integers(0, rank - 1))
    step = draw(st.sampled_from([1, 2, -1]))
    size = sizes[axis]
    start = draw(st.integers(0, size - 1))
    room = start + 1 if step < 0 else size - start
    length = draw(st.integers(1, (room + abs(step) - 1) // abs(step)))
    return sizes, operands, ops, axis, start, length, step


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=_cases())
def test_random_slices_of_elementwise_work(vm, case):
    sizes, operand_sizes, ops, axis, start, length, step = case
    ctx = build.ShapeContext()
    x = f32_input(tuple(sizes), 0)
    ins = [x] + [f32_input(sh, i + 1) for i, sh in enumerate(operand_sizes)]
    work = ew(ctx, "exp", x)
    for op, a in zip(ops, ins[1:]):
        work = ew(ctx, op, work, a)
    y = ew(ctx, "neg", build.slice_view(ctx, work, axis, start, length, step=step))
    cg = CompiledGraph(ins, [y])
    assert not cg.plan.workspaces
    rng = np.random.default_rng(len(ops))
    arrays = [rng.standard_normal(sh).astype(F32) for sh in [tuple(sizes)] + operand_sizes]
    want = np.exp(arrays[0])
    for op, a in zip(ops, arrays[1:]):
        want = {"add": np.add, "mul": np.multiply, "sub": np.subtract, "maximum": np.maximum}[op](want, a)
    index = [slice(None)] * len(sizes)
    index[axis] = slice(start, start + step * length if start + step * length >= 0 else None, step)
    (got,) = cg.run({}, arrays)
    np.testing.assert_allclose(got, -want[tuple(index)], rtol=1e-6, atol=1e-6)


@st.composite
def _merges(draw):
    """Work over (a, b, c) that no load can take reshaped (a where on an index of axis 1), merged to
    (a, b * c), then 1-3 elementwise readers, each with an operand full, broadcast over the merged
    axis, broadcast over the first, or a scalar; the last value an output, or summed over an axis."""
    a, b, c = (draw(st.sampled_from([1, 2, 3])) for _ in range(3))
    readers = []
    for _ in range(draw(st.integers(1, 3))):
        shape = draw(st.sampled_from([(a, b * c), (a, 1), (1, b * c), (b * c,), ()]))
        readers.append((draw(st.sampled_from(["add", "mul", "maximum"])), shape))
    return (a, b, c), readers, draw(st.sampled_from([None, 0, 1]))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=_merges())
def test_random_risen_reshapes(vm, case):
    (a, b, c), readers, reduce_axis = case
    ctx = build.ShapeContext()
    x = f32_input((a, b, c), 0)
    ins = [x] + [f32_input(shape, i + 1) for i, (_, shape) in enumerate(readers)]
    first = ew(ctx, "eq", build.iota((a, b, c), 1), build.const(0))
    v = build.reshape(ctx, ew(ctx, "where", first, ew(ctx, "exp", x), ew(ctx, "neg", x)), (a, b * c))
    for (op, _), operand in zip(readers, ins[1:]):
        v = ew(ctx, op, v, operand)
    y = v if reduce_axis is None else build.reduce(ctx, "sum", v, reduce_axis)
    cg = CompiledGraph(ins, [y])
    if reduce_axis is None:     # risen to the output: stored through the view, no workspace
        assert not cg.plan.workspaces and len(cg.plan.groups) == 1
    rng = np.random.default_rng(a * 9 + b * 3 + c)
    arrays = [rng.standard_normal(sh).astype(F32) for sh in [(a, b, c)] + [s for _, s in readers]]
    xa = arrays[0]
    want = np.where(np.arange(b)[None, :, None] == 0, np.exp(xa), -xa).reshape(a, b * c)
    for (op, _), arr in zip(readers, arrays[1:]):
        want = {"add": np.add, "mul": np.multiply, "maximum": np.maximum}[op](want, arr)
    if reduce_axis is not None:
        want = want.sum(reduce_axis, dtype=F32)
    (got,) = cg.run({}, arrays)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
