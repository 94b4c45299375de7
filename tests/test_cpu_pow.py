"""The CPU VM's float32 pow (jit/powf): the float64 polynomial path on tiles of ordinary lanes
against libm's float64 pow rounded to float32, which other tiles run (and the VM ran before)."""
from __future__ import annotations

import numpy as np
import pytest

import dvm

pytestmark = pytest.mark.cpu_vm

POW = dvm.kernel(lambda k, x, y: k.store(k.pow(k.load(x), k.load(y))))


def _pow_by(e):
    return dvm.kernel(lambda k, x: k.store(k.pow(k.load(x), e)))


POW_SCALAR = {e: _pow_by(e) for e in (9, 2.5, -1.7, 37.3)}


@pytest.fixture(autouse=True)
def vm():
    return "cpu"


def _libm(x: np.ndarray, y) -> np.ndarray:
    with np.errstate(all="ignore"):
        return np.power(x.astype(np.float64), np.asarray(y, np.float32).astype(np.float64)).astype(np.float32)


def _ordinary(n: int, seed: int) -> np.ndarray:
    """Positive finite float32 values over the whole range: subnormals, near 1, huge."""
    rng = np.random.default_rng(seed)
    bits = rng.integers(1, 0x7F800000, n, dtype=np.int64).astype(np.uint32).view(np.float32)
    return np.concatenate([bits, rng.uniform(0, 2, n).astype(np.float32), np.float32([1e-45, 1e-40, 1, 3.4e38])])


@pytest.mark.parametrize("y", [9.0, 2.5, -1.7, 0.001, 37.3, -40.0, 128.0, 1e6, -1e6, 1.0, 0.0])
def test_ordinary_lanes_round_as_libm(y):
    x = _ordinary(1 << 15, 7)
    got = POW(x, np.full_like(x, y))
    np.testing.assert_array_max_ulp(got, _libm(x, y), maxulp=1)
    want = _libm(x, y)
    assert np.mean(got == want) > 0.9999, "the float64 polynomials round otherwise than libm too often"


@pytest.mark.parametrize("e", [9, 2.5, -1.7, 37.3])
def test_scalar_exponent_as_libm(e):
    x = np.random.default_rng(3).uniform(0, 1.5, (64, 1000)).astype(np.float32)
    x[3, 7] = 0.0            # +0 stays on the polynomial path: 0 or inf
    np.testing.assert_array_max_ulp(POW_SCALAR[e](x), _libm(x, e), maxulp=1)


def test_zero_bases_in_ordinary_tiles():
    x = np.float32([0.0, 2.0, 3.0, 0.5])
    for y, first in ((2.0, 0.0), (-3.0, np.inf), (0.0, 1.0), (0.5, 0.0)):
        got = POW(x, np.full_like(x, y))
        assert got[0] == first and not np.signbit(got[0])
        np.testing.assert_array_max_ulp(got[1:], _libm(x[1:], y), maxulp=1)


def test_tiles_with_other_lanes_are_libms():
    """A negative, infinite or NaN base, or an infinite or NaN exponent anywhere in a tile: C99 pow
    on every lane (signs of odd integer powers, NaN of a negative base's fraction power, pow(1, NaN),
    pow(x, 0) = 1 for NaN x, infinities)."""
    x = np.float32([-2.0, -0.0, 0.0, np.inf, -np.inf, np.nan, 1.0, 2.0, -0.5, 0.5])
    cases = {
        3.0: [-8.0, -0.0, 0.0, np.inf, -np.inf, np.nan, 1.0, 8.0, -0.125, 0.125],
        0.5: [np.nan, 0.0, 0.0, np.inf, np.inf, np.nan, 1.0, np.sqrt(2), np.nan, np.sqrt(0.5)],
        -1.0: [-0.5, -np.inf, np.inf, 0.0, -0.0, np.nan, 1.0, 0.5, -2.0, 2.0],
        0.0: [1.0] * 10,
        np.inf: [np.inf, 0.0, 0.0, np.inf, np.inf, np.nan, 1.0, np.inf, 0.0, 0.0],
        np.nan: [np.nan, np.nan, np.nan, np.nan, np.nan, np.nan, 1.0, np.nan, np.nan, np.nan],
    }
    for y, want in cases.items():
        got = POW(x, np.full_like(x, y))
        want = np.float32(want)
        np.testing.assert_array_equal(got, want, err_msg=f"pow(x, {y})")
        assert np.array_equal(np.signbit(got[~np.isnan(got)]), np.signbit(want[~np.isnan(want)])), y


def test_one_other_lane_sends_only_its_tile_to_libm():
    x = _ordinary(1 << 14, 11)
    x[100] = -3.0
    y = np.full_like(x, 3.0)
    got = POW(x, y)
    assert got[100] == np.float32(-27.0)
    np.testing.assert_array_max_ulp(np.delete(got, 100), np.delete(_libm(x, 3.0), 100), maxulp=1)
