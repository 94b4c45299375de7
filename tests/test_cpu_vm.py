"""Differential tests: the numba CPU VM (dvm.vm.cpu) against the reference VM (the executable spec).

Every kernel here is run on both VMs from the same verified Program; float outputs are compared
with torch.testing.assert_close default tolerances for their dtype (NaN positions equal), bool and
integer outputs exactly.
"""
from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

import dvm
from dvm.codegen import isa
from dvm.codegen.encoder import NeedsCopy
from dvm.codegen.verifier import check_buffers, verify
from dvm.errors import DvmError
from dvm.graph.dtypes import DType
from dvm.graph.ops import BINARY, UNARY
from dvm.runtime.compiled import as_buffer
from dvm.vm import cpu, reference

from helpers import DTYPES, FLOATS, INTS, NP_DTYPE, dvm_call, random_values, to_torch

pytestmark = [pytest.mark.cpu_vm, pytest.mark.vm_once]   # compares the VMs itself


# --- running one kernel on a chosen VM ------------------------------------------------------------
def run_on(vm_run, kfn, *arrays):
    """Run kernel `kfn` on `arrays` with `vm_run` (reference.run or cpu.run); returns the outputs."""
    arrays = [np.asarray(a) for a in arrays]
    try:
        prog = kfn.program(*arrays)
    except NeedsCopy as e:
        arrays[e.slot] = np.ascontiguousarray(arrays[e.slot])
        return run_on(vm_run, kfn, *arrays)
    layout = verify(prog)
    ref = kfn(*arrays)    # shapes of the outputs
    refs = ref if isinstance(ref, tuple) else (ref,)
    outs = [np.empty(r.shape, r.dtype) for r in refs]
    for o in outs:   # poison: freed memory of an earlier run must not pass for results
        o.reshape(-1).view(np.uint8)[...] = 0x7F
    bufs = [as_buffer(a)[0] for a in arrays] + [o.reshape(-1) for o in outs]
    for info in layout.args[len(bufs):]:
        bufs.append(np.empty(info.numel, DType(info.dtype).np_dtype))
    check_buffers(layout, bufs)
    vm_run(layout, bufs)
    return outs


def compare(kfn, *arrays, **tol):
    """Run on both VMs and compare; returns the CPU VM's outputs."""
    want = run_on(reference.run, kfn, *arrays)
    got = run_on(cpu.run, kfn, *arrays)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        if w.dtype.kind in "biu":
            np.testing.assert_array_equal(g, w)
        else:
            torch.testing.assert_close(to_torch(g), to_torch(w), equal_nan=True, **tol)
    return got


def ew_kernel(name: str, n: int):
    names = [f"a{i}" for i in range(n)]
    src = f"def kern(k, {', '.join(names)}):\n    return k.store(dvm_call(k, name, {', '.join(f'k.load({a})' for a in names)}))\n"
    scope = {"dvm_call": dvm_call, "name": name}
    exec(src, scope)  # noqa: S102 - one named parameter per input
    return dvm.kernel(scope["kern"])


RNG = np.random.default_rng(1234)


def _accepts(kfn, *arrays) -> bool:
    try:
        kfn.program(*arrays)
    except (DvmError, TypeError, NeedsCopy):
        return False
    return True


# --- coverage of the ISA ---------------------------------------------------------------------------
def test_every_opcode_dispatched():
    missing = [s.name for s in isa.ISA if not cpu.handled(s)]
    assert not missing, f"CPU VM does not implement: {missing}"
    for s in isa.ISA:
        assert cpu.DECODE[s.code, 0] >= 0, s.name


# --- elementwise ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name", UNARY)
def test_unary(name):
    kfn = ew_kernel(name, 1)
    ran = 0
    for dt in DTYPES:
        lo, hi = (-3, 3) if name in ("exp", "exp2", "expm1") else (-10, 10)
        x = random_values(RNG, dt, (7, 151), lo=lo, hi=hi)
        if not _accepts(kfn, x):
            continue
        compare(kfn, x)
        ran += 1
    assert ran


