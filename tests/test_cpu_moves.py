"""The CPU VM's raw byte moves (jit/moves): memmove's semantics for every short run, the rows of
a tile moved between a register and strided buffer rows exactly as NumPy's indexing moves them,
for every short row width of each element size, and a kernel over short rows apart bitwise the
reference VM's."""
from __future__ import annotations

import numpy as np
import pytest
from numba import njit

import dvm
from dvm.vm.cpu.jit.mem import convert_rows as _convert
from dvm.vm.cpu.jit.moves import SHORT_RUN
from dvm.vm.cpu.jit.moves import move_bytes as _move_bytes
from dvm.vm.cpu.jit.moves import move_rows as _move_rows

from test_cpu_layouts import _bitwise_as_reference

pytestmark = [pytest.mark.cpu_vm, pytest.mark.vm_once]

RNG = np.random.default_rng(11)


@njit
def _bytes(dst, src, nbytes):
    _move_bytes(dst, src, nbytes)


@njit
def _rows(is_store, reg, buf, at, rb, nrv, bn):
    _move_rows(is_store, reg, buf, at, rb, nrv, bn)


def test_move_bytes_keeps_memmove_semantics_for_overlapping_runs():
    buf = RNG.integers(0, 255, 70_000).astype(np.uint8)
    for n in (*range(SHORT_RUN + 2), 1000, 4096, 20_000):   # every short run's pieces and tail
        for src, dst in ((0, 40_000), (40_000, 0), (100, 100 + n // 2), (100 + n // 2, 100), (7, 7), (5, 6)):
            want = buf.copy()
            want[dst:dst + n] = buf[src:src + n].copy()
            got = buf.copy()
            _bytes(got.ctypes.data + dst, got.ctypes.data + src, n)
            np.testing.assert_array_equal(got, want, err_msg=f"{n} bytes from {src} to {dst}")


def _row_starts(kind: str, nrv: int, bn: int) -> np.ndarray:
    """Element offsets of nrv buffer rows of bn elements: apart (a gap after each row), in reverse,
    repeated (a broadcast operand's rows: loads only), or in groups of back-to-back rows."""
    if kind == "apart":
        return np.arange(nrv, dtype=np.int64) * (bn + 3)
    if kind == "reversed":
        return np.arange(nrv, dtype=np.int64)[::-1].copy() * (bn + 1)
    if kind == "repeated":
        return np.arange(nrv, dtype=np.int64) // 3 * (2 * bn)
    return np.arange(nrv, dtype=np.int64) // 2 * (3 * bn) + np.arange(nrv, dtype=np.int64) % 2 * bn


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.float32, np.float64])
@pytest.mark.parametrize("kind", ["apart", "reversed", "repeated", "pairs"])
def test_rows_move_like_numpy_indexing(dtype, kind):
    isz = np.dtype(dtype).itemsize
    for bn in (*range(1, SHORT_RUN // isz + 2), 100, 1000):
        for nrv in (1, 2, 7):
            rb = _row_starts(kind, nrv, bn)
            at = 5
            buf = RNG.integers(0, 100, at + int(rb.max()) + bn + 9).astype(dtype)
            reg = np.full(nrv * bn + 4, 77, dtype)   # lanes past the rows stay untouched
            idx = at + rb[:, None] + np.arange(bn)
            _rows(False, reg, buf, at, rb, nrv, bn)
            np.testing.assert_array_equal(reg[:nrv * bn].reshape(nrv, bn), buf[idx], err_msg=f"load {bn} {nrv}")
            assert (reg[nrv * bn:] == 77).all()
            if kind == "repeated":
                continue
            want = buf.copy()
            want[idx] = reg[:nrv * bn].reshape(nrv, bn) + 1
            reg[:nrv * bn] += 1
            _rows(True, reg, buf, at, rb, nrv, bn)
            np.testing.assert_array_equal(buf, want, err_msg=f"store {bn} {nrv}")


def test_rows_of_a_register_inside_the_buffer_move_like_numpy():
    """A register that aliases part of the buffer (an in-place tile) takes the general path."""
    buf = np.arange(400, dtype=np.float32)
    reg = buf[300:340]
    rb = np.arange(5, dtype=np.int64) * 11
    want = buf[rb[:, None] + np.arange(8)].reshape(-1).copy()
    _rows(False, reg, buf, 0, rb, 5, 8)
    np.testing.assert_array_equal(buf[300:340], want)


@dvm.kernel
def rope_like(k, x, c, s):
    """x * c + x * s over rows of x's heads: c and s broadcast over the heads (repeated rows)."""
    x = k.load(x)
    return k.store(k.add(k.mul(x, k.load(c)), k.mul(x, k.load(s))))


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64, np.int32, np.float16, "bfloat16"])
@pytest.mark.parametrize("lanes", [1, 3, 8, 16, 24, 33, 70])
def test_short_strided_rows_on_the_vm_as_on_the_reference(dtype, lanes):
    """A kernel whose operands' rows are short and apart (a head slice of a wider row, a
    broadcast operand's repeated rows), bitwise the reference VM's, on 1 and 2 threads: raw
    moves, and the whole-tile conversions of f16, bf16 and int32 rows (jit/mem.convert_rows)."""
    import ml_dtypes
    dtype = ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype
    n, h = 37, 3
    x = (RNG.standard_normal((n, h, 2 * lanes + 1)) * 4).astype(dtype)[..., 1:lanes + 1]
    c = (RNG.standard_normal((n, 1, lanes)) * 4).astype(dtype)
    s = (RNG.standard_normal((n, 1, lanes)) * 4).astype(dtype)
    _bitwise_as_reference(rope_like, x, c, s, why=(dtype, lanes))


