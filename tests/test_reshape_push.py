"""Reshapes of elementwise work moved onto its loads (fusion/reshape_push), on both VMs: the
residual + LayerNorm of OPT-style blocks in one kernel, merges of batch and length, operands
broadcast over part of a merged group, work read twice or broadcast (left alone), views and
reductions under the reshape, unit-axis reshapes of slices (views), and random reshapes of
random broadcasts against NumPy (Hypothesis)."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dvm.fusion.reshape_push import axis_groups, renames_axes, splits_only
from dvm.graph import build
from dvm.graph.dtypes import DType
from dvm.graph.node import Node
from dvm.graph.symbolic import sym
from dvm.runtime.compiled import CompiledGraph

from graph_helpers import ew, f32_input

F32 = np.float32


def _layer_norm(ctx, v, w):
    mean = build.reduce(ctx, "mean", v, v.ndim - 1, True)
    d = ew(ctx, "sub", v, mean)
    var = build.reduce(ctx, "mean", ew(ctx, "mul", d, d), v.ndim - 1, True)
    return ew(ctx, "mul", ew(ctx, "mul", d, ew(ctx, "rsqrt", ew(ctx, "add", var, build.const(1e-5)))), w)


def _np_layer_norm(v, w):
    d = v - v.mean(-1, keepdims=True, dtype=F32)
    return d / np.sqrt((d * d).mean(-1, keepdims=True, dtype=F32) + F32(1e-5)) * w


def test_axis_groups():
    s, b = sym("s"), sym("b")
    assert axis_groups((b, s, 4), (b * s, 4)) == [([0, 1], [0]), ([2], [1])]
    assert axis_groups((1, s, 4), (s, 1, 4)) == [([1], [0]), ([2], [2])]
    assert axis_groups((s, 6), (s, 2, 3)) == [([0], [0]), ([1], [1, 2])]
    assert axis_groups((s, 4), (b, 4)) is None                 # counts not provably equal
    assert axis_groups((2, 0), (0, 2)) is None                 # empty: nothing to gain
    assert renames_axes((1, s, 4), (s, 4, 1)) and not renames_axes((b, s), (b * s,))


@pytest.mark.parametrize("batch", [1, 3])
def test_residual_and_layer_norm_are_one_kernel(vm, batch):
    """OPT: h = x + r (an output, 3-D) viewed as (rows, hidden) and normalized: one kernel, no
    workspace; the 3-D sum is stored from the 2-D kernel."""
    ctx, s, b = build.ShapeContext(), sym("s"), sym("b")
    lead = (1,) if batch == 1 else (b,)
    x, r, w = f32_input((*lead, s, 16), 0), f32_input((*lead, s, 16), 1), f32_input((16,), 2)
    h = ew(ctx, "add", x, r)
    rows = s if batch == 1 else b * s
    y = _layer_norm(ctx, build.reshape(ctx, h, (rows, 16)), w)
    g = CompiledGraph([x, r, w], [y, h])
    assert len(g.plan.groups) == 1 and not g.plan.workspaces
    rng = np.random.default_rng(batch)
    xa, ra = (rng.standard_normal((batch, 7, 16)).astype(F32) for _ in range(2))
    wa = rng.standard_normal(16).astype(F32)
    got_y, got_h = g.run({"s": 7, "b": batch}, [xa, ra, wa])
    np.testing.assert_array_equal(got_h, xa + ra)
    np.testing.assert_allclose(got_y, _np_layer_norm((xa + ra).reshape(-1, 16), wa), rtol=1e-5, atol=1e-5)


def test_a_scalar_output_keeps_its_own_kernel(vm):
    """GPT-2's GELU beside sqrt(2 / pi) from 0-d inputs: the 0-d output is not stored from the
    elementwise kernel (a reshape keeps the element count)."""
    ctx, s = build.ShapeContext(), sym("s")
    x = f32_input((1, s, 8), 0)
    a, b = (Node.make("input", DType.FLOAT64, (), index=i) for i in (1, 2))
    c = ew(ctx, "sqrt", ew(ctx, "div", a, b))
    y = ew(ctx, "mul", x, build.cast(c, DType.FLOAT32))
    g = CompiledGraph([x, a, b], [y, c])
    xa = np.arange(24, dtype=F32).reshape(1, 3, 8)
    got_y, got_c = g.run({"s": 3}, [xa, np.array(2.0), np.array(8.0)])
    assert got_c.shape == () and got_c == 0.5
    np.testing.assert_array_equal(got_y, xa * F32(0.5))


@pytest.mark.parametrize("reader", ["broadcast", "shared"])
def test_work_that_would_be_redone_stays_put(vm, reader):
    """T5's position bias (4, s, s) viewed as (1, 4, s, s) and added to a (b, 1, 1, s) mask, and a
    value read both reshaped and as it is: moved, the work would run once per copy, so the value
    is stored once and read back, as before."""
    ctx, s, b = build.ShapeContext(), sym("s"), sym("b")
    x, m = f32_input((4, s, s), 0), f32_input((b, 1, 1, s), 1)
    e = ew(ctx, "exp", x)
    v = build.reshape(ctx, e, (1, 4, s, s))
    outs = [ew(ctx, "add", v, m)] if reader == "broadcast" else \
        [build.reduce(ctx, "sum", v, 3), ew(ctx, "neg", e)]
    g = CompiledGraph([x, m], outs)
    assert len(g.plan.workspaces) == 1
    xa = np.random.default_rng(4).standard_normal((4, 5, 5)).astype(F32)
    ma = np.random.default_rng(5).standard_normal((2, 1, 1, 5)).astype(F32)
    got = g.run({"s": 5, "b": 2}, [xa, ma])
    ea = np.exp(xa)
    if reader == "broadcast":
        np.testing.assert_allclose(got[0], ea[None] + ma, rtol=1e-6, atol=1e-6)
    else:
        np.testing.assert_allclose(got[0], ea[None].sum(3, dtype=F32), rtol=1e-6)
        np.testing.assert_allclose(got[1], -ea, rtol=1e-6)


def test_partial_broadcast_over_a_merged_group_is_left_alone(vm):
    """(b, 1, h) broadcast against (b, s, h) does not survive merging b and s: the sum is
    materialized as before, and the results are the same."""
    ctx, s, b = build.ShapeContext(), sym("s"), sym("b")
    x, p = f32_input((b, s, 8), 0), f32_input((b, 1, 8), 1)
    flat = build.reshape(ctx, ew(ctx, "add", x, p), (b * s, 8))
    y = build.reduce(ctx, "sum", flat, 1)
    g = CompiledGraph([x, p], [y])
    assert len(g.plan.workspaces) == 1
    xa = np.random.default_rng(0).standard_normal((3, 5, 8)).astype(F32)
    pa = np.random.default_rng(1).standard_normal((3, 1, 8)).astype(F32)
    (got,) = g.run({"s": 5, "b": 3}, [xa, pa])
    np.testing.assert_allclose(got, (xa + pa).reshape(15, 8).sum(1), rtol=1e-5, atol=1e-5)


def test_unit_axis_reshape_of_a_slice_is_a_view(vm):
    """Qwen2-MoE's top-2 combine: the two halves of a (2n, h) input sliced, reshaped with a unit
    axis and added: read in place, no copy kernel; after a permute moving the last axis, too (a
    unit-axis reshape always has strides; a copy would read in the load's order)."""
    ctx, n = build.ShapeContext(), sym("n")
    x = f32_input((2 * n, 8), 0)
    pairs = build.reshape(ctx, x, (n, 2, 8))
    halves = [build.reshape(ctx, build.slice_view(ctx, pairs, 1, k, 1), (1, n, 8)) for k in (0, 1)]
    g = CompiledGraph([x], [ew(ctx, "add", *halves)])
    assert not g.plan.workspaces
    xa = np.random.default_rng(6).standard_normal((10, 8)).astype(F32)
    (got,) = g.run({"n": 5}, [xa])
    np.testing.assert_array_equal(got, (xa[0::2] + xa[1::2])[None])
    t = build.reshape(ctx, build.permute(ctx, f32_input((8, n), 0), (1, 0)), (1, n, 8))
    g = CompiledGraph([t.inputs[0].inputs[0]], [ew(ctx, "neg", t)])
    assert not g.plan.workspaces and len(g.plan.groups) == 1
    (got,) = g.run({"n": 5}, [xa.reshape(8, 10)[:, :5].copy()])
    np.testing.assert_array_equal(got, -xa.reshape(8, 10)[:, :5].T[None])


def test_views_and_reductions_under_the_reshape(vm):
    """A unit-axis reshape over exp of a transposed input moves onto the input (a strided load,
    no copy); a reshape over a reduction's result is not moved onto it (the normalized value is
    stored through a view)."""
    ctx, n = build.ShapeContext(), sym("n")
    x = f32_input((8, n), 0)
    t = build.permute(ctx, x, (1, 0))                                  # (n, 8)
    e = build.reshape(ctx, ew(ctx, "exp", t), (1, n, 8))
    norm = ew(ctx, "div", t, build.reduce(ctx, "sum", t, 1, True))
    flat = build.reshape(ctx, norm, (n * 8,))
    g = CompiledGraph([x], [e, flat])
    assert not g.plan.workspaces
    xa = np.random.default_rng(2).standard_normal((8, 6)).astype(F32)
    got_e, got_flat = g.run({"n": 6}, [xa])
    np.testing.assert_allclose(got_e, np.exp(xa.T)[None], rtol=1e-6)
    np.testing.assert_allclose(got_flat, (xa.T / xa.T.sum(1, keepdims=True, dtype=F32)).reshape(-1), rtol=1e-5)


@st.composite
def _cases(draw):
    """Random old shape (unit, symbolic and constant axes), a random merge / unit-axis edit of
    it, and operands each full or broadcast on random axes (lower ranks included)."""
    rank = draw(st.integers(1, 4))
    sizes = [draw(st.sampled_from([1, 2, 3, 5])) for _ in range(rank)]
    symbolic = [draw(st.booleans()) and d > 1 for d in sizes]
    old = tuple(sym(f"d{i}") if symbolic[i] else d for i, d in enumerate(sizes))
    env = {f"d{i}": d for i, d in enumerate(sizes) if symbolic[i]}
    new, new_sizes, i = [], [], 0
    while i < rank:
        k = draw(st.integers(1, rank - i))                            # merge k axes
        dim, size = 1, 1
        for j in range(i, i + k):
            dim, size = dim * old[j], size * sizes[j]
        if draw(st.booleans()):
            new.append(1)
            new_sizes.append(1)
        new.append(dim)
        new_sizes.append(size)
        i += k
    operands = []
    for _ in range(draw(st.integers(1, 3))):
        drop = draw(st.integers(0, rank - 1))
        keep = [draw(st.booleans()) for _ in range(rank - drop)]
        operands.append(tuple(d if kept else 1 for d, kept in zip(sizes[drop:], keep)))
    ops = draw(st.lists(st.sampled_from(["add", "mul", "sub", "maximum"]), min_size=len(operands),
                        max_size=len(operands)))
    return old, sizes, env, tuple(new), tuple(new_sizes), operands, ops


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=_cases())
def test_random_reshapes_of_broadcasts(vm, case):
    old, sizes, env, new, new_sizes, operand_sizes, ops = case
    ctx = build.ShapeContext()
    x = f32_input(old, 0)
    sym_of = dict(zip(range(len(old)), old))
    inputs, value, arrays = [x], x, []
    rng = np.random.default_rng(len(operand_sizes))
    xa = rng.standard_normal(sizes).astype(F32)
    want = xa
    for k, (shape, op) in enumerate(zip(operand_sizes, ops)):
        drop = len(old) - len(shape)
        dims = tuple(1 if d == 1 else sym_of[drop + i] for i, d in enumerate(shape))
        o = f32_input(dims, k + 1)
        inputs.append(o)
        value = ew(ctx, op, value, o)
        a = rng.standard_normal(shape).astype(F32)
        arrays.append(a)
        want = {"add": np.add, "mul": np.multiply, "sub": np.subtract, "maximum": np.maximum}[op](want, a)
    flat = build.reshape(ctx, ew(ctx, "exp", value), new)
    red = build.reduce(ctx, "sum", flat, len(new) - 1)
    g = CompiledGraph(inputs, [flat, red, value])
    got_flat, got_red, got_value = g.run(env, [xa, *arrays])
    np.testing.assert_array_equal(got_value, want)
    np.testing.assert_allclose(got_flat, np.exp(want).reshape(new_sizes), rtol=1e-6)
    np.testing.assert_allclose(got_red, np.exp(want).reshape(new_sizes).sum(-1, dtype=F32), rtol=1e-5)