@pytest.mark.parametrize("name", BINARY)
def test_binary(name):
    kfn = ew_kernel(name, 2)
    ran = 0
    for dt in DTYPES:
        a = random_values(RNG, dt, (5, 67), lo=-6, hi=6, nonzero=name in ("floor_divide", "remainder"))
        b = random_values(RNG, dt, (67,), lo=-6, hi=6, nonzero=name in ("floor_divide", "remainder"))
        if name == "pow" and dt in INTS:
            b = RNG.integers(-2, 9, size=b.shape).astype(b.dtype)
        if not _accepts(kfn, a, b):
            continue
        compare(kfn, a, b)
        compare(kfn, b[None, :3], a[:3, :3].T)   # broadcast and transposed operands
        ran += 1
    assert ran


@pytest.mark.parametrize("dt", ("int32", "int64"))
@pytest.mark.parametrize("name", ("floor_divide", "remainder"))
def test_integer_division_by_zero(name, dt):
    kfn = ew_kernel(name, 2)
    a = np.arange(10, dtype=dt)
    b = np.ones(10, dtype=dt)
    b[3] = 0
    for vm in (reference.run, cpu.run):
        with pytest.raises(ZeroDivisionError):
            run_on(vm, kfn, a, b)


@pytest.mark.parametrize("name", ("where", "clamp"))
def test_ternary(name):
    kfn = ew_kernel(name, 3)
    for dt in DTYPES:
        if name == "where":
            args = (RNG.random((9, 40)) < 0.5, random_values(RNG, dt, (9, 40)), random_values(RNG, dt, (40,)))
        else:
            args = (random_values(RNG, dt, (9, 40)), random_values(RNG, dt, (9, 1), lo=-5, hi=0),
                    random_values(RNG, dt, (40,), lo=0, hi=5))
        if _accepts(kfn, *args):
            compare(kfn, *args)


@pytest.mark.parametrize("src", DTYPES)
def test_casts(src):
    x = random_values(RNG, src, (3, 1000), lo=-70000, hi=70000)

    @dvm.kernel
    def casts(k, x):
        v = k.load(x)
        return tuple(k.store(k.cast(v, d)) for d in DTYPES)
    compare(casts, x)


def test_chain_and_iota():
    @dvm.kernel
    def chain(k, a, b):
        a, b = k.load(a), k.load(b)
        y = k.mul(k.tanh(k.add(k.exp(k.mul(a, b)), a)), b)
        return k.store(y), k.store(k.add(k.iota(a.shape, 1), k.cast(k.gt(a, 0), "int32")))
    a = RNG.standard_normal((37, 300)).astype(np.float32)
    b = RNG.standard_normal((37, 300)).astype(np.float32)
    compare(chain, a, b)
    compare(chain, a[::2, ::3], b[::2, ::3])   # sliced views


def _iota_kernel(axis):
    @dvm.kernel
    def iota_plus(k, x):
        v = k.load(x)
        return k.store(k.add(k.iota(v.shape, axis), k.cast(k.gt(v, 0), "int64")))
    return iota_plus


def _iota_col_sum_kernel(axis):
    @dvm.kernel
    def iota_col_sum(k, x):   # a reduction over axis 0 of a strided view: column-major tiles
        v = k.load(x)
        return k.store(k.sum(k.add(k.iota(v.shape, axis), k.cast(k.gt(v, 0), "int64")), axis=0))
    return iota_col_sum


@pytest.mark.parametrize("shape", [(3, 5, 7, 300), (2, 3, 4100), (4, 1024, 2, 16), (5000, 3)])
def test_iota_along_every_axis(shape):
    """The index tiles (the CPU VM's odometer over the column dims, a row's offset added per row),
    on folded row and column dims, partial tiles and transposed views: the reference VM's values."""
    x = RNG.standard_normal(shape).astype(np.float32)
    for axis in range(len(shape)):
        compare(_iota_kernel(axis), x)
        compare(_iota_kernel(axis), np.swapaxes(x, 0, -1))
        compare(_iota_col_sum_kernel(axis), x)


# --- reductions ------------------------------------------------------------------------------------
REDS = ("sum", "prod", "max", "min", "argmax", "argmin", "mean")


