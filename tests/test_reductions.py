"""Reductions (sum, mean, prod, max, min, argmax, argmin) over every axis subset of rank 1-3
tensors, every dtype, keepdims both ways, compared with PyTorch eager; NaN / ties / empty axes;
long accumulations; post-reduction fusion (softmax, log-softmax, LayerNorm, RMSNorm) as one
kernel; several reductions over different axes in one kernel function."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import dvm
from helpers import (BF16, DTYPES, FLOATS, NAME_OF_TORCH, NP_DTYPE, TORCH_DTYPE, assert_same,
                     random_values, to_torch, tol)

REDUCE_OPS = ("sum", "mean", "prod", "max", "min", "argmax", "argmin")
SHAPES = {1: [(7,), (1,)], 2: [(3, 5), (2, 4099)], 3: [(2, 3, 4), (3, 1, 5)]}


def reduce_kernel(op, axis, keepdims, dynamic: bool = True):
    @dvm.kernel(dynamic=dynamic)
    def f(k, x):
        return k.store(getattr(k, op)(k.load(x), axis=axis, keepdims=keepdims))
    return f


def norm_axes(axis, ndim):
    if axis is None:
        return tuple(range(ndim))
    axis = (axis,) if isinstance(axis, int) else axis
    return tuple(sorted(a % ndim for a in axis))


def torch_reduce(op, t: torch.Tensor, axis, keepdims):
    """Eager reference for DVM's reduction semantics (NumPy-style axis / keepdims)."""
    axes = norm_axes(axis, t.ndim)
    if op in ("sum", "mean"):
        return getattr(torch, op)(t, dim=axes, keepdim=keepdims)
    if op in ("max", "min"):
        return (torch.amax if op == "max" else torch.amin)(t, dim=axes, keepdim=keepdims)
    if op == "prod":
        # torch.prod takes one dim: multiply in f64 (ints: in int64, exact modulo 2^64), round once
        out_dtype = torch.prod(t.reshape(-1)[:1]).dtype
        acc = t.double() if t.is_floating_point() else t.long()
        for a in sorted(axes, reverse=True):
            acc = torch.prod(acc, dim=a, keepdim=True)
        if not keepdims:
            acc = acc.reshape([d for i, d in enumerate(t.shape) if i not in axes])
        return acc.to(out_dtype)
    # argmax / argmin: flat row-major index over the reduced axes (NumPy, via f64: exact for
    # every dtype here; NumPy, like eager, returns the first NaN and the first of equal values)
    a = t.double().numpy() if t.dtype != torch.int64 else t.numpy()
    rest = [i for i in range(t.ndim) if i not in axes]
    moved = np.transpose(a, rest + list(axes))
    n = int(np.prod([t.shape[i] for i in axes], dtype=np.int64))
    flat = moved.reshape(moved.shape[:len(rest)] + (n,))
    idx = (np.argmax if op == "argmax" else np.argmin)(flat, axis=-1)
    if keepdims:
        idx = idx.reshape([1 if i in axes else d for i, d in enumerate(t.shape)])
    return torch.from_numpy(np.asarray(idx, dtype=np.int64))


def axis_forms(ndim):
    """None, and every non-empty axis subset as int / tuple, some written with negative axes."""
    yield None
    for r in range(1, ndim + 1):
        for i, sub in enumerate(itertools.combinations(range(ndim), r)):
            yield sub[0] if r == 1 else sub
            yield (sub[0] - ndim) if r == 1 else tuple(a - ndim if (a + i) % 2 else a for a in sub)


def _data(op, dtype, shape, rng):
    if op in ("max", "min", "argmax", "argmin"):
        x = random_values(rng, dtype, shape, lo=-50, hi=50)
        if dtype in FLOATS:  # NaN propagation is tested separately
            x[np.isnan(x.astype(np.float64))] = 3
        return x
    if op == "prod":
        if dtype in FLOATS:
            return rng.uniform(0.6, 1.5, size=shape).astype(NP_DTYPE[dtype])
        return random_values(rng, dtype, shape, lo=-3, hi=3, specials=False)
    if dtype in FLOATS:
        return rng.uniform(-4, 4, size=shape).astype(NP_DTYPE[dtype])
    return random_values(rng, dtype, shape, lo=-100, hi=100)