def test_splits_only():
    s, b = sym("s"), sym("b")
    assert splits_only((1, s, 128), (1, s, 4, 32)) and splits_only((s, 6), (s, 1, 2, 3))
    assert not splits_only((b, s, 4), (b * s, 4)) and not splits_only((s, 4), (b, 4))


@pytest.mark.parametrize("start, heads", [(0, 4), (16, 2), (8, 3)])
def test_a_split_of_a_slice_is_read_through_strides(vm, start, heads):
    """HF's q / k: a slice of the fused projection's rows, split into heads and transposed, then
    RoPE-like work: one kernel per value, no workspace copy of the slice."""
    ctx, s = build.ShapeContext(), sym("s")
    p, c = f32_input((1, s, 32), 0), f32_input((1, s, 4), 1)
    q = build.slice_view(ctx, p, 2, start, heads * 4)
    q = build.permute(ctx, build.reshape(ctx, q, (1, s, heads, 4)), (0, 2, 1, 3))
    y = ew(ctx, "mul", q, build.reshape(ctx, c, (1, 1, s, 4)))
    g = CompiledGraph([p, c], [y])
    assert len(g.plan.groups) == 1 and not g.plan.workspaces
    rng = np.random.default_rng(start)
    for n in (1, 5, 9):
        pa, ca = rng.standard_normal((1, n, 32)).astype(F32), rng.standard_normal((1, n, 4)).astype(F32)
        (got,) = g.run({"s": n}, [pa, ca])
        want = pa[:, :, start:start + heads * 4].reshape(1, n, heads, 4).transpose(0, 2, 1, 3) * ca[:, None]
        np.testing.assert_array_equal(got, want)


def test_splits_only_keeps_empty_renames():
    assert splits_only((0, 4), (0, 4, 1)) and not splits_only((0, 4), (4, 0))