@njit
def _convert_rows(is_store, reg, buf, cv, at, rb, nrv, bn):
    _convert(is_store, reg, buf, cv, at, rb, nrv, bn)


@pytest.mark.parametrize("stored", ["float16", "bfloat16", "int32"])
@pytest.mark.parametrize("kind", ["apart", "reversed", "repeated", "pairs"])
def test_converted_rows_like_numpy(stored, kind):
    """Whole-tile row conversions (f16 / bf16 bits, int32 to int64 registers), loads and stores,
    rows apart or in runs: the values NumPy's casts give, every other buffer element untouched."""
    import ml_dtypes
    from dvm.vm.cpu.abi import DT_BF16, DT_F16, DT_I32
    dt = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16, "int32": np.int32}[stored]
    cv = {"float16": DT_F16, "bfloat16": DT_BF16, "int32": DT_I32}[stored]
    reg_dt = np.int64 if stored == "int32" else np.float32
    bits = (lambda a: a.view(np.uint16)) if stored != "int32" else (lambda a: a)
    for bn in (1, 3, 8, 24, 100):
        for nrv in (1, 2, 7):
            rb = _row_starts(kind, nrv, bn)
            at = 5
            buf = (RNG.standard_normal(at + int(rb.max()) + bn + 9) * 50).astype(dt)
            idx = at + rb[:, None] + np.arange(bn)
            reg = np.zeros(nrv * bn, reg_dt)
            _convert_rows(False, reg, bits(buf), cv, at, rb, nrv, bn)
            np.testing.assert_array_equal(reg.reshape(nrv, bn), buf[idx].astype(reg_dt), err_msg=f"load {bn} {nrv}")
            if kind == "repeated":
                continue
            reg = (RNG.standard_normal(nrv * bn) * 50).astype(reg_dt)
            want = buf.copy()
            want[idx] = reg.reshape(nrv, bn).astype(dt)
            _convert_rows(True, reg, bits(buf), cv, at, rb, nrv, bn)
            np.testing.assert_array_equal(bits(buf), bits(want), err_msg=f"store {bn} {nrv}")
