"""The single-tile stream: a row that fits one tile is reduced inside the body (rowred) and
row-level results are stored from it (storerow); it must agree bit for bit with the sweep form,
whatever its tile width (a power of two, or for the CPU VM the row rounded up: tight rows)."""
import functools
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

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


@dvm.kernel
def shifted_stats(k, x, m):
    y = k.add(k.load(x), k.load(m))
    e = k.exp(k.sub(y, k.max(y, axis=-1, keepdims=True)))
    return k.store(k.div(e, k.sum(e, axis=-1, keepdims=True))), k.store(k.sum(k.mul(y, y), axis=-1)), \
        k.store(k.max(y, axis=-1))


def _kernel_tiles(kfn, *args, vm: str) -> tuple[int, int, int]:
    """(tile height, tile width, sweeps) of kfn's first kernel encoded for VM vm."""
    m = re.search(r"tile (\d+)x(\d+)\s+sweeps (\d+)", dvm.disasm(kfn.program(*args, vm=vm)))
    return int(m.group(1)), int(m.group(2)), int(m.group(3))


def _outputs_for(monkeypatch, vm_run, vm: str, *args) -> list:
    """shifted_stats' outputs from its program encoded for VM vm, run by vm_run."""
    from test_cpu_vm import run_on
    monkeypatch.setattr(shifted_stats, "program", functools.partial(type(shifted_stats).program, shifted_stats, vm=vm))
    return run_on(vm_run, shifted_stats, *args)


@pytest.mark.parametrize("cols", [300, 513, 768, 1025, 3000])
def test_tight_rows_take_their_width_rounded_up_with_the_same_bits(monkeypatch, cols):
    """Rows of a single-tile stream that no row form takes, over TIGHT_MIN_COLS columns: encoded
    for the CPU VM, a tile as wide as the row rounded up to TIGHT_LANES (where that is at most
    TIGHT_MOST of the next power of two), for the reference VM the power of two; the same bits
    from either tile on either VM (the softmax's exp: each VM's own)."""
    from dvm.vm import cpu, reference
    rng = np.random.default_rng(cols)
    x = (rng.standard_normal((37, cols)) * 4).astype(np.float32)
    m = rng.standard_normal((1, cols)).astype(np.float32)
    x[3, 5], x[4, -1] = np.inf, np.nan
    pow2, tight = encoder._pow2_at_least(cols), -(-cols // encoder.TIGHT_LANES) * encoder.TIGHT_LANES
    assert _kernel_tiles(shifted_stats, x, m, vm="cpu")[1] == (tight if tight <= encoder.TIGHT_MOST * pow2 else pow2)
    assert _kernel_tiles(shifted_stats, x, m, vm="reference")[1] == pow2
    runs = {(vm_name, vm): _outputs_for(monkeypatch, run, vm, x, m)
            for vm_name, run in (("ref", reference.run), ("cpu", cpu.run)) for vm in ("cpu", "reference")}
    for vm_name in ("ref", "cpu"):
        for a, b in zip(runs[vm_name, "cpu"], runs[vm_name, "reference"]):
            np.testing.assert_array_equal(a, b)
    for a, b in zip(runs["cpu", "cpu"][1:], runs["ref", "cpu"][1:]):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(runs["cpu", "cpu"][0], runs["ref", "cpu"][0], rtol=1e-5, atol=1e-6)


def test_row_forms_plain_reductions_and_narrow_rows_keep_the_power_of_two():
    """A softmax or LayerNorm (the CPU VM's row forms need a power of two), a row sum of loaded
    values (no lanes to save; its tree reads a power of two's valid lanes in place) and rows of
    at most TIGHT_MIN_COLS columns keep the next power of two."""
    from dvm.frontend.library import layernorm, softmax
    from dvm.tools.bench_ops_cases import sum_last
    x, w = np.ones((4, 513), np.float32), np.ones(513, np.float32)
    assert _kernel_tiles(softmax, x, vm="cpu")[1] == 1024 and _kernel_tiles(layernorm, x, w, w, vm="cpu")[1] == 1024
    assert _kernel_tiles(sum_last, x, vm="cpu")[1] == 1024
    narrow = np.ones((4, 150), np.float32)
    assert _kernel_tiles(shifted_stats, narrow, narrow[:1], vm="cpu")[1] == 256


@dvm.kernel
def channel_norm(k, x, w):
    """LayerNorm (weight) over the last axis, and the plain sum over it."""
    x = k.load(x)
    d = k.sub(x, k.mean(x, axis=-1, keepdims=True))
    y = k.mul(k.mul(d, k.rsqrt(k.add(k.mean(k.mul(d, d), axis=-1, keepdims=True), 1e-5))), k.load(w))
    return k.store(y), k.store(k.sum(x, axis=-1))


@dvm.kernel
def channel_sum(k, x):
    return k.store(k.sum(k.load(x), axis=-1))


@pytest.mark.parametrize("channels, positions", [(32, 1024), (16, 300), (96, 4100)])
def test_a_norm_over_strided_columns_keeps_the_single_tile_stream_for_the_cpu_vm(monkeypatch, channels, positions):
    """A LayerNorm over the channels of a channels-first image (its rows contiguous, its columns
    strided): encoded for the CPU VM, the single-tile stream (Target.rereads_rows: its rows are
    read again after their reduction); for the reference VM, column-major tiles of the sweeps; a
    plain sum keeps those for both. Each encoding gives the same bits on either VM, the CPU VM's
    those of a contiguous copy's (the sweeps of column-major tiles sum in another order)."""
    from test_cpu_vm import run_on

    from dvm.vm import cpu, reference
    rng = np.random.default_rng(channels)
    image = (rng.standard_normal((channels, positions)) * 3).astype(np.float32)
    image[3, 5], image[4, -1] = np.inf, np.nan
    x, w = image.T, rng.standard_normal(channels).astype(np.float32)   # (positions, channels), strided
    width, sweeps = _kernel_tiles(channel_norm, x, w, vm="cpu")[1:]
    assert width >= channels and sweeps == 1   # (a whole row in a tile)
    assert _kernel_tiles(channel_norm, x, w, vm="reference")[2] > 1
    assert _kernel_tiles(channel_sum, x, vm="cpu")[1:] == _kernel_tiles(channel_sum, x, vm="reference")[1:]
    runs = {}
    for vm_name, run in (("ref", reference.run), ("cpu", cpu.run)):
        for vm in ("cpu", "reference"):
            monkeypatch.setattr(channel_norm, "program", functools.partial(type(channel_norm).program, channel_norm,
                                                                           vm=vm))
            runs[vm_name, vm] = run_on(run, channel_norm, x, w)
    runs["cpu", "contiguous"] = run_on(cpu.run, channel_norm, np.ascontiguousarray(x), w)
    for pair in ((("ref", "cpu"), ("cpu", "cpu")), (("cpu", "contiguous"), ("cpu", "cpu")),
                 (("ref", "reference"), ("cpu", "reference"))):
        for a, b in zip(runs[pair[0]], runs[pair[1]]):
            np.testing.assert_array_equal(a, b)
    for a, b in zip(runs["cpu", "cpu"], runs["cpu", "reference"]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows, cols, strips", [(64, 4100, True), (40, 3000, True), (16, 4100, False),
                                                (64, 2048, False), (600, 4097, False)])
