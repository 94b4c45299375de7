"""The 'slice' view (graph level, both VMs): offsets, steps, negative steps (flips), select,
slices of workspaces and of strided / reversed inputs, reshapes after slices, bounds checks."""
import numpy as np
import pytest

from dvm.errors import ShapeError
from dvm.graph import build
from dvm.graph.dtypes import DType
from dvm.graph.node import Node
from dvm.graph.symbolic import sym
from dvm.runtime.compiled import CompiledGraph


def _input(shape, index=0, dtype=DType.FLOAT32):
    return Node.make("input", dtype, shape, index=index)


def _run(inputs, outputs, env, arrays, vm):
    return CompiledGraph(inputs, outputs).run(env, arrays, vm=vm)


def test_slices_of_an_input(vm):
    ctx, n = build.ShapeContext(), sym("n")
    x = _input((n, 9))
    outs = [build.slice_view(ctx, x, 1, 2, 4),                      # x[:, 2:6]
            build.slice_view(ctx, x, 1, 1, 4, 2),                   # x[:, 1:9:2]
            build.slice_view(ctx, x, 1, 8, 9, -1),                  # x[:, ::-1]
            build.slice_view(ctx, x, 0, 1, 1, keep=False),          # x[1]
            build.slice_view(ctx, x, 0, n - 1, 1, keep=False)]      # x[-1]
    outs = [build.elementwise(ctx, "add", o, build.const(1.0)) for o in outs]
    a = np.random.default_rng(0).standard_normal((7, 23)).astype(np.float32)
    for arr in (a[:, :9], a[:, ::-2][:, :9], a.T.copy().T[2:, 3:12]):    # strided, reversed, offset
        got = _run([x], outs, {"n": arr.shape[0]}, [arr], vm)
        want = [arr[:, 2:6], arr[:, 1:9:2], arr[:, ::-1], arr[1], arr[-1]]
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w + np.float32(1))


def test_flip_of_rows_and_rotate_half(vm):
    """rotate_half over [..., 2, h]: where(row == 0, -flip, flip), reshaped back."""
    ctx, n = build.ShapeContext(), sym("n")
    x = _input((n, 3, 8))
    x2 = build.reshape(ctx, x, (n, 3, 2, 4))
    flip = build.slice_view(ctx, x2, 2, 1, 2, -1)
    row0 = build.elementwise(ctx, "eq", build.iota(x2.shape, 2), build.const(0))
    rot = build.elementwise(ctx, "where", row0, build.elementwise(ctx, "neg", flip), flip)
    out = build.reshape(ctx, build.elementwise(ctx, "mul", rot, build.const(2.0)), (n, 3, 8))
    a = np.random.default_rng(1).standard_normal((5, 3, 8)).astype(np.float32)
    for arr in (a, a.transpose(1, 0, 2).copy().transpose(1, 0, 2)):
        (got,) = _run([x], [out], {"n": 5}, [arr], vm)
        np.testing.assert_array_equal(got, np.concatenate([-arr[..., 4:], arr[..., :4]], -1) * 2)


def test_slice_of_a_computed_value_and_reshape_after(vm):
    ctx, n = build.ShapeContext(), sym("n")
    x = _input((n, 6))
    s = build.reduce(ctx, "sum", x, 1, True)                       # a reduction: workspace base
    y = build.elementwise(ctx, "mul", x, s)
    tail = build.slice_view(ctx, y, 0, 1, n - 1)                   # y[1:]
    odd = build.slice_view(ctx, y, 1, 1, 3, 2)                     # y[:, 1::2]
    flat = build.reshape(ctx, odd, (n * 3,))                       # a reshape after a slice
    outs = [build.elementwise(ctx, "exp", tail), build.elementwise(ctx, "neg", flat)]
    a = np.random.default_rng(2).standard_normal((6, 6)).astype(np.float32)
    got = _run([x], outs, {"n": 6}, [a], vm)
    yy = a * a.sum(1, keepdims=True, dtype=np.float32)
    np.testing.assert_allclose(got[0], np.exp(yy[1:]), rtol=1e-5)
    np.testing.assert_allclose(got[1], -yy[:, 1::2].reshape(-1), rtol=1e-5)


def test_slice_bounds_are_checked():
    ctx, n = build.ShapeContext(), sym("n")
    x = _input((n, 4))
    with pytest.raises(ShapeError):
        build.slice_view(ctx, x, 1, 2, 3)                          # 2 + 3 > 4
    with pytest.raises(ShapeError):
        build.slice_view(ctx, x, 1, -1, 2)
    build.slice_view(ctx, x, 0, 3, 2)                              # x[3:5]: needs n >= 5
    assert any("past the end" in c.why for c in ctx.checks)
    build.slice_view(ctx, x, 0, 0, n, -1)                          # indices 0, -1, ...: needs n <= 1
    assert any("negative index" in c.why for c in ctx.checks)


def test_flip_along_a_symbolic_size(vm):
    """x[::-1] and x[n-2::-1] (n - 1 elements) along a symbolic axis: no run-time check, equal to NumPy's for every n, on inputs strided, reversed and offset."""
    ctx, n = build.ShapeContext(), sym("n", 1)
    x = _input((n, 5))
    outs = [build.elementwise(ctx, "mul", build.slice_view(ctx, x, 0, n - 1, n, -1), build.const(2.0)),
            build.slice_view(ctx, build.elementwise(ctx, "exp", x), 0, n - 2, n - 1, -1)]
    assert not ctx.checks, [c.why for c in ctx.checks]      # every index decided in bounds for every n
    a = np.random.default_rng(3).standard_normal((9, 11)).astype(np.float32)
    for rows in (1, 2, 3, 9):
        for arr in (a[:rows, :5], a[::-1][:rows, 3:8], a.T.copy().T[-rows:, :10:2]):
            got = _run([x], outs, {"n": rows}, [arr], vm)
            np.testing.assert_array_equal(got[0], arr[::-1] * np.float32(2))
            np.testing.assert_allclose(got[1], np.exp(arr)[rows - 2::-1] if rows > 1 else np.exp(arr)[:0], rtol=1e-6)
