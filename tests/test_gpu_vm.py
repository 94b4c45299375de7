"""Differential tests of the GPU VM (dvm/vm/gpu) against the reference VM, in Triton's interpreter
mode on the CPU (tests/gpu_helpers.py sets TRITON_INTERPRET=1): every opcode and bank, casts,
every reduction with the reference's tree order, sweeps, tails, broadcast and strided operands,
sequence-stacked kernels, registers beyond the hot register file, more arguments than kernel
slots, and that one compiled kernel (per variant) serves every shape.

Shapes are tiny: the interpreter runs a tile in milliseconds. The same tests on a real GPU:
tests/test_gpu_device.py.
"""
from __future__ import annotations

import numpy as np
import pytest

from gpu_helpers import GPU, compare, interpreted, run_on   # (first: sets TRITON_INTERPRET)

import dvm
from dvm import config as dvm_config
from dvm.codegen import isa
from dvm.errors import DvmError
from dvm.graph.ops import BINARY, UNARY
from dvm.tools import bench_gpu_cases
from dvm.vm import reference
from dvm.vm.gpu import abi
from dvm.vm.gpu.image import _decode_one

from helpers import DTYPES, FLOATS, INTS, dvm_call, random_values

pytestmark = [pytest.mark.filterwarnings("ignore::RuntimeWarning"),
              pytest.mark.skipif(not interpreted(), reason="the GPU VM's kernels were defined for a real "
                                 "GPU in this process: see tests/test_gpu_device.py")]
RNG = np.random.default_rng(48)


@pytest.fixture(autouse=True)
def vm(monkeypatch):
    """Not parametrized over VMs: this module compares the GPU VM with the reference itself, on
    its interpreter (specialisation off: tests/test_gpu_tiers.py)."""
    monkeypatch.setenv("DVM_GPU_SPECIALIZE", "0")
    dvm_config.reload()
    yield None
    monkeypatch.undo()
    dvm_config.reload()


def _accepted(names, arity, dtype) -> list[str]:
    """The ops of `names` that take `dtype` operands (the builder raises DTypeError otherwise)."""
    out = []
    for name in names:
        probe = _many([name], arity)
        try:
            probe.trace(*[np.zeros(2, _np(dtype)) for _ in range(3)])
        except DvmError:
            continue
        out.append(name)
    assert out, (arity, dtype)
    return out


def _np(dtype: str):
    from helpers import NP_DTYPE
    return NP_DTYPE[dtype]


def _many(names, arity):
    """One kernel computing every op of `names` on the same operands (one launch, many outputs)."""
    @dvm.kernel
    def many(k, a, b, c):
        xs = (k.load(a), k.load(b), k.load(c))[:arity]
        return tuple(k.store(dvm_call(k, n, *xs)) for n in names)
    return many


def test_every_opcode_decodes():
    for spec in isa.ISA:
        kind, *_ = _decode_one(spec, [0] * len(spec.fields))
        assert 0 <= kind <= abi.K_ROWRED, spec.name


@pytest.mark.parametrize("dtype", DTYPES)
def test_unary_every_op(dtype):
    names = _accepted(UNARY, 1, dtype)
    lo, hi = (-12, 12) if dtype in FLOATS else (-50, 50)
    x = random_values(RNG, dtype, (3, 70), lo=lo, hi=hi)
    compare(_many(names, 1), x, x, x, what=f"unary {dtype}: {names}")


# f32 functions whose GPU form is the CPU VM's algorithm, operation for operation (gpu/mathf.py, mathf_ext.py):
# bitwise the CPU VM's results. The log family's GPU forms round differently (1 ULP on some inputs).
SAME_BITS_AS_CPU = ("exp", "exp2", "expm1", "tanh", "sigmoid", "silu", "erf", "gelu", "gelu_tanh", "sin",
                    "cos", "rsqrt", "sqrt", "reciprocal")


