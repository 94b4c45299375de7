"""Streams that reduce over a strided axis and read their rows again with no row form (x minus its
mean over axis 0, x over its max, x scaled by its root mean square): over at most
column_tiles.WHOLE_REREAD_ROWS kept rows, tiles of every kept row in column-major registers (one
contiguous run each); bitwise the reference VM's on 1 and 2 threads for random shapes, dtypes and
special values (Hypothesis). A softmax (a row form) and an operand varying along the reduced axis
only keep the tiles they had."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import dvm
from dvm.codegen import column_tiles
from dvm.codegen.encoder import ROW_TILE_ELEMS
from dvm.codegen.limits import pow2_at_least
from dvm.tools.bench_ops_cases import centre_first, softmax_first
from dvm.vm.cpu.host.desc import prog_desc

from test_cpu_layouts import _bitwise_as_reference

pytestmark = [pytest.mark.cpu_vm, pytest.mark.vm_once]   # compares the VMs itself


@dvm.kernel
def over_max(k, x):
    v = k.load(x)
    return k.store(k.div(v, k.max(v, axis=0, keepdims=True)))


@dvm.kernel
def rms_scaled(k, x):
    v = k.load(x)
    return k.store(k.mul(v, k.rsqrt(k.add(k.mean(k.mul(v, v), axis=0, keepdims=True), 1e-6))))


@dvm.kernel
def centre_middle(k, x):
    """over the middle axis of (batch, S, D): kept rows batch x D"""
    v = k.load(x)
    return k.store(k.sub(v, k.mean(v, axis=1, keepdims=True)))


@dvm.kernel
def centre_plus_reduced_weight(k, x, w):
    """w varies along the reduced axis only"""
    v = k.load(x)
    return k.store(k.add(k.sub(v, k.sum(v, axis=0, keepdims=True)), k.load(w)))


DTYPES = {"f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16}
SPECIALS = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 3e-39, 1e4, -1e4], np.float32)


def _tiles(kfn, *args):
    """(bm, rows, column-major registers) of the kernel's one kernel."""
    layout = dvm.verify(kfn.program(*args))
    kl = layout.kernels[0]
    return kl.bm, kl.rows, bool(prog_desc(layout)[1][0].transposed)


def _data(shape, dtype, specials: bool, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32)
    if specials:
        flat = x.reshape(-1)
        picks = rng.choice(flat.size, size=min(flat.size, SPECIALS.size), replace=False)
        flat[picks] = SPECIALS[:picks.size]
    return x.astype(dtype)


@settings(max_examples=25, deadline=None)
@given(kind=st.sampled_from(["centre", "over_max", "rms_scaled"]), n=st.integers(1, 1500),
       kept=st.sampled_from([1, 2, 7, 16, 17, 64, 100, 256, 300, 513, 1001, 2048]),
       dtype=st.sampled_from(sorted(DTYPES)), specials=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_whole_kept_rows_match_the_reference(kind, n, kept, dtype, specials, seed):
    kfn = {"centre": centre_first, "over_max": over_max, "rms_scaled": rms_scaled}[kind]
    x = _data((n, kept), DTYPES[dtype], specials, seed)
    bm, rows, transposed = _tiles(kfn, x)
    single_tile_holds_all = kept * pow2_at_least(n) <= ROW_TILE_ELEMS   # (one sweep, as before)
    if n > 1 and 1 < kept <= column_tiles.WHOLE_REREAD_ROWS and not single_tile_holds_all:
        assert bm >= rows and transposed, (kind, x.shape, bm)
    _bitwise_as_reference(kfn, x, why=(kind, x.shape, dtype))


@pytest.mark.parametrize("shape", [(3, 2000, 40), (2, 33, 256), (5, 700, 3)])
def test_batched_kept_rows_match_the_reference(shape):
    """Kept rows over two dims (batch, D) around the reduced one."""
    x = _data(shape, np.float32, True, 5)
    _bitwise_as_reference(centre_middle, x, why=(shape,))


def test_large_whole_tiles():
    """4096x64, 65536x16 and 300x4096 (tiles of 256, 1,024 and 4 strided columns): whole tiles, the
    reference's bits; past WHOLE_REREAD_ROWS kept rows, strips."""
    for shape in ((4096, 64), (65536, 16), (300, column_tiles.WHOLE_REREAD_ROWS)):
        x = _data(shape, np.float32, True, 9)
        bm, rows, transposed = _tiles(centre_first, x)
        assert (bm, transposed) == (rows, True), shape
        _bitwise_as_reference(centre_first, x, why=(shape,))
    x = _data((300, column_tiles.WHOLE_REREAD_ROWS + 1), np.float32, True, 10)
    bm, rows, _ = _tiles(centre_first, x)
    assert bm < rows
    _bitwise_as_reference(centre_first, x, why=("past the whole tiles",))


def test_row_forms_and_reduced_axis_operands_keep_their_tiles():
    """A softmax over axis 0 (a row form) and an operand varying along the reduced axis only
    (column-major registers would expand it over every tile) keep strips of kept rows."""
    x = _data((4096, 64), np.float32, False, 3)
    assert _tiles(softmax_first, x)[0] < 64
    w = _data((4096, 1), np.float32, False, 4)
    bm, _, transposed = _tiles(centre_plus_reduced_weight, x, w)
    assert bm < 64 and not transposed
    _bitwise_as_reference(centre_plus_reduced_weight, x, w, why=("weight",))