@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("rank", [1, 2, 3])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", REDUCE_OPS)
def test_reduction_every_axis_subset(op, dtype, rank, keepdims):
    rng = np.random.default_rng(rank * 100 + DTYPES.index(dtype))
    for shape in SHAPES[rank]:
        x = _data(op, dtype, shape, rng)
        t = to_torch(x)
        for axis in axis_forms(rank):
            f = reduce_kernel(op, axis, keepdims)
            what = f"{op}({dtype}{list(shape)}, axis={axis}, keepdims={keepdims})"
            if op in ("argmax", "argmin") and dtype == "bool":
                continue  # see test_argmax_argmin_reject_bool
            if op == "mean" and not _torch_accepts(op, t):
                with pytest.raises(dvm.DTypeError):  # eager: mean of ints
                    f(x)
                continue
            expected = torch_reduce(op, t, axis, keepdims)
            assert_same(f(x), expected, what, **tol(op, NAME_OF_TORCH[expected.dtype]))


def _torch_accepts(op, t):
    try:
        getattr(torch, op)(t)
    except RuntimeError:
        return False
    return True


def test_argmax_single_axis_matches_torch_directly():
    rng = np.random.default_rng(5)
    x = rng.integers(0, 4, size=(4, 6, 5)).astype(np.float32)  # many ties
    for op in ("argmax", "argmin"):
        for axis in (0, 1, 2, -1):
            for keepdims in (False, True):
                expected = getattr(torch, op)(to_torch(x), dim=axis, keepdim=keepdims)
                assert_same(reduce_kernel(op, axis, keepdims)(x), expected, f"{op} axis={axis}")
        assert_same(reduce_kernel(op, None, False)(x), getattr(torch, op)(to_torch(x)), f"{op} all")


# --- NaN, ties -----------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", FLOATS)
def test_max_min_propagate_nan(dtype):
    x = np.array([[1.0, np.nan, 3.0, -np.inf],
                  [np.inf, 2.0, np.nan, np.nan],
                  [0.0, -0.0, 5.0, 4.0]], dtype=NP_DTYPE[dtype])
    t = to_torch(x)
    for op in ("max", "min"):
        for axis in (None, 0, 1, (0, 1)):
            assert_same(reduce_kernel(op, axis, False)(x), torch_reduce(op, t, axis, False),
                        f"{op}({dtype}, axis={axis}) with NaN")


@pytest.mark.parametrize("dtype", FLOATS)
def test_argmax_argmin_pick_first_nan(dtype):
    x = np.array([[1.0, np.nan, 3.0, np.nan],
                  [np.inf, 2.0, -np.inf, np.nan],
                  [7.0, 7.0, -7.0, -7.0]], dtype=NP_DTYPE[dtype])
    t = to_torch(x)
    for op in ("argmax", "argmin"):
        for axis in (0, 1):
            expected = getattr(torch, op)(t, dim=axis)
            assert_same(reduce_kernel(op, axis, False)(x), expected, f"{op}({dtype}, axis={axis}) NaN")
        assert_same(reduce_kernel(op, None, False)(x), getattr(torch, op)(t), f"{op}({dtype}) all NaN")


def test_argmax_argmin_reject_bool():
    x = np.array([[True, False], [False, True]])
    for op in ("argmax", "argmin"):
        with pytest.raises(RuntimeError, match="does not support bool"):
            getattr(torch, op)(to_torch(x), dim=1)
        with pytest.raises(dvm.DTypeError):
            reduce_kernel(op, 1, False)(x)


