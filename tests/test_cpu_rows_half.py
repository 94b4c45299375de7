"""Norms of 16-bit models in the CPU VM's row form (jit/fused/rownorm, rowhalf): float16 and
bfloat16 operands, outputs and stored sums converted through f32 scratch rows, and the rounding
casts eager PyTorch makes inside them (host/fuse_plan._row_norm: x's after its sum, the scale's
before the weight), bitwise against the reference VM."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import dvm
from dvm.codegen import isa
from dvm.codegen.disasm import disasm
from dvm.frontend.library import softmax
from dvm.vm.cpu.abi import FK_ROWNORM, NO_CAST
from dvm.vm.cpu.host import desc as cpu_desc

from test_cpu_layouts import RNG, _bitwise_as_reference
from test_cpu_rows import fuse_kind_at_first_load

pytestmark = [pytest.mark.cpu_vm, pytest.mark.vm_once]   # compares the VMs itself

HALVES = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16}


def _half_rmsnorm(dtype: str):
    @dvm.kernel
    def half_rmsnorm(k, x, r, w):
        """Hugging Face's RMSNorm of a residual sum in a 16-bit model: the sum in the model's
        dtype (rounded), the norm in float32, rounded back before the weight; the sum stored."""
        h = k.add(k.load(x), k.load(r))
        hf = k.cast(h, "float32")
        y = k.mul(hf, k.rsqrt(k.add(k.mean(k.mul(hf, hf), axis=-1, keepdims=True), 1e-6)))
        return k.store(k.mul(k.load(w), k.cast(y, dtype))), k.store(h)
    return half_rmsnorm


def _half_rmsnorm_first(dtype: str):
    @dvm.kernel
    def half_rmsnorm_first(k, x, w):
        """The same of a loaded row (a block's first norm: no sum)."""
        xf = k.cast(k.load(x), "float32")
        y = k.mul(xf, k.rsqrt(k.add(k.mean(k.mul(xf, xf), axis=-1, keepdims=True), 1e-6)))
        return k.store(k.mul(k.load(w), k.cast(y, dtype)))
    return half_rmsnorm_first


RMSNORM = {name: _half_rmsnorm(name) for name in HALVES}
RMSNORM_FIRST = {name: _half_rmsnorm_first(name) for name in HALVES}


@dvm.kernel
def half_layernorm(k, x, r, w, b):
    """torch's layer_norm of a 16-bit residual sum (rounded; the norm in float32, rounded when
    stored), the sum not stored."""
    h = k.cast(k.add(k.load(x), k.load(r)), "float32")
    d = k.sub(h, k.mean(h, axis=-1, keepdims=True))
    return k.store(d * k.rsqrt(k.mean(d * d, axis=-1, keepdims=True) + 1e-5) * k.load(w) + k.load(b))


@dvm.kernel
def rounded_rmsnorm(k, x, r, w):
    """float32 operands with bfloat16 roundings inside: the stored sum is the unrounded one, the
    norm takes the rounded sum (the stored row must be written before the rounding)."""
    h = k.add(k.load(x), k.load(r))
    hr = k.cast(k.cast(h, "bfloat16"), "float32")
    y = k.mul(hr, k.rsqrt(k.add(k.mean(k.mul(hr, hr), axis=-1, keepdims=True), 1e-6)))
    return k.store(k.mul(k.cast(k.cast(y, "bfloat16"), "float32"), k.load(w))), k.store(h)


def _rows(shape, dtype, seed_scale=1.0):
    """Random rows with NaN, infinities, signed zeros, values past the 16-bit range and ties of
    the bfloat16 rounding (a float32 halfway between two bfloat16 values)."""
    x = RNG.standard_normal(shape).astype(np.float32) * np.float32(seed_scale)
    x[0] = -0.0
    x[2, ::7] = np.nan
    x[3, 1], x[3, -1] = np.inf, -np.inf
    x[4, ::3] = np.float32(1.0 + 2.0 ** -8)   # a tie: rounds to even (1.0)
    x[5] *= np.float32(3e4)                   # float16 overflows, bfloat16 holds them
    with np.errstate(over="ignore"):
        return x.astype(dtype)


@pytest.mark.parametrize("dtype", sorted(HALVES))
@pytest.mark.parametrize("cols", [128, 300, 512, 600, 1024, 4096, 70000])
def test_16bit_norms_bitwise_as_reference(dtype, cols):
    """16-bit RMSNorms (residual with its stored sum; a first norm) and LayerNorm: one row form
    (FK_ROWNORM planned, with its rounding casts), bitwise the reference VM's on 1 and 2 threads
    (rows under ROW_FORM_MIN_BN lanes: the tile form; 70000 columns: one tile of 131072 lanes, as
    for f32), with x passed twice and a transposed term (the form refuses it)."""
    t = HALVES[dtype]
    x, r = _rows((9, cols), t), _rows((9, cols), t, 0.5)
    w, b = (RNG.standard_normal(cols).astype(t) for _ in range(2))
    assert fuse_kind_at_first_load(RMSNORM[dtype], x, r, w) == FK_ROWNORM
    assert fuse_kind_at_first_load(RMSNORM_FIRST[dtype], x, w) == FK_ROWNORM
    assert fuse_kind_at_first_load(half_layernorm, x, r, w, b) == FK_ROWNORM
    rt = np.ascontiguousarray(r.T).T
    for args in ((x, r, w), (x, x, w), (x, rt, w)):
        _bitwise_as_reference(RMSNORM[dtype], *args, why=(dtype, cols))
    _bitwise_as_reference(RMSNORM_FIRST[dtype], x, w, why=(dtype, cols))
    _bitwise_as_reference(half_layernorm, x, r, w, b, why=(dtype, cols))


@pytest.mark.parametrize("cols", [300, 1024, 4096])
def test_mixed_and_rounded_norms_bitwise_as_reference(cols):
    """A float32 term beside a bfloat16 one, a float16 output of a bfloat16 norm, and float32
    operands with bfloat16 roundings inside (the stored sum unrounded): bitwise the reference's."""
    x, r = _rows((9, cols), np.float32), _rows((9, cols), ml_dtypes.bfloat16)
    w = RNG.standard_normal(cols).astype(np.float32)
    _bitwise_as_reference(half_layernorm, x, r, w, w, why=(cols,))
    _bitwise_as_reference(RMSNORM["float16"], x.astype(ml_dtypes.bfloat16), r, w.astype(np.float16), why=(cols,))
    assert fuse_kind_at_first_load(rounded_rmsnorm, x, x, w) == FK_ROWNORM
    _bitwise_as_reference(rounded_rmsnorm, x, r.astype(np.float32), w, why=(cols,))


def _planned_casts(kfn, *args) -> tuple[list[int], list[int]]:
    """The FK_ROWNORM run's cast fields and the pcs of the kernel's rounding casts."""
    layout = dvm.verify(kfn.program(*args))
    kl = layout.kernels[0]
    fuse = cpu_desc._desc(kl, len(layout.args)).fuse
    (pc,) = np.flatnonzero(fuse[:, 0] == FK_ROWNORM)
    casts = [q for q, row in enumerate(kl.instrs) if isa.BY_CODE[int(row[0])].name == "cast.f32.f32"]
    return [int(v) for v in fuse[pc, 8:10]], casts


def test_rounding_casts_are_planned_in_the_row_form():
    """The plan names both rounding casts of a 16-bit RMSNorm (x's after the sum, the scale's
    before the weight), of float32 operands' roundings too, and none of a LayerNorm that rounds
    only its sum."""
    x = _rows((9, 1024), ml_dtypes.bfloat16)
    fields, casts = _planned_casts(RMSNORM["bfloat16"], x, x, x[0])
    assert len(casts) == 2 and fields == casts
    xf = x.astype(np.float32)
    fields, casts = _planned_casts(rounded_rmsnorm, xf, xf, xf[0])
    assert len(casts) == 2 and fields == casts
    fields, casts = _planned_casts(half_layernorm, x, x, x[0], x[0])
    assert fields == [casts[0], NO_CAST]


@dvm.kernel
def sum3_rmsnorm(k, x, r, s, w):
    """An RMSNorm of three loaded terms (a parallel block's), no rounding between the adds."""
    h = k.add(k.add(k.load(x), k.load(r)), k.load(s))
    return k.store(k.mul(k.mul(h, k.rsqrt(k.add(k.mean(k.mul(h, h), axis=-1, keepdims=True), 1e-6))), k.load(w)))


def _parallel_norms(dtype: str):
    """A parallel block's RMSNorm in a 16-bit model (Phi's, GPT-J's, Falcon's sum of attention,
    MLP and residual): the terms summed in float32, the sum rounded to dtype, the norm in float32,
    rounded when stored; of three terms and of four."""
    @dvm.kernel
    def parallel_norm3(k, x, r, s, w):
        return k.store(k.cast(_norm_of(k, k.add(k.add(_f32(k, x), _f32(k, r)), _f32(k, s)), dtype, w), dtype))

    @dvm.kernel
    def parallel_norm4(k, x, r, s, t, w):
        h = k.add(k.add(k.add(_f32(k, x), _f32(k, r)), _f32(k, s)), _f32(k, t))
        return k.store(k.cast(_norm_of(k, h, dtype, w), dtype))
    return parallel_norm3, parallel_norm4


def _f32(k, v):
    return k.cast(k.load(v), "float32")


def _norm_of(k, h, dtype, w):
    h = k.cast(k.cast(h, dtype), "float32")
    return k.mul(k.mul(h, k.rsqrt(k.add(k.mean(k.mul(h, h), axis=-1, keepdims=True), 1e-6))), _f32(k, w))


PARALLEL = {name: _parallel_norms(name) for name in HALVES}


@pytest.mark.parametrize("dtype", sorted(HALVES))
@pytest.mark.parametrize("cols", [128, 300, 1024, 4096, 70000])
def test_16bit_later_terms_of_a_sum_bitwise_as_reference(dtype, cols):
    """A parallel block's norm (three or four 16-bit terms) in the row form, each term past the
    first two converted through a scratch row; a 16-bit third term after f32 ones, and later
    terms of two dtypes (refused: the tile form runs them): bitwise the reference's."""
    t = HALVES[dtype]
    norm3, norm4 = PARALLEL[dtype]
    x, r, s, u = (_rows((9, cols), t, 0.5 + i) for i in range(4))
    w = RNG.standard_normal(cols).astype(t)
    assert fuse_kind_at_first_load(norm3, x, r, s, w) == FK_ROWNORM
    assert fuse_kind_at_first_load(norm4, x, r, s, u, w) == FK_ROWNORM
    _bitwise_as_reference(norm3, x, r, s, w, why=(dtype, cols))
    _bitwise_as_reference(norm4, x, r, s, u, w, why=(dtype, cols))
    xf = x.astype(np.float32)
    _bitwise_as_reference(norm3, xf, xf, s, w, why=(dtype, cols))
    _bitwise_as_reference(norm4, x, r, s.astype(np.float32), u, w, why=(dtype, cols))


def _tile(kfn, *args) -> str:
    (line,) = [ln for ln in disasm(kfn.program(*args)).splitlines() if " tile " in ln]
    return line.split(" tile ")[1].split()[0]


def test_16bit_rows_wider_than_a_tile_take_the_row_form_where_it_runs_them():
    """Rows past SINGLE_TILE_COLS are one tile when the row form takes every instruction of such
    operands (host/fuse_plan.whole_row_forms): a 16-bit norm does, a 16-bit third term of its sum
    too, a 16-bit softmax does not (the sweeps run it), nor a sum whose later terms mix dtypes."""
    bf = ml_dtypes.bfloat16
    x = RNG.standard_normal((2, 70000)).astype(bf)
    xf = x.astype(np.float32)
    assert _tile(RMSNORM["bfloat16"], x, x, x[0]) == "1x131072"
    assert _tile(half_layernorm, x, x, x[0], x[0]) == "1x131072"
    assert _tile(softmax, x) != "1x131072" and _tile(softmax, xf) == "1x131072"
    assert _tile(sum3_rmsnorm, xf, xf, x, x[0]) == "1x131072"
    assert _tile(PARALLEL["bfloat16"][1], xf, xf, x, xf, x[0]) != "1x131072"
    assert _tile(sum3_rmsnorm, xf, x, xf, x[0]) == "1x131072"
    _bitwise_as_reference(sum3_rmsnorm, xf, x, xf, x[0], why=("sum3",))
    _bitwise_as_reference(sum3_rmsnorm, xf, xf, x, x[0], why=("sum3",))
