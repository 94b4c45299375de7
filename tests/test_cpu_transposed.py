"""Transposed operands of row-major tiles (jit/moves.move_transposed, jit/mem.mem_tile): an operand
whose innermost axis runs along the tile's rows moves in 8x8 blocks (transpose8) with the edges
lane by lane. The moves equal NumPy's transposed indexing for every block edge, loads and stores,
touching nothing else; kernels over transposed views of random shapes, dtypes and batch axes are
bitwise the reference VM's (Hypothesis)."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from numba import njit

import dvm
from dvm.vm.cpu.jit.moves import BLOCK_T
from dvm.vm.cpu.jit.moves import move_transposed as _move_transposed

from test_cpu_layouts import _bitwise_as_reference

pytestmark = [pytest.mark.cpu_vm, pytest.mark.vm_once]

RNG = np.random.default_rng(23)
EDGES = (1, 2, BLOCK_T - 1, BLOCK_T, BLOCK_T + 1, 2 * BLOCK_T, 3 * BLOCK_T + 5)


@pytest.fixture(scope="module", autouse=True)
def _fast_pieces():
    """The kernels run on the VM's fast pieces (jit/mem's tile moves), not the tier before them."""
    from dvm.vm import cpu
    cpu.warm_up(wait_fast=True)


@njit
def _moved(is_store, reg, buf, at, rb, stride, nrv, ncv, bn):
    return _move_transposed(is_store, reg, buf, at, rb, stride, nrv, ncv, bn)


def _row_starts(kind: str, nrv: int, stride: int) -> np.ndarray:
    """One run of consecutive rows, or runs of 5 rows a batch apart (rows of a tile crossing
    batches of a transposed operand)."""
    i = np.arange(nrv, dtype=np.int64)
    return i if kind == "one run" else (i // 5) * (5 + stride * 40) + i % 5


@pytest.mark.parametrize("dtype", [np.float32, np.int32])
@pytest.mark.parametrize("runs", ["one run", "runs of 5"])
@pytest.mark.parametrize("nrv", EDGES)
@pytest.mark.parametrize("ncv", EDGES)
def test_transposed_moves_like_numpy(dtype, runs, nrv, ncv):
    """Lanes (i, k) <-> buf[at + rb[i] + k*stride]: loads fill exactly the valid lanes, stores
    write exactly those elements (the 4-byte patterns as they are: NaN payloads, integers)."""
    at, bn = 3, ncv + 5
    stride = nrv + 2 if runs == "one run" else 5 + 2
    rb = _row_starts(runs, nrv, stride)
    n = at + int(rb[-1]) + (ncv - 1) * stride + 8
    bits = RNG.integers(-2 ** 31, 2 ** 31, n, dtype=np.int64).astype(np.int32)
    buf = bits.view(dtype)
    idx = at + rb[:, None] + np.arange(ncv)[None, :] * stride   # (i, k)
    reg = np.full(nrv * bn, 7, np.int32).view(dtype)
    assert _moved(False, reg, buf, at, rb, stride, nrv, ncv, bn)
    tile = reg.view(np.int32).reshape(nrv, bn)
    np.testing.assert_array_equal(tile[:, :ncv], bits[idx])
    assert (tile[:, ncv:] == 7).all(), "lanes past the valid columns untouched"

    reg = RNG.integers(-2 ** 31, 2 ** 31, nrv * bn, dtype=np.int64).astype(np.int32)
    out = bits.copy()
    assert _moved(True, reg.view(dtype), out.view(dtype), at, rb, stride, nrv, ncv, bn)
    want = bits.copy()
    want[idx] = reg.reshape(nrv, bn)[:, :ncv]
    np.testing.assert_array_equal(out, want)


def test_other_lane_types_are_not_moved():
    """A conversion (int32 into int64 lanes) or another size: move_transposed leaves them to the
    row path, untouched."""
    rb = np.arange(8, dtype=np.int64)
    for reg, buf in ((np.zeros(64, np.int64), np.ones(100, np.int32)), (np.zeros(64), np.ones(100))):
        assert not _moved(False, reg, buf, 0, rb, 9, 8, 8, 8)
        assert not reg.any()


@dvm.kernel
def _scaled_sum(k, x, y):
    return k.store(k.add(k.mul(k.load(x), 3), k.load(y)))


@dvm.kernel
def _copied(k, x):
    return k.store(k.load(x))


_DTYPES = {"float32": np.float32, "int32": np.int32, "float64": np.float64, "float16": np.float16,
           "bfloat16": ml_dtypes.bfloat16}


@settings(max_examples=40, deadline=None)
@given(m=st.integers(1, 80), n=st.integers(1, 80), batch=st.integers(0, 3),
       dtype=st.sampled_from(sorted(_DTYPES)), seed=st.integers(0, 2 ** 16))
def test_kernels_over_transposed_views_match_the_reference(m, n, batch, dtype, seed):
    """x a transposed view of its last two axes (batches of them: tiles crossing a batch have
    rows that are not consecutive), y row-major; the copy and x*3 + y bitwise the reference VM's
    on 1 and 2 threads and NumPy's values. 4-byte dtypes take transpose8, the others the row path."""
    dt = _DTYPES[dtype]
    rng = np.random.default_rng(seed)
    lead = (batch,) if batch else ()
    x = np.swapaxes((rng.standard_normal((*lead, n, m)) * 8).astype(dt), -1, -2)
    y = (rng.standard_normal((*lead, m, n)) * 8).astype(dt)
    _bitwise_as_reference(_copied, x, why=(dtype, x.shape))
    _bitwise_as_reference(_scaled_sum, x, y, why=(dtype, x.shape))
    np.testing.assert_array_equal(_copied(x), x)


@pytest.mark.parametrize("shape", [(2048, 128), (1000, 37), (3, 130, 72), (32, 128, 64), (9, 8)])
def test_large_transposed_copies_match_numpy(shape):
    """Whole tiles of 8x8 blocks and their edges on both threads' row ranges; tiles whose rows
    cross batches (runs of consecutive rows)."""
    x = np.swapaxes(RNG.standard_normal(shape[:-2] + shape[-2:][::-1]).astype(np.float32), -1, -2)
    _bitwise_as_reference(_copied, x, why=(shape,))
    np.testing.assert_array_equal(_copied(x), x)