@pytest.mark.parametrize("dtype", DTYPES)
def test_ties_pick_first_index(dtype):
    x = np.array([[1, 3, 3, 0, 3], [0, 0, 0, 0, 0], [2, 1, 2, 1, 2]]).astype(NP_DTYPE[dtype])
    if dtype == "bool":
        x = x.astype(bool)
    t = to_torch(x)
    for op in ("argmax", "argmin"):
        for axis in (0, 1):
            if dtype == "bool":
                continue  # see test_argmax_argmin_reject_bool
            assert_same(reduce_kernel(op, axis, False)(x), getattr(torch, op)(t, dim=axis),
                        f"{op}({dtype}, axis={axis}) ties")


def test_ties_across_column_tiles_pick_first_index():
    x = np.zeros((2, 5000), dtype=np.float32)
    x[0, [17, 4200, 4999]] = 5.0
    x[1, [4500, 100]] = -5.0
    assert_same(reduce_kernel("argmax", 1, False)(x), torch.argmax(to_torch(x), dim=1), "argmax")
    assert_same(reduce_kernel("argmin", 1, False)(x), torch.argmin(to_torch(x), dim=1), "argmin")
    y = np.full((2, 5000), 1.0, dtype=np.float32)
    y[:, 4098] = np.nan
    y[1, 3000] = np.nan
    assert_same(reduce_kernel("argmax", 1, False)(y), torch.argmax(to_torch(y), dim=1), "argmax NaN")
    assert_same(reduce_kernel("max", 1, False)(y), torch.amax(to_torch(y), dim=1), "max NaN")


# --- empty -------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float32", "float16", "int32", "bool"])
def test_empty_reductions(dtype):
    x = np.zeros((3, 0), dtype=NP_DTYPE[dtype])
    t = to_torch(x)
    assert_same(reduce_kernel("sum", 1, False)(x), torch.sum(t, dim=1), "sum over empty axis")
    assert_same(reduce_kernel("sum", None, False)(x), torch.sum(t), "sum of empty")
    assert_same(reduce_kernel("prod", 1, False)(x), torch.prod(t, dim=1), "prod over empty axis")
    assert_same(reduce_kernel("prod", None, True)(x), torch_reduce("prod", t, None, True), "prod of empty")
    for op in ("max", "min") + (("argmax", "argmin") if dtype != "bool" else ()):
        with pytest.raises(dvm.ShapeError):
            reduce_kernel(op, 1, False)(x)
        with pytest.raises(dvm.ShapeError):
            reduce_kernel(op, None, False)(x)
    # reducing a non-empty axis of an empty tensor is fine
    for op in ("max", "sum") + (("argmin",) if dtype != "bool" else ()):
        out = reduce_kernel(op, 0, False)(x)
        assert out.shape == (0,), f"{op} over the non-empty axis of a (3, 0) tensor: {out.shape}"
    if dtype in FLOATS:
        assert_same(reduce_kernel("mean", 1, False)(x), torch.mean(t, dim=1), "mean over empty axis (NaN)")


# --- long accumulations ---------------------------------------------------------------------
def test_sum_ones_float16_20000():
    out = reduce_kernel("sum", None, False)(np.ones(20000, dtype=np.float16))
    assert out.dtype == np.float16 and out.shape == () and float(out) == 20000.0, out


def test_mean_ones_bfloat16_70000():
    out = reduce_kernel("mean", None, False)(np.ones(70000, dtype=BF16))
    assert out.dtype == BF16 and out.shape == () and float(out) == 1.0, out


def test_long_row_sum_matches_torch():
    rng = np.random.default_rng(9)
    for dtype in ("float32", "bfloat16", "int32"):
        x = _data("sum", dtype, (3, 5000), rng)
        for op in ("sum", "max", "argmin"):
            assert_same(reduce_kernel(op, 1, True)(x), torch_reduce(op, to_torch(x), 1, True),
                        f"{op}({dtype}, 3x5000)")


# --- post-reduction fusion ------------------------------------------------------------------
@dvm.kernel
def softmax_k(k, x):
    v = k.load(x)
    e = k.exp(k.sub(v, k.max(v, axis=-1, keepdims=True)))
    return k.store(k.div(e, k.sum(e, axis=-1, keepdims=True)))


