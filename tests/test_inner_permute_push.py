"""Permutes of elementwise work that further work reads (fusion/reshape_push.push_inner_permutes),
on both VMs: ConvNeXt's block (a layer scale and a residual added in the channels-first order,
then LayerNorm in the channels-last one) in one kernel, no workspace; work read elsewhere or
holding a reduction stays put; random chains through two orders against NumPy (Hypothesis)."""
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dvm.fusion.reshape_push import push_inner_permutes
from dvm.graph import build
from dvm.graph.node import topo_order
from dvm.graph.symbolic import sym
from dvm.graph.views import split_chain
from dvm.runtime.compiled import CompiledGraph

from graph_helpers import ew, f32_input

F32 = np.float32
NCHW, NHWC = (0, 3, 1, 2), (0, 2, 3, 1)


def _layer_norm(ctx, x):
    """x normalized over its last axis (no affine)."""
    n = x.shape[-1]
    mean = ew(ctx, "div", build.reduce(ctx, "sum", x, x.ndim - 1, True), build.const(float(n)))
    d = ew(ctx, "sub", x, mean)
    var = ew(ctx, "div", build.reduce(ctx, "sum", ew(ctx, "mul", d, d), x.ndim - 1, True), build.const(float(n)))
    return ew(ctx, "mul", d, ew(ctx, "rsqrt", ew(ctx, "add", var, build.const(1e-6))))


def _np_layer_norm(x):
    d = x - x.mean(-1, keepdims=True, dtype=F32)
    return d / np.sqrt((d * d).mean(-1, keepdims=True, dtype=F32) + F32(1e-6))


def _permutes_of_work(outs):
    """The permutes in outs' graphs of anything but an input's views (a strided load)."""
    return [n for n in topo_order(outs) if n.op == "permute" and split_chain(n)[0].op != "input"]


def test_a_convnext_block_is_one_kernel_in_the_channels_last_order(vm):
    """residual (NHWC, viewed NCHW) + permute(gamma * y, NCHW), viewed back NHWC and normed over
    the channels: the sum is computed in the norm's order, one kernel, no workspace."""
    ctx, h, w = build.ShapeContext(), sym("h"), sym("w")
    res, y, gamma = f32_input((1, h, w, 16), 0), f32_input((1, h, w, 16), 1), f32_input((16,), 2)
    scaled = build.permute(ctx, ew(ctx, "mul", gamma, y), NCHW)
    summed = ew(ctx, "add", build.permute(ctx, res, NCHW), scaled)
    out = _layer_norm(ctx, build.permute(ctx, summed, NHWC))
    (moved,) = push_inner_permutes([out])
    assert not _permutes_of_work([moved])
    g = CompiledGraph([res, y, gamma], [out])
    assert len(g.plan.groups) == 1 and not g.plan.workspaces
    rng = np.random.default_rng(0)
    for hw in ((1, 1), (5, 7)):
        ra, ya = (rng.standard_normal((1, *hw, 16)).astype(F32) for _ in range(2))
        ga = rng.standard_normal(16).astype(F32)
        (got,) = g.run({"h": hw[0], "w": hw[1]}, [ra, ya, ga])
        np.testing.assert_allclose(got, _np_layer_norm(ra + ga * ya), rtol=1e-5, atol=1e-5)


def test_work_read_elsewhere_or_holding_a_reduction_stays_put(vm):
    ctx, s = build.ShapeContext(), sym("s")
    x, z = f32_input((s, 5), 0), f32_input((5, s), 1)
    work = ew(ctx, "exp", x)
    read_twice = [ew(ctx, "add", build.permute(ctx, work, (1, 0)), z), ew(ctx, "neg", work)]
    reduced = ew(ctx, "mul", x, build.reduce(ctx, "sum", x, 1, True))
    with_reduction = [ew(ctx, "add", build.permute(ctx, reduced, (1, 0)), z)]
    xa, za = np.random.default_rng(1).standard_normal((7, 5)).astype(F32), np.ones((5, 7), F32)
    for outs, want in ((read_twice, [np.exp(xa).T + za, -np.exp(xa)]),
                       (with_reduction, [(xa * xa.sum(1, keepdims=True, dtype=F32)).T + za])):
        assert push_inner_permutes(outs) == outs
        got = CompiledGraph([x, z], outs).run({"s": 7}, [xa, za])
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


@st.composite
def _chains(draw):
    rank = draw(st.integers(2, 4))
    sizes = draw(st.lists(st.integers(1, 5), min_size=rank, max_size=rank))
    perms = [tuple(draw(st.permutations(range(rank)))) for _ in range(draw(st.integers(1, 3)))]
    reduce_last = draw(st.booleans())
    return sizes, perms, reduce_last


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=_chains())
def test_random_chains_through_several_orders(vm, case):
    """exp(x) viewed through random permutes, each step adding an input of the new order, then
    (maybe) a sum over the last axis: NumPy's values; no permute of work is left."""
    sizes, perms, reduce_last = case
    rank = len(sizes)
    ctx = build.ShapeContext()
    names = [sym(f"d{i}") for i in range(rank)]
    env = {f"d{i}": n for i, n in enumerate(sizes) if n != 1}
    order = list(range(rank))                      # the current value's axes, as x's axes
    x = f32_input(tuple(1 if n == 1 else names[i] for i, n in enumerate(sizes)), 0)
    rng = np.random.default_rng(rank)
    arrays = [rng.standard_normal(sizes).astype(F32)]
    value, want, inputs = ew(ctx, "exp", x), np.exp(arrays[0]), [x]
    for k, perm in enumerate(perms):
        value, want = build.permute(ctx, value, perm), want.transpose(perm)
        order = [order[p] for p in perm]
        b = f32_input(tuple(1 if sizes[a] == 1 else names[a] for a in order), k + 1)
        arrays.append(rng.standard_normal([sizes[a] for a in order]).astype(F32))
        inputs.append(b)
        value, want = ew(ctx, "add", value, b), want + arrays[-1]
    if reduce_last:
        value, want = build.reduce(ctx, "sum", value, rank - 1, True), want.sum(-1, keepdims=True, dtype=F32)
    (moved,) = push_inner_permutes([value])
    assert not _permutes_of_work([moved])
    (got,) = CompiledGraph(inputs, [value]).run(env, arrays)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