def test_a_norm_over_long_strided_rows_sweeps_strips_of_rows_for_the_cpu_vm(rows, cols, strips):
    """A norm over more than 2048 strided columns (a softmax over the sequence axis of a heads-last
    layout) would fill the single-tile stream's tiles with a few strided rows, each cache line read
    once per row: with 32 or more contiguous rows and at most 8 MiB of data, the CPU VM's encoding
    sweeps over strips of rows instead (a multiple of 16 rows, at least two strips); fewer rows,
    2048 columns or more data keep the single-tile stream. Either gives the reference VM's bits
    for the same Program, and the values of the reference VM's own encoding."""
    from test_cpu_vm import run_on

    from dvm.vm import cpu, reference
    rng = np.random.default_rng(rows + cols)
    image = (rng.standard_normal((cols, rows)) * 3).astype(np.float32)
    image[5, 3], image[-1, 4] = np.inf, np.nan
    x, w = image.T, rng.standard_normal(cols).astype(np.float32)   # (rows, cols): the rows contiguous
    bm, _, sweeps = _kernel_tiles(channel_norm, x, w, vm="cpu")
    if strips:
        assert sweeps > 1 and bm % 16 == 0 and 16 <= bm < rows
    else:
        assert sweeps == 1
    on_cpu = run_on(cpu.run, channel_norm, x, w)
    for a, b in zip(run_on(reference.run, channel_norm, x, w), on_cpu):
        np.testing.assert_array_equal(a, b)
    expected = channel_norm(x, w, vm="reference")   # (its sum of 4097 terms in another order)
    for a, b in zip(on_cpu, expected):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-3)


