"""float16 <-> float32 conversions of the CPU VM (jit/bits): the CPU's instructions where the
pieces are compiled for them, else bit manipulation. Both give NumPy's float16 casts for every
half and for float32 values around every rounding boundary; a NaN stays a NaN of the same sign.
bfloat16 rows (jit/mem.convert_rows: fixed-size blocks for short runs, loops for long ones) give
ml_dtypes' casts the same way."""
import numba
import numpy as np
import pytest

from dvm.vm.cpu.jit import bits
from dvm.vm.cpu.jit.mem import SHORT_CONVERT, convert_rows

pytestmark = [pytest.mark.cpu_vm, pytest.mark.vm_once]
CONVERSIONS = [("bits", bits._h2f_bits, bits._f2h_bits)]
if bits.CPU_HALVES:
    CONVERSIONS.append(("cpu", bits._h2f_cpu, bits._f2h_cpu))


def _loops(h2f, f2h):
    @numba.njit
    def widen(b, o):
        for i in range(b.size):
            o[i] = h2f(b[i])

    @numba.njit
    def narrow(x, b):
        for i in range(x.size):
            b[i] = f2h(np.float32(x[i]))
    return widen, narrow


def _same_or_nan(got: np.ndarray, want: np.ndarray, nan: np.ndarray, sign_bit: int) -> None:
    assert np.array_equal(got[~nan], want[~nan])
    assert np.array_equal(got[nan] & sign_bit, want[nan] & sign_bit)


def _f32_cases() -> np.ndarray:
    """Every float16 value, the midpoints between neighbours (ties round to even), a step either
    side of each, the range's edges and random float32 bit patterns."""
    halves = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    finite = np.sort(halves[np.isfinite(halves)].astype(np.float64))
    mid = (finite[1:] + finite[:-1]) / 2
    mids = mid.astype(np.float32)   # exact: a midpoint needs 12 significant bits
    around = np.concatenate([np.nextafter(mids, np.float32(np.inf)), np.nextafter(mids, np.float32(-np.inf))])
    edges = np.array([65504, 65519.996, 65520, 1e9, 2.0 ** -24, 2.0 ** -25, 2.0 ** -26, 1e-30, 0.0, -0.0,
                      np.inf, -np.inf, np.nan], np.float32)
    rng = np.random.default_rng(5)
    noise = rng.integers(0, 1 << 32, 200_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    return np.concatenate([halves.astype(np.float32), mids, around, edges, noise])


@pytest.mark.parametrize("name, h2f, f2h", CONVERSIONS)
def test_halves_widen_as_numpy(name, h2f, f2h):
    widen, _ = _loops(h2f, f2h)
    b = np.arange(1 << 16, dtype=np.uint16)
    got = np.empty(b.size, np.float32)
    widen(b, got)
    want = b.view(np.float16).astype(np.float32)
    _same_or_nan(got.view(np.uint32), want.view(np.uint32), np.isnan(want), 1 << 31)
    assert np.isnan(got[np.isnan(want)]).all()


@pytest.mark.parametrize("name, h2f, f2h", CONVERSIONS)
def test_floats_narrow_as_numpy(name, h2f, f2h):
    _, narrow = _loops(h2f, f2h)
    x = _f32_cases()
    got = np.empty(x.size, np.uint16)
    narrow(x, got)
    with np.errstate(over="ignore"):
        want = x.astype(np.float16)
    nan = np.isnan(x)
    _same_or_nan(got, want.view(np.uint16), nan, 1 << 15)
    assert np.isnan(got[nan].view(np.float16)).all()


def _bf16_cases() -> np.ndarray:
    """Every bfloat16 value, the midpoints between neighbours (ties round to even), a step either
    side of each, and random float32 bit patterns (NaNs with every payload among them)."""
    import ml_dtypes
    every = np.arange(1 << 16, dtype=np.uint16).view(ml_dtypes.bfloat16).astype(np.float32)
    finite = np.sort(every[np.isfinite(every)].astype(np.float64))
    mids = ((finite[1:] + finite[:-1]) / 2).astype(np.float32)   # exact: 9 significant bits
    around = np.concatenate([np.nextafter(mids, np.float32(np.inf)), np.nextafter(mids, np.float32(-np.inf))])
    noise = np.random.default_rng(6).integers(0, 1 << 32, 200_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    return np.concatenate([every, mids, around, noise])


@numba.njit
def _bf16_runs(x, out, back, run, cv):
    """x -> bf16 bits (out) -> float32 (back) by jit/mem.convert_rows, in rows of `run` lanes
    (a tile of x.size // run rows, back to back in the buffer only when run >= SHORT_CONVERT)."""
    n = x.size // run
    rb = np.arange(n) * run
    if run < SHORT_CONVERT:   # rows apart: every row is a run of its own
        rb = rb * 2
    convert_rows(True, x, out, cv, 0, rb, n, run)
    convert_rows(False, back, out, cv, 0, rb, n, run)


@pytest.mark.parametrize("run", [1, 7, 8, 9, 31, 32, 33, 64, 100, SHORT_CONVERT - 1, SHORT_CONVERT, 1000])
def test_bfloat16_rows_round_as_ml_dtypes(run):
    """float32 -> bfloat16 and back by convert_rows, whose short runs (8 to 255 lanes) go through
    the fixed-size block converters (bits.f2bf_run / bf2f_run) and whose other runs through
    loops of bits.f2bf / bf2f: ml_dtypes' values, a NaN stays a NaN of the same sign."""
    import ml_dtypes
    from dvm.vm.cpu.abi import DT_BF16
    x = _bf16_cases()
    x = x[:x.size - x.size % run]
    out = np.zeros(2 * x.size + run, np.uint16)
    back = np.empty_like(x)
    _bf16_runs(x, out, back, run, DT_BF16)
    stride = 2 if run < SHORT_CONVERT else 1
    got = out[:x.size * stride].reshape(-1, stride * run)[:, :run].reshape(-1)
    with np.errstate(invalid="ignore"):
        want = x.astype(ml_dtypes.bfloat16).view(np.uint16)
    nan = np.isnan(x)
    _same_or_nan(got, want, nan, 1 << 15)
    assert np.isnan(got[nan].view(ml_dtypes.bfloat16)).all()
    assert np.array_equal(back.view(np.uint32), (got.astype(np.uint32) << 16))
    if run < SHORT_CONVERT:   # rows apart: the lanes between them untouched
        assert not out[:x.size * 2].reshape(-1, 2 * run)[:, run:].any()
