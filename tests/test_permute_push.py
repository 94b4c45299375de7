"""Permutes of elementwise work moved onto its loads (fusion/reshape_push.push_permutes), on both
VMs: HF's RoPE on transposed heads stored in the heads' memory order in one kernel (also after
Qwen3's per-head norm, the transpose cancelled), work read elsewhere or reading a reduction
(left alone), and random permutes of random broadcasts of
permuted inputs against NumPy (Hypothesis)."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dvm.fusion.reshape_push import push_permutes
from dvm.graph import build
from dvm.graph.dtypes import DType
from dvm.graph.node import Node
from dvm.graph.symbolic import sym
from dvm.runtime.compiled import CompiledGraph

from graph_helpers import ew, f32_input

F32 = np.float32
_NP = {"add": np.add, "mul": np.multiply, "sub": np.subtract, "maximum": np.maximum}


def test_rope_on_transposed_heads_is_one_kernel_in_the_heads_order(vm):
    """q: a slice of the fused projection split into heads and transposed (b, h, s, d); q * cos +
    q' * sin stored in PyTorch's order (b, s, h, d): one kernel over that domain, no workspace."""
    ctx, s = build.ShapeContext(), sym("s")
    p, c, r = f32_input((1, s, 32), 0), f32_input((1, 1, s, 4), 1), f32_input((1, 3, s, 4), 2)
    q = build.slice_view(ctx, p, 2, 8, 12)
    q = build.permute(ctx, build.reshape(ctx, q, (1, s, 3, 4)), (0, 2, 1, 3))
    y = ew(ctx, "add", ew(ctx, "mul", q, c), ew(ctx, "mul", r, c))
    (moved,) = push_permutes([build.permute(ctx, y, (0, 2, 1, 3))])
    assert moved.op == "add" and moved.shape == (1, s, 3, 4)
    g = CompiledGraph([p, c, r], [moved])
    assert len(g.plan.groups) == 1 and not g.plan.workspaces and g.plan.groups[0].shape == (1, s, 3, 4)
    rng = np.random.default_rng(0)
    for n in (1, 6):
        pa = rng.standard_normal((1, n, 32)).astype(F32)
        ca, ra = rng.standard_normal((1, 1, n, 4)).astype(F32), rng.standard_normal((1, 3, n, 4)).astype(F32)
        (got,) = g.run({"s": n}, [pa, ca, ra])
        qa = pa[:, :, 8:20].reshape(1, n, 3, 4).transpose(0, 2, 1, 3)
        np.testing.assert_array_equal(got, (qa * ca + ra * ca).transpose(0, 2, 1, 3))


def test_flip_rope_of_transposed_heads_is_one_kernel_in_the_heads_order(vm):
    """The flip form (fx_patterns): q viewed [b, h, s, 2, d/2], its halves swapped by a negative
    stride and signed by a +-1 input, the result reshaped to [b, h, s, d]; its permute to the
    heads' memory order moves under that reshape, and the split after q's transpose is a strided
    load: one kernel, no workspace, NumPy's values."""
    ctx, s = build.ShapeContext(), sym("s")
    p, c, sg = f32_input((1, s, 24), 0), f32_input((1, 1, s, 4), 1), f32_input((2, 1), 2)
    q = build.permute(ctx, build.reshape(ctx, build.slice_view(ctx, p, 2, 4, 12), (1, s, 3, 4)), (0, 2, 1, 3))
    q2 = build.reshape(ctx, q, (1, 3, s, 2, 2))
    flipped = build.slice_view(ctx, q2, 3, 1, 2, -1)
    c2 = build.reshape(ctx, c, (1, 1, s, 2, 2))
    rot = ew(ctx, "mul", flipped, build.reshape(ctx, sg, (2, 1)))
    y = build.reshape(ctx, ew(ctx, "add", ew(ctx, "mul", q2, c2), ew(ctx, "mul", rot, c2)), (1, 3, s, 4))
    (moved,) = push_permutes([build.permute(ctx, y, (0, 2, 1, 3))])
    assert moved.op == "reshape" and moved.shape == (1, s, 3, 4) and moved.inputs[0].op == "add"
    g = CompiledGraph([p, c, sg], [moved])
    assert len(g.plan.groups) == 1 and not g.plan.workspaces
    rng = np.random.default_rng(3)
    sa = np.array([[-1], [1]], F32)
    for n in (1, 7):
        pa, ca = rng.standard_normal((1, n, 24)).astype(F32), rng.standard_normal((1, 1, n, 4)).astype(F32)
        (got,) = g.run({"s": n}, [pa, ca, sa])
        qa = pa[:, :, 4:16].reshape(1, n, 3, 4).transpose(0, 2, 1, 3)
        rota = np.concatenate((-qa[..., 2:], qa[..., :2]), -1)
        np.testing.assert_array_equal(got, (qa * ca + rota * ca).transpose(0, 2, 1, 3))


