"""FK_UNBIN (cpu_unbin): a math op, or an add / sub / mul with a constant, and the add / sub / mul
that consumes it, in one pass. The plan finds the runs (with and without a load between the two,
the first result on either side, the constant on either side) and refuses those whose first
result is read again, whose other operand is not a full tile (a row vector, a row's statistic, a
constant) or whose B a run of its own takes; the fused runs give bitwise what the instructions
give one by one, on 1 and 2 threads, with NaN, infinities, -0.0 and values outside exp's one-step
range (the out-of-range re-runs) in the data, partial tiles, operands that are views (rows not
back to back: z read row by row where it is dead after the run and the tile holds whole rows, as
the two halves of a gate-and-up product's rows; else the load copies and nothing fuses) and
results that reuse their first op's source register (a math op's refused at run time unless
written straight into the output; a constant's computed over that tile). Written over an input
(runtime/in_place's updates): tests/test_in_place."""
from __future__ import annotations

import numpy as np
import pytest

import dvm
from dvm.codegen.verifier import verify
from dvm.vm import reference
from dvm.vm.cpu.host import desc as cpu_desc
from dvm.vm.cpu.host.fuse_plan import without_x_load
from dvm.vm.cpu.abi import (FK_ADDSUM, FK_UNBIN, FUSED_BIN, FUSED_UN, NO_LOAD, UNBIN_C_SHIFT, UNBIN_SWAP,
                            UNBIN_X_SHIFT, UNBIN_ZDEAD)

from test_cpu_fused import _kinds, _same, _threads, _unfused
from test_cpu_vm import run_on

pytestmark = [pytest.mark.cpu_vm, pytest.mark.vm_once]   # compares the VMs itself


RNG = np.random.default_rng(5)


def _rows(kfn, *args) -> list[list[int]]:
    layout = verify(kfn.program(*args))
    return [[int(v) for v in row] for kl in layout.kernels
            for row in cpu_desc._desc(kl, len(layout.args)).fuse if row[0] == FK_UNBIN]


def _plans(kfn, *args) -> list[list[int]]:
    """The FK_UNBIN runs, each once: a run that starts with x's load (UNBIN_X_SHIFT) is left out, the
    same run without the load follows it (for tiles whose x it cannot read in place)."""
    out, rows = [], _rows(kfn, *args)
    for i, run in enumerate(rows):
        if run[7] >> UNBIN_X_SHIFT:
            nxt = rows[i + 1]
            assert nxt == without_x_load(run)
            continue
        out.append(run)
    return out


def _pair(u: str, b: str, math_first: bool):
    """b(u(x), z), or b(z, u(x)). The lowering loads z where b needs it: between the two
    instructions in either form (a run with its load)."""
    def kern(k, x, z):
        t = getattr(k, u)(k.load(x))
        zv = k.load(z)
        return k.store(getattr(k, b)(t, zv) if math_first else getattr(k, b)(zv, t))
    kern.__name__ = f"{b}_{u}_{int(math_first)}"
    return dvm.kernel(kern)


def _reuse(u: str, b: str):
    """b(u(x * z), x): the result takes the register of x * z, dead after the math op (the
    allocator's reuse of a dead source; x * z is in a register row, not a buffer): fused only where
    the result goes straight into the output's tile."""
    def kern(k, x, z):
        xv = k.load(x)
        return k.store(getattr(k, b)(getattr(k, u)(k.mul(xv, k.load(z))), xv))
    kern.__name__ = f"reuse_{b}_{u}"
    return dvm.kernel(kern)


@dvm.kernel
def math_live(k, x, z):
    """exp(x) is stored as well: no fused run."""
    e = k.exp(k.load(x))
    return k.store(k.mul(e, k.load(z))), k.store(e)


@dvm.kernel
def square(k, x):
    """tanh(x)^2: both sides of the mul are the math result: no fused run."""
    t = k.tanh(k.load(x))
    return k.store(k.mul(t, t))


SCALE = 2.5


def _scaled(u: str, b: str, first: bool, const_first: bool):
    """b(u(x, c), z) or b(z, u(x, c)), the constant c on either side of u."""
    def kern(k, x, z):
        xv = k.load(x)
        t = getattr(k, u)(SCALE, xv) if const_first else getattr(k, u)(xv, SCALE)
        zv = k.load(z)
        return k.store(getattr(k, b)(t, zv) if first else getattr(k, b)(zv, t))
    kern.__name__ = f"{b}_{u}c_{int(first)}{int(const_first)}"
    return dvm.kernel(kern)


