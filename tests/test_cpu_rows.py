"""The CPU VM's tile widths and partial rows: elementwise tiles without padding lanes
(encoder._even_bn) and rows narrower than their power-of-two tile (fused/rowpart), bitwise against
the reference VM. Split from test_cpu_layouts (its helpers are shared)."""
from __future__ import annotations

import re

import numpy as np
import pytest

import dvm
from dvm.codegen import encoder, isa
from dvm.codegen.disasm import disasm
from dvm.frontend.library import layernorm, rmsnorm, softmax
from dvm.tools.bench_ops_cases import max_last, sum_last
from dvm.vm import reference
from dvm.vm.cpu.abi import FK_ROWNORM, M_COLS, M_ROWS
from dvm.vm.cpu.host import desc as cpu_desc
from dvm.vm.cpu.jit.fused import rowpart

from test_cpu_layouts import RNG, _bitwise_as_reference, _threads
from test_cpu_vm import run_on

pytestmark = [pytest.mark.cpu_vm, pytest.mark.vm_once]   # compares the VMs itself


@dvm.kernel
def bias_mix(k, x, b):
    """An elementwise kernel with a row-vector operand and two outputs (one of another dtype)."""
    x, b = k.load(x), k.load(b)
    y = k.maximum(k.sub(k.mul(k.add(x, b), b), x), -1.0)
    return k.store(y), k.store(k.cast(k.mul(y, 3.0), "float16"))


@pytest.mark.parametrize("shape, bn", [((4097, 17), 17), ((9, 1030), 1030), ((7, 65537), 13120),
                                       ((3, 4097), 2064), ((1, 20000), 4000), ((5, 3, 65), 65),
                                       ((69649,), 3872)])
def test_elementwise_tiles_have_no_padding_lanes(shape, bn):
    """Elementwise tiles are exactly as wide as the rows, or an even split of a longer row into
    widths that are multiples of 16 (encoder._even_bn: at most MAX_BN lanes, up to MID_TILE_ELEMS in
    larger kernels): bitwise equal to the reference VM on 1 and 2 threads, also with a strided
    (transposed) input."""
    x = RNG.standard_normal(shape).astype(np.float32)
    b = RNG.standard_normal(shape[-1]).astype(np.float32)
    assert dvm.verify(bias_mix.program(x, b)).kernels[0].bn == bn
    _bitwise_as_reference(bias_mix, x, b, why=(shape,))
    if len(shape) == 2:
        xt = np.ascontiguousarray(x.T).T
        _bitwise_as_reference(bias_mix, xt, b, why=(shape, "transposed"))


@dvm.kernel
def residual_norms(k, x, r, w):
    """Norms of a computed row (x + r), not of a load: the tile form's fused sums of squares
    (FK_SQSUM, FK_CSQSUM), not the row forms."""
    h = k.add(k.load(x), k.load(r))
    rms = k.mul(h, k.rsqrt(k.add(k.mean(k.mul(h, h), axis=-1, keepdims=True), 1e-6)))
    hc = k.sub(h, k.mean(h, axis=-1, keepdims=True))
    ln = k.mul(hc, k.rsqrt(k.add(k.mean(k.mul(hc, hc), axis=-1, keepdims=True), 1e-5)))
    return k.store(k.mul(rms, k.load(w))), k.store(k.add(ln, k.load(w))), k.store(h)


@pytest.mark.parametrize("cols", [129, 200, 300, 512, 1001, 2049, 3072, 3500, 5000, 7000, 10000, 16384, 70000,
                                  131073])
def test_partial_rows_with_signed_zeros_and_specials(cols):
    """Rows narrower than their power-of-two tile: the row forms, the in-place row reductions and
    the tile form's sums of squares take the tree's first levels from the valid lanes
    (fused/rowpart), the padding lanes' identity written in (129 columns: one lane past half the
    tile; 512: whole rows). Bitwise the reference VM's (which
    pads), also where only the padding's +0.0 makes a sum of -0.0 rows +0.0, and with NaN and
    infinities. From 10000 columns a tile is one row (BM = 1), whose weights the row forms read
    as row vectors too (read in place when f32); 16384 fills its tile. 70000 and 131073 exceed
    SINGLE_TILE_COLS: the norms and softmax take one tile of 131072 / 262144 lanes (their row
    forms), the other kernels the sweeps."""
    x = RNG.standard_normal((7, cols)).astype(np.float32)
    x[0] = -0.0
    x[1] = -0.0
    x[1, -1] = 0.0
    x[2, ::5] = np.nan
    x[3, 1], x[3, -1] = np.inf, -np.inf
    x[4, -1] = np.inf
    x[5] *= np.float32(1e19)
    w = RNG.standard_normal(cols).astype(np.float32)
    zero = np.full_like(x, -0.0)   # x + -0.0 is x, signed zeros included
    for kfn, args in ((sum_last, (x,)), (max_last, (x,)), (layernorm, (x, w, w)), (rmsnorm, (x, w)),
                      (residual_norms, (x, zero, w))):
        _bitwise_as_reference(kfn, *args, why=(cols,))
    want = run_on(reference.run, softmax, x)[0]
    for n in (1, 2):
        np.testing.assert_allclose(run_on(_threads(n), softmax, x)[0], want, rtol=1e-5, atol=1e-6)


