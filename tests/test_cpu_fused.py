"""Fused instruction runs of the CPU VM (host/fuse_plan finds them, the fused pieces run them): the plan
finds a normalisation's and a softmax's runs and refuses runs whose intermediates are read later; results are
bitwise equal to the reference VM (NaNs compared as NaNs: an x86 operation that creates one gives
-NaN, NumPy's np.nan is +NaN, and the two VMs may meet them in either order) with NaN and
infinities in every operand, f16/bf16 operands,
partial tiles, rows narrower than a tile, run-time fallbacks (a register not in the state
the run needs) and two scale chains whose weights stay cached across tiles, on 1 and 2 threads."""
from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import pytest

import dvm
from dvm.codegen import isa
from dvm.codegen.verifier import verify
from dvm.frontend.library import layernorm, rmsnorm, softmax
from dvm.graph.dtypes import DType
from dvm.vm import cpu, reference
from dvm.vm.cpu.host import desc as cpu_desc
from dvm.tools.bench_ops_cases import sum_first
from dvm.vm.cpu.host.fuse_plan import fuse_plan
from dvm.vm.cpu.host.in_place import in_place_plan
from dvm.vm.cpu.abi import (FK_ADDSUM, FK_APPLY, FK_CSQSUM, FK_EXPSUM, FK_LOADACC, FK_LOADRED, FK_ROWNORM,
                              FK_ROWSOFTMAX, FK_SQSUM, FK_UNBIN, PEEP_LATER)

from test_cpu_layouts import _bitwise_as_reference
from test_cpu_vm import run_on
from test_reductions import softmax_k as softmax_div   # divides by the row sum: the row form's div

pytestmark = [pytest.mark.cpu_vm, pytest.mark.vm_once]   # compares the VMs itself


RNG = np.random.default_rng(11)


@dvm.kernel
def sq_live(k, x):
    """x*x is read again after its sum: no fused sum of squares."""
    x = k.load(x)
    t = k.mul(x, x)
    return k.store(k.mul(t, k.sum(t, axis=-1, keepdims=True)))


@dvm.kernel
def apply_live(k, x, w, b):
    """The scaled value is stored as well: no fused scale chain (the sums still fuse)."""
    x = k.load(x)
    y = k.mul(x, k.rsqrt(k.add(k.mean(k.mul(x, x), axis=-1, keepdims=True), 1e-6)))
    return k.store(k.add(k.mul(y, k.load(w)), k.load(b))), k.store(y)


@dvm.kernel
def apply_full(k, x, z, w):
    """A scale chain whose first product has two full tiles: planned, refused at run time."""
    x, z = k.load(x), k.load(z)
    return k.store(k.mul(k.mul(x, z), k.load(w)))


@dvm.kernel
def weight_twice(k, x, w):
    """A weight loaded once and used by the chain and after it (a row-vector register source)."""
    x, w = k.load(x), k.load(w)
    s = k.rsqrt(k.mean(k.mul(x, x), axis=-1, keepdims=True))
    return k.store(k.add(k.mul(k.mul(x, s), w), w))


@dvm.kernel
def two_scales(k, x, w, v, b):
    """Two scale chains in one kernel, each with its own weight (and one bias): the row vectors
    cached across tiles (fused/common.cached_row) belong to their run."""
    x = k.load(x)
    ms = k.mean(k.mul(x, x), axis=-1, keepdims=True)
    y = k.add(k.mul(k.mul(x, k.rsqrt(k.add(ms, 1e-6))), k.load(w)), k.load(b))
    z = k.mul(k.mul(x, k.rsqrt(k.add(ms, 2.0))), k.load(v))
    return k.store(y), k.store(z)


def _row_reducer(op: str):
    """op over the last axis of a loaded tile that nothing else reads: a fused load and reduce."""
    def reduce_rows(k, x):
        return k.store(getattr(k, op)(k.load(x), axis=-1))
    reduce_rows.__name__ = f"{op}_rows"
    return dvm.kernel(reduce_rows)


ROW_REDUCERS = [_row_reducer(op) for op in ("sum", "prod", "max", "min", "mean")]


@dvm.kernel
def max_live(k, x):
    """The loaded tile is read again after its max: no fused load and reduce."""
    x = k.load(x)
    return k.store(k.sub(x, k.max(x, axis=-1, keepdims=True)))