@dvm.kernel
def scaled_reuse(k, x, z):
    """y = (x * z) * c + x, stored as y * y: y takes the register of x * z (dead after the scaling)
    and is read again, not written into an output: the run computes over that register's tile."""
    xv = k.load(x)
    y = k.add(k.mul(k.mul(xv, k.load(z)), SCALE), xv)
    return k.store(k.mul(y, y))


def _stored_later(u: str, const: bool):
    """y = u(x) * z (or (x * c) * z) read by another op before it is stored: y goes straight into
    its output's tile (peep PEEP_LATER), which the later op then reads."""
    def kern(k, x, z):
        xv = k.load(x)
        y = k.mul(getattr(k, u)(xv, SCALE) if const else getattr(k, u)(xv), k.load(z))
        return k.store(k.add(y, xv)), k.store(y)
    kern.__name__ = f"later_{u}{'c' if const else ''}"
    return dvm.kernel(kern)


@dvm.kernel
def row_scale(k, x, w, z):
    """x * w + z for a weight row w: a row vector, not a constant: no run."""
    return k.store(k.add(k.mul(k.load(x), k.load(w)), k.load(z)))


@dvm.kernel
def plus_const(k, x, z):
    """exp(x) + c and (x * z) - c: B's other operand is a constant, not a full tile: no run."""
    xv, zv = k.load(x), k.load(z)
    return k.store(k.add(k.exp(xv), SCALE)), k.store(k.sub(k.mul(xv, zv), SCALE))


@dvm.kernel
def scaled_sum(k, x, z):
    """sum(x * c + z) over rows of 64: the add and its sum are an FK_ADDSUM run: no FK_UNBIN."""
    h = k.add(k.mul(k.load(x), SCALE), k.load(z))
    return k.store(h), k.store(k.sum(h, axis=-1, keepdims=True))


PAIRS = [_pair(u, b, first) for u in FUSED_UN for b in FUSED_BIN for first in (True, False)]
REUSES = [_reuse(u, b) for u in FUSED_UN for b in FUSED_BIN]
SCALED = [_scaled(u, b, first, cf) for u in FUSED_BIN for b in FUSED_BIN for first in (True, False)
          for cf in (True, False)] + [scaled_reuse]
LATER = [_stored_later("silu", False), _stored_later("exp", False), _stored_later("mul", True),
         _stored_later("sub", True)]


def _data(shape):
    x = (RNG.standard_normal(shape) * 4).astype(np.float32)
    z = RNG.standard_normal(shape).astype(np.float32)
    flat = x.reshape(-1)
    flat[::97], flat[5::89], flat[7::101], flat[11::103] = np.nan, np.inf, -np.inf, -0.0
    flat[13::301], flat[17::307] = 95.0, -120.0   # outside exp's one-step range: the re-run
    z.reshape(-1)[3::113] = np.nan
    return x, z


def test_plan_finds_the_runs():
    a = np.ones((8, 64), np.float32)
    (run,) = _plans(_pair("silu", "mul", True), a, a)
    assert run[:2] == [FK_UNBIN, 3] and run[6] != NO_LOAD and run[7] == UNBIN_ZDEAD   # load between, t first
    (run,) = _plans(_pair("exp", "sub", False), a, a)
    assert run[:2] == [FK_UNBIN, 3] and run[6] != NO_LOAD and run[7] == UNBIN_SWAP | UNBIN_ZDEAD   # z - exp(x)
    loaded, inner = _rows(_pair("silu", "mul", True), a, a)   # x's load right before U: a run from it too
    assert loaded[1] == 4 and loaded[7] >> UNBIN_X_SHIFT > 0 and inner[1] == 3 and inner[7] >> UNBIN_X_SHIFT == 0
    (run,) = _rows(_reuse("tanh", "add"), a, a)   # U's x is a product, not a load: no run from a load
    assert run[7] >> UNBIN_X_SHIFT == 0
    for kfn in SCALED:   # a constant's U: never from x's load
        assert all(r[7] >> UNBIN_X_SHIFT == 0 for r in _rows(kfn, a, a)), kfn
    (run,) = _plans(_reuse("tanh", "add"), a, a)
    assert run[2] == run[5]   # y is x's register
    assert _plans(math_live, a, a) == [] and _plans(square, a) == []
    for kfn in PAIRS + REUSES:
        assert len(_plans(kfn, a, a)) == 1, kfn
        assert _plans(kfn, a, a)[0][7] >> UNBIN_C_SHIFT == 0, kfn   # a math op: no constant
    for kfn in LATER:
        assert len(_plans(kfn, a, a)) == 1, kfn


