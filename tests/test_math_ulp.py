"""Accuracy of the CPU VM's f32 math against float64, over the whole float32 range.

For each transcendental op: random float32 bit patterns (every exponent), a dense sample of the
op's interesting range, and special values. The error is measured in units of float32 spacing at
the exact (float64) result, and as relative error; special values must give exactly the
reference VM's results (NaN, signed infinities and zeros). The measured table is printed by
`python -m tests.test_math_ulp` and recorded in BENCHMARKS.md. Results below the normal float32
range (below 2^-120) are held to an absolute bound instead (SUBNORMAL_ABS).
"""
from __future__ import annotations

import math
import zlib

import numpy as np
import pytest

import dvm
from dvm.graph.ops import OP_TABLE

pytestmark = pytest.mark.cpu_vm   # measures the CPU VM

# op -> (max ULP allowed, why when above 4)
ULP_BUDGET = {op: (4.0, "") for op in (
    "exp", "exp2", "expm1", "log", "log2", "log1p", "tanh", "sigmoid", "erf", "gelu", "gelu_tanh", "silu",
    "sin", "cos", "rsqrt", "sqrt", "reciprocal")}
ULP_BUDGET["pow"] = (4.0, "")

# results this small are held to an absolute bound instead of ULPs: subnormals and the binades
# just above them, where a product inside the f32 formula (x*p(x) of erf, x*sigmoid(x) of silu)
# is itself subnormal and has lost bits
TINY = 2.0 ** -120
SUBNORMAL_ABS = 2.0 ** -136   # ~1.1e-41: 8192 steps of the f32 subnormal spacing

# where the dense sample concentrates (the whole f32 range is sampled too)
DENSE = {"exp": (-88, 88), "exp2": (-126, 127), "expm1": (-20, 20), "log": (1e-3, 1e3),
         "log2": (1e-3, 1e3), "log1p": (-0.999, 100), "tanh": (-10, 10), "sigmoid": (-30, 30),
         "erf": (-5, 5), "gelu": (-13, 8), "gelu_tanh": (-8, 8), "silu": (-30, 30),
         "sin": (-100, 100), "cos": (-100, 100), "rsqrt": (1e-6, 1e6), "sqrt": (0, 1e6),
         "reciprocal": (-1e3, 1e3)}
SPECIALS = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -1e-45, 1.17e-38, -1.17e-38,
                     3.4e38, -3.4e38, 1.0, -1.0, 0.5, 88.72, 88.73, -103.9, -87.3], np.float32)


@pytest.fixture(autouse=True)
def vm():
    """Runs once: this module measures the CPU VM against float64 directly."""
    return "cpu"


def _kernel(op: str):
    arity = OP_TABLE[op].arity

    def fn(k, *xs):
        return k.store(getattr(k, op)(*[k.load(x) for x in xs]))
    if arity == 1:
        return dvm.kernel(lambda k, x: fn(k, x))
    return dvm.kernel(lambda k, x, y: fn(k, x, y))


def _inputs(op: str, n: int = 1 << 17) -> np.ndarray:
    rng = np.random.default_rng(zlib.crc32(op.encode()))  # the same sample in every process
    bits = rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32).view(np.float32)
    bits = bits[np.isfinite(bits)]
    lo, hi = DENSE[op]
    dense = rng.uniform(lo, hi, n).astype(np.float32)
    return np.concatenate([bits, dense, SPECIALS])


def measure(op: str, n: int = 1 << 17) -> tuple[float, float, int]:
    """(max ULP, max relative error, number of finite samples) of the CPU VM for `op`."""
    ref_fn = OP_TABLE[op].ref
    kern = _kernel(op)
    if op == "pow":
        rng = np.random.default_rng(7)
        x = np.abs(_inputs("exp", n)) % np.float32(100)
        y = rng.uniform(-8, 8, x.size).astype(np.float32)
        got = kern(x, y, vm="cpu")
        exact = ref_fn(x.astype(np.float64), y.astype(np.float64))
        ref_vm = kern(x, y, vm="reference")
    else:
        x = _inputs(op, n)
        got = kern(x, vm="cpu")
        exact = ref_fn(x.astype(np.float64))
        ref_vm = kern(x, vm="reference")
    # special values: exactly the reference VM's (NaN where it has NaN, same infinities)
    nonfinite = ~np.isfinite(ref_vm)
    np.testing.assert_array_equal(got[nonfinite], ref_vm[nonfinite], err_msg=f"{op}: non-finite results")
    ok = np.isfinite(exact) & np.isfinite(ref_vm) & (np.abs(exact) < np.finfo(np.float32).max)
    exact, got = exact[ok], got[ok].astype(np.float64)
    # results below the normal f32 range: an absolute bound (the VM does not promise full
    # precision for subnormal results; they have fewer significant bits anyway)
    tiny = np.abs(exact) < TINY
    sub_err = np.abs(got[tiny] - exact[tiny]).max(initial=0.0)
    assert sub_err <= SUBNORMAL_ABS, f"{op}: subnormal-range error {sub_err:.3g} > {SUBNORMAL_ABS:.3g}"
    exact, got = exact[~tiny], got[~tiny]
    ulp = np.abs(got - exact) / np.spacing(np.abs(exact.astype(np.float32))).astype(np.float64)
    rel = np.abs(got - exact) / np.abs(exact)
    return float(ulp.max(initial=0.0)), float(rel.max(initial=0.0)), int(ok.sum())


@pytest.mark.parametrize("op", sorted(ULP_BUDGET))
def test_f32_math_within_ulp_budget(op):
    max_ulp, max_rel, n = measure(op)
    budget, why = ULP_BUDGET[op]
    assert n > 1000
    assert max_ulp <= budget, f"{op}: {max_ulp:.2f} ULP > {budget} ({why or 'no documented reason'})"
    assert math.isfinite(max_rel)


