"""FK_UNBIN over float16 and bfloat16 operands (jit/fused/unbinhalf): x's and z's 16-bit rows read
where they lie and converted in chunks, y rounded into its store's rows (plan field 8), as a 16-bit
model's SiLU(gate) * up runs under torch.compile (the math in float32 between the loads and the
store). Bitwise what the instructions give one by one (the tile form), on 1 and 2 threads; close
to the reference VM (whose exp differs in the last bit); NaN, infinities, -0.0, values past
float16's range and outside exp's one-step range in the data; partial tiles, rows under
ROWS_MIN_LANES (the tile form), a gate-and-up product's halves (row-strided views), 3-D operands,
mixed dtypes, a z computed in registers, and a result read again after its store (no field 8)."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch

import dvm
from dvm.vm import reference
from dvm.vm.cpu.abi import FK_UNBIN, FUSED_BIN, FUSED_UN, UNBIN_X_SHIFT

from test_cpu_fused import _same, _threads, _unfused
from test_cpu_unbin import _rows as _unbin_rows
from test_cpu_vm import run_on

pytestmark = [pytest.mark.cpu_vm, pytest.mark.vm_once]   # compares the VMs itself

RNG = np.random.default_rng(67)
HALVES = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16}
TORCH = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
SCALE = 0.75


def _pair(u: str, b: str, math_first: bool, out: str):
    """b(u(x), z) or b(z, u(x)) in float32 from operands of any dtype, stored as `out`."""
    def kern(k, x, z):
        t = getattr(k, u)(k.cast(k.load(x), "float32"))
        zv = k.cast(k.load(z), "float32")
        return k.store(k.cast(getattr(k, b)(t, zv) if math_first else getattr(k, b)(zv, t), out))
    kern.__name__ = f"{b}_{u}_{int(math_first)}_{out}"
    return dvm.kernel(kern)


def _scaled(u: str, b: str, out: str):
    """b(u(x, c), z): a scaled residual's form (U an add, sub or mul with a constant)."""
    def kern(k, x, z):
        t = getattr(k, u)(k.cast(k.load(x), "float32"), SCALE)
        return k.store(k.cast(getattr(k, b)(t, k.cast(k.load(z), "float32")), out))
    kern.__name__ = f"{b}_{u}c_{out}"
    return dvm.kernel(kern)


@dvm.kernel
def z_in_registers(k, x, a):
    """SiLU(x) * (a * a): z is computed, not loaded (NO_LOAD); stored as bfloat16."""
    av = k.cast(k.load(a), "float32")
    return k.store(k.cast(k.mul(k.silu(k.cast(k.load(x), "float32")), k.mul(av, av)), "bfloat16"))


@dvm.kernel
def read_after_store(k, x, z):
    """SiLU(x) * z stored, then read again: no store in the plan (field 8 = 0), y in registers."""
    y = k.mul(k.silu(k.cast(k.load(x), "float32")), k.cast(k.load(z), "float32"))
    return k.store(k.cast(y, "bfloat16")), k.store(k.cast(k.add(y, 1.0), "bfloat16"))


def _data(shape, dt):
    """x at 4x z's scale, with NaN, infinities, -0.0, ties of the bfloat16 rounding and values
    outside exp's one-step range (and float16's) in x; NaN in z."""
    x = (RNG.standard_normal(shape) * 4).astype(np.float32)
    z = RNG.standard_normal(shape).astype(np.float32)
    flat = x.reshape(-1)
    flat[::97], flat[5::89], flat[7::101], flat[11::103] = np.nan, np.inf, -np.inf, -0.0
    flat[13::301], flat[17::307], flat[19::311] = 95.0, -120.0, np.float32(1.0 + 2.0 ** -8)
    z.reshape(-1)[3::113] = np.nan
    with np.errstate(over="ignore"):
        return x.astype(dt), z.astype(dt)