def _encode_for_the_cpu_vm(monkeypatch):
    """Programs encoded for the CPU VM whatever conftest's `vm` (which restores DVM_VM)."""
    monkeypatch.setenv("DVM_VM", "cpu")
    dvm.config.reload()


@pytest.mark.parametrize("shape, column_major", [((7, 4099), True), ((13, 2001), True), ((32, 300), True),
                                                 ((64, 300), False), ((128, 1024), True), ((200, 2048), True),
                                                 ((200, 2000), False), ((1024, 1024), False), ((301, 5), None),
                                                 ((300, 40), None)])
def test_rereading_streams_over_strided_rows_take_column_major_registers_where_they_pay(monkeypatch, shape,
                                                                                        column_major):
    """A softmax over the first axis of `shape` (its rows strided, the kept axis contiguous) takes
    column-major registers (a column of the tile: one contiguous run) for tiles up to 32 wide, or
    up to 512 where the strided axis steps a multiple of 4 KiB (1024 or 2048 f32 rows: row-major
    tiles' transposing loads alias); row-major ones otherwise; over the last axis (None),
    column-major below 8 lanes a row only.
    The layout is invisible: a first-axis softmax gives the bits of the last-axis softmax of a
    contiguous copy (row-major registers), and the reference VM's values (its exp rounds apart)."""
    from test_cpu_vm import run_on

    from dvm.codegen.verifier import verify
    from dvm.frontend.library import softmax
    from dvm.tools.bench_ops_cases import softmax_first
    from dvm.vm import cpu, reference
    from dvm.vm.cpu.host import desc as cpu_desc
    _encode_for_the_cpu_vm(monkeypatch)
    x = np.random.default_rng(shape[0]).standard_normal(shape).astype(np.float32) * 4
    x[1, 2], x[-1, 0] = np.inf, np.nan
    kfn, want = (softmax, shape[1] < 8) if column_major is None else (softmax_first, column_major)
    assert [d.transposed for d in cpu_desc.prog_desc(verify(kfn.program(x)))[1]] == [want]
    (got,) = run_on(cpu.run, kfn, x)
    if column_major is not None:
        np.testing.assert_array_equal(got, run_on(cpu.run, softmax, np.ascontiguousarray(x.T))[0].T)
    np.testing.assert_allclose(got, run_on(reference.run, kfn, x)[0], rtol=1e-5, atol=1e-7)


@dvm.kernel
def centered(k, x):
    """x minus its row mean, and that scaled by the rows' rsqrt variance (a LayerNorm)."""
    x = k.load(x)
    d = k.sub(x, k.mean(x, axis=-1, keepdims=True))
    return k.store(d), k.store(k.mul(d, k.rsqrt(k.add(k.mean(k.mul(d, d), axis=-1, keepdims=True), 1e-5))))


_LONG_ROWS = st.tuples(st.integers(1, 80), st.sampled_from([2048, 2049, 3000, 4096, 5001]))   # (rows, cols)
_ALIASED = st.tuples(st.one_of(st.integers(1, 80), st.sampled_from([512, 1024, 2048])), st.integers(1, 300))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shape=st.one_of(_LONG_ROWS, _ALIASED),
       dtype=st.sampled_from(["float32", "float64", "float16", "bfloat16"]), specials=st.booleans())
def test_rereading_streams_over_strided_rows_give_the_reference_vms_bits(monkeypatch, shape, dtype, specials):
    """Rows strided, the kept axis contiguous, any size about the choices above (strips of rows;
    column-major registers, narrow or over 4 KiB strides; row-major ones) and dtype: the CPU VM's
    Program on the CPU VM and on the reference VM gives the same bits."""
    import ml_dtypes
    from test_cpu_vm import run_on

    from dvm.vm import cpu, reference
    _encode_for_the_cpu_vm(monkeypatch)
    rows, cols = shape
    dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    image = np.random.default_rng(rows * cols).standard_normal((cols, rows)) * 3
    if specials:
        image[0, 0], image[-1, -1] = np.inf, np.nan
    x = image.astype(dt).T
    for a, b in zip(run_on(reference.run, centered, x), run_on(cpu.run, centered, x)):
        np.testing.assert_array_equal(a.astype(np.float64), b.astype(np.float64))   # (NaN == NaN)