@pytest.mark.parametrize("axis", [2, 3])   # (static short axes sum as adds of slices)
def test_reductions_move_with_their_axes_renumbered(vm, axis):
    """Qwen3's q_norm (RMSNorm over the head size of transposed heads) and sums over axes that
    move: one kernel in the permuted order, NumPy's values."""
    ctx, s = build.ShapeContext(), sym("s")
    p, w = f32_input((2, s, 3, 4), 0), f32_input((4,), 1)
    q = build.permute(ctx, p, (0, 2, 1, 3))
    rms = build.reduce(ctx, "mean", ew(ctx, "mul", q, q), axis, True)
    y = ew(ctx, "mul", ew(ctx, "mul", q, ew(ctx, "rsqrt", ew(ctx, "add", rms, build.const(1e-6)))), w)
    (moved,) = push_permutes([build.permute(ctx, y, (0, 2, 1, 3))])
    assert moved.op == "mul" and moved.shape == (2, s, 3, 4)
    g = CompiledGraph([p, w], [moved])
    assert len(g.plan.groups) == 1 and not g.plan.workspaces
    rng = np.random.default_rng(axis)
    pa, wa = rng.standard_normal((2, 5, 3, 4)).astype(F32), rng.standard_normal(4).astype(F32)
    (got,) = g.run({"s": 5}, [pa, wa])
    qa = pa.transpose(0, 2, 1, 3)
    want = qa / np.sqrt((qa * qa).mean(axis, keepdims=True, dtype=F32) + F32(1e-6)) * wa
    np.testing.assert_allclose(got, want.transpose(0, 2, 1, 3), rtol=1e-5, atol=1e-6)


def _qk_norm_rope(ctx, s, p, w, c, sg):
    """Qwen3's q: an RMSNorm over each head of the projection in (b, s, h, d) order, transposed
    to (b, h, s, d), then the flip RoPE on its [.., 2, d/2] view, reshaped back. -> (the norm,
    its halves view, the RoPE)."""
    q = build.reshape(ctx, p, (1, s, 3, 4))
    rms = build.reduce(ctx, "mean", ew(ctx, "mul", q, q), 3, True)
    normed = ew(ctx, "mul", ew(ctx, "mul", q, ew(ctx, "rsqrt", ew(ctx, "add", rms, build.const(1e-6)))), w)
    halves = build.reshape(ctx, build.permute(ctx, normed, (0, 2, 1, 3)), (1, 3, s, 2, 2))
    c2 = build.reshape(ctx, c, (1, 1, s, 2, 2))
    rot = ew(ctx, "mul", build.slice_view(ctx, halves, 3, 1, 2, -1), build.reshape(ctx, sg, (2, 1)))
    y = build.reshape(ctx, ew(ctx, "add", ew(ctx, "mul", halves, c2), ew(ctx, "mul", rot, c2)), (1, 3, s, 4))
    return normed, halves, y


def _np_qk_norm_rope(pa, wa, ca, sa):
    qa = pa.reshape(1, -1, 3, 4)
    na = (qa / np.sqrt((qa * qa).mean(3, keepdims=True, dtype=F32) + F32(1e-6)) * wa).transpose(0, 2, 1, 3)
    return na, (na * ca + np.concatenate((-na[..., 2:], na[..., :2]), -1) * ca).transpose(0, 2, 1, 3)