def test_row_forms_leave_tiles_over_twice_the_row_to_the_tile_form(monkeypatch):
    """A verified program may give rows a tile more than twice their width (the encoder's is the
    row's next power of two): the row forms, which read rows of BN / 2 + 1 to BN lanes where they
    are, leave such tiles to the instructions. Bitwise the reference VM's, specials included (the
    softmax within rounding: the VMs' exp differ)."""
    wide = encoder._pow2_at_least
    monkeypatch.setattr(encoder, "_pow2_at_least", lambda n: 2 * wide(n))
    x = RNG.standard_normal((5, 150)).astype(np.float32)
    x[0] = -0.0
    x[1, 3], x[2, -1] = np.nan, np.inf
    w = RNG.standard_normal(150).astype(np.float32)
    for kfn, args in ((layernorm, (x, w, w)), (rmsnorm, (x, w)), (softmax, (x,))):
        assert re.search(r"tile \d+x512 ", disasm(kfn.program(*args))), kfn
    for kfn, args in ((layernorm, (x, w, w)), (rmsnorm, (x, w))):
        _bitwise_as_reference(kfn, *args, why=("bn 512",))
    want = run_on(reference.run, softmax, x)[0]
    for n in (1, 2):
        np.testing.assert_allclose(run_on(_threads(n), softmax, x)[0], want, rtol=1e-5, atol=1e-6)


@dvm.kernel
def hf_rmsnorm(k, x, r, w, eps):
    """Hugging Face's RMSNorm of a residual sum, as the torch backend lowers it: the epsilon a 0-d
    float64 input (a float Dynamo passes as a tensor), the weight on the left, the sum stored
    after the norm (a pre-norm block's next residual)."""
    h = k.add(k.load(x), k.load(r))
    var = k.mean(k.mul(h, h), axis=-1, keepdims=True)
    y = k.mul(k.load(w), k.mul(h, k.rsqrt(k.add(var, k.cast(k.load(eps), "float32")))))
    return k.store(y), k.store(h)


@dvm.kernel
def hf_rmsnorm_first(k, x, w, eps):
    """hf_rmsnorm of a loaded row (a block's first norm)."""
    h = k.load(x)
    var = k.mean(k.mul(h, h), axis=-1, keepdims=True)
    return k.store(k.mul(k.load(w), k.mul(h, k.rsqrt(k.add(var, k.cast(k.load(eps), "float32"))))))


@dvm.kernel
def post_layernorm(k, x, r, w, b):
    """A post-norm block's LayerNorm of the residual sum (BERT's), the sum not stored."""
    h = k.add(k.load(x), k.load(r))
    d = k.sub(h, k.mean(h, axis=-1, keepdims=True))
    return k.store(d * k.rsqrt(k.mean(d * d, axis=-1, keepdims=True) + 1e-5) * k.load(w) + k.load(b))


def fuse_kind_at_first_load(kfn, *args) -> int:
    """The fused run the CPU VM plans at the first f32 load of kfn's kernel on args."""
    layout = dvm.verify(kfn.program(*args))
    kl = layout.kernels[0]
    fuse = cpu_desc._desc(kl, len(layout.args)).fuse
    return int(fuse[next(pc for pc, row in enumerate(kl.instrs) if isa.BY_CODE[int(row[0])].name == "load.f32"), 0])