@dvm.kernel
def log_softmax_k(k, x):
    v = k.load(x)
    s = k.sub(v, k.max(v, axis=-1, keepdims=True))
    return k.store(k.sub(s, k.log(k.sum(k.exp(s), axis=-1, keepdims=True))))


@dvm.kernel
def layer_norm_k(k, x, w, b):
    v = k.cast(k.load(x), "float32")
    mu = k.mean(v, axis=-1, keepdims=True)
    d = k.sub(v, mu)
    var = k.mean(k.mul(d, d), axis=-1, keepdims=True)
    y = k.mul(k.mul(d, k.rsqrt(k.add(var, 1e-5))), k.load(w))
    return k.store(k.cast(k.add(y, k.load(b)), x.node.dtype.short))


@dvm.kernel
def rms_norm_k(k, x, w):
    v = k.cast(k.load(x), "float32")
    ms = k.mean(k.mul(v, v), axis=-1, keepdims=True)
    y = k.mul(k.mul(v, k.rsqrt(k.add(ms, 1e-6))), k.load(w))
    return k.store(k.cast(y, x.node.dtype.short))


FUSION_SHAPES = [(4, 37), (1, 1), (3, 4099), (2, 3, 65)]


def _one_kernel(kf, *args):
    prog = kf.program(*args)
    assert isinstance(prog, dvm.Program)
    n = len(dvm.verify(prog).kernels)
    assert n == 1, f"{kf.fn.__name__} on {[a.shape for a in args]} ran as {n} kernels, expected 1"


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64"])
@pytest.mark.parametrize("shape", FUSION_SHAPES)
def test_softmax_and_log_softmax(shape, dtype):
    """The reference is eager in f32 (f64 for f64) rounded once to the dtype: DVM computes f16 /
    bf16 in f32 and rounds on store. (Eager's own f16 log_softmax is less accurate: on this data
    it is 24 ulp off at -0.0144 where DVM is exact.)"""
    rng = np.random.default_rng(31)
    x = (rng.standard_normal(shape) * 3).astype(NP_DTYPE[dtype])
    t = to_torch(x)
    wide = t.double() if dtype == "float64" else t.float()
    assert_same(softmax_k(x), torch.softmax(wide, dim=-1).to(t.dtype), f"softmax {dtype}{shape}")
    assert_same(log_softmax_k(x), torch.log_softmax(wide, dim=-1).to(t.dtype),
                f"log_softmax {dtype}{shape}")
    _one_kernel(softmax_k, x)
    _one_kernel(log_softmax_k, x)


def test_softmax_with_inf_and_large_values():
    x = np.array([[1000.0, 1000.0, -1000.0, 0.0], [-np.inf, 0.0, 1.0, -np.inf]], dtype=np.float32)
    assert_same(softmax_k(x), torch.softmax(to_torch(x), dim=-1), "softmax large / -inf")
    assert_same(log_softmax_k(x), torch.log_softmax(to_torch(x), dim=-1), "log_softmax large / -inf")


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("shape", FUSION_SHAPES)
def test_layer_norm(shape, dtype):
    rng = np.random.default_rng(32)
    x = (rng.standard_normal(shape) * 2 + 1).astype(NP_DTYPE[dtype])
    w = rng.standard_normal(shape[-1]).astype(np.float32)
    b = rng.standard_normal(shape[-1]).astype(np.float32)
    expected = F.layer_norm(to_torch(x).float(), (shape[-1],), to_torch(w), to_torch(b), eps=1e-5)
    assert_same(layer_norm_k(x, w, b), expected.to(TORCH_DTYPE[dtype]), f"layer_norm {dtype}{shape}")
    _one_kernel(layer_norm_k, x, w, b)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("shape", FUSION_SHAPES)
def test_rms_norm(shape, dtype):
    rng = np.random.default_rng(33)
    x = (rng.standard_normal(shape) * 2).astype(NP_DTYPE[dtype])
    w = rng.standard_normal(shape[-1]).astype(np.float32)
    expected = F.rms_norm(to_torch(x).float(), (shape[-1],), to_torch(w), eps=1e-6)
    assert_same(rms_norm_k(x, w), expected.to(TORCH_DTYPE[dtype]), f"rms_norm {dtype}{shape}")
    _one_kernel(rms_norm_k, x, w)