def test_rope_of_normed_heads_is_one_kernel_in_the_heads_order(vm):
    """Qwen3's q / k (_qk_norm_rope) stored in PyTorch's memory order (b, s, h, d): the permute
    to it moves through the RoPE's reshapes and flipped slice and cancels the transpose after the
    norm, so the RoPE runs over (b, s, h, 2, d/2) after the norm's kernel, reading it through a
    view, and stores its result in that order (stored row-major, attention's output would need a
    copy to be read as (b, s, h * d)). The norm also returned as it is: still one computation of
    it. NumPy's values."""
    ctx, s = build.ShapeContext(), sym("s")
    p, w, c, sg = f32_input((1, s, 12), 0), f32_input((4,), 1), f32_input((1, 1, s, 4), 2), f32_input((2, 1), 3)
    normed, _, y = _qk_norm_rope(ctx, s, p, w, c, sg)
    (moved,) = push_permutes([build.permute(ctx, y, (0, 2, 1, 3))])
    assert moved.op == "reshape" and moved.shape == (1, s, 3, 4) and moved.inputs[0].op == "add"
    rng = np.random.default_rng(5)
    sa = np.array([[-1], [1]], F32)
    for outs in ([moved], [moved, normed]):
        g = CompiledGraph([p, w, c, sg], outs)
        assert [grp.shape for grp in g.plan.groups] == [(1, s, 3, 4), (1, s, 3, 2, 2)]
        for n in (1, 6):
            pa, wa = rng.standard_normal((1, n, 12)).astype(F32), rng.standard_normal(4).astype(F32)
            ca = rng.standard_normal((1, 1, n, 4)).astype(F32)
            got = g.run({"s": n}, [pa, wa, ca, sa])
            na, want = _np_qk_norm_rope(pa, wa, ca, sa)
            np.testing.assert_allclose(got[0], want, rtol=1e-5, atol=1e-6)
            if len(outs) == 2:
                np.testing.assert_allclose(got[1], na.transpose(0, 2, 1, 3), rtol=1e-5, atol=1e-6)


