"""The CPU VM's register layouts, compact row-level registers and shared work units: results match
the reference VM (bitwise where no transcendental function is involved: the CPU VM's exp may
differ by an ulp) and do not depend on the thread count (threads=1..3), for
narrow rows (column-major registers), first-axis reductions (column-major, read in place or
not), multi-sweep rows, and row-level arithmetic of every bank."""
from __future__ import annotations

import numpy as np
import pytest

import dvm
from dvm.frontend.library import layernorm, rmsnorm, softmax
from dvm.codegen.verifier import verify
from dvm.tools.bench_ops_cases import max_first, sum_first, sum_last
from dvm.vm import cpu, reference
from dvm.vm.cpu.host import desc as cpu_desc

from test_cpu_vm import run_on

pytestmark = [pytest.mark.cpu_vm, pytest.mark.vm_once]   # compares the VMs itself

RNG = np.random.default_rng(7)


@dvm.kernel
def rowlevel_mix(k, x):
    """Row-level values of several banks: a comparison of two reductions, an int64 row sum, a
    where between a full tile and a row-level value, and a row-level value stored broadcast."""
    x = k.load(x)
    m = k.max(x, axis=-1, keepdims=True)
    s = k.mean(x, axis=-1, keepdims=True)
    big = k.gt(k.mul(s, 2.0), m)
    n = k.sum(k.cast(k.gt(x, s), "int64"), axis=-1, keepdims=True)
    y = k.where(big, k.sub(x, m), k.add(k.cast(n, "float32"), s))
    return k.store(k.add(y, k.mul(k.exp(k.sub(m, s)), x))), k.store(k.add(n, 1))


@dvm.kernel
def col_mix(k, x, w):
    """A first-axis reduction feeding arithmetic with another operand (column-major registers)."""
    x = k.load(x)
    return k.store(k.mul(k.sum(k.mul(x, x), axis=0), k.load(w)))


EXACT = (layernorm, rmsnorm, sum_first, max_first, col_mix)


def _threads(n: int):
    return lambda layout, bufs: cpu.run(layout, bufs, threads=n)


def _bitwise_as_reference(kfn, *args, why=()) -> None:
    """kfn's outputs on the CPU VM, with 1 and 2 threads, equal the reference VM's bit for bit."""
    want = run_on(reference.run, kfn, *args)
    for n in (1, 2):
        got = run_on(_threads(n), kfn, *args)
        assert len(got) == len(want)
        for g, r in zip(got, want):
            assert g.shape == r.shape and g.tobytes() == r.tobytes(), (kfn, *why, n)


CASES = [
    (softmax, lambda s: [RNG.standard_normal(s).astype(np.float32)]),
    (layernorm, lambda s: [RNG.standard_normal(s).astype(np.float32),
                           RNG.standard_normal(s[-1]).astype(np.float32),
                           RNG.standard_normal(s[-1]).astype(np.float32)]),
    (rmsnorm, lambda s: [RNG.standard_normal(s).astype(np.float32), RNG.standard_normal(s[-1]).astype(np.float32)]),
    (sum_first, lambda s: [RNG.standard_normal(s).astype(np.float32)]),
    (max_first, lambda s: [RNG.standard_normal(s).astype(np.float32)]),
    (rowlevel_mix, lambda s: [RNG.standard_normal(s).astype(np.float32)]),
    (col_mix, lambda s: [RNG.standard_normal(s).astype(np.float32), RNG.standard_normal(s[-1]).astype(np.float32)]),
]


@pytest.mark.parametrize("shape", [(37, 17), (301, 5), (9, 130), (130, 9), (5, 5000), (300, 64), (40, 32), (3, 7, 33),
                                   (2, 20000), (4, 3072), (3, 700), (6, 200)])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_matches_reference(case, shape):
    kfn, make = CASES[case]
    args = make(shape)
    want = run_on(reference.run, kfn, *args)
    for n in (1, 2, 3):
        got = run_on(_threads(n), kfn, *args)
        for g, w in zip(got, want):
            if kfn in EXACT:
                assert g.tobytes() == w.tobytes(), (kfn, shape, n)
            else:
                np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-4)   # exp: an ulp of ~40