@pytest.mark.cpu_vm
def test_f32_math_is_bitwise_the_cpu_vms():
    x = np.concatenate([RNG.uniform(-14, 14, 160), RNG.standard_normal(60),
                        [0.0, -0.0, 1e-45, -1e-45, np.inf, -np.inf, np.nan, -13.9, -14.0, 14.0, 10.5,
                         -4.0, 4.0, 1.0, -1.0, 88.7, -103.0]]).astype(np.float32)
    kfn = _many(SAME_BITS_AS_CPU, 1)
    got = run_on(GPU.run, kfn, x, x, x)
    want = kfn(x, x, x, vm="cpu")
    for name, g, w in zip(SAME_BITS_AS_CPU, got, want):
        same = (g.view(np.uint32) == w.view(np.uint32)) | (np.isnan(g) & np.isnan(w))
        assert same.all(), (name, x[~same][:4], g[~same][:4], w[~same][:4])


@pytest.mark.parametrize("dtype", DTYPES)
def test_binary_every_op(dtype):
    names = _accepted(BINARY, 2, dtype)
    a = random_values(RNG, dtype, (6, 33), lo=-6, hi=6, nonzero=True)
    b = random_values(RNG, dtype, (33,), lo=-6, hi=6, nonzero=True)   # broadcast along rows
    if dtype in INTS:
        b = np.where(b == 0, 3, b).astype(b.dtype)
        names_pow = [n for n in names if n == "pow"]
        names = [n for n in names if n != "pow"]
        if names_pow:   # integer exponents in a range where the reference's wrapping is defined
            compare(_many(names_pow, 2), a, RNG.integers(-2, 9, size=b.shape).astype(b.dtype), a, what="pow")
    compare(_many(names, 2), a, b, a, what=f"binary {dtype}: {names}")
    compare(_many(names, 2), b[None, :5], a[:5, :5].T, a, what=f"binary {dtype} transposed")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64", "int32", "int64", "bool"])
def test_ternary(dtype):
    cond = RNG.random((5, 40)) < 0.5
    a, b = random_values(RNG, dtype, (5, 40)), random_values(RNG, dtype, (40,))

    @dvm.kernel
    def where(k, c, x, y):
        return k.store(k.where(k.load(c), k.load(x), k.load(y)))
    compare(where, cond, a, b)
    if dtype != "bool":
        @dvm.kernel
        def clamp(k, x, lo, hi):
            return k.store(k.clamp(k.load(x), min=k.load(lo), max=k.load(hi)))
        compare(clamp, a, random_values(RNG, dtype, (5, 1), lo=-5, hi=0), random_values(RNG, dtype, (40,), lo=0, hi=5))


@pytest.mark.parametrize("src", DTYPES)
def test_casts(src):
    x = random_values(RNG, src, (2, 90), lo=-70000, hi=70000)
    x.reshape(-1)[:6] = np.array([3e9, -3e9, 1e20, 0.5, -0.5, 2.5]).astype(x.dtype) if src in FLOATS else x.reshape(-1)[:6]

    @dvm.kernel
    def casts(k, x):
        v = k.load(x)
        return tuple(k.store(k.cast(v, d)) for d in DTYPES)
    compare(casts, x)


def _reduce_kernel(red, axis, keepdims=False):
    @dvm.kernel
    def kern(k, x):
        return k.store(getattr(k, red)(k.load(x), axis=axis, keepdims=keepdims))
    return kern


# single tile per row (rowred), several column tiles and sweeps (acc/rfin), a column-major
# reduction (axis 0), several reduced axes, a reduction of everything, an odd tail
SHAPES = (((3, 50), -1), ((2, 1500), -1), ((40, 6), 0), ((3, 4, 5), (0, 2)), ((7, 9), None))