def test_a_view_of_work_read_elsewhere_stays_put(vm):
    """The RoPE's halves view of the normed heads also returned: moving the permute would compute
    the norm's work twice (once per order), so the RoPE keeps its row-major store."""
    ctx, s = build.ShapeContext(), sym("s")
    p, w, c, sg = f32_input((1, s, 12), 0), f32_input((4,), 1), f32_input((1, 1, s, 4), 2), f32_input((2, 1), 3)
    _, halves, y = _qk_norm_rope(ctx, s, p, w, c, sg)
    outs = [build.permute(ctx, y, (0, 2, 1, 3)), halves]
    assert push_permutes(outs)[0] is outs[0]
    rng = np.random.default_rng(6)
    pa, wa = rng.standard_normal((1, 5, 12)).astype(F32), rng.standard_normal(4).astype(F32)
    ca, sa = rng.standard_normal((1, 1, 5, 4)).astype(F32), np.array([[-1], [1]], F32)
    got = CompiledGraph([p, w, c, sg], outs).run({"s": 5}, [pa, wa, ca, sa])
    na, want = _np_qk_norm_rope(pa, wa, ca, sa)
    np.testing.assert_allclose(got[0], want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got[1], na.reshape(1, 3, 5, 2, 2), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("case", ["work_is_an_output", "interior_read_twice", "reduction_read_twice"])
def test_work_that_would_be_redone_stays_put(vm, case):
    """The work also returned as it is, an interior value read by another output, a reduction
    read by another output: not moved (stored, then read back permuted), and the same results."""
    ctx, s = build.ShapeContext(), sym("s")
    x, z = f32_input((s, 5), 0), f32_input((s, 5), 1)
    inner = ew(ctx, "mul", x, z)
    if case == "work_is_an_output":
        work = ew(ctx, "exp", inner)
        outs = [build.permute(ctx, work, (1, 0)), work]
    elif case == "interior_read_twice":
        work = ew(ctx, "exp", inner)
        outs = [build.permute(ctx, work, (1, 0)), ew(ctx, "neg", inner)]
    else:
        total = build.reduce(ctx, "sum", z, 1, True)
        outs = [build.permute(ctx, ew(ctx, "mul", x, total), (1, 0)), total]
    assert push_permutes(outs)[0] is outs[0]
    g = CompiledGraph([x, z], outs)
    xa, za = (np.random.default_rng(i).standard_normal((7, 5)).astype(F32) for i in (1, 2))
    got = g.run({"s": 7}, [xa, za])
    if case == "reduction_read_twice":
        np.testing.assert_allclose(got[1], za.sum(1, keepdims=True, dtype=F32), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(got[0], (xa * za.sum(1, keepdims=True, dtype=F32)).T, rtol=1e-5, atol=1e-5)
        return
    np.testing.assert_allclose(got[0], np.exp(xa * za).T, rtol=1e-6)
    np.testing.assert_allclose(got[1], np.exp(xa * za) if case == "work_is_an_output" else -(xa * za), rtol=1e-6)


def test_lower_rank_work_keeps_its_place_under_the_permute(vm):
    """Mamba2's segment sum (HF's torch_forward): exp of a cumulative sum masked by a (c, c) mask
    under the heads, times decay factors stored heads-first, stored with the heads first (PyTorch's
    order): the mask's work is read as it is (its axes stay the trailing ones), one kernel, no
    workspace. Work whose axes the permute would move in front of others stays put."""
    ctx, c, h = build.ShapeContext(), sym("c"), 3
    cs, g6 = f32_input((1, h, 1, c, c), 0), f32_input((h, c, 1, c), 2)
    mask = Node.make("input", DType.BOOL, (c, c), index=1)
    masked = ew(ctx, "where", ew(ctx, "logical_not", mask), build.const(float("-inf")), cs)
    decay = build.reshape(ctx, build.permute(ctx, g6, (2, 1, 3, 0)), (1, 1, c, c, h))   # heads last
    m = ew(ctx, "mul", decay, build.permute(ctx, ew(ctx, "exp", masked), (0, 2, 3, 4, 1)))
    out = build.permute(ctx, m, (4, 0, 1, 2, 3))
    (moved,) = push_permutes([out])
    assert moved.op == "mul" and moved.shape == (h, 1, 1, c, c)
    g = CompiledGraph([cs, mask, g6], [out])
    assert not g.plan.workspaces and len(g.plan.groups) == 1
    rng = np.random.default_rng(9)
    ca, ga = rng.standard_normal((1, h, 1, 5, 5)).astype(F32), rng.standard_normal((h, 5, 1, 5)).astype(F32)
    ma = np.tril(np.ones((5, 5), bool))
    (got,) = g.run({"c": 5}, [ca, ma, ga])
    lm = np.exp(np.where(ma, ca, -np.inf))[0, :, 0]                        # (h, c, c)
    np.testing.assert_allclose(got, (ga[:, :, 0, :] * lm)[:, None, None], rtol=1e-6)
    flipped = build.permute(ctx, ew(ctx, "mul", f32_input((c, h), 3), ew(ctx, "neg", f32_input((h,), 4))), (1, 0))
    assert push_permutes([flipped])[0] is flipped


@st.composite
def _cases(draw):
    rank = draw(st.integers(2, 4))
    sizes = draw(st.lists(st.integers(1, 5), min_size=rank, max_size=rank))
    perm = tuple(draw(st.permutations(range(rank))))
    x_perm = tuple(draw(st.permutations(range(rank))))   # x is an input viewed through a permute
    operands = []
    for _ in range(draw(st.integers(1, 3))):
        drop = draw(st.integers(0, rank - 1))                 # lower rank: broadcast from the left
        operands.append(tuple(d if draw(st.booleans()) else 1 for d in sizes[drop:]))
    ops = draw(st.lists(st.sampled_from(sorted(_NP)), min_size=len(operands), max_size=len(operands)))
    negated = draw(st.lists(st.booleans(), min_size=len(operands), max_size=len(operands)))   # work, not a load
    return sizes, perm, x_perm, operands, ops, negated


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=_cases())
def test_random_permutes_of_broadcasts(vm, case):
    """exp of a permuted input combined with operands of random broadcasts (lower ranks among
    them), each an input or work (its negation), stored permuted: equal to NumPy; with loads only,
    one kernel in the permuted order."""
    sizes, perm, x_perm, operand_sizes, ops, negated = case
    rank = len(sizes)
    ctx = build.ShapeContext()
    names = [sym(f"d{i}") for i in range(rank)]
    dims = tuple(1 if n == 1 else names[i] for i, n in enumerate(sizes))
    env = {f"d{i}": n for i, n in enumerate(sizes) if n != 1}
    inv = tuple(x_perm.index(i) for i in range(rank))
    x_in = f32_input(tuple(dims[i] for i in inv), 0)           # stored in another order
    value = build.permute(ctx, x_in, x_perm)
    rng = np.random.default_rng(rank)
    xa = rng.standard_normal([sizes[i] for i in inv]).astype(F32)
    want = xa.transpose(x_perm)
    inputs, arrays = [x_in], [xa]
    for k, (shape, op) in enumerate(zip(operand_sizes, ops)):
        drop = rank - len(shape)
        o = f32_input(tuple(1 if d == 1 else dims[drop + i] for i, d in enumerate(shape)), k + 1)
        inputs.append(o)
        value = ew(ctx, op, value, ew(ctx, "neg", o) if negated[k] else o)
        a = rng.standard_normal(shape).astype(F32)
        arrays.append(a)
        want = _NP[op](want, -a if negated[k] else a)
    out = build.permute(ctx, ew(ctx, "exp", value), perm)
    g = CompiledGraph(inputs, [out])
    if perm != tuple(range(rank)) and not any(negated):
        assert not g.plan.workspaces and len(g.plan.groups) == 1
    (got,) = g.run(env, arrays)
    np.testing.assert_allclose(got, np.exp(want).transpose(perm), rtol=1e-6)