@pytest.mark.parametrize("shape", [(4097, 17), (1000, 1001), (7, 65537), (3, 262145), (256, 1024), (2000, 300), (5, 9000)])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_thread_count_does_not_change_results(case, shape):
    kfn, make = CASES[case]
    args = make(shape)
    runs = [run_on(_threads(n), kfn, *args) for n in (1, 2, 3, 2)]
    for other in runs[1:]:
        for a, b in zip(runs[0], other):
            assert a.tobytes() == b.tobytes(), (kfn, shape)


def _register_layouts(kfn, shape) -> list[bool]:
    """Per kernel of kfn's Program on a float32 array of `shape`: column-major registers?"""
    prog = kfn.program(np.zeros(shape, np.float32))
    return [d.transposed for d in cpu_desc.prog_desc(verify(prog))[1]]


@pytest.mark.parametrize("shape", [(256, 1024), (1000, 1001), (2048, 2048), (4097, 17), (8192, 64), (32, 128)])
def test_first_axis_reductions_read_columns_in_place(shape):
    """A sum / max over axis 0 of a contiguous array reads each tile column (a run along the kept
    axis) in place, in column-major registers, whatever its tile width: row-major registers would
    gather every lane with a stride of the row length (56e367d did that for 32-lane tiles: 256x1024
    took 194 us instead of 18)."""
    for kfn in (sum_first, max_first):
        assert _register_layouts(kfn, shape) == [True], (kfn, shape)


@pytest.mark.parametrize("shape", [(8192, 64), (300, 32), (1000, 128), (4097, 17), (301, 9), (40, 8), (100, 63)])
def test_rows_from_8_lanes_reduce_in_row_major_registers(shape):
    """Contiguous rows of 8 or more lanes, any width: row-major registers, the row in vector
    registers (jit/vtree; a column-major tile of them loads by strided reads)."""
    assert _register_layouts(sum_last, shape) == [False]
    assert _register_layouts(softmax, shape) == [False]


@pytest.mark.parametrize("shape", [(301, 5), (4097, 7), (64, 2)])
def test_rows_under_8_lanes_reduce_in_column_major_registers(shape):
    """Narrower rows: column-major registers (a tree level is one loop over the rows)."""
    assert _register_layouts(sum_last, shape) == [True]


@dvm.kernel
def heads_mix(k, x, c):
    """x: attention heads as a transposed view (rows of D contiguous values, strided), c broadcast."""
    x = k.load(x)
    return k.store(k.add(k.mul(x, k.load(c)), x))


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64, np.int32, np.float16, "bfloat16"])
@pytest.mark.parametrize("L,H,D", [(1000, 4, 32), (7, 3, 5), (130, 2, 33), (3, 2, 5000), (300, 4, 8), (70, 3, 24)])
def test_strided_rows_copied_whole(dtype, L, H, D):
    """Rows that are byte-identical runs in the buffer and the register (unit stride, same type)
    are moved whole (jit/moves.move); the others element by element. Partial tiles, both layouts."""
    import ml_dtypes
    dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    q = (RNG.standard_normal((L, H, D)) * 4).astype(dt).transpose(1, 0, 2)   # (H, L, D), rows strided
    c = (RNG.standard_normal((L, D)) * 4).astype(dt)
    _bitwise_as_reference(heads_mix, q, c, why=(dt, L, H, D))


