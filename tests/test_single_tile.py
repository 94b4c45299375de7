"""The single-tile stream: a row that fits one tile is reduced inside the body (rowred) and
row-level results are stored from it (storerow); it must agree bit for bit with the sweep form."""
import numpy as np
import pytest

import dvm
from dvm.codegen import encoder
from dvm.codegen.program import KHEAD_WORDS, Program


@dvm.kernel
def norm_stats(k, x, w):
    x = k.load(x)
    mu = k.mean(x, axis=-1, keepdims=True)
    d = k.sub(x, mu)
    var = k.mean(k.mul(d, d), axis=-1, keepdims=True)
    y = k.mul(k.mul(d, k.rsqrt(k.add(var, 1e-5))), k.load(w))
    return k.store(y), k.store(k.reshape(mu, (-1,))), k.store(k.argmax(x, axis=-1)), \
        k.store(k.max(x, axis=-1))


def _run_both(monkeypatch, *args):
    single = norm_stats(*args)
    text = dvm.disasm(norm_stats.program(*args))
    monkeypatch.setattr(encoder, "SINGLE_TILE_COLS", 0)
    sweeps = norm_stats(*args)
    return single, sweeps, text


@pytest.mark.parametrize("shape", [(1, 1), (3, 5), (7, 129), (5, 4096), (2, 3, 17), (2, 8192)])
def test_single_tile_matches_sweeps_bitwise(monkeypatch, shape):
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape).astype(np.float32)
    x.reshape(-1)[::7] = x.reshape(-1)[0]  # ties for argmax
    w = rng.standard_normal(shape[-1]).astype(np.float32)
    single, sweeps, text = _run_both(monkeypatch, x, w)
    assert "rowred" in text and "storerow" in text and "sweeps 1" in text
    for a, b in zip(single, sweeps):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(single[2], x.reshape(-1, shape[-1]).argmax(-1).reshape(shape[:-1]))


def test_wide_rows_and_empty_rows_use_sweeps():
    x = np.ones((2, 65537), np.float32)   # wider than SINGLE_TILE_COLS, not all row forms
    assert "rowred" not in dvm.disasm(norm_stats.program(x, np.ones(65537, np.float32)))

    @dvm.kernel
    def row_sum(k, x):
        return k.store(k.sum(k.load(x), axis=-1))
    empty = np.ones((2, 0), np.float32)
    assert "rowred" not in dvm.disasm(row_sum.program(empty))
    np.testing.assert_array_equal(row_sum(empty), np.zeros(2, np.float32))


def test_wide_rows_of_row_forms_take_one_tile_up_to_max_tile(monkeypatch):
    """Softmax, LayerNorm and RMSNorm of f32 rows wider than SINGLE_TILE_COLS take the single-tile
    stream up to MAX_TILE lanes when encoded for the CPU VM (it runs them as row forms); f16 data,
    rows over MAX_TILE and SINGLE_TILE_COLS = 0 keep the sweeps, as does a VM without row forms."""
    from dvm.codegen.program import MAX_TILE
    from dvm.frontend.library import layernorm, rmsnorm, softmax

    def single(kfn, cols, dtype=np.float32, rows=2):
        x, w = np.ones((rows, cols), dtype), np.ones(cols, dtype)
        args = {softmax: (x,), rmsnorm: (x, w), layernorm: (x, w, w)}[kfn]
        return "rowred" in dvm.disasm(kfn.program(*args, vm=vm))
    vm = "cpu"
    for kfn in (softmax, layernorm, rmsnorm):
        assert single(kfn, 65537) and single(kfn, MAX_TILE)
        assert not single(kfn, MAX_TILE + 1, rows=1) and not single(kfn, 65537, np.float16)
    vm = "reference"
    assert not single(softmax, 65537) and single(softmax, 100)
    vm = "cpu"
    monkeypatch.setattr(encoder, "SINGLE_TILE_COLS", 0)
    assert not single(softmax, 65537) and not single(softmax, 100)


def test_verifier_rejects_single_tile_stream_with_wide_rows():
    x = np.ones((3, 5), np.float32)
    prog = norm_stats.program(x, np.ones(5, np.float32))
    words = prog.words.copy()
    layout = dvm.verify(prog)
    kl = layout.kernels[0]
    off = int(words[6 + 3 * len(layout.args)])           # first kernel block
    nr = len(kl.row_sizes)
    words[off + KHEAD_WORDS + nr] = kl.bn + 1             # the column size now exceeds one tile
    with pytest.raises(dvm.VerifyError) as err:
        dvm.verify(Program(words))
    assert err.value.rule == "single_tile"
