"""Raw byte moves of the CPU VM's tiles: whole rows with a vectorized byte loop (short rows of the
common head widths with a constant size: LLVM's memmove, inlined as vector moves), back-to-back
rows as one run, and the repetition of a tile row by doubling block copies (compiled into the
pieces that use them: jit/mem, jit/rowlevel).

Not libc's memmove for long runs: from ~4 KB it uses `rep movsb`, which on this project's AMD
hosts runs an order of magnitude slower when the destination is 16 bytes past the source modulo
4096 (the byte loop runs at the same speed at every offset). Tiles are 16 KB, and glibc puts
large allocations at 16 bytes past a page, so a copy kernel hit it on some output addresses.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import carray, njit, types
from numba.extending import intrinsic, overload

from ..abi import DT_BF16, DT_F16
from .bits import OPTS, ptr_u8


@intrinsic
def move(typingctx, dst, src, nbytes):
    """memmove(dst, src, nbytes) on raw addresses (LLVM's intrinsic: a few cycles for a short
    row, where a generic element loop pays ~20 cycles of trip-count and alias checks per row)."""
    if not all(isinstance(a, types.Integer) for a in (dst, src, nbytes)):
        return None

    def codegen(context, builder, sig, args):
        i8p = ir.IntType(8).as_pointer()
        fn = builder.module.declare_intrinsic("llvm.memmove", [i8p, i8p, ir.IntType(64)])
        builder.call(fn, [builder.inttoptr(args[0], i8p), builder.inttoptr(args[1], i8p),
                          args[2], ir.Constant(ir.IntType(1), 0)])
        return context.get_dummy_value()
    return types.none(dst, src, nbytes), codegen


@njit(**OPTS)
def raw_copy(reg, buf, cv, stride, general):
    """Rows of reg and buf are byte-identical runs: unit stride, same element type (equal sizes
    and no f16/bf16 conversion means the same type: see mem.memop)."""
    return (not general) and stride == 1 and cv != DT_F16 and cv != DT_BF16 and reg.itemsize == buf.itemsize


@njit(**OPTS)
def copy_bytes(dst, src, nbytes):
    """dst[:nbytes] = src[:nbytes] for runs that do not overlap, by a loop LLVM vectorizes. The
    XOR with a zero it cannot prove zero keeps it from turning the loop back into memmove."""
    z = np.uint8(nbytes >> 62)
    d, s = carray(ptr_u8(dst), nbytes), carray(ptr_u8(src), nbytes)
    for i in range(nbytes):
        d[i] = s[i] ^ z


SHORT_RUN = 256   # bytes: shorter runs that do not overlap move in constant-size pieces


@njit(inline='always', **OPTS)
def _ends(dst, src, nbytes, p):
    """A run of p to 2p bytes (p a constant where inlined) as two p-byte moves, its first p bytes
    and its last p, which overlap unless nbytes == 2p: each is one or two vector moves. Correct
    when source and destination do not overlap (the overlap rewrites the same bytes)."""
    move(dst, src, p)
    move(dst + nbytes - p, src + nbytes - p, p)


@njit(**OPTS)   # a call (three integers) costs a few ns; inlined at every site, mem compiled 1.45x longer
def move_short(dst, src, nbytes):
    """A run of under SHORT_RUN bytes that does not overlap, as two constant-size moves of the
    largest power of two it holds (_ends): a row of a rotary or pass-through slice, 8 or 24 f32
    lanes, costs a few cycles instead of a loop's ~20 of trip-count and alias checks."""
    if nbytes >= 32:
        if nbytes >= 128:
            _ends(dst, src, nbytes, 128)
        elif nbytes >= 64:
            _ends(dst, src, nbytes, 64)
        else:
            _ends(dst, src, nbytes, 32)
    elif nbytes >= 8:
        if nbytes >= 16:
            _ends(dst, src, nbytes, 16)
        else:
            _ends(dst, src, nbytes, 8)
    elif nbytes >= 2:
        if nbytes >= 4:
            _ends(dst, src, nbytes, 4)
        else:
            _ends(dst, src, nbytes, 2)
    elif nbytes == 1:
        move(dst, src, 1)


@njit(inline='always', **OPTS)
def _short_rows(is_store, at_reg, at_buf, rb, isz, nrv, nbytes, p, exact):
    """Rows i < nrv of nbytes each (p to 2p, p a constant where inlined; exactly p when the
    constant `exact` is True): register row i at at_reg + i * nbytes, buffer row at
    at_buf + rb[i] * isz; one p-byte move each, or _ends."""
    for i in range(nrv):
        r = at_reg + i * nbytes
        b = at_buf + rb[i] * isz
        d, s = (b, r) if is_store else (r, b)
        if exact:
            move(d, s, p)
        else:
            _ends(d, s, nbytes, p)