@pytest.mark.parametrize("red", ["sum", "prod", "max", "min", "argmax", "argmin", "mean"])
def test_reductions(red):
    ran = 0
    for dtype in ("float32", "bfloat16", "float64", "int32", "int64", "bool"):   # (float16: the norms)
        for shape, axis in SHAPES:
            lo, hi = (0.8, 1.2) if red == "prod" else (-10, 10)
            x = random_values(RNG, dtype, shape, lo=lo, hi=hi, specials=red != "prod")
            kfn = _reduce_kernel(red, axis)
            try:
                kfn.trace(x)
            except DvmError:
                continue
            compare(kfn, x, what=f"{red} {dtype} {shape} axis={axis}")
            ran += 1
    assert ran


def test_float32_sums_are_bitwise_the_reference():
    """The pairwise-halving tree over each row's lanes: f32 sums equal the reference bit for bit."""
    for shape in ((3, 50), (2, 1500), (5, 1024), (1, 1025)):
        x = RNG.standard_normal(shape).astype(np.float32) * 1e3
        kfn = _reduce_kernel("sum", -1)
        want = run_on(reference.run, kfn, x)[0]
        got = run_on(GPU.run, kfn, x)[0]
        assert got.tobytes() == want.tobytes(), shape


def test_nan_propagation_and_first_index():
    x = np.array([[1.0, np.nan, 3.0, np.nan], [2.0, 2.0, -1.0, 2.0], [-np.inf, -np.inf, -np.inf, -np.inf]],
                 np.float32)
    for red in ("max", "min", "argmax", "argmin"):
        compare(_reduce_kernel(red, -1), x, what=red)
    y = np.full((2, 1300), 5.0, np.float32)
    y[0, 1200] = np.nan
    y[1, 7] = y[1, 1100] = 9.0   # a tie across column tiles: the first index wins
    for red in ("max", "argmax", "argmin"):
        compare(_reduce_kernel(red, -1), y, what=f"{red} across tiles")


def test_empty_rows_write_identities():
    for red in ("sum", "prod", "max"):
        kfn = _reduce_kernel(red, -1)
        x = np.zeros((3, 0), np.float32)
        if red == "max":
            with pytest.raises(DvmError):
                kfn.trace(x)
            continue
        compare(kfn, x, what=red)


softmax, layer_norm, rms_norm = bench_gpu_cases.softmax.fn, bench_gpu_cases.layer_norm.fn, bench_gpu_cases.rms_norm.fn


@pytest.mark.parametrize("dtype, cols", [("float32", 1300), ("bfloat16", 37), ("bfloat16", 1300),
                                         ("float16", 37)])   # one tile per row / sweeps over column tiles
def test_softmax_layernorm_rmsnorm(dtype, cols):
    x = random_values(RNG, dtype, (5, cols), lo=-4, hi=4, specials=False)
    w = random_values(RNG, dtype, (cols,), lo=0.5, hi=1.5, specials=False)
    b = random_values(RNG, dtype, (cols,), lo=-1, hi=1, specials=False)
    compare(dvm.kernel(softmax), x, what="softmax")
    compare(dvm.kernel(layer_norm), x, w, b, what="layer_norm")
    compare(dvm.kernel(rms_norm), x, w, what="rms_norm")


def test_strided_and_broadcast_operands():
    @dvm.kernel
    def f(k, a, b):
        return k.store(k.mul(k.add(k.load(a), k.load(b)), k.load(b)))
    a = RNG.standard_normal((6, 9, 11)).astype(np.float32)
    b = RNG.standard_normal((9, 1)).astype(np.float32)
    compare(f, a, b)
    compare(f, a[::2, :, ::-3], b)                        # sliced, reversed
    compare(f, a.transpose(2, 0, 1), RNG.standard_normal((6, 1)).astype(np.float32))
    compare(f, np.broadcast_to(b, (4, 9, 7)), b[:1])      # stride-0 input


def test_iota_index_and_int_chain():
    @dvm.kernel
    def f(k, a):
        a = k.load(a)
        i = k.iota(a.shape, 1)
        return k.store(k.add(k.mul(i, 3), k.cast(k.gt(a, 0), "int32"))), k.store(k.floor_divide(i, 2))
    compare(f, RNG.standard_normal((5, 23)).astype(np.float32))