@dvm.kernel
def ln_stats(k, x, w, b):
    """A LayerNorm that also stores its mean and rstd (native_layer_norm in training): its row sums
    are read after the run, so no row form (the runs inside it still fuse)."""
    x = k.load(x)
    mean = k.mean(x, axis=-1, keepdims=True)
    xc = k.sub(x, mean)
    rstd = k.rsqrt(k.add(k.mean(k.mul(xc, xc), axis=-1, keepdims=True), 1e-5))
    return k.store(k.add(k.mul(k.mul(xc, rstd), k.load(w)), k.load(b))), k.store(mean), k.store(rstd)


@dvm.kernel
def ln_variant(k, x, w):
    """A LayerNorm without bias, the mean halved and 1 / sqrt for rsqrt: chains of two and
    four compact ops (one with two constants), a scale of one stage."""
    x = k.load(x)
    xc = k.sub(x, k.mul(k.mean(x, axis=-1, keepdims=True), 0.5))
    var = k.mean(k.mul(xc, xc), axis=-1, keepdims=True)
    return k.store(k.mul(k.mul(xc, k.reciprocal(k.sqrt(k.add(k.mul(var, 2.0), 1e-5)))), k.load(w)))


@dvm.kernel
def softmax_lse(k, x):
    """Softmax that also stores its row max and sum (a log-sum-exp's parts): no row form."""
    x = k.load(x)
    m = k.max(x, axis=-1, keepdims=True)
    e = k.exp(k.sub(x, m))
    s = k.sum(e, axis=-1, keepdims=True)
    return k.store(k.mul(e, k.reciprocal(s))), k.store(m), k.store(s)


SOFTMAXES = [softmax, softmax_div, softmax_lse]


def _kinds(kfn, *args) -> set[int]:
    layout = verify(kfn.program(*args))
    return {int(kind) for kl in layout.kernels for kind in cpu_desc._desc(kl, len(layout.args)).fuse[:, 0]} - {0}