def test_models_norms_are_row_forms():
    """The norms as models' graphs have them are planned as whole row forms (FK_ROWNORM at the
    first load): the epsilon input computed before the row's loads (codegen/lower.uniforms_first,
    its register held to the body's end), the weight loaded next to its product, a residual
    sum's two loads and add taken by the form."""
    x, w, eps = RNG.standard_normal((16, 1024)).astype(np.float32), np.ones(1024, np.float32), np.array(1e-6)
    for kfn, args in ((hf_rmsnorm, (x, x, w, eps)), (hf_rmsnorm_first, (x, w, eps)), (post_layernorm, (x, x, w, w))):
        assert fuse_kind_at_first_load(kfn, *args) == FK_ROWNORM, kfn
    text = disasm(hf_rmsnorm.program(x, x, w, eps))
    assert re.search(r"load\.f64 .*\n.*cast\.f64\.f32 .*\n.*load\.f32", text), text


@pytest.mark.parametrize("cols", [128, 200, 256, 512, 600, 768, 1024, 2049, 4096, 70000])
def test_models_norms_bitwise_as_reference(cols):
    """hf_rmsnorm (both outputs), hf_rmsnorm_first and post_layernorm: bitwise the reference VM's
    on 1 and 2 threads, with NaN, infinities, signed zeros and huge rows; with x passed twice;
    with a transposed input (the row form refuses it: the instructions run). 128-256 columns: the
    narrow row form (rows.py's _norm_rows_narrow, a block of rows at a time). 70000 columns:
    post_layernorm is all row form, so one tile of 131072 lanes (encoder.WIDE_ROW_COLS)."""
    x = RNG.standard_normal((9, cols)).astype(np.float32)
    r = RNG.standard_normal((9, cols)).astype(np.float32)
    x[0], r[0] = -0.0, -0.0
    x[2, ::7] = np.nan
    x[3, 1], r[3, -1] = np.inf, -np.inf
    x[5] *= np.float32(1e19)
    w = RNG.standard_normal(cols).astype(np.float32)
    b = RNG.standard_normal(cols).astype(np.float32)
    eps = np.array(1e-6)
    xt = np.ascontiguousarray(x.T).T
    for kfn, args in ((hf_rmsnorm, (x, r, w, eps)), (hf_rmsnorm_first, (x, w, eps)), (post_layernorm, (x, r, w, b))):
        _bitwise_as_reference(kfn, *args, why=(cols,))
        _bitwise_as_reference(kfn, xt, *args[1:], why=(cols, "transposed"))
        if kfn is not hf_rmsnorm_first:
            _bitwise_as_reference(kfn, x, x, *args[2:], why=(cols, "x twice"))


@pytest.mark.parametrize("shape", [(4096, 1024), (4200, 1001), (1024, 8192)])
def test_rows_from_memory_are_touched_first_with_the_same_bits(shape):
    """Past fused/rowpart.STREAM_BYTES (a norm's or softmax's input and output; a row reduction's
    input alone) the row forms and the in-place row reductions touch each row before its trees
    (rowpart.touch_row): bitwise the reference VM's, specials included (the softmax within
    rounding). 4096x1024: whole rows (LayerNorm's and softmax's touched, the sum's not); 4200x1001:
    partial rows (rowpart's first levels); 1024x8192: the row sum touched too (the staged tree)."""
    x = RNG.standard_normal(shape).astype(np.float32)
    x[0] = -0.0
    x[1, ::5] = np.nan
    x[2, 1], x[2, -1] = np.inf, -np.inf
    x[3] *= np.float32(1e19)
    w = RNG.standard_normal(shape[1]).astype(np.float32)
    lanes = shape[0] * shape[1]
    assert 8 * lanes >= rowpart.STREAM_BYTES
    meta = np.zeros(16, np.int64)
    meta[M_ROWS], meta[M_COLS] = shape
    assert rowpart.rows_from_memory(meta, 2)
    assert rowpart.rows_from_memory(meta, 1) == (4 * lanes >= rowpart.STREAM_BYTES)
    for kfn, args in ((layernorm, (x, w, w)), (rmsnorm, (x, w)), (sum_last, (x,)), (max_last, (x,))):
        want = run_on(reference.run, kfn, *args)[0]
        got = run_on(_threads(2), kfn, *args)[0]
        assert got.tobytes() == want.tobytes(), (kfn, shape)
    want = run_on(reference.run, softmax, x)[0]
    np.testing.assert_allclose(run_on(_threads(1), softmax, x)[0], want, rtol=1e-5, atol=1e-6)


def _silu_gate(k, a, b):
    return k.store(k.mul(k.silu(k.load(a)), k.load(b)))


silu_gate, silu_gate_again = dvm.kernel(_silu_gate), dvm.kernel(_silu_gate)   # (each caches its Programs)