# --- several reductions over different axes -----------------------------------------------------
def test_reductions_over_different_axes_in_one_function():
    @dvm.kernel
    def f(k, x):
        v = k.load(x)
        col = k.sum(v, axis=0, keepdims=True)        # (1, n)
        row = k.max(v, axis=1, keepdims=True)        # (m, 1)
        centered = k.sub(k.sub(v, col), row)          # needs both
        return (k.store(col), k.store(row), k.store(k.sum(centered, axis=1)),
                k.store(k.argmin(centered, axis=0)), k.store(k.mean(v)))
    rng = np.random.default_rng(41)
    for shape in ((5, 7), (3, 4099), (1, 9), (6, 1)):
        x = rng.standard_normal(shape).astype(np.float32)
        t = to_torch(x)
        col = t.sum(0, keepdim=True)
        row = t.amax(1, keepdim=True)
        c = t - col - row
        outs = f(x)
        for got, want, what in zip(outs, (col, row, c.sum(1), c.argmin(0), t.mean()),
                                   ("col sum", "row max", "sum of centered", "argmin", "mean")):
            assert_same(got, want, f"{what} {shape}")
        assert len(dvm.verify(f.program(x)).kernels) >= 2


def test_reduce_then_reduce_other_axis():
    @dvm.kernel
    def f(k, x):
        v = k.load(x)
        return k.store(k.sum(k.max(v, axis=2), axis=0))
    rng = np.random.default_rng(42)
    x = rng.standard_normal((3, 4, 5)).astype(np.float32)
    assert_same(f(x), to_torch(x).amax(2).sum(0), "sum(max(x, 2), 0)")


def test_mean_integer_rejected_and_sum_bool_is_int64():
    with pytest.raises(dvm.DTypeError):
        reduce_kernel("mean", None, False)(np.arange(4, dtype=np.int64))
    x = np.array([True, True, False])
    assert_same(reduce_kernel("sum", None, False)(x), torch.sum(to_torch(x)), "sum(bool)")
    assert_same(reduce_kernel("prod", None, False)(x), torch.prod(to_torch(x)), "prod(bool)")
    assert_same(reduce_kernel("max", None, False)(x), torch.amax(to_torch(x)), "max(bool)")


@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
def test_short_inner_axis_sum_is_adds_with_the_same_bits(n, dtype, monkeypatch):
    """A float sum over one short axis that is not the last (an MoE's top-k combine) is written
    as adds of its slices (graph.build._short_axis_sum): no reduction instructions, and the same
    bits as the reduction form (f16 / bf16: f32 adds, one rounding), signed zeros, infinities
    and NaN included; matches PyTorch."""
    from dvm.graph import build
    rng = np.random.default_rng(n)
    x = rng.standard_normal((37, n, 130)).astype(NP_DTYPE[dtype])
    x[0] = -0.0
    x[1, :, 0] = np.nan
    x[2, 0, 1] = np.inf
    x[3, 0, 2], x[3, n - 1, 2] = np.inf, -np.inf
    x[4, :, 3] = -0.0
    x[4, n - 1, 3] = 0.0
    with np.errstate(over="ignore"):   # +-inf in f16
        x[5, :, :] = 1e30 * (-1) ** np.arange(n)[:, None]
    adds = reduce_kernel("sum", 1, False, dynamic=False)   # static sizes: the axis's 2-4 is known
    assert "rfin" not in dvm.disasm(adds.program(x))
    got = adds(x)
    monkeypatch.setattr(build, "SHORT_AXIS_MAX", 1)   # the reduction form, traced by a new kernel
    reduced = reduce_kernel("sum", 1, False, dynamic=False)
    assert "rfin" in dvm.disasm(reduced.program(x))
    want = reduced(x)
    assert got.tobytes() == want.tobytes()
    assert not np.signbit(got[0]).any()   # -0 + -0 sums to +0, as in PyTorch
    assert_same(got, to_torch(x).sum(1))
