"""The CPU VM's fused accumulations (FK_LOADACC: `load ; acc`, FK_CSQACC: a centered
sum of squares over the sweeps) and the row blocks of column-major reductions
(column_tiles.column_major_rows): bitwise against the reference VM on 1 and 2 threads; column-major
tiles only for reductions (elementwise kernels over transposed operands keep full-width tiles)."""
from __future__ import annotations

import numpy as np
import pytest

import dvm
from dvm.codegen import column_tiles, encoder
from dvm.codegen.verifier import verify
from dvm.frontend.library import layernorm
from dvm.tools.bench_ops_cases import max_first, max_last, sum_first, sum_last
from dvm.vm import cpu, reference
from dvm.vm.cpu.abi import FK_CSQACC, FK_LOADACC

from test_cpu_fused import _kinds
from test_cpu_layouts import RNG, _bitwise_as_reference
from test_cpu_vm import run_on

pytestmark = [pytest.mark.cpu_vm, pytest.mark.vm_once]   # compares the VMs itself


@dvm.kernel
def min_first(k, x):
    return k.store(k.min(k.load(x), axis=0))


@dvm.kernel
def prod_first(k, x):
    return k.store(k.prod(k.load(x), axis=0))


@dvm.kernel
def min_last(k, x):
    return k.store(k.min(k.load(x), axis=-1))


FIRST = (sum_first, max_first, min_first, prod_first)   # one reduction of a load each: the fused run
LAST = (sum_last, max_last, min_last)


def _with_specials(shape, dtype=np.float32) -> np.ndarray:
    x = RNG.standard_normal(shape).astype(dtype)
    flat = x.reshape(-1)
    picks = RNG.choice(flat.size, size=min(flat.size, 12), replace=False)
    flat[picks] = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 1e30, -1e30, 3e-39, np.nan, -0.0, 7.0, -7.0][:picks.size],
                           dtype)
    x[:, 3] = -0.0   # a column of -0.0: its sum is -0.0 only if nothing turns it into +0.0
    return x