@dvm.kernel
def rope_like(k, q, cos, r, sin):
    """q * cos + r * sin over (H, L, D): q a transposed view (strided rows), cos and sin broadcast
    over the heads (runs of L back-to-back rows that wrap), r contiguous over two row dims (read
    and written in place: jit/addr.direct_addr)."""
    return k.store(k.add(k.mul(k.load(q), k.load(cos)), k.mul(k.load(r), k.load(sin))))


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("L,H,D", [(1, 4, 32), (33, 4, 32), (100, 4, 32), (128, 2, 16), (129, 3, 64), (9, 2, 48)])
def test_head_rows_coalesced_and_in_place(dtype, L, H, D):
    """Back-to-back rows move as one run, short rows of 64/128/256 bytes with a constant-size move,
    partial tiles repeat their last row by doubling copies: bitwise equal to the reference VM."""
    q = (RNG.standard_normal((L, H, D)) * 4).astype(dtype).transpose(1, 0, 2)
    cos, sin = ((RNG.standard_normal((L, D)) * 4).astype(dtype) for _ in range(2))
    r = (RNG.standard_normal((H, L, D)) * 4).astype(dtype)
    _bitwise_as_reference(rope_like, q, cos, r, sin, why=(dtype, L, H, D))


@dvm.kernel
def copy_of(k, x):
    return k.store(k.load(x))


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.float16, np.bool_])
@pytest.mark.parametrize("n", [5000, 65536, 100_003])
def test_raw_copies_at_every_relative_offset(dtype, n):
    """A copy kernel's tiles move as raw bytes (jit/moves.copy_bytes, not libc's memmove): the
    output is the input at every placement of the two buffers modulo 4096 (including the
    16-byte offset where `rep movsb` is slow), whole tiles and a partial last one."""
    from dvm.vm.buffers import data_ptr
    x_raw = (RNG.standard_normal(n + 8192) * 100).astype(dtype)   # room for 8 KB of offsets
    o_raw = np.zeros(n + 8192, dtype)
    isz = x_raw.itemsize
    layout = dvm.verify(copy_of.program(x_raw[:n]))
    for dx, do in ((0, 0), (0, 16), (16, 0), (48, 0), (2048, 16), (4080, 0)):
        sx = ((-data_ptr(x_raw) % 4096) + dx) // isz
        so = ((-data_ptr(o_raw) % 4096) + do) // isz
        x, o = x_raw[sx:sx + n], o_raw[so:so + n]
        o[:] = 0
        cpu.run_addrs(layout, np.array([data_ptr(x), data_ptr(o), n, n], np.int64))
        np.testing.assert_array_equal(o, x, err_msg=f"x at +{dx}, out at +{do} mod 4096")


@dvm.kernel
def sum_topk(k, x, w):
    """Top-k expert outputs summed (x: (T, C, K) as a permuted view of (T, K, C)) and scaled:
    column-major registers whose columns are runs of C contiguous values (jit/mem_t.mem_tile_t)."""
    return k.store(k.mul(k.sum(k.load(x), axis=-1), k.load(w)))


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64, np.float16])
@pytest.mark.parametrize("T,K,C", [(24, 2, 128), (7, 3, 5), (1, 2, 64), (100, 4, 33), (3, 2, 2000)])
def test_column_runs_over_row_dims(dtype, T, K, C):
    """Several row dims whose innermost has unit stride: each column of a column-major tile moves
    as runs (a tile may start and end inside a run), loaded and stored; bitwise equal to the
    reference VM."""
    x = (RNG.standard_normal((T, K, C)) * 4).astype(dtype).transpose(0, 2, 1)
    w = (RNG.standard_normal((T, C)) * 4).astype(dtype)
    _bitwise_as_reference(sum_topk, x, w, why=(dtype, T, K, C))

@dvm.kernel
def rowvec_mix(k, x, w, v):
    """Row vectors (w, v: broadcast over the rows) as either operand of each supported binary op,
    beside a row-level value, read by a unary op (expanded), and stored as they are."""
    x = k.load(x)
    w, v = k.load(w), k.load(v)
    m = k.max(x, axis=-1, keepdims=True)
    y = k.add(k.div(w, x), k.sub(x, v))
    y = k.add(y, k.maximum(w, k.mul(x, v)))
    y = k.sub(k.minimum(y, v), k.mul(w, m))
    return k.store(k.add(y, k.abs(v))), k.store(w)


