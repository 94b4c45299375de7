"""cat of pieces of any sizes (graph op 'concat', both VMs): each piece stored into its slice of
one buffer, by a kernel of its own domain; as an output, read back by later kernels (also by a
reduction and through views), nested, of mixed dtypes, strided inputs, empty pieces, symbolic
sizes; shape errors. Hypothesis draws pieces, axes, dtypes and layouts."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dvm
from dvm.errors import ShapeError
from dvm.graph import build
from dvm.graph.dtypes import DType
from dvm.graph.node import Node
from dvm.graph.symbolic import sym
from dvm.runtime.compiled import CompiledGraph

SETTINGS = dict(deadline=None, max_examples=60,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
DTYPES = {"float32": DType.FLOAT32, "float64": DType.FLOAT64, "int64": DType.INT64, "int32": DType.INT32,
          "bool": DType.BOOL}


@dvm.kernel
def cat_computed(k, a, b):
    return k.store(k.cat([k.load(a) * 2.0, k.exp(k.load(b))], axis=1))


@dvm.kernel
def cat_read_back(k, a, b):
    c = k.cat([k.load(a), k.load(b) + 1.0], axis=-1)
    return k.store(c * 3.0), k.store(k.sum(c, axis=-1))


def test_pieces_fill_their_slices(vm):
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((5, 3), np.float32), rng.standard_normal((5, 7), np.float32)
    np.testing.assert_array_equal(cat_computed(a, b, vm=vm)[:, :3], a * np.float32(2))
    np.testing.assert_allclose(cat_computed(a, b, vm=vm)[:, 3:], np.exp(b), rtol=1e-6)
    c = np.concatenate([a, b + np.float32(1)], 1)
    times3, sums = cat_read_back(a, b, vm=vm)
    np.testing.assert_array_equal(times3, c * np.float32(3))
    np.testing.assert_allclose(sums, c.sum(-1), rtol=1e-5, atol=1e-6)
    for bad in (a[:4], a.T.copy()):   # other sizes must agree
        with pytest.raises(ShapeError):
            cat_computed(bad, b, vm=vm)


def test_a_kernel_stores_once_into_a_cat(vm):
    """cat([x.sum(-1, keepdims), x]): the row piece would fit the reduction's kernel, which also
    could hold the other piece; two stores of one kernel into one buffer would overlap."""
    @dvm.kernel
    def f(k, x):
        x = k.load(x)
        s = k.sum(x, axis=-1, keepdims=True)
        return k.store(k.cat([s, x * s], axis=-1))
    x = np.random.default_rng(1).standard_normal((6, 9)).astype(np.float32)
    s = x.sum(-1, keepdims=True, dtype=np.float32)
    want = np.concatenate([s, x * s], -1)
    np.testing.assert_allclose(f(x, vm=vm), want, rtol=1e-5, atol=1e-5)
    assert "2 into a cat's slice" not in dvm.explain(f, x)   # never two in one kernel


def _input(shape, index, dtype=DType.FLOAT32):
    return Node.make("input", dtype, shape, index=index)


def test_nested_viewed_and_symbolic(vm):
    """Sizes n and m along the axis; a cat of a cat; slices and a permute of a cat read back."""
    ctx, n, m = build.ShapeContext(), sym("n"), sym("m")
    x, y = _input((n, 4), 0), _input((m, 4), 1)
    inner = build.concat(ctx, [x, build.elementwise(ctx, "neg", y)], 0)
    outer = build.concat(ctx, [inner, x, y], 0)
    tail = build.slice_view(ctx, inner, 0, 1, n + m - 1)
    flipped = build.permute(ctx, inner, (1, 0))
    outs = [outer, build.elementwise(ctx, "mul", tail, build.const(2.0)),
            build.elementwise(ctx, "add", flipped, build.const(1.0))]
    rng = np.random.default_rng(2)
    for nv, mv in ((3, 5), (1, 1), (0, 2), (7, 0)):
        a = rng.standard_normal((nv, 4)).astype(np.float32)
        b = rng.standard_normal((4, mv)).astype(np.float32).T     # strided
        got = CompiledGraph([x, y], outs).run({"n": nv, "m": mv}, [a, b], vm=vm)
        cat = np.concatenate([a, -b], 0)
        np.testing.assert_array_equal(got[0], np.concatenate([cat, a, b], 0))
        np.testing.assert_array_equal(got[1], cat[1:] * np.float32(2))
        np.testing.assert_array_equal(got[2], cat.T + np.float32(1))


def test_builder_errors():
    @dvm.kernel
    def one_value(k, a):
        return k.store(k.cat(k.load(a)))

    @dvm.kernel
    def with_a_scalar(k, a):
        return k.store(k.cat([k.load(a), 2.0]))
    x = np.ones((2, 3), np.float32)
    with pytest.raises(dvm.TraceError, match="list or tuple"):
        one_value(x)
    with pytest.raises(ShapeError, match="rank 0"):
        with_a_scalar(x)


def test_shape_errors():
    ctx = build.ShapeContext()
    x, y, s = _input((3, 4), 0), _input((3, 5), 1), _input((), 2)
    with pytest.raises(ShapeError):
        build.concat(ctx, [x, y], 0)          # 4 != 5 off the axis
    with pytest.raises(ShapeError):
        build.concat(ctx, [s, s], 0)          # zero-dimensional
    with pytest.raises(ShapeError):
        build.concat(ctx, [x, _input((3,), 3)], 1)    # ranks differ
    with pytest.raises(ShapeError):
        build.concat(ctx, [x, y], 2)          # no such axis
    assert build.concat(ctx, [x, y], -1).shape == (3, 9)


@st.composite
def cases(draw):
    rank = draw(st.integers(1, 3))
    axis = draw(st.integers(-rank, rank - 1))
    base = [draw(st.sampled_from([1, 2, 3, 5, 8])) for _ in range(rank)]
    n = draw(st.integers(1, 4))
    sizes = [draw(st.sampled_from([0, 1, 2, 3, 7, 16])) for _ in range(n)]
    dtypes = [draw(st.sampled_from(sorted(DTYPES))) for _ in range(n)]
    computed = [draw(st.booleans()) for _ in range(n)]
    transposed = [draw(st.booleans()) for _ in range(n)]
    reduce_after = draw(st.booleans())
    return rank, axis, base, sizes, dtypes, computed, transposed, reduce_after


@settings(**SETTINGS)
@given(case=cases(), seed=st.integers(0, 2 ** 16))
def test_random_cats_match_numpy(vm, case, seed):
    rank, axis, base, sizes, dtypes, computed, transposed, reduce_after = case
    ctx, rng = build.ShapeContext(), np.random.default_rng(seed)
    shapes = [tuple(s if d == axis % rank else base[d] for d in range(rank)) for s in sizes]
    ax = axis % rank
    syms = [tuple(sym(f"p{i}") if d == ax else sym(f"d{d}") for d in range(rank)) for i in range(len(sizes))]
    inputs = [_input(sh, i, DTYPES[dt]) for i, (sh, dt) in enumerate(zip(syms, dtypes))]
    out_dt = DTYPES[np.result_type(*[np.dtype(dt) for dt in dtypes]).name]
    pieces = []
    for node, comp in zip(inputs, computed):
        piece = build.cast(node, out_dt)
        if comp:   # computed in the piece's own kernel (exactly, for every dtype)
            piece = build.elementwise(ctx, "maximum", piece, build.cast(build.const(0), out_dt))
        pieces.append(piece)
    cat = build.concat(ctx, pieces, axis)
    outs = [cat]
    if reduce_after and out_dt is not DType.BOOL and sum(sizes) and all(base):
        outs.append(build.reduce(ctx, "max", cat, None))
    arrays, views = [], []
    for sh, dt, comp, tr in zip(shapes, dtypes, computed, transposed):
        a = (rng.standard_normal(sh[::-1]) * 5).astype(dt)
        a = a.T if tr else a.T.copy()
        arrays.append(a)
        v = a.astype(out_dt.np_dtype)
        views.append(np.maximum(v, np.zeros((), v.dtype)) if comp else v)
    env = {s.as_symbol().name: v for ss, sh in zip(syms, shapes) for s, v in zip(ss, sh)}
    graph = CompiledGraph(inputs, outs)
    want = np.concatenate(views, axis)
    got = graph.run(env, arrays, vm=vm)
    np.testing.assert_array_equal(got[0], want)
    if len(outs) == 2 and want.size:
        np.testing.assert_array_equal(got[1], want.max())