def _stream_tile(kl) -> int:
    """The encoder's stream tile of an elementwise kernel: STREAM_TILE_ELEMS lanes, fewer where its
    registers would pass STREAM_REGISTER_BYTES."""
    lane = sum(n * w for n, w in zip(kl.nregs, (4, 8, 8, 1)))
    fits = encoder.STREAM_REGISTER_BYTES // lane
    return max(encoder.MAX_BN, min(encoder.STREAM_TILE_ELEMS, 1 << (fits.bit_length() - 1)))


def test_larger_elementwise_kernels_take_larger_tiles():
    """Elementwise kernels below STREAM_ELEMS get tiles of TILE_ELEMS lanes, doubled up to
    MID_TILE_ELEMS while MID_MIN_TILES tiles remain; reductions keep theirs; bitwise the reference
    VM's on 1 and 2 threads, with a row vector, a strided input and a partial last tile."""
    cols, least = 256, 2 * encoder.TILE_ELEMS * encoder.MID_MIN_TILES
    for rows, tile in ((least // cols, 2 * encoder.TILE_ELEMS), (least // cols - 1, encoder.TILE_ELEMS),
                       (2 * encoder.MID_TILE_ELEMS * encoder.MID_MIN_TILES // cols + 5, encoder.MID_TILE_ELEMS)):
        x = RNG.standard_normal((rows, cols)).astype(np.float32)
        kl = dvm.verify(bias_mix.program(x, x[1])).kernels[0]
        assert kl.bm * kl.bn == tile, (rows, kl.bm, kl.bn)
        _bitwise_as_reference(bias_mix, x, x[1], why=(rows,))
        _bitwise_as_reference(bias_mix, np.ascontiguousarray(x.T).T, x[1], why=(rows, "transposed"))
    assert dvm.verify(sum_last.program(x)).kernels[0].bm * cols == encoder.ROW_TILE_ELEMS


def _add_pair(k, a, b):
    return k.store(k.add(k.load(a), k.load(b)))


add_pair = dvm.kernel(_add_pair)


def test_serial_kernels_take_larger_tiles():
    """A kernel the CPU VM runs on one thread (fewer lanes than its Target.serial_lanes) with at
    most SERIAL_LANE_BYTES of registers a lane takes tiles of up to MID_TILE_ELEMS however few
    remain, and one it shares among threads LEAN_MIN_TILES tiles; the reference VM's Programs and
    kernels with more registers keep MID_MIN_TILES tiles; bitwise the reference VM's results."""
    from dvm.vm.cpu.host.desc import PARALLEL_MIN_ELEMS

    def tile(kfn, *args, vm="cpu") -> int:
        kl = dvm.verify(kfn.program(*args, vm=vm)).kernels[0]
        return kl.bm * kl.bn

    a, b = (RNG.standard_normal((2 * encoder.MID_TILE_ELEMS // 256, 256)).astype(np.float32) for _ in range(2))
    assert 2 * encoder.MID_TILE_ELEMS < PARALLEL_MIN_ELEMS
    assert tile(add_pair, a, b) == encoder.MID_TILE_ELEMS   # two tiles (MID_MIN_TILES: eight)
    assert tile(add_pair, a, b, vm="reference") == encoder.TILE_ELEMS
    assert tile(bias_mix, a, a[0]) == encoder.TILE_ELEMS   # six registers a lane
    _bitwise_as_reference(add_pair, a, b, why=("serial",))
    _bitwise_as_reference(add_pair, a[:, :255], b[:, 1:], why=("strided",))
    big = RNG.standard_normal((PARALLEL_MIN_ELEMS // 256, 256)).astype(np.float32)
    assert PARALLEL_MIN_ELEMS // encoder.LEAN_MIN_TILES <= encoder.MID_TILE_ELEMS
    assert tile(add_pair, big, big) == PARALLEL_MIN_ELEMS // encoder.LEAN_MIN_TILES   # shared among threads
    assert tile(add_pair, big, big, vm="reference") == encoder.TILE_ELEMS
    assert tile(bias_mix, big, big[0]) == encoder.TILE_ELEMS   # six registers a lane
    _bitwise_as_reference(add_pair, big, big[::-1], why=("parallel",))


def test_streaming_kernels_take_stream_tiles(monkeypatch):
    """Kernels of STREAM_ELEMS lanes or more (elementwise and single-tile-stream ones) get tiles of
    STREAM_TILE_ELEMS lanes (elementwise ones fewer where their registers would pass
    STREAM_REGISTER_BYTES), the sweeps keep theirs; bitwise the reference VM's (SiLU, whose exp
    differs between the VMs: bitwise the CPU VM's own on ordinary tiles)."""
    n = encoder.STREAM_ELEMS
    a, b = (RNG.standard_normal(n).astype(np.float32) for _ in range(2))
    kl = dvm.verify(silu_gate.program(a, b)).kernels[0]
    assert (kl.bm, kl.bn) == (1, _stream_tile(kl))
    streamed = [run_on(_threads(t), silu_gate, a, b)[0] for t in (1, 2)]
    with monkeypatch.context() as m:
        m.setattr(encoder, "STREAM_ELEMS", 2 * n)
        m.setattr(encoder, "MID_TILE_ELEMS", encoder.TILE_ELEMS)
        assert dvm.verify(silu_gate_again.program(a, b)).kernels[0].bn == encoder.MAX_BN
        tiled = run_on(_threads(2), silu_gate_again, a, b)[0]
    for got in streamed:
        assert got.tobytes() == tiled.tobytes()
    x = a.reshape(2048, -1)
    kl = dvm.verify(bias_mix.program(x, x[0])).kernels[0]
    assert kl.bm * kl.bn == _stream_tile(kl) < encoder.STREAM_TILE_ELEMS   # 6 registers: 32768 lanes
    _bitwise_as_reference(bias_mix, x, x[0], why=("rows",))
    for kfn in (sum_last, max_last):
        assert re.search(rf"tile {encoder.STREAM_TILE_ELEMS // x.shape[1]}x{x.shape[1]} ",
                         disasm(kfn.program(x))), kfn
    _bitwise_as_reference(max_last, x, why=("rows",))
    wide = a.reshape(4, -1)   # 1 M columns: the sweeps, with their own tiles
    assert "tile 1x4096 " in disasm(sum_last.program(wide))


def _many_registers(k, a, b, c):
    a, b, c = k.load(a), k.load(b), k.load(c)
    m = k.add(k.mul(a, 0.9), k.mul(b, 0.1))
    v = k.add(k.mul(c, 0.999), k.mul(k.mul(b, b), 0.001))
    d = k.add(k.div(k.sqrt(v), 0.5), 1e-8)
    return k.store(k.sub(a, k.div(k.mul(m, 0.01), d))), k.store(m), k.store(v)


adam_like, adam_like_again = dvm.kernel(_many_registers), dvm.kernel(_many_registers)


def test_register_heavy_streaming_kernels_take_smaller_tiles(monkeypatch):
    """An Adam-like elementwise kernel streams in tiles that keep its registers within
    STREAM_REGISTER_BYTES; bitwise the same as with STREAM_TILE_ELEMS-lane tiles."""
    a, b, c = (RNG.standard_normal(encoder.STREAM_ELEMS).astype(np.float32) for _ in range(3))
    c = np.abs(c)
    kl = dvm.verify(adam_like.program(a, b, c)).kernels[0]
    assert kl.bm * kl.bn == _stream_tile(kl) < encoder.STREAM_TILE_ELEMS
    small = run_on(_threads(2), adam_like, a, b, c)
    with monkeypatch.context() as m:
        m.setattr(encoder, "STREAM_REGISTER_BYTES", 1 << 40)
        assert dvm.verify(adam_like_again.program(a, b, c)).kernels[0].bn == encoder.STREAM_TILE_ELEMS
        big = run_on(_threads(2), adam_like_again, a, b, c)
    for x, y in zip(small, big):
        assert x.tobytes() == y.tobytes()


@pytest.mark.parametrize("kfn", [bias_mix, sum_last, layernorm, residual_norms])
def test_stream_tiles_on_smaller_data(monkeypatch, kfn):
    """The stream tiles on data past a lowered STREAM_ELEMS (tall and partial tiles, row vectors,
    the row forms and fused runs over 16-row tiles): bitwise the reference VM's."""
    monkeypatch.setattr(encoder, "STREAM_ELEMS", 1 << 12)
    x = RNG.standard_normal((1001, 300)).astype(np.float32)
    w = RNG.standard_normal(300).astype(np.float32)
    args = {bias_mix: (x, w), sum_last: (x,), layernorm: (x, w, w), residual_norms: (x, x, w)}[kfn]
    kl = dvm.verify(kfn.program(*args)).kernels[0]
    assert kl.bm * kl.bn > encoder.ROW_TILE_ELEMS, (kl.bm, kl.bn)
    _bitwise_as_reference(kfn, *args, why=("stream tiles",))