@pytest.mark.parametrize("red", REDS)
def test_reductions(red):
    def make(axis, keepdims):
        @dvm.kernel
        def kern(k, x):
            return k.store(getattr(k, red)(k.load(x), axis=axis, keepdims=keepdims))
        return kern
    for dt in DTYPES:
        for shape, axis, keep in (((3, 5000), -1, True), ((4, 7, 9), (0, 2), False), ((6, 130), 0, False),
                                  ((2, 3, 4), None, False)):
            lo, hi = (0.5, 1.5) if red == "prod" else (-10, 10)
            x = random_values(RNG, dt, shape, lo=lo, hi=hi, specials=red != "prod")
            kfn = make(axis, keep)
            if not _accepts(kfn, x):
                continue
            compare(kfn, x)
            if x.ndim == 2:
                compare(kfn, x.T.copy().T)                         # transposed layout
                compare(kfn, np.broadcast_to(x[:1], x.shape))      # broadcast input
                compare(kfn, x[:, 1::2])                           # sliced input


def test_nan_propagation():
    x = RNG.standard_normal((4, 3000)).astype(np.float32)
    x[1, 2500] = np.nan
    x[2, 7] = np.nan
    x[3, :] = np.nan

    @dvm.kernel
    def k1(k, x):
        v = k.load(x)
        return (k.store(k.max(v, axis=1)), k.store(k.min(v, axis=1)), k.store(k.argmax(v, axis=1)),
                k.store(k.argmin(v, axis=1)), k.store(k.maximum(v, 0.0)), k.store(k.sum(v, axis=1)))
    outs = compare(k1, x)
    assert np.isnan(outs[0][1:]).all() and outs[2][1] == 2500 and outs[2][2] == 7


def assert_same_bits(kfn, *arrays):
    """kfn's outputs on the CPU VM and the reference VM are bitwise equal (NaNs canonicalised:
    their payloads may differ)."""
    for g, w in zip(run_on(cpu.run, kfn, *arrays), run_on(reference.run, kfn, *arrays)):
        if g.dtype.kind == "f":
            g, w = np.where(np.isnan(g), np.nan, g), np.where(np.isnan(w), np.nan, w)
        np.testing.assert_array_equal(g.view(f"u{g.itemsize}"), w.view(f"u{w.itemsize}"))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_max_min_signed_zero_and_nan_bitwise(dtype):
    """maximum/minimum and max/min reductions agree with the reference VM bit for bit on +-0
    ties (np.maximum's rule: the second operand wins; reductions keep the tree order) and NaN,
    over both axes, whole and partial tiles (the CPU VM's float combine is max/min plus a NaN
    select, not the reference's comparison)."""
    vals = np.array([np.nan, -np.inf, -1.0, -0.0, 0.0, 1.0, np.inf], dtype)
    a = np.repeat(vals, len(vals)).reshape(len(vals), len(vals))
    b = a.T.copy()

    @dvm.kernel
    def pairs(k, a, b):
        x, y = k.load(a), k.load(b)
        return (k.store(k.maximum(x, y)), k.store(k.minimum(x, y)), k.store(k.maximum(y, 0.0)),
                k.store(k.minimum(-0.0, x)))

    @dvm.kernel
    def reductions(k, x):
        v = k.load(x)
        return (k.store(k.max(v, axis=0)), k.store(k.min(v, axis=0)), k.store(k.max(v, axis=1)),
                k.store(k.min(v, axis=1)))

    assert_same_bits(pairs, a, b)
    zeros = np.where(RNG.random((37, 1030)) < 0.5, -0.0, 0.0).astype(dtype)
    zeros[3, 1029] = np.nan
    zeros[5, 2] = np.nan
    for x in (zeros, zeros[:, :1024], zeros[:, :17], zeros.T.copy()):
        assert_same_bits(reductions, x)