def _check(kfn, *args, why=()):
    """Bitwise the instructions one by one on 1 and 2 threads; close to the reference VM with
    torch.testing.assert_close's defaults for the output's dtype."""
    with _unfused(kfn, *args):
        want = run_on(_threads(1), kfn, *args)
    for n in (1, 2):
        got = run_on(_threads(n), kfn, *args)
        assert all(_same(g, w) for g, w in zip(got, want)), (kfn, *why, n)
    for w, r in zip(want, run_on(reference.run, kfn, *args)):
        wt, rt = (torch.from_numpy(v.astype(np.float32)) for v in (w, r))
        torch.testing.assert_close(wt.to(TORCH[str(w.dtype)]), rt.to(TORCH[str(r.dtype)]), equal_nan=True,
                                   msg=lambda m: f"{kfn} {why}: {m}")


PAIRS = {dt: [_pair(u, b, first, dt) for u in FUSED_UN for b in FUSED_BIN for first in (True, False)]
         for dt in HALVES}
SCALED = {dt: [_scaled(u, b, dt) for u in FUSED_BIN for b in FUSED_BIN] for dt in HALVES}
SILU_PAIRS = [_pair("silu", b, first, "bfloat16") for b in FUSED_BIN for first in (True, False)]


@pytest.mark.parametrize("dtype", sorted(HALVES))
@pytest.mark.parametrize("shape", [(9, 128), (9, 300), (7, 4096), (2, 20000), (67, 256), (3, 5, 600), (300, 64),
                                   (5, 17)])
def test_16bit_runs_match_the_instructions(dtype, shape):
    """Every math op and constant form with each B, operands and output of one 16-bit dtype."""
    x, z = _data(shape, HALVES[dtype])
    for kfn in PAIRS[dtype] + SCALED[dtype]:
        _check(kfn, x, z, why=(dtype, shape))


@pytest.mark.parametrize("rows,half", [(64, 256), (67, 256), (3, 1024), (1, 11008), (300, 64)])
def test_gate_and_up_halves(rows, half):
    """x and z the two halves of each row of one bfloat16 product (row-strided views); rows past
    the last row block clamp to its last row; rows of 64 lanes take the tile form."""
    both = np.concatenate(_data((rows, half), ml_dtypes.bfloat16), axis=-1)
    x, z = both[:, :half], both[:, half:]
    for kfn in SILU_PAIRS:
        _check(kfn, x, z, why=(rows, half))


@pytest.mark.parametrize("cols", [300, 4096])
def test_mixed_dtypes_and_registers(cols):
    """bfloat16 x with a float32 z into float16; float32 operands into bfloat16 (the store alone
    16-bit); float16 into float32; a z computed in registers; a result read after its store."""
    xb, zb = _data((9, cols), ml_dtypes.bfloat16)
    xf, zf = _data((9, cols), np.float32)
    xh, zh = _data((9, cols), np.float16)
    silu_mul = {dt: _pair("silu", "mul", True, dt) for dt in ("bfloat16", "float16", "float32")}
    _check(silu_mul["float16"], xb, zf, why=(cols,))
    _check(silu_mul["bfloat16"], xf, zf, why=(cols,))
    _check(silu_mul["float32"], xh, zh, why=(cols,))
    _check(z_in_registers, xb, zb, why=(cols,))
    _check(read_after_store, xb, zb, why=(cols,))


def test_plan_names_the_store():
    """Field 8: the operand + 1 of the store right after the run (on the run from x's load and the
    run after it), 0 when y is read after its store."""
    x = np.ones((8, 256), ml_dtypes.bfloat16)
    rows = _unbin_rows(_pair("silu", "mul", True, "bfloat16"), x, x)
    assert [r[7] >> UNBIN_X_SHIFT > 0 for r in rows] == [True, False]
    assert all(r[0] == FK_UNBIN and r[8] == 3 for r in rows)   # operands: x, z, the output
    assert all(r[8] == 0 for r in _unbin_rows(read_after_store, x, x))