@dvm.kernel
def uniform_mix(k, x):
    """Constants on either side of each supported binary op (applied as a scalar)."""
    x = k.load(x)
    y = k.add(k.sub(2.0, x), k.div(3.0, x))
    y = k.maximum(k.mul(y, 0.5), k.minimum(1.5, x))
    return k.store(k.sub(k.div(y, 7.0), 0.25))


@pytest.mark.parametrize("dtype", [np.float32, np.float16, "bfloat16"])
@pytest.mark.parametrize("shape", [(37, 17), (9, 1030), (256, 1024), (5, 3, 65), (1, 200)])
def test_row_vectors_and_uniform_operands(dtype, shape):
    """A load whose rows are all the same keeps row 0 only (jit/rowlevel._bin_rowv applies it per
    row); a constant operand is read as a scalar. Bitwise equal to the reference VM, with NaN and
    infinities in every operand, partial tiles, 1 and 2 threads."""
    import ml_dtypes
    dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    x = RNG.standard_normal(shape).astype(dt)
    w, v = (RNG.standard_normal(shape[-1]) * 3).astype(dt), RNG.standard_normal(shape[-1]).astype(dt)
    x.reshape(-1)[::11] = np.nan
    w[::5], v[1::7], x.reshape(-1)[3::13] = np.inf, -np.inf, 0
    for kfn, args in ((rowvec_mix, (x, w, v)), (uniform_mix, (x,))):
        _bitwise_as_reference(kfn, *args, why=(dt, shape))


@dvm.kernel
def constant_mix(k, x):
    """Constants (kept in BM lanes until a full-tile reader needs them all): beside a row-level
    value, as a scalar operand, in a comparison and a where read as full tiles, and in the int64
    and f64 banks."""
    x = k.load(x)
    ms = k.mean(k.mul(x, x), axis=-1, keepdims=True)
    y = k.mul(x, k.rsqrt(k.add(ms, 1e-5)))
    y = k.where(k.gt(x, 0.25), y, -2.0)
    n = k.add(k.cast(k.gt(x, 0.0), "int64"), 3)
    d = k.mul(k.cast(x, "float64"), 1.5)
    return k.store(k.add(y, 0.5)), k.store(n), k.store(d)


@pytest.mark.parametrize("shape", [(256, 1024), (9, 1030), (37, 17), (5, 3, 65), (1, 1)])
def test_constants_filled_on_demand(shape):
    """A constant fills lanes [0, BM) of its register; the first full-tile reader fills the rest
    (jit/rowlevel._expand_sources). Bitwise equal to the reference VM on 1 and 2 threads, tall
    row tiles (256 x 1024: 16 rows) and narrow ones included, with NaN and infinities."""
    x = (RNG.standard_normal(shape) * 2).astype(np.float32)
    x.reshape(-1)[::11], x.reshape(-1)[5::17] = np.nan, np.inf
    _bitwise_as_reference(constant_mix, x, why=(shape,))


@dvm.kernel
def scalar_mix(k, x, e, s, h, n, p):
    """0-d operands (loaded compact): an f64 epsilon cast to f32 beside a row-level value (the
    form dynamic=True gives a norm's epsilon), f32 and f16 scalars against full tiles, an int64
    count, a bool choosing a branch, and arithmetic of 0-d values stored broadcast."""
    x = k.load(x)
    ms = k.mean(k.mul(x, x), axis=-1, keepdims=True)
    y = k.mul(x, k.rsqrt(k.add(ms, k.cast(k.load(e), "float32"))))
    y = k.add(k.mul(y, k.load(s)), k.cast(k.load(h), "float32"))
    c = k.cast(k.add(k.load(n), 1), "float32")
    y = k.where(k.load(p), k.sub(y, c), y)
    return k.store(y), k.store(k.add(k.mul(k.load(s), c), ms)), k.store(k.mul(k.load(n), 3))