@pytest.mark.parametrize("dtype", ["float32", "float64", "int64"])
@pytest.mark.parametrize("cols", [17, 250, 300, 1001])
def test_partial_row_reductions_keep_padding(dtype, cols):
    """Reductions over partial rows leave the reduced register's padding lanes as they were
    (copies of the last valid column): a division by that register afterwards sees no padding
    zero (an int64 floor division fails on a zero divisor in any lane of the tile, and a sum's
    identity is 0), and max / sum / sum of squares match the reference VM bit for bit."""
    x = RNG.integers(1, 50, (37, cols)) * RNG.choice([-1, 1], (37, cols))
    x = x.astype(dtype)
    if dtype != "int64":
        x[3, cols - 1], x[5, 0], x[6, cols // 2], x[7, 1] = np.nan, -0.0, np.inf, -np.inf

    @dvm.kernel
    def reduce_then_divide(k, x):
        v = k.load(x)
        mx, sq, s = k.max(v, axis=1, keepdims=True), k.sum(k.mul(v, v), axis=1), k.sum(v, axis=1, keepdims=True)
        q = k.floor_divide(s, v) if dtype == "int64" else k.div(s, v)
        return k.store(mx), k.store(sq), k.store(s), k.store(q)

    assert_same_bits(reduce_then_divide, x)


def _softmax(k, x):
    x = k.load(x)
    m = k.max(x, axis=-1, keepdims=True)
    e = k.exp(k.sub(x, m))
    return k.store(k.div(e, k.sum(e, axis=-1, keepdims=True)))


def _layernorm(k, x, w, b):
    x = k.load(x)
    mu = k.mean(x, axis=-1, keepdims=True)
    d = k.sub(x, mu)
    var = k.mean(k.mul(d, d), axis=-1, keepdims=True)
    return k.store(k.add(k.mul(k.mul(d, k.rsqrt(k.add(var, 1e-5))), k.load(w)), k.load(b)))


def _rmsnorm(k, x, w):
    x = k.load(x)
    ms = k.mean(k.mul(x, x), axis=-1, keepdims=True)
    return k.store(k.mul(k.mul(x, k.rsqrt(k.add(ms, 1e-6))), k.load(w)))


softmax, layernorm, rmsnorm = dvm.kernel(_softmax), dvm.kernel(_layernorm), dvm.kernel(_rmsnorm)


@pytest.mark.parametrize("dt", FLOATS)
@pytest.mark.parametrize("shape", [(4, 17), (3, 5000), (65, 1024)])
def test_norms(dt, shape):
    x = (RNG.standard_normal(shape) * 3).astype(NP_DTYPE[dt])
    w = RNG.standard_normal(shape[-1]).astype(NP_DTYPE[dt])
    b = RNG.standard_normal(shape[-1]).astype(NP_DTYPE[dt])
    compare(softmax, x)
    compare(layernorm, x, w, b)
    compare(rmsnorm, x, w)


# --- edge shapes -----------------------------------------------------------------------------------
def test_zero_size_and_rank0():
    @dvm.kernel
    def k(k, a, b):
        a, b = k.load(a), k.load(b)
        return k.store(k.add(a, b)), k.store(k.sum(a, axis=-1)), k.store(k.exp(b))
    for shape in ((0, 5), (5, 0), (0,)):
        compare(k, np.zeros(shape, np.float32), np.zeros(shape, np.float32))
    compare(k, np.array(2.5, np.float32), np.array(-1.0, np.float32)) if _accepts(
        k, np.array(2.5, np.float32), np.array(-1.0, np.float32)) else None

    @dvm.kernel
    def k0(k, a):
        return k.store(k.mul(k.exp(k.load(a)), 2.0))
    compare(k0, np.array(0.75, np.float32))
    compare(k0, np.array(0.75, np.float64))
    compare(softmax, np.zeros((0, 7), np.float32))


# --- determinism -----------------------------------------------------------------------------------
def test_deterministic_across_runs_and_threads():
    x = RNG.standard_normal((300, 3000)).astype(np.float32)
    big = RNG.standard_normal(1 << 20).astype(np.float32)
    kchain = ew_kernel("gelu", 1)
    results = []
    for n in (1, 2, 3, 1):   # the VM's own thread count (DVM_NUM_THREADS), passed per run
        run_n = functools.partial(cpu.run, threads=n)
        results.append(run_on(run_n, softmax, x) + run_on(run_n, kchain, big)
                       + run_on(run_n, layernorm, x, x[0], x[1]))
    for other in results[1:]:
        for a, b in zip(results[0], other):
            assert a.tobytes() == b.tobytes()