def _f32(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def test_plan_finds_norm_runs():
    x, w = _f32(64, 1024), _f32(1024)
    assert _kinds(layernorm, x, w, w) == {FK_ROWNORM, FK_CSQSUM, FK_APPLY}
    assert _kinds(rmsnorm, x, w) == {FK_ROWNORM, FK_SQSUM, FK_APPLY}
    assert _kinds(softmax, x) == _kinds(softmax_div, x) == {FK_ROWSOFTMAX, FK_EXPSUM}
    assert all(_kinds(kfn, x) == {FK_LOADRED} for kfn in ROW_REDUCERS)


def test_plan_respects_liveness():
    x, w = _f32(64, 1024), _f32(1024)
    assert FK_SQSUM not in _kinds(sq_live, x)
    assert _kinds(apply_live, x, w, w) == {FK_SQSUM}
    assert _kinds(apply_full, x, x, w) == {FK_APPLY}
    assert _kinds(weight_twice, x, w) == {FK_ROWNORM, FK_SQSUM, FK_APPLY}   # w: a row-vector register
    assert _kinds(two_scales, x, w, w, w) == {FK_SQSUM, FK_APPLY}
    assert _kinds(max_live, x) == set()
    assert _kinds(ln_stats, x, w, w) == {FK_CSQSUM, FK_APPLY}
    assert FK_ROWSOFTMAX not in _kinds(softmax_lse, x)
    assert _kinds(ln_variant, x, w) == {FK_ROWNORM, FK_CSQSUM, FK_APPLY}


def _plan(*rows, sections):
    """fuse_plan's kinds per pc for an instruction stream written as (name, f1, f2, ...) rows."""
    instrs = np.array([[isa.opcode(name), *fields, *[0] * (isa.WORDS - 1 - len(fields))] for name, *fields in rows],
                      np.int64)
    return [int(k) for k in fuse_plan(instrs, sections)[:, 0]]


def test_liveness_follows_the_sections_in_order():
    """A register a run leaves is dead when every later section (this row block's next sweeps,
    then the next row block's, never the prologue again) writes it before reading it, and live
    when a later body may read it first, even when the run's own body writes it before the run."""
    load_acc = [("accinit.sum.f32", 2), ("load.f32", 3, 0), ("acc.sum.f32", 2, 3)]
    fin_writes = [("rfin.sum.f32", 3, 2), ("store.f32", 3, 1)]
    assert _plan(*load_acc, *fin_writes, sections=[(0, 0), (0, 1), (1, 3), (3, 5)])[1] == FK_LOADACC
    fin_reads = [("store.f32", 3, 1)]   # the store reads the load's tile, not the sum
    assert _plan(*load_acc, *fin_reads, sections=[(0, 0), (0, 1), (1, 3), (3, 4)])[1] == 0
    body_writes_first = [("accinit.sum.f32", 2), ("const.f32", 3, 0), ("load.f32", 3, 0), ("acc.sum.f32", 2, 3)]
    assert _plan(*body_writes_first, *fin_reads, sections=[(0, 0), (0, 1), (1, 4), (4, 5)])[2] == 0
    prologue_reads = [("store.f32", 3, 1), *load_acc]   # runs once, before: never after the run
    assert _plan(*prologue_reads, sections=[(0, 1), (1, 2), (2, 4), (4, 4)])[2] == FK_LOADACC


def _peep(*rows, args=(0, 1, 2, 3)):
    """in_place_plan for one body section written as rows (as _plan), every operand f32; operand j
    of argument args[j]."""
    instrs = np.array([[isa.opcode(name), *fields, *[0] * (isa.WORDS - 1 - len(fields))] for name, *fields in rows],
                      np.int64)
    return in_place_plan(instrs, np.full(4, int(DType.FLOAT32), np.int64), np.array(args, np.int64),
                         [(0, 0), (0, len(rows))]).tolist()


def test_in_place_plan_points_a_value_read_before_its_later_store():
    """An op whose result is read, then stored (a residual sum feeding a norm, stored after the
    norm's output) writes it into the store's tile (PEEP_LATER - operand); not when a write of the
    register or a store into the same argument comes between, nor when it is read after such a
    store or by another store. The store right after, with no other reader: the operand itself."""
    add, red, mul = ("add.f32", 4, 2, 3), ("rowred.sum.f32", 5, 4), ("mul.f32", 6, 4, 4)
    assert _peep(add, red, ("store.f32", 4, 1))[0] == PEEP_LATER - 1
    assert _peep(add, ("store.f32", 4, 1), mul)[0] == PEEP_LATER - 1   # read after its own store
    assert _peep(add, ("store.f32", 4, 1), ("rowred.sum.f32", 5, 2))[0] == 1
    assert _peep(add, ("store.f32", 4, 0))[0] == 0
    assert _peep(add, red, ("store.f32", 5, 0), ("store.f32", 4, 1))[0] == PEEP_LATER - 1   # another argument
    assert _peep(add, red, ("store.f32", 5, 0), ("store.f32", 4, 1), args=(1, 1, 2, 3))[0] == -1
    assert _peep(add, ("mul.f32", 4, 4, 2), ("store.f32", 4, 1))[0] == -1      # written again first
    assert _peep(add, ("store.f32", 4, 1), ("store.f32", 2, 1), mul)[0] == -1  # read after a store there
    assert _peep(add, ("store.f32", 4, 1), ("store.f32", 2, 0), mul)[0] == PEEP_LATER - 1
    assert _peep(add, ("store.f32", 4, 1), ("store.f32", 4, 2))[0] == -1       # stored twice


@dvm.kernel
def residual_layernorm(k, x, r, w, b):
    h = k.add(k.load(x), k.load(r))
    d = h - k.mean(h, axis=-1, keepdims=True)
    return k.store(h), k.store(d * k.rsqrt(k.mean(d * d, axis=-1, keepdims=True) + 1e-5) * k.load(w) + k.load(b))


@dvm.kernel
def residual_rmsnorm(k, x, r, w):
    h = k.add(k.load(x), k.load(r))
    return k.store(h), k.store(h * k.rsqrt(k.mean(h * h, axis=-1, keepdims=True) + 1e-6) * k.load(w))


@dvm.kernel
def rmsnorm_then_residual(k, x, r, w):
    """The order a model's segment stores them in: the norm's output first, the residual sum last."""
    h = k.add(k.load(x), k.load(r))
    return k.store(h * k.rsqrt(k.mean(h * h, axis=-1, keepdims=True) + 1e-6) * k.load(w)), k.store(h)


@dvm.kernel
def layernorm_then_residual(k, x, r, w, b):
    """The models' order for a LayerNorm: the norm's output stored first, the residual sum last."""
    h = k.add(k.load(x), k.load(r))
    d = h - k.mean(h, axis=-1, keepdims=True)
    return k.store(d * k.rsqrt(k.mean(d * d, axis=-1, keepdims=True) + 1e-5) * k.load(w) + k.load(b)), k.store(h)


def test_plan_sums_a_residual_sum_as_it_is_written():
    """The residual sum stored last, the whole norm is also a row form (FK_ROWNORM: refused at run
    time below ROW_FORM_MIN_BN lanes, as here); stored first, its store splits the norm."""
    x, w = _f32(64, 128), _f32(128)
    assert _kinds(layernorm_then_residual, x, x, w, w) == {FK_ROWNORM, FK_ADDSUM, FK_CSQSUM, FK_APPLY}
    assert _kinds(residual_layernorm, x, x, w, w) == {FK_ADDSUM, FK_CSQSUM, FK_APPLY}
    assert FK_ADDSUM not in _kinds(residual_rmsnorm, x, x, w)   # its add feeds a sum of squares


@pytest.mark.parametrize("shape", [(64, 128), (70, 256), (9, 512), (33, 16), (300, 64), (5, 1024), (40, 100),
                                   (2, 3, 32)])
def test_residual_sum_summed_as_written_matches_unfused(shape):
    """FK_ADDSUM (whole power-of-two rows of 16-512 lanes; wider or other rows refused at run time)
    gives bitwise what the add and the row sum give one by one, with NaN and infinities in some
    rows, on 1 and 2 threads, also on a transposed view (no tile in place) and with x passed twice."""
    x, w, b = _data(np.dtype(np.float32), shape)
    r = _data(np.dtype(np.float32), shape)[0]
    for args in ((x, r, w, b), (np.swapaxes(x, -1, -2).copy().swapaxes(-1, -2), r, w, b), (x, x, w, b)):
        with _unfused(layernorm_then_residual, *args):
            want = run_on(_threads(1), layernorm_then_residual, *args)
        for threads in (1, 2):
            for g, r_ in zip(run_on(_threads(threads), layernorm_then_residual, *args), want):
                assert _same(g, r_), (shape, args[0].strides, threads)


@pytest.mark.parametrize("shape", [(64, 128), (37, 100), (16, 1024), (5, 1024), (300, 64)])
def test_a_residual_sum_written_into_its_output_while_the_norm_reads_it(shape):
    """The residual sum's register points at its output tile (full tiles) or is copied there by the
    store (partial ones): both outputs bitwise the reference VM's, on 1 and 2 threads, also with the
    sum's input viewed transposed and with x passed twice."""
    x, r, w = _f32(*shape), _f32(*shape), _f32(shape[-1])
    for kfn, args in ((residual_layernorm, (x, r, w, w)), (residual_rmsnorm, (x, r, w)),
                      (rmsnorm_then_residual, (x, r, w)), (layernorm_then_residual, (x, r, w, w))):
        peep = cpu_desc._desc(verify(kfn.program(*args)).kernels[0], len(args) + 2).peep
        assert (peep <= PEEP_LATER).any(), kfn
        _bitwise_as_reference(kfn, *args, why=(shape,))
        _bitwise_as_reference(kfn, np.ascontiguousarray(x.T).T, *args[1:], why=(shape, "transposed"))
        _bitwise_as_reference(kfn, x, x, *args[2:], why=(shape, "x twice"))


def test_plan_finds_loaded_accumulations():
    """load ; acc in the sweeps of long rows (over MAX_TILE: a norm or softmax of narrower rows
    takes one tile) and in column reductions (FK_LOADACC)."""
    from dvm.codegen.program import MAX_TILE
    n = MAX_TILE + 1
    assert FK_LOADACC in _kinds(layernorm, _f32(3, n), _f32(n), _f32(n))
    # (the last sweep's exp(x - m) * (1 / sum) is an FK_UNBIN run too, refused at run time: its
    # other operand is compact)
    assert _kinds(softmax, _f32(3, n)) == {FK_LOADACC, FK_UNBIN}
    assert _kinds(sum_first, _f32(1000, 1001)) == {FK_LOADACC}


@dvm.kernel
def add_half(k, x):
    return k.store(k.add(k.load(x), 0.5))


def test_plans_are_shared_per_instruction_stream():
    """Layouts of one kernel at different shapes share the stream-derived plan (host/stream); a
    different operand dtype (the in-place plan needs an f32 store) gets its own, and no
    descriptor can write into a shared plan."""
    descs = [cpu_desc._desc(kl, len(lay.args)) for lay in (verify(layernorm.program(_f32(r, 1001), _f32(1001), _f32(1001)))
                                                       for r in (3, 17, 64)) for kl in lay.kernels]
    assert len({id(d.fuse) for d in descs}) == 1 and len({id(d.peep) for d in descs}) == 1
    assert {d.n_units for d in descs} != {descs[0].n_units}   # the shape-dependent parts are not shared
    assert not (descs[0].fuse.flags.writeable or descs[0].peep.flags.writeable or descs[0].rio.flags.writeable)
    peeps = [cpu_desc._desc(lay.kernels[0], len(lay.args)).peep
             for lay in (verify(add_half.program(np.ones(64, dt))) for dt in (np.float32, np.float16))]
    assert (peeps[0] >= 0).any() and not (peeps[1] >= 0).any()
    with pytest.raises(ValueError):
        descs[0].fuse[0, 0] = FK_ROWNORM


def test_descriptor_from_the_stream_template_is_the_packed_descriptor():
    """Later instances of a stream get their descriptor from the template packed for the first,
    with the instance segments and work-unit count written in: the same words as packing whole."""
    lays = [verify(layernorm.program(_f32(r, c), _f32(c), _f32(c))) for r, c in ((3, 1001), (17, 1001), (64, 77))]
    lays += [verify(add_half.program(np.ones(n, np.float32))) for n in (64, 5000, 70000)]
    for lay in lays:
        argsz, descs, _, _, _ = cpu_desc.prog_desc(lay)
        for d in descs:
            assert np.array_equal(d.blob, cpu_desc._pack(d, argsz))
    assert lays[0].kernels[0].stream is lays[1].kernels[0].stream
    assert lays[0].kernels[0].stream.derived["cpu_blob"] is lays[1].kernels[0].stream.derived["cpu_blob"]


def _same(got: np.ndarray, want: np.ndarray) -> bool:
    nan = np.isnan(want.astype(np.float32))
    if not np.array_equal(np.isnan(got.astype(np.float32)), nan):
        return False
    return got[~nan].tobytes() == want[~nan].tobytes()


@contextmanager
def _unfused(kfn, *args):
    """The kernel's instructions run one by one (its fuse plan emptied while inside)."""
    layout = verify(kfn.program(*args))
    argsz, descs, outs, chain, stack = cpu_desc.prog_desc(layout)
    saved = [(d, d.fuse, d.blob) for d in descs]
    for d in descs:
        d.fuse = np.zeros_like(d.fuse)   # the plan itself is shared and read-only (host/stream)
        d.blob = cpu_desc._pack(d, argsz)
    unfused_chain = cpu_desc._chain(descs)
    object.__setattr__(layout, "_cpu_prog", (argsz, descs, outs, unfused_chain, cpu_desc.Stack.of(descs, unfused_chain)))
    try:
        yield
    finally:
        for d, fuse, blob in saved:
            d.fuse = fuse
            d.blob = blob
        object.__setattr__(layout, "_cpu_prog", (argsz, descs, outs, chain, stack))


def _threads(n: int):
    return lambda layout, bufs: cpu.run(layout, bufs, threads=n)


def _data(dt, shape):
    x = (RNG.standard_normal(shape) * 3).astype(dt)
    w, b = (RNG.standard_normal(shape[-1]) * 2).astype(dt), RNG.standard_normal(shape[-1]).astype(dt)
    rows = x.reshape(-1, shape[-1])     # specials in every third row only: a NaN poisons its row
    rows[::3, ::97], rows[::3, 5::89], rows[1::6, 7::101] = np.nan, np.inf, -np.inf
    w[3::170], b[4::190], w[9::230] = np.nan, -np.inf, 0
    return x, w, b


@pytest.mark.parametrize("dtype", [np.float32, np.float16, "bfloat16"])
@pytest.mark.parametrize("shape", [(64, 1024), (9, 1001), (5, 300), (3, 128), (13, 4096), (2, 3, 513)])
def test_fused_runs_match_reference(dtype, shape):
    import ml_dtypes
    dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    x, w, b = _data(dt, shape)
    z = np.abs(_data(dt, shape)[0])
    cases = [(layernorm, (x, w, b)), (rmsnorm, (x, w)), (sq_live, (x,)), (apply_live, (x, w, b)),
             (apply_full, (x, z, w)), (weight_twice, (x, w)), (two_scales, (x, w, b[::-1].copy(), b))]
    for kfn, args in cases:
        want = run_on(reference.run, kfn, *args)
        for n in (1, 2):
            got = run_on(_threads(n), kfn, *args)
            for g, r in zip(got, want):
                assert _same(g, r), (kfn, dt, shape, n)


@pytest.mark.parametrize("shape", [(64, 1024), (9, 1001), (5, 300), (13, 4096), (2, 3, 513), (70, 100)])
def test_fused_softmax_matches_unfused(shape):
    """exp may differ from NumPy's by an ulp, so the fused softmax (the row form, or the tile form
    for a transposed view) is held to the same VM with its instructions run one by one: bitwise,
    on 1 and 2 threads; rows not back to back too."""
    x = _data(np.dtype(np.float32), shape)[0]
    for a in (x, x[..., 1:], np.swapaxes(x, -1, -2).copy().swapaxes(-1, -2)):
        for kfn in SOFTMAXES:
            with _unfused(kfn, a):
                want = run_on(_threads(1), kfn, a)
            for n in (1, 2):
                for g, r in zip(run_on(_threads(n), kfn, a), want):
                    assert _same(g, r), (kfn, shape, a.strides, n)
    np.testing.assert_allclose(want[0], run_on(reference.run, softmax_lse, a)[0], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("shape", [(70, 250), (9, 1001), (33, 1024), (5, 300), (3, 128), (2, 3, 513), (100, 17)])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_fused_row_reductions_match_unfused(shape, dtype):
    """The fused load and reduce reads rows in place (partial tiles, rows past the last one, rows
    of a transposed view, f16 rows that fall back to the load): bitwise what the load and the
    reduction give one by one, on 1 and 2 threads, with NaN and infinities in some rows."""
    x = _data(np.dtype(dtype), shape)[0]
    inputs = [x, np.swapaxes(x, -1, -2).copy().swapaxes(-1, -2)]   # rows one element apart
    if dtype == np.float32:
        inputs.append(x[..., 1:])   # rows not back to back, starting off the buffer's start
    for kfn in ROW_REDUCERS:
        for a in inputs:
            with _unfused(kfn, a):
                want = run_on(_threads(1), kfn, a)[0]
            for n in (1, 2):
                assert _same(run_on(_threads(n), kfn, a)[0], want), (kfn, shape, dtype, n)
            ref = run_on(reference.run, kfn, a)[0]
            np.testing.assert_allclose(want.astype(np.float32), ref.astype(np.float32), rtol=2e-3, atol=1e-5)


@pytest.mark.parametrize("shape", [(70, 1001), (33, 1024), (5, 300), (3, 128), (2, 3, 513), (9, 4096), (40, 100),
                                   (3, 70000)])
def test_row_norms_match_unfused(shape):
    """A norm run row by row (FK_ROWNORM: partial rows and row blocks, rows of a view that are not
    back to back, one-row tiles wider than SINGLE_TILE_COLS; a transposed view runs the tile form)
    gives bitwise what its instructions give one by one, on 1 and 2 threads, with NaN and
    infinities in some rows and in the weights; weights read in place, or copied when strided."""
    x, w, b = _data(np.dtype(np.float32), shape)
    ws = np.repeat(w, 2)[::2]   # a strided view of the same values
    for a in (x, x[..., 1:], np.swapaxes(x, -1, -2).copy().swapaxes(-1, -2)):
        n = a.shape[-1]
        cases = [(layernorm, (a, w[:n], b[:n])), (rmsnorm, (a, w[:n])), (ln_stats, (a, w[:n], b[:n])),
                 (ln_variant, (a, w[:n])), (layernorm, (a, ws[:n], b[:n])), (rmsnorm, (a, ws[:n]))]
        for kfn, args in cases:
            with _unfused(kfn, *args):
                want = run_on(_threads(1), kfn, *args)
            for threads in (1, 2):
                for g, r in zip(run_on(_threads(threads), kfn, *args), want):
                    assert _same(g, r), (kfn, shape, a.strides, threads)


def test_apply_run_stops_at_a_load_into_its_own_value():
    """mul y, a, b ; load y, o ; mul y, y, w: the load overwrites the run's value, so the three are
    not an FK_APPLY run (a mutant of `dvm fuzz programs` made the plan fuse them: the weight was
    applied where the Program applies the loaded value)."""
    op = isa.opcode
    instrs = np.array([[op("mul.f32"), 3, 1, 2, 0, 0],
                       [op("load.f32"), 3, 0, 0, 0, 0],
                       [op("mul.f32"), 3, 3, 4, 0, 0],
                       [op("store.f32"), 3, 1, 0, 0, 0]], np.int64)
    assert fuse_plan(instrs, [(0, 4)])[0, 0] != FK_APPLY
    instrs[1, 1] = 5   # into another register: the run applies it
    assert fuse_plan(instrs, [(0, 4)])[0, 0] == FK_APPLY
