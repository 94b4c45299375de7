"""The pairwise-halving tree over 16 to 512 lanes in vector registers (CPU VM, numba).

The spec's tree (docs/DECISIONS.md) over p lanes, p a power of two, combines lane k with lane
k + p/2, then k with k + p/4, ... down to one lane. Over whole 16-lane chunks that is chunk i with
chunk i + m/2 (m chunks), until one chunk is left; the last four levels (8, 4, 2, 1) are halves of
that one vector. `vtree(op, x, p)` emits exactly those combines as LLVM vector instructions: the
same operations in the same order as cpu_reduce._tree, so bitwise the same results, with max/min
as _fmax/_fmin (NaN propagates, b on ties).

Why intrinsics: written as loops, a level of 16-64 lanes fell below the trip count LLVM's
vectorizer needs (16 lanes x 4 interleaved) and ran scalar, and the last levels were scalar
loads and adds: a 64-lane row cost ~10 ns; in registers it costs ~2.
"""
from __future__ import annotations

from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from .cpu_bits import OPTS
from .cpu_kernels import R_MAX, R_MIN, R_PROD, R_SUM

CHUNK = 16          # lanes per vector
VTREE_MAX = 512     # the widest row reduced in registers (32 vectors; wider rows: one staged pass
                    # of three levels first, so MAX_BN = 4096 lanes end here after one pass)


def _combine_ir(builder: ir.IRBuilder, op: int, lo, hi, is_float: bool):
    """cpu_reduce._combine on vectors."""
    if op == R_SUM:
        return builder.fadd(lo, hi) if is_float else builder.add(lo, hi)
    if op == R_PROD:
        return builder.fmul(lo, hi) if is_float else builder.mul(lo, hi)
    cmp = ">" if op == R_MAX else "<"
    if not is_float:   # a if a > b else b (ties: the same value)
        return builder.select(builder.icmp_signed(cmp, lo, hi), lo, hi)
    # _fmax / _fmin: max(b, a) (b on ties) where both are ordered, else a + b (the NaN)
    m = builder.select(builder.fcmp_ordered(cmp, lo, hi), lo, hi)
    return builder.select(builder.fcmp_ordered("ord", lo, hi), m, builder.fadd(lo, hi))


def _vtree_intrinsic(op: int, p: int):
    """The tree over x[:p] of a contiguous 1-D float or signed integer array x (p in 16..512)."""
    def impl(typingctx, arr):
        if not (isinstance(arr, types.Array) and arr.ndim == 1 and arr.layout == "C"
                and (isinstance(arr.dtype, types.Float)
                     or isinstance(arr.dtype, types.Integer) and arr.dtype.signed)):
            return None

        def codegen(context, builder, sig, args):
            aty = sig.args[0]
            data = context.make_array(aty)(context, builder, args[0]).data
            is_float = isinstance(aty.dtype, types.Float)
            base = builder.bitcast(data, ir.VectorType(context.get_value_type(aty.dtype), CHUNK).as_pointer())
            align = aty.dtype.bitwidth // 8
            vs = [builder.load(builder.gep(base, [ir.Constant(ir.IntType(64), i)]), align=align)
                  for i in range(p // CHUNK)]
            while len(vs) > 1:   # whole-chunk levels: chunk i . chunk i + m/2
                h = len(vs) // 2
                vs = [_combine_ir(builder, op, vs[i], vs[i + h], is_float) for i in range(h)]
            v, w = vs[0], CHUNK // 2
            while w >= 1:        # the last levels, inside one vector: lanes [0, w) . [w, 2w)
                def lanes(lo):
                    return ir.Constant(ir.VectorType(ir.IntType(32), w), list(range(lo, lo + w)))
                v = _combine_ir(builder, op, builder.shuffle_vector(v, v, lanes(0)),
                                builder.shuffle_vector(v, v, lanes(w)), is_float)
                w //= 2
            return builder.extract_element(v, ir.Constant(ir.IntType(32), 0))
        return arr.dtype(arr), codegen
    impl.__name__ = f"vtree_{op}_{p}"
    return intrinsic(impl)


_S16, _S32, _S64, _S128, _S256, _S512 = (_vtree_intrinsic(R_SUM, p) for p in (16, 32, 64, 128, 256, 512))
_P16, _P32, _P64, _P128, _P256, _P512 = (_vtree_intrinsic(R_PROD, p) for p in (16, 32, 64, 128, 256, 512))
_X16, _X32, _X64, _X128, _X256, _X512 = (_vtree_intrinsic(R_MAX, p) for p in (16, 32, 64, 128, 256, 512))
_N16, _N32, _N64, _N128, _N256, _N512 = (_vtree_intrinsic(R_MIN, p) for p in (16, 32, 64, 128, 256, 512))


@njit(inline='always', **OPTS)   # a call with an array argument per row cost ~10 ns (the work ~2)
def vtree(op, x, p):
    """The tree over x[:p], p a power of two in [16, VTREE_MAX]; op one of R_SUM/PROD/MAX/MIN."""
    if op == R_SUM:
        if p == 16:
            return _S16(x)
        if p == 32:
            return _S32(x)
        if p == 64:
            return _S64(x)
        if p == 128:
            return _S128(x)
        return _S256(x) if p == 256 else _S512(x)
    if op == R_MAX:
        if p == 16:
            return _X16(x)
        if p == 32:
            return _X32(x)
        if p == 64:
            return _X64(x)
        if p == 128:
            return _X128(x)
        return _X256(x) if p == 256 else _X512(x)
    if op == R_PROD:
        if p == 16:
            return _P16(x)
        if p == 32:
            return _P32(x)
        if p == 64:
            return _P64(x)
        if p == 128:
            return _P128(x)
        return _P256(x) if p == 256 else _P512(x)
    if p == 16:
        return _N16(x)
    if p == 32:
        return _N32(x)
    if p == 64:
        return _N64(x)
    if p == 128:
        return _N128(x)
    return _N256(x) if p == 256 else _N512(x)