@njit(**OPTS)
def _apart_short_rows(is_store, reg, buf, at, rb, nrv, bn):
    """Rows of 4 to SHORT_RUN - 1 bytes, no two back to back, the register outside the buffer:
    moved with the size class chosen once for all rows (per row it cost more than the move).
    False (nothing moved) for any other rows."""
    isz = buf.itemsize
    nbytes = bn * isz
    at_reg, lo = reg.ctypes.data, buf.ctypes.data
    if nbytes < 4 or nbytes >= SHORT_RUN or not (at_reg >= lo + buf.size * isz or at_reg + nrv * nbytes <= lo):
        return False
    for k in range(1, nrv):
        if rb[k] == rb[k - 1] + bn:
            return False
    at_buf = lo + at * isz
    if nbytes == 128:   # the common head widths (32, 64 f32 lanes; 64 bf16): one move a row
        _short_rows(is_store, at_reg, at_buf, rb, isz, nrv, nbytes, 128, True)
    elif nbytes == 64:
        _short_rows(is_store, at_reg, at_buf, rb, isz, nrv, nbytes, 64, True)
    elif nbytes >= 128:
        _short_rows(is_store, at_reg, at_buf, rb, isz, nrv, nbytes, 128, False)
    elif nbytes >= 64:
        _short_rows(is_store, at_reg, at_buf, rb, isz, nrv, nbytes, 64, False)
    elif nbytes >= 32:
        _short_rows(is_store, at_reg, at_buf, rb, isz, nrv, nbytes, 32, False)
    elif nbytes >= 16:
        _short_rows(is_store, at_reg, at_buf, rb, isz, nrv, nbytes, 16, False)
    elif nbytes >= 8:
        _short_rows(is_store, at_reg, at_buf, rb, isz, nrv, nbytes, 8, False)
    else:
        _short_rows(is_store, at_reg, at_buf, rb, isz, nrv, nbytes, 4, False)
    return True


@njit(inline='always', **OPTS)   # per row of a tile: a call costs more than a short row's move
def move_bytes(dst, src, nbytes):
    """memmove. The common short row lengths (16/32/64 f32 lanes: attention heads) get a constant
    size, which LLVM inlines as a few vector moves instead of a libc call; other short runs that
    do not overlap take move_short, longer ones copy_bytes (see the module's note), overlapping
    ones libc's memmove."""
    if nbytes == 128:
        move(dst, src, 128)
    elif nbytes == 256:
        move(dst, src, 256)
    elif nbytes == 64:
        move(dst, src, 64)
    elif dst - src >= nbytes or src - dst >= nbytes:
        if nbytes < SHORT_RUN:
            move_short(dst, src, nbytes)
        else:
            copy_bytes(dst, src, nbytes)
    else:
        move(dst, src, nbytes)


@njit(inline='always', **OPTS)   # per row of a tile: a call passes both arrays' fields (~20 ns a row)
def move_run(is_store, reg, buf, lane, at, n):
    """buf[at:at + n] -> reg[lane:lane + n], or back when storing, byte for byte (raw_copy holds)."""
    isz = buf.itemsize
    p, q = reg.ctypes.data + lane * isz, buf.ctypes.data + at * isz
    if is_store:
        move_bytes(q, p, n * isz)
    else:
        move_bytes(p, q, n * isz)


@njit(inline='always', **OPTS)
def run_end(rb, i, nrv, step):
    """The first row after i whose buffer row does not start `step` elements after the previous
    one's: rows i .. run_end - 1 are one run (step bn: back-to-back rows; 1: a transposed view's
    consecutive elements)."""
    k = i + 1
    while k < nrv and rb[k] == rb[k - 1] + step:
        k += 1
    return k


@njit(**OPTS)
def move_rows(is_store, reg, buf, at, rb, nrv, bn):
    """Full-width raw rows: rows whose buffer runs are back to back (rb[i + 1] == rb[i] + bn, as
    in a contiguous inner row dim) move as one run, like their register rows; short rows apart
    from each other take _apart_short_rows."""
    if _apart_short_rows(is_store, reg, buf, at, rb, nrv, bn):
        return
    i = 0
    while i < nrv:
        k = run_end(rb, i, nrv, bn)
        move_run(is_store, reg, buf, i * bn, at + rb[i], (k - i) * bn)
        i = k


# shufflevector masks of an 8x8 transpose of 4-byte lanes (AVX's unpack, shuffle, permute2f128)
_UNPACK = ([0, 8, 1, 9, 4, 12, 5, 13], [2, 10, 3, 11, 6, 14, 7, 15])
_PAIRS = ([0, 1, 8, 9, 4, 5, 12, 13], [2, 3, 10, 11, 6, 7, 14, 15])
_HALVES = ([0, 1, 2, 3, 8, 9, 10, 11], [4, 5, 6, 7, 12, 13, 14, 15])
BLOCK_T = 8   # rows and columns of transpose8's block


