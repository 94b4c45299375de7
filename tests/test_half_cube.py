"""float16 / bfloat16 `x ** 3` (GPT-2's gelu_new) lowers to (x*x)*x in the f32 registers
(graph/build._pow_by_scalar), bitwise the pow it replaced: every value's cube, exact in float64,
rounded to float32 and then to the dtype where stored."""
import numpy as np
import pytest

import dvm
from helpers import NP_DTYPE, run_ew


def _cube(k, x):
    return k.store(k.pow(k.load(x), 3))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_every_half_value_cubed_as_the_f64_cube_rounded_twice(dtype):
    x = np.arange(1 << 16, dtype=np.uint16).view(NP_DTYPE[dtype]).reshape(256, 256)
    got = run_ew("pow", x, 3)
    with np.errstate(over="ignore", invalid="ignore"):
        want = (x.astype(np.float64) ** 3).astype(np.float32).astype(NP_DTYPE[dtype])
    assert got.dtype == want.dtype
    nan = np.isnan(want.astype(np.float32))
    assert np.array_equal(np.isnan(got.astype(np.float32)), nan)
    assert np.array_equal(got.view(np.uint16)[~nan], want.view(np.uint16)[~nan])


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_cube_is_two_products(dtype):
    x = np.ones((4, 8), NP_DTYPE[dtype])
    text = dvm.disasm(dvm.kernel(_cube).program(x))
    assert "pow" not in text and text.count("mul.f32") == 2, text