def test_plan_finds_the_runs_with_a_constant():
    a = np.ones((8, 64), np.float32)
    for kfn in SCALED:
        (run,) = _plans(kfn, a, a)
        assert run[7] >> UNBIN_C_SHIFT > 0, kfn   # U's other operand: the constant's register
    (run,) = _plans(_scaled("mul", "sub", False, False), a, a)
    assert run[7] & UNBIN_SWAP and run[6] != NO_LOAD   # z - x * c: swapped, z loaded between
    assert _plans(row_scale, a, a[0], a) == [] and _plans(plus_const, a, a) == []
    assert _kinds(scaled_sum, a, a) == {FK_ADDSUM}


@pytest.mark.parametrize("shape", [(64, 1024), (9, 1001), (5, 300), (2, 3, 513), (1, 70001)])
def test_fused_pairs_match_unfused(shape):
    x, z = _data(shape)
    views = [(x, z), (x[..., 1:], z[..., 1:])]   # rows not back to back: loads copy, no in-place z
    for kfn in PAIRS + REUSES + SCALED + LATER:
        for a, b in views:
            with _unfused(kfn, a, b):
                want = run_on(_threads(1), kfn, a, b)[0]
            for n in (1, 2):
                assert _same(run_on(_threads(n), kfn, a, b)[0], want), (kfn, shape, a.strides, n)
            ref = run_on(reference.run, kfn, a, b)[0]
            np.testing.assert_allclose(want, ref, rtol=2e-6, atol=1e-6, equal_nan=True, err_msg=str(kfn))


@dvm.kernel
def z_live(k, x, z):
    """exp(x) * z, and z read again after the run: z's load stays a load (no UNBIN_ZDEAD)."""
    zv = k.load(z)
    y = k.mul(k.exp(k.load(x)), zv)
    return k.store(k.add(y, zv))


def test_plan_marks_a_dead_z():
    a = np.ones((8, 64), np.float32)
    for kfn in PAIRS + [k for k in SCALED if k is not scaled_reuse]:
        (run,) = _plans(kfn, a, a)
        assert run[6] == NO_LOAD or run[7] & UNBIN_ZDEAD, kfn
    (run,) = _plans(z_live, a, a)
    assert not run[7] & UNBIN_ZDEAD


@pytest.mark.parametrize("rows,half", [(64, 256), (67, 256), (3, 1024), ((2, 5), 128), (1, 4096), (300, 64),
                                       (9, 17)])
def test_row_strided_z_matches_unfused(rows, half):
    """x and z the two halves of each row of one array (a gate-and-up product's SiLU(g) * u): x's
    and z's rows are read where they lie (x's where its load starts the run); rows past the last
    row block's end clamp to the last row; rows under ROWS_MIN_LANES lanes (64, 17) leave the run
    to the instructions (with a contiguous z: to the run after x's load)."""
    shape = (*rows, half) if isinstance(rows, tuple) else (rows, half)
    both = np.concatenate(_data(shape), axis=-1)   # (z of z's scale: exp(x) - z cancels no further than
    x, z = both[..., :half], both[..., half:]      # the other tests' data, whose tolerance is for that)
    for kfn, zz in [(k, z) for k in PAIRS + SCALED + [z_live]] + [(k, np.ascontiguousarray(z)) for k in PAIRS]:
        with _unfused(kfn, x, zz):   # (a contiguous z: x's rows alone where they lie, or x's load
            want = run_on(_threads(1), kfn, x, zz)[0]   # and the run after it)
        for n in (1, 2):
            assert _same(run_on(_threads(n), kfn, x, zz)[0], want), (kfn, shape, n)
        ref = run_on(reference.run, kfn, x, zz)[0]
        np.testing.assert_allclose(want, ref, rtol=2e-6, atol=1e-6, equal_nan=True, err_msg=str(kfn))


def test_bench_chains_fuse_and_match_unfused():
    """The chains of `dvm bench ops` that contain runs (SiLU*b, tanh(exp(a*b)+a)*b, chain8),
    fused as the builder calls them, against their instructions one by one."""
    from dvm.tools.bench_encode import chain8
    from dvm.tools.bench_ops_cases import silu_mul, tanh_exp
    x, z = _data((37, 4096))
    for kfn, args, runs in ((silu_mul, (x, z), 1), (tanh_exp, (x, z), 2), (chain8, (x,), 1)):
        assert len(_plans(kfn, *args)) == runs
        with _unfused(kfn, *args):
            want = run_on(_threads(1), kfn, *args)[0]
        assert _same(run_on(_threads(2), kfn, *args)[0], want), kfn
        assert _same(kfn(*args, vm="cpu"), want), kfn   # the builder's cached call