@pytest.mark.parametrize("op", ["exp", "sigmoid", "silu"])
def test_one_step_exp_paths_are_bitwise_the_full_range_functions(op):
    """exp_into / sigmoid_into scale by 2**n in one step while every lane of the span is in
    range (exp: or below EXP_ZERO, where expf is +0), else redo the span with expf / sigmoidf. The
    one-step values must be those functions' bit for bit, or a lane's result would depend on its neighbours (and on tile and thread
    splits). The ULP table above measures mostly the full-range path: its samples put an
    out-of-range lane in nearly every tile."""
    from numba import njit

    from dvm.vm.cpu.jit.mathf import EXP1_HI, EXP1_LO, exp_into, expf, sigmoid_into, sigmoidf

    @njit
    def one_step(o, a):
        if op == "exp":
            exp_into(o, a, a.shape[0])
        else:
            sigmoid_into(o, a, a.shape[0], op == "silu")

    @njit
    def full_range(o, a):
        for k in range(a.shape[0]):
            o[k] = expf(a[k]) if op == "exp" else (a[k] * sigmoidf(a[k]) if op == "silu" else sigmoidf(a[k]))

    lo, hi = (EXP1_LO, EXP1_HI) if op == "exp" else (EXP1_LO, -EXP1_LO)
    rng = np.random.default_rng(5)
    edges = np.array([lo, hi, np.nextafter(hi, np.float32(0)), 0.0, -0.0, 1e-30, -1e-30, 1e-45], np.float32)
    x = np.concatenate([rng.uniform(lo, hi, 1 << 20).astype(np.float32), edges])
    x = x[(x >= lo) & (x <= hi)]
    fast, full = np.empty_like(x), np.empty_like(x)
    one_step(fast, x)
    full_range(full, x)
    np.testing.assert_array_equal(fast.view(np.int32), full.view(np.int32))
    # one lane outside the range sends the span down the full-range path: same values again
    for bad in (np.nan, np.float32(lo) - 1, np.float32(hi) + 1):
        y = x.copy()
        y[7] = bad
        one_step(fast, y)
        full_range(full, y)
        np.testing.assert_array_equal(fast.view(np.int32), full.view(np.int32))
    if op == "exp":   # lanes below EXP_ZERO (a masked softmax's) are +0 on the one-step path
        from dvm.vm.cpu.jit.mathf import EXP_ZERO
        below = np.array([-np.inf, np.finfo(np.float32).min, -1e30, np.nextafter(EXP_ZERO, np.float32(-np.inf))],
                         np.float32)
        for extra in (None, np.nan, np.float32(-90.0), EXP_ZERO):
            y = x.copy()
            y[::3] = np.resize(below, y[::3].shape)
            if extra is not None:
                y[5] = extra
            one_step(fast, y)
            full_range(full, y)
            np.testing.assert_array_equal(fast.view(np.int32), full.view(np.int32))
            assert not fast[::3].view(np.int32).any()   # +0


@pytest.mark.parametrize("op", ["sin", "cos"])
def test_sin_cos_huge_arguments_recomputed_only_where_present(op):
    """A span holding an argument above SINCOS_BIG redoes those lanes in float64 libm (found by
    an OR over the span); every other lane keeps the polynomial's bits, with or without such a
    neighbour in its tile."""
    from dvm.vm.cpu.jit.mathf_ext import SINCOS_BIG

    kern = _kernel(op)
    rng = np.random.default_rng(11)
    x = rng.uniform(-300, 300, 20_000).astype(np.float32)
    plain = kern(x, vm="cpu")
    huge = np.array([SINCOS_BIG * 1.5, -3e7, 1e30, -3.4e38, np.inf, np.nan], np.float32)
    where = np.array([3, 4097, 9000, 12_345, 15_000, 19_999])
    y = x.copy()
    y[where] = huge
    got = kern(y, vm="cpu")
    keep = np.ones(x.size, bool)
    keep[where] = False
    np.testing.assert_array_equal(got[keep].view(np.int32), plain[keep].view(np.int32))
    with np.errstate(invalid="ignore"):   # sin / cos of inf
        exact = getattr(np, op)(huge.astype(np.float64)).astype(np.float32)
    np.testing.assert_array_equal(got[where], exact)   # NaN for inf and NaN
    fin = where[:4]
    np.testing.assert_array_equal(got[fin].view(np.int32), kern(y, vm="reference")[fin].view(np.int32))


def test_f32_reciprocal_is_the_reference_vms_bit_for_bit():
    """The CPU VM divides in float32; the reference VM's rule is the float64 quotient rounded
    once. Division is correctly rounded either way (float64 has more than 2*24+2 bits), so the
    bits agree everywhere, subnormals, zeros, infinities and NaN included."""
    kern = _kernel("reciprocal")
    x = np.concatenate([_inputs("reciprocal", 1 << 18), SPECIALS,
                        np.array([2.0 ** -149, -2.0 ** -149, 2.0 ** 127, 2.0 ** -127, 3e-39], np.float32)])
    got, want = kern(x, vm="cpu"), kern(x, vm="reference")
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    fin = ~np.isnan(want)
    np.testing.assert_array_equal(got[fin].view(np.int32), want[fin].view(np.int32))


def table() -> str:
    rows = ["| op | max ULP | max rel. error | budget | note |", "|---|---:|---:|---:|---|"]
    for op in sorted(ULP_BUDGET):
        max_ulp, max_rel, _ = measure(op)
        budget, why = ULP_BUDGET[op]
        rows.append(f"| {op} | {max_ulp:.2f} | {max_rel:.2e} | {budget:g} | {why} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(table())