@pytest.mark.parametrize("shape", [(37, 17), (9, 1030), (5, 5000), (130, 9), (3, 7, 33), (1, 1)])
def test_zero_d_operands(shape):
    """A load of a 0-d operand fills a compact register (jit/mem._load_compact): bitwise equal to
    the reference VM in both register layouts, multi-sweep rows (loads in finalize sections),
    with a NaN scalar, on 1 and 2 threads."""
    x = RNG.standard_normal(shape).astype(np.float32)
    for s in (np.float32(0.75), np.float32(np.nan)):
        args = (x, np.array(1e-6), np.array(s), np.array(-1.5, np.float16), np.array(4, np.int64),
                np.array(True))
        _bitwise_as_reference(scalar_mix, *args, why=(shape, s))


@dvm.kernel
def mask_mix(k, pr, pc, sr, sc, fr, fc, dr, dc, x):
    """Attention-mask forms: per-row values (column strides 0: compact) compared with per-column
    values (row strides 0: row vectors) in int64, float32 and float64, either operand order (HF's
    `pos[c] <= pos[r]` and `seq[r] == seq[c]`); a row vector and a compact value also meet a full
    tile (both expanded) and are stored broadcast."""
    pos_r, pos_c = k.load(pr), k.load(pc)
    keep = k.bitwise_and(k.le(pos_c, pos_r), k.eq(k.load(sr), k.load(sc)))
    f = k.logical_and(k.lt(k.load(fr), k.load(fc)), k.ge(k.load(dc), k.load(dr)))
    y = k.where(keep, k.load(x), k.cast(pos_c, "float32"))
    return k.store(keep), k.store(f), k.store(k.add(y, k.cast(k.gt(pos_r, k.load(x)), "float32")))


