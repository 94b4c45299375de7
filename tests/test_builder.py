"""The builder API contract: tracing once per signature, errors that name arguments, layouts."""
import ml_dtypes
import numpy as np
import pytest

import dvm
from dvm.codegen.program import MAX_TILE


@dvm.kernel
def softmax(k, x):
    x = k.load(x)
    m = k.max(x, axis=-1, keepdims=True)
    e = k.exp(k.sub(x, m))
    return k.store(k.div(e, k.sum(e, axis=-1, keepdims=True)))


def np_softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_issue_example_runs_and_disassembles():
    x = np.random.rand(7, 129).astype(np.float32)
    np.testing.assert_allclose(softmax(x), np_softmax(x), rtol=1e-6, atol=1e-7)
    prog = softmax.program(np.empty((3, 5), np.float32))
    assert isinstance(prog, dvm.Program)
    text = dvm.disasm(prog)
    assert "rowred.max.f32" in text and "rowred.sum.f32" in text  # a row fits one tile
    assert len(dvm.verify(prog).kernels) == 1  # post-reduction fusion: one kernel
    wide = dvm.disasm(softmax.program(np.empty((3, MAX_TILE + 1), np.float32)))   # rows over MAX_TILE
    assert "rfin.max.f32" in wide and "rfin.sum.f32" in wide and "sweeps 3" in wide


def test_new_shapes_encode_without_retrace():
    @dvm.kernel
    def softmax2(k, x):
        x = k.load(x)
        e = k.exp(k.sub(x, k.max(x, axis=-1, keepdims=True)))
        return k.store(k.div(e, k.sum(e, axis=-1, keepdims=True)))
    dvm.reset_counters()
    for rows, cols in [(2, 3), (5, 17), (9, 4097), (2, 3)]:
        x = np.random.rand(rows, cols).astype(np.float32)
        np.testing.assert_allclose(softmax2(x), np_softmax(x), rtol=1e-6, atol=1e-7)
    c = dvm.counters()
    assert c["traces"] == 1  # one trace for every size
    assert c["encodes"] == 3 and c["cache_hits"] == 1


def test_dynamic_false_specializes_per_shape():
    @dvm.kernel(dynamic=False)
    def double(k, x):
        return k.store(k.mul(k.load(x), 2))
    dvm.reset_counters()
    double(np.ones((2, 3), np.float32))
    double(np.ones((4, 3), np.float32))
    double(np.ones((2, 3), np.float32))
    assert dvm.counters()["traces"] == 2


def test_multiple_outputs_and_layouts():
    @dvm.kernel
    def two(k, x, b):
        x, b = k.load(x), k.load(b)
        y = k.add(x, b)
        return k.store(y), k.store(k.sum(y, axis=0))
    base = np.arange(24, dtype=np.float64).reshape(4, 6)
    b = np.broadcast_to(np.arange(3.0), (3,))
    for x in (base[:, ::2], base.T[::2].T, base[::-1, 1::2], np.broadcast_to(np.arange(3.0), (4, 3))):
        y, s = two(x, b)
        np.testing.assert_array_equal(y, x + b)
        np.testing.assert_array_equal(s, (x + b).sum(0))


def test_errors_name_the_argument():
    @dvm.kernel
    def add(k, x, y):
        return k.store(k.add(k.load(x), k.load(y)))
    with pytest.raises(dvm.ShapeError, match="argument 'y'"):
        add(np.ones((2, 3)), np.ones(4))
    with pytest.raises(dvm.DTypeError, match="argument 'x'"):
        add(np.ones(3, np.complex64), np.ones(3))
    with pytest.raises(dvm.DTypeError, match="argument 'y'"):
        add(np.ones(3), np.array(["a", "b", "c"]))
    with pytest.raises(dvm.TraceError, match="takes 2 array"):
        add(np.ones(3))
    with pytest.raises(dvm.ShapeError):
        add(np.ones((2, 3)), np.ones((3, 2)))


def test_trace_errors_are_clear():
    @dvm.kernel
    def no_store(k, x):
        return k.exp(k.load(x))
    with pytest.raises(dvm.TraceError, match="k.store"):
        no_store(np.ones(3))

    @dvm.kernel
    def branch(k, x):
        x = k.load(x)
        if k.gt(x, 0):
            return k.store(x)
    with pytest.raises(dvm.TraceError, match="truth value"):
        branch(np.ones(3))

    @dvm.kernel
    def bad_axis(k, x):
        return k.store(k.sum(k.load(x), axis=3))
    with pytest.raises(dvm.ShapeError, match="axis 3"):
        bad_axis(np.ones((2, 2)))


def test_scalar_promotion_is_weak_like_pytorch():
    @dvm.kernel
    def f(k, x):
        x = k.load(x)
        return k.store(k.add(x, 2)), k.store(k.add(x, 2.5)), k.store(k.mul(x, k.scalar(2, dtype="int64")))
    a, b, c = f(np.array([1, 2], np.int32))
    assert a.dtype == np.int32 and b.dtype == np.float32 and c.dtype == np.int32
    h, _, _ = f(np.array([1, 2], np.float16))
    assert h.dtype == np.float16


def test_iota_masks_and_casts():
    @dvm.kernel
    def tril(k, x):
        x = k.load(x)
        i, j = k.iota(x.shape, 0), k.iota(x.shape, 1)
        return k.store(k.where(k.le(j, i), x, 0.0)), k.store(k.cast(x, "bfloat16"))
    x = np.random.rand(5, 7).astype(np.float32)
    t, bf = tril(x)
    np.testing.assert_array_equal(t, np.tril(x))
    assert bf.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(bf, x.astype(ml_dtypes.bfloat16))


def test_explain_reports_groups():
    text = dvm.explain(softmax, np.ones((2, 3), np.float32))
    assert "1 vector kernel" in text and "reductions max[1], sum[1]" in text


@dvm.kernel
def _masks(k, x, y):
    m = k.lt(k.load(x), k.load(y))
    return k.store(k.bitwise_and(m, True)), k.store(k.logical_or(False, m)), k.store(k.logical_and(m, False))


def test_and_with_true_or_with_false_is_no_instruction():
    """True & m and False | m are m itself (HF's masks AND an all-True padding mask); m & False
    is still computed."""
    x, y = np.random.rand(5, 3).astype(np.float32), np.random.rand(5, 3).astype(np.float32)
    a, b, c = _masks(x, y)
    assert (a == (x < y)).all() and (b == (x < y)).all() and not c.any()
    text = dvm.disasm(_masks.program(x, y))
    assert "bitwise_and" not in text and "logical_or" not in text and text.count("logical_and.b8") == 1


def test_a_kernel_beyond_a_programs_arguments_is_refused(monkeypatch):
    """More buffers than a Program holds: a clear error when the kernel is traced, not a
    verifier's rejection of the encoded bytes."""
    from dvm.runtime import compiled
    monkeypatch.setattr(compiled, "MAX_ARGS", 8)

    @dvm.kernel
    def many(k, a, b, c, d, e):
        return tuple(k.store(k.load(x) * 2.0) for x in (a, b, c, d, e))
    with pytest.raises(dvm.ProgramLimitError, match="at most 8"):
        many(*[np.ones(3, np.float32)] * 5)
