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
from numba.extending import intrinsic

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


@njit(**OPTS)
def move_rows(is_store, reg, buf, at, rb, nrv, bn):
    """Full-width raw rows: rows whose buffer runs are back to back (rb[i + 1] == rb[i] + bn, as
    in a contiguous inner row dim) move as one run, like their register rows; short rows apart
    from each other take _apart_short_rows."""
    if _apart_short_rows(is_store, reg, buf, at, rb, nrv, bn):
        return
    i = 0
    while i < nrv:
        k = i + 1
        while k < nrv and rb[k] == rb[k - 1] + bn:
            k += 1
        move_run(is_store, reg, buf, i * bn, at + rb[i], (k - i) * bn)
        i = k


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
