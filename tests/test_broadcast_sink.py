"""Broadcasts of computed values that elementwise work reads dropped (fusion/broadcast_sink), on
both VMs: an RMSNorm's gradient (a row sum's per-row value broadcast into it) stored by the kernel
of the row sum, a broadcast read by a reduction too, a column sum's broadcast kept, and random
elementwise work over broadcasts of row and column sums against NumPy (Hypothesis)."""
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dvm.fusion.broadcast_sink import sink_broadcasts
from dvm.graph import build
from dvm.graph.node import topo_order
from dvm.graph.symbolic import sym
from dvm.runtime.compiled import CompiledGraph

from graph_helpers import ew, f32_input

F32 = np.float32


def test_rms_norm_gradient_is_stored_by_the_row_sum_kernel(vm):
    """PyTorch's RMSNorm backward (AOTAutograd's graph): x's gradient reads the row sum of
    g * w * x scaled by -0.5 * rstd**3 and expanded to the rows; w's gradient sums over the rows.
    The expand is dropped: no workspace, and x's gradient is stored by the row sum's kernel."""
    ctx, n = build.ShapeContext(), sym("n")
    h = 16
    g, x, w, r = f32_input((n, h), 0), f32_input((n, h), 1), f32_input((h,), 2), f32_input((n, 1), 3)
    gw = ew(ctx, "mul", g, w)
    s = build.reduce(ctx, "sum", ew(ctx, "mul", gw, x), 1, True)
    r3 = ew(ctx, "mul", ew(ctx, "mul", r, r), r)
    scale = build.broadcast_to(ctx, ew(ctx, "mul", ew(ctx, "mul", s, build.const(-0.5)), r3), (n, h))
    term = ew(ctx, "mul", ew(ctx, "div", scale, build.const(float(h))), ew(ctx, "mul", x, build.const(2.0)))
    grad_x = ew(ctx, "add", ew(ctx, "mul", gw, r), term)
    grad_w = build.reduce(ctx, "sum", ew(ctx, "mul", g, ew(ctx, "mul", x, r)), 0)
    cg = CompiledGraph([g, x, w, r], [grad_x, grad_w])
    assert not cg.plan.workspaces and len(cg.plan.groups) == 2
    row_sums = next(gr for gr in cg.plan.groups if gr.axes == frozenset({1}))
    assert [st_.slot for st_ in row_sums.stores] == [4]
    rng = np.random.default_rng(0)
    ga, xa = (rng.standard_normal((7, h)).astype(F32) for _ in range(2))
    wa, ra = rng.standard_normal(h).astype(F32), (rng.random((7, 1)) + 0.5).astype(F32)
    sa = (ga * wa * xa).sum(1, keepdims=True, dtype=F32)
    want_x = ga * wa * ra + sa * -0.5 * ra ** 3 / h * (2 * xa)
    got_x, got_w = cg.run({"n": 7}, [ga, xa, wa, ra])
    np.testing.assert_allclose(got_x, want_x, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got_w, (ga * xa * ra).sum(0, dtype=F32), rtol=1e-5, atol=1e-5)


def test_a_broadcast_read_by_a_reduction_keeps_its_shape(vm):
    """exp(broadcast(row max)) read by a sum over the rows and by elementwise work: the sum reads
    the work at its full shape (the rows' values repeated), the elementwise reader per row."""
    ctx, n = build.ShapeContext(), sym("n")
    x = f32_input((n, 5), 0)
    e = ew(ctx, "exp", build.broadcast_to(ctx, build.reduce(ctx, "max", x, 1, True), (n, 5)))
    total = build.reduce(ctx, "sum", e, 0)
    y = ew(ctx, "sub", x, e)
    (new_total, new_y) = sink_broadcasts([total, y])
    assert e in topo_order([new_total])
    assert all(v.op != "broadcast_to" for v in topo_order([new_y]))
    cg = CompiledGraph([x], [total, y])
    xa = np.random.default_rng(1).standard_normal((6, 5)).astype(F32)
    ea = np.broadcast_to(np.exp(xa.max(1, keepdims=True)), (6, 5))
    got_total, got_y = cg.run({"n": 6}, [xa])
    np.testing.assert_allclose(got_total, ea.sum(0, dtype=F32), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got_y, xa - ea, rtol=1e-6, atol=1e-6)