@pytest.mark.parametrize("R,C", [(37, 17), (100, 100), (5, 1030), (130, 9), (1, 300), (2000, 3)])
def test_compact_and_row_vector_comparisons(R, C):
    """Loads of per-row operands are compact, per-column ones row vectors in every bank, and a
    comparison of the two runs per pair (jit/rowlevel._cmp_outer): bitwise equal to the reference
    VM with NaN and equal values, partial tiles, both register layouts, 1 and 2 threads."""
    pos = np.arange(max(R, C), dtype=np.int64)
    seq = np.repeat(np.arange(max(R, C) // 3 + 1), 3)[:max(R, C)].astype(np.int64)
    fr, fc = RNG.standard_normal((R, 1)).astype(np.float32), RNG.standard_normal((1, C)).astype(np.float32)
    fr[::4], fc[0, ::5], fr[1::4], fc[0, 1::6] = np.nan, np.nan, 0.5, 0.5   # NaN and equal values
    dr, dc = fr.astype(np.float64), fc.astype(np.float64)
    args = (pos[:R, None], pos[None, :C], seq[:R, None], seq[None, :C], fr, fc, dr, dc,
            RNG.standard_normal((R, C)).astype(np.float32))
    _bitwise_as_reference(mask_mix, *args, why=(R, C))


@pytest.mark.parametrize("B,R,C", [(3, 300, 300), (2, 37, 17), (4, 5, 1030), (3, 130, 9), (2, 1, 40)])
def test_per_batch_row_vectors(B, R, C):
    """Per-column operands that differ between batches (row strides 0 except the batch's: HF's
    attention mask at batch > 1) are row vectors in a tile inside one batch
    (jit/addr.tile_row_uniform) and full tiles in one across a batch boundary: bitwise equal to
    the reference VM, with NaN and equal values, partial tiles, 1 and 2 threads."""
    n = max(R, C)
    pos = np.arange(n, dtype=np.int64)[None, :] + 7 * np.arange(B, dtype=np.int64)[:, None]
    seq = np.repeat(np.arange(n // 3 + 1), 3)[:n].astype(np.int64)[None, :] + np.arange(B)[:, None]
    fr = RNG.standard_normal((B, R, 1)).astype(np.float32)
    fc = RNG.standard_normal((B, 1, C)).astype(np.float32)
    fr[:, ::4], fc[:, 0, ::5], fr[:, 1::4], fc[:, 0, 1::6] = np.nan, np.nan, 0.5, 0.5
    args = (pos[:, :R, None], pos[:, None, :C] - 3, seq[:, :R, None], seq[:, None, :C], fr, fc,
            fr.astype(np.float64), fc.astype(np.float64), RNG.standard_normal((B, R, C)).astype(np.float32))
    _bitwise_as_reference(mask_mix, *args, why=(B, R, C))


@dvm.kernel
def stacked(k, x, d):
    """Three kernels in one launch, each reading the one before: a first-axis sum, x scaled by it,
    and an integer remainder by d (a zero in d raises after the first two have run)."""
    x = k.load(x)
    s = k.sum(x, axis=0)
    y = k.mul(x, s)
    q = k.remainder(k.cast(k.sum(y, axis=-1), "int64"), k.load(d))
    return k.store(s), k.store(y), k.store(q)


@pytest.mark.parametrize("shape", [(3, 5), (37, 130), (700, 300)])
def test_small_kernels_run_as_one_chain(shape):
    """Below the threading threshold a launch's kernels run in one call of the compiled code (a
    chain of packed kernels); above it, one call per kernel. Same results either way, and an
    integer division by zero in the chain's last kernel still raises."""
    x = RNG.standard_normal(shape).astype(np.float32)
    d = RNG.integers(1, 5, shape[0]).astype(np.int64)
    layout = dvm.verify(stacked.program(x, d))
    _, descs, _, chain, _ = cpu_desc.prog_desc(layout)
    assert len(descs) >= 2
    assert (chain is not None) == (max(d.work for d in descs) < cpu_desc.PARALLEL_MIN_ELEMS)
    _bitwise_as_reference(stacked, x, d, why=(shape,))
    d[-1] = 0
    with pytest.raises(ZeroDivisionError):
        run_on(_threads(1), stacked, x, d)


@dvm.kernel
def scale_shift(k, x, c):
    """x * c + c for a c broadcast over x's outer dims, and its copy: loads read in place when the
    tile's rows lie in one contiguous block of c (addr.direct_addr), copied row by row otherwise."""
    x, c = k.load(x), k.load(c)
    return k.store(k.add(k.mul(x, c), c)), k.store(k.neg(c))


@pytest.mark.parametrize("shape", [(4, 1024, 32), (3, 100, 48), (2, 5, 7, 64), (6, 2, 16), (2, 3, 2, 2, 40)])
def test_operands_broadcast_over_outer_dims(shape):
    """Row offsets (addr.row_bases: an odometer on the two innermost row dims) and in-place tiles
    of an operand with stride 0 over the outer dims, on contiguous, transposed and reversed
    views, tiles inside and across the operand's contiguous blocks: the reference VM's bits."""
    x = RNG.standard_normal(shape).astype(np.float32)
    c = RNG.standard_normal((1,) + shape[1:]).astype(np.float32)
    _bitwise_as_reference(scale_shift, x, np.broadcast_to(c, shape), why=(shape,))
    _bitwise_as_reference(scale_shift, x[..., ::-1, :], np.broadcast_to(c[..., ::-1, :], shape), why=(shape, "rev"))
    xt = np.ascontiguousarray(np.swapaxes(x, 0, -2)).swapaxes(0, -2)
    _bitwise_as_reference(scale_shift, xt, np.broadcast_to(c, shape), why=(shape, "transposed"))
