"""One-element values computed with more than casts and + - * / max min (fusion/partition.scalar_work:
an optimizer's bias correction from its step count) are computed once, by a kernel of their own,
and read broadcast by the larger kernels; cheap ones stay inlined. Both VMs against NumPy."""
import numpy as np
import pytest

from dvm.fusion.partition import scalar_work
from dvm.graph import build
from dvm.graph.dtypes import DType
from dvm.graph.symbolic import sym
from dvm.runtime.compiled import CompiledGraph

from graph_helpers import ew, f32_input

S, C = sym("s"), 24


def _bias_corrected(ctx):
    """x * sqrt(1 - 0.9 ** t) + t: the correction (pow, sqrt) on the 0-d step t."""
    x, t = f32_input((S, C), 0), f32_input((), 1)
    corr = ew(ctx, "sqrt", ew(ctx, "sub", build.const(1.0), ew(ctx, "pow", build.const(0.9), t)))
    return [x, t], [ew(ctx, "add", ew(ctx, "mul", x, corr), t)], corr


def test_costly_scalar_work_is_its_own_kernel(vm):
    ctx = build.ShapeContext()
    inputs, outputs, corr = _bias_corrected(ctx)
    assert scalar_work(outputs) == [corr]
    graph = CompiledGraph(inputs, outputs)
    assert [tuple(g.shape) for g in graph.plan.groups] == [(), (S, C)]
    rng = np.random.default_rng(0)
    for rows, step in ((1, 1.0), (5, 3.0), (300, 17.0)):
        x, t = rng.standard_normal((rows, C)).astype(np.float32), np.array(step, np.float32)
        (got,) = graph.run({"s": rows}, [x, t])
        want = x * np.sqrt(np.float32(1) - np.float32(0.9) ** t) + t
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_cheap_scalar_work_stays_inlined():
    ctx = build.ShapeContext()
    x, t = f32_input((S, C), 0), f32_input((), 1)
    y = ew(ctx, "mul", x, ew(ctx, "add", build.cast(t, DType.FLOAT32), build.const(1.0)))
    assert scalar_work([y]) == []
    assert len(CompiledGraph([x, t], [y]).plan.groups) == 1


@pytest.mark.parametrize("also_stored", [False, True])
def test_scalar_work_also_an_output(vm, also_stored):
    """The correction stored as an output too (and read by the larger kernel): computed once."""
    ctx = build.ShapeContext()
    inputs, outputs, corr = _bias_corrected(ctx)
    if also_stored:
        outputs.append(corr)
    graph = CompiledGraph(inputs, outputs)
    x, t = np.ones((4, C), np.float32), np.array(2.0, np.float32)
    res = graph.run({"s": 4}, [x, t])
    c = np.sqrt(np.float32(1) - np.float32(0.9) ** t)
    np.testing.assert_allclose(res[0], x * c + t, rtol=1e-6)
    if also_stored:
        np.testing.assert_allclose(res[1], c, rtol=1e-6)


def test_nested_scalar_work_is_one_kernel(vm):
    """m read by the larger kernel and by n = exp(m), read by it too: one one-element kernel."""
    ctx = build.ShapeContext()
    x, t = f32_input((S, C), 0), f32_input((), 1)
    m = ew(ctx, "sqrt", ew(ctx, "sub", build.const(1.0), ew(ctx, "pow", build.const(0.9), t)))
    n = ew(ctx, "exp", m)
    y = ew(ctx, "add", ew(ctx, "mul", x, m), n)
    assert scalar_work([y]) == [m, n]
    graph = CompiledGraph([x, t], [y])
    assert [tuple(g.shape) for g in graph.plan.groups] == [(), (S, C)]
    xv, tv = np.full((3, C), 2.0, np.float32), np.array(4.0, np.float32)
    (got,) = graph.run({"s": 3}, [xv, tv])
    mv = np.sqrt(np.float32(1) - np.float32(0.9) ** tv)
    np.testing.assert_allclose(got, xv * mv + np.exp(mv), rtol=1e-6)