def test_a_column_sum_broadcast_keeps_its_workspace(vm):
    """x minus its column mean, the mean expanded: the broadcast stays, so the subtraction runs in
    a kernel of its own, not as a second sweep of the column reduction's kernel."""
    ctx, n = build.ShapeContext(), sym("n")
    x = f32_input((n, 6), 0)
    mean = ew(ctx, "div", build.reduce(ctx, "sum", x, 0, True), build.const(4.0))
    y = ew(ctx, "sub", x, build.broadcast_to(ctx, mean, (n, 6)))
    assert sink_broadcasts([y]) == [y]
    cg = CompiledGraph([x], [y])
    assert len(cg.plan.groups) == 2 and len(cg.plan.workspaces) == 1
    xa = np.random.default_rng(2).standard_normal((4, 6)).astype(F32)
    (got,) = cg.run({"n": 4}, [xa])
    np.testing.assert_allclose(got, xa - xa.sum(0, keepdims=True, dtype=F32) / 4, rtol=1e-6, atol=1e-6)


_UNARY = {"tanh": np.tanh, "neg": np.negative, "abs": np.abs}
_BINARY = {"add": np.add, "mul": np.multiply, "sub": np.subtract, "maximum": np.maximum}


@st.composite
def _cases(draw):
    """A sum of exp(x) (rows x cols, a leading batch axis or not) over its rows or columns, kept,
    broadcast back, then 1-4 steps of elementwise work: a unary op, or a binary op with x, with a
    per-row or per-column input, with a scalar, or with the broadcast again."""
    shape = draw(st.sampled_from([(3, 4), (5, 1), (1, 6), (2, 3, 4)]))
    axis = draw(st.integers(len(shape) - 2, len(shape) - 1))
    steps = draw(st.lists(st.one_of(
        st.tuples(st.sampled_from(sorted(_UNARY)), st.just(None)),
        st.tuples(st.sampled_from(sorted(_BINARY)), st.sampled_from(["x", "row", "col", "scalar", "again"]))),
        min_size=1, max_size=4))
    return shape, axis, steps, draw(st.booleans())


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=_cases())
def test_random_work_over_broadcast_sums(vm, case):
    shape, axis, steps, swap = case
    ctx = build.ShapeContext()
    row_shape, col_shape = shape[:-1] + (1,), shape[-1:]
    x, per_row, per_col = f32_input(shape, 0), f32_input(row_shape, 1), f32_input(col_shape, 2)
    b = build.broadcast_to(ctx, build.reduce(ctx, "sum", ew(ctx, "exp", x), axis, True), shape)
    operands = {"x": x, "row": per_row, "col": per_col, "scalar": build.const(0.5), "again": b}
    v = b
    for op, other in steps:
        if other is None:
            v = ew(ctx, op, v)
        else:
            v = ew(ctx, op, *((operands[other], v) if swap else (v, operands[other])))
    cg = CompiledGraph([x, per_row, per_col], [v])
    one_sum = np.prod(shape) == shape[axis]     # (a one-element value is computed once: scalar_work)
    row_sum = axis == len(shape) - 1 and not one_sum    # (a column sum's broadcast keeps its workspace)
    if any(other == "x" for _, other in steps) and row_sum:   # x's shape reached reading the sum
        assert not cg.plan.workspaces
    rng = np.random.default_rng(len(steps))
    xa, ra, ca = (rng.standard_normal(sh).astype(F32) for sh in (shape, row_shape, col_shape))
    ba = np.broadcast_to(np.exp(xa).sum(axis, keepdims=True, dtype=F32), shape)
    arrays = {"x": xa, "row": ra, "col": ca, "scalar": F32(0.5), "again": ba}
    want = ba
    for op, other in steps:
        if other is None:
            want = _UNARY[op](want)
        else:
            want = _BINARY[op](*((arrays[other], want) if swap else (want, arrays[other])))
    (got,) = cg.run({}, [xa, ra, ca])
    np.testing.assert_allclose(got, np.broadcast_to(want, shape), rtol=1e-5, atol=1e-5)