@intrinsic
def transpose8(typingctx, src, src_step, dst, dst_step):
    """Row c of the 8x8 block of 4-byte lanes at dst (rows dst_step bytes apart) = column c of the
    one at src (rows src_step bytes apart): 8 vector loads, 24 shuffles, 8 vector stores (the
    blocks must not overlap)."""
    if not all(isinstance(a, types.Integer) for a in (src, src_step, dst, dst_step)):
        return None

    def codegen(context, builder, sig, args):
        i32, i64 = ir.IntType(32), ir.IntType(64)
        vec = ir.VectorType(i32, BLOCK_T)
        src_at, src_step_, dst_at, dst_step_ = args

        def row(at, step, r):
            return builder.inttoptr(builder.add(at, builder.mul(step, ir.Constant(i64, r))), vec.as_pointer())

        def shuffle(a, b, lanes):
            return builder.shuffle_vector(a, b, ir.Constant(vec, [ir.Constant(i32, x) for x in lanes]))
        rows = [builder.load(row(src_at, src_step_, r), align=4) for r in range(BLOCK_T)]
        t = [shuffle(rows[r], rows[r + 1], m) for r in range(0, BLOCK_T, 2) for m in _UNPACK]
        tt = [shuffle(t[a], t[a + 2], m) for a in (0, 1, 4, 5) for m in _PAIRS]
        cols = [shuffle(tt[c], tt[c + 4], m) for m in _HALVES for c in range(4)]
        for c in range(BLOCK_T):
            builder.store(cols[c], row(dst_at, dst_step_, c), align=4)
        return context.get_dummy_value()
    return types.none(src, src_step, dst, dst_step), codegen


def move_transposed(is_store, reg, buf, at, rb, stride, nrv, ncv, bn):
    """Lanes (i, k), i < nrv, k < ncv, of a row-major tile <-> buf[at + rb[i] + k*stride], rows in
    runs of consecutive elements (rb[i + 1] == rb[i] + 1: an operand whose innermost axis runs
    along the tile's rows, a transposed view), each run by _transposed_run. Returns whether it
    moved them: for 4-byte lanes of the buffer's own type; others (a conversion, another size)
    move nothing and compile nothing. numba only."""
    raise NotImplementedError


def _move_transposed(is_store, reg, buf, at, rb, stride, nrv, ncv, bn):
    i = 0
    while i < nrv:
        e = run_end(rb, i, nrv, 1)
        _transposed_run(is_store, reg[i * bn:], buf, at + rb[i], stride, e - i, ncv, bn)
        i = e
    return True


def _not_moved(is_store, reg, buf, at, rb, stride, nrv, ncv, bn):
    return False


@overload(move_transposed)
def _move_transposed_impl(is_store, reg, buf, at, rb, stride, nrv, ncv, bn):
    same_word = reg.dtype == buf.dtype and getattr(buf.dtype, "bitwidth", 0) == 32
    return _move_transposed if same_word else _not_moved


@njit(**OPTS)
def _transposed_run(is_store, reg, buf, at, stride, nrv, ncv, bn):
    """move_transposed's rows 0 .. nrv-1 of reg at buf[at + i + k*stride]: 8x8 blocks by
    transpose8, the edges lane by lane (a row at a time, the tile took ~1.3 ns a lane; transpose8
    ~0.25-0.5)."""
    isz = buf.itemsize
    r_at, b_at = reg.ctypes.data, buf.ctypes.data + at * isz
    i8, k8 = nrv - nrv % BLOCK_T, ncv - ncv % BLOCK_T
    for i0 in range(0, i8, BLOCK_T):
        for k0 in range(0, k8, BLOCK_T):
            r, b = r_at + (i0 * bn + k0) * isz, b_at + (k0 * stride + i0) * isz
            if is_store:
                transpose8(r, bn * isz, b, stride * isz)
            else:
                transpose8(b, stride * isz, r, bn * isz)
    for i in range(nrv):
        lanes = reg[i * bn:i * bn + ncv]
        for k in range(k8 if i < i8 else 0, ncv):
            if is_store:
                buf[at + i + k * stride] = lanes[k]
            else:
                lanes[k] = buf[at + i + k * stride]


@njit(**OPTS)
def repeat_row(reg, r, bm, bn):
    """Rows r+1 .. bm-1 of a row-major tile become copies of row r, by doubling block copies
    (rows r .. r+m-1 already hold row r; about log2(bm - r) moves instead of one per row)."""
    row = bn * reg.itemsize
    at = reg.ctypes.data + r * row
    m = 1
    while r + m < bm:
        k = min(m, bm - r - m)
        move(at + m * row, at, k * row)
        m += k