def test_cat_pieces_stored_into_slices():
    """A cat of unequal pieces: each piece's kernel stores into its slice of one output (strided
    stores with an offset), which a later kernel reads back."""
    @dvm.kernel
    def f(k, a, b):
        c = k.cat([k.exp(k.load(a)), k.load(b)], axis=-1)
        return k.store(c), k.store(k.sum(c, axis=-1))
    a = RNG.standard_normal((5, 3)).astype(np.float32)
    compare(f, a, RNG.standard_normal((7, 5)).astype(np.float32).T)


def test_sequence_stacked_kernels():
    """Several kernels in one Program (workspaces between them): one launch per kernel block."""
    @dvm.kernel
    def f(k, x, y):
        x, y = k.load(x), k.load(y)
        s = k.sum(k.mul(x, y), axis=0, keepdims=True)        # kernel 1: over rows
        e = k.exp(k.sub(x, s))                               # kernel 2: over columns
        return k.store(k.div(e, k.sum(e, axis=1, keepdims=True)))
    x = RNG.standard_normal((9, 21)).astype(np.float32)
    y = RNG.standard_normal((9, 21)).astype(np.float32)
    prog = f.program(x, y, vm="gpu")
    assert len(dvm.verify(prog).kernels) >= 2
    compare(f, x, y)


def test_registers_beyond_the_hot_file():
    """More live float32 values than hot registers, and more live bools: the rest in scratch."""
    @dvm.kernel
    def f(k, x):
        x = k.load(x)
        vs = [k.add(k.mul(x, float(i + 1)), float(i)) for i in range(12)]
        bs = [k.gt(v, 1.0) for v in vs[:7]]
        acc = vs[0]
        for v in vs[1:]:
            acc = k.add(acc, k.mul(v, vs[0]))
        for bb in bs:
            acc = k.where(bb, acc, k.neg(acc))
        return k.store(acc)
    x = RNG.standard_normal((3, 40)).astype(np.float32)
    assert dvm.verify(f.program(x, vm="gpu")).kernels[0].nregs[0] > abi.VARIANTS["full"][0]
    compare(f, x)


def test_more_arguments_than_slots():
    n = abi.N_SLOTS + 3
    names = [f"a{i}" for i in range(n)]
    src = f"def many(k, {', '.join(names)}):\n    acc = k.load(a0)\n"
    src += "".join(f"    acc = k.add(acc, k.load({a}))\n" for a in names[1:])
    src += "    return k.store(acc)\n"
    scope: dict = {}
    exec(src, scope)  # noqa: S102 - a kernel with one named parameter per input
    kfn = dvm.kernel(scope["many"])
    arrays = [RNG.standard_normal((2, 5)).astype(np.float32) for _ in range(n)]
    compare(kfn, *arrays)


def test_one_compiled_kernel_per_variant_for_every_shape():
    """Every launch passes int64 addresses only (annotated int64 and never specialized) plus the
    variant's constexprs: Triton compiles one binary per variant, whatever the shapes."""
    import triton.language as tl

    from dvm.vm.gpu import interp
    fn = getattr(interp.vm_kernel, "fn", interp.vm_kernel)
    assert all(fn.__annotations__[name] is tl.int64 for name in abi.ARG_NAMES)
    assert list(getattr(interp.vm_kernel, "kwargs", {}).get("do_not_specialize", abi.ARG_NAMES)) == \
        list(abi.ARG_NAMES)
    for shape in ((1, 7), (9, 31), (4, 1500), (33, 2)):
        x = RNG.standard_normal(shape).astype(np.float32)
        compare(dvm.kernel(softmax), x)
        compare(_reduce_kernel("argmax", -1), x)
    sigs = GPU.launch_signatures()
    assert 1 <= len(sigs) <= len(abi.VARIANTS)
    for sig in sigs:
        assert set(sig[:len(abi.ARG_NAMES)]) == {"int"}