@pytest.mark.parametrize("kfn", FIRST)
@pytest.mark.parametrize("shape", [(100, 37), (64, 50), (250, 9), (33, 300), (4, 40), (3, 5000)])
def test_first_axis_row_blocks(monkeypatch, shape, kfn):
    """Kept rows split into blocks (small ones here: the encoder's limits lowered; 5000 kept rows
    take blocks of COLUMN_MAJOR_BM anyway), a partial last block among them; each block's tile
    columns are read from the buffer."""
    monkeypatch.setattr(column_tiles, "COLUMN_MAJOR_BLOCK_ELEMS", 256)
    monkeypatch.setattr(column_tiles, "COLUMN_MAJOR_MIN_BM", 16)
    x = _with_specials(shape)   # C order: the reduced axis 0 strided, the kept axis contiguous
    if kfn is prod_first:
        x = np.where(np.isfinite(x), 1.0 + 0.01 * x, x).astype(np.float32)
    n, R = shape
    bm = dvm.verify(kfn.program(x)).kernels[0].bm
    split = R > column_tiles.COLUMN_MAJOR_WHOLE or min(8, n * R // 256, -(-R // 16)) >= 2
    assert (bm < R) == split and (bm == R or bm % 16 == 0), (shape, bm)
    _bitwise_as_reference(kfn, x, why=(shape,))


def test_default_blocks_for_large_reductions():
    """Without the test overrides: a 1000x1001 sum over axis 0 takes two row blocks (work units
    the threads share), 4096x4096 eight, a 64x64 one stays whole."""
    k = dvm.verify(sum_first.program(np.zeros((1000, 1001), np.float32))).kernels[0]
    assert (k.bm, k.bn) == (512, 32)
    k = dvm.verify(sum_first.program(np.zeros((4096, 4096), np.float32))).kernels[0]
    assert (k.bm, k.bn) == (512, 32)
    assert dvm.verify(sum_first.program(np.zeros((64, 64), np.float32))).kernels[0].bm == 64


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_first_axis_other_dtypes_take_the_load(monkeypatch, dtype):
    """Operands other than f32 are converted by the load: the fused run declines them."""
    monkeypatch.setattr(column_tiles, "COLUMN_MAJOR_BLOCK_ELEMS", 256)
    monkeypatch.setattr(column_tiles, "COLUMN_MAJOR_MIN_BM", 16)
    _bitwise_as_reference(sum_first, _with_specials((37, 100), dtype), why=(dtype,))


@pytest.mark.parametrize("kfn", LAST)
@pytest.mark.parametrize("shape", [(5, 3000), (3, 7, 1030), (40, 260)])
def test_row_sweeps_read_rows_in_place(monkeypatch, shape, kfn):
    """Rows over several tiles (the sweeps, pinned by SINGLE_TILE_COLS = 0): `load ; acc` reads
    the operand's rows, also a partial last tile and the rows of a strided view."""
    monkeypatch.setattr(encoder, "SINGLE_TILE_COLS", 0)
    x = _with_specials((int(np.prod(shape[:-1])), shape[-1])).reshape(shape)
    _bitwise_as_reference(kfn, x, why=(shape,))
    if len(shape) == 2:
        wide = np.zeros((shape[0], shape[1] + 5), np.float32)
        wide[:, 2:-3] = x
        _bitwise_as_reference(kfn, wide[:, 2:-3], why=(shape, "view"))


@dvm.kernel
def variance(k, x):
    """The centered sum of squares alone (its mean from a first sweep)."""
    x = k.load(x)
    d = k.sub(x, k.mean(x, axis=-1, keepdims=True))
    return k.store(k.sum(k.mul(d, d), axis=-1))


@pytest.mark.parametrize("shape", [(5, 3000), (3, 7, 1030), (40, 260)])
def test_centered_squares_over_the_sweeps(monkeypatch, shape):
    """LayerNorm and a variance over rows of several tiles: FK_CSQACC (and FK_LOADACC) in the plan,
    bitwise against the reference VM, signed zeros and specials included."""
    monkeypatch.setattr(encoder, "SINGLE_TILE_COLS", 0)
    x = _with_specials((int(np.prod(shape[:-1])), shape[-1])).reshape(shape)
    w, b = RNG.standard_normal(shape[-1]).astype(np.float32), RNG.standard_normal(shape[-1]).astype(np.float32)
    assert {FK_CSQACC, FK_LOADACC} <= _kinds(layernorm, x, w, b)
    _bitwise_as_reference(layernorm, x, w, b, why=(shape,))
    _bitwise_as_reference(variance, x, why=(shape,))
    x[np.isnan(x) | np.isinf(x)] = 2.0   # finite rows: a NaN would hide a wrong sum
    _bitwise_as_reference(variance, x, why=(shape, "finite"))


@dvm.kernel
def copy_two(k, a, b):
    """Two elementwise copies in one kernel (HF's repeat_kv of k and v)."""
    return k.store(k.load(a)), k.store(k.neg(k.load(b)))


@pytest.mark.parametrize("S,D", [(6144, 128), (37, 130), (1000, 64)])
def test_transposed_elementwise_operands_keep_full_width_tiles(S, D):
    """An elementwise kernel whose operands are contiguous along the rows (transposed views) keeps
    row-major tiles of the row's width: the tall, narrow column-major tiles of a reduction over
    axis 0 (1024 x 4) made every row a 4-lane strided load and store (two k / v copies of 128 x
    128 heads: 18.9 ms against eager's 0.37; with full-width tiles 2.2 ms), and the same values."""
    a, b = (RNG.standard_normal((D, S)).astype(np.float32).T for _ in range(2))   # (S, D), rows contiguous
    assert all(kl.bn >= min(D, 64) for kl in verify(copy_two.program(a, b)).kernels)
    for got, want in zip(run_on(cpu.run, copy_two, a, b), run_on(reference.run, copy_two, a, b)):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(run_on(cpu.run, copy_two, a, b)[1], -b)
