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
from numba import types
from numba.extending import intrinsic

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


WIDTHS = tuple(CHUNK << k for k in range(VTREE_MAX.bit_length() - CHUNK.bit_length() + 1))   # 16 ... 512


def _tree_ir(builder: ir.IRBuilder, base, op: int, p: int, align: int, is_float: bool):
    """The tree over the p lanes at base (a pointer to CHUNK-lane vectors), straight-line."""
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


@intrinsic
def vtree(typingctx, op, arr, p):
    """The tree over arr[:p] of a contiguous 1-D float or signed integer array, p a power of two
    in [16, VTREE_MAX] (another p: VTREE_MAX); op one of R_SUM/PROD/MAX (another op: R_MIN).
    One straight-line tree per (op, p), chosen by two switches: inlined where op is a constant,
    LLVM keeps that op's trees only."""
    if not (isinstance(arr, types.Array) and arr.ndim == 1 and arr.layout == "C"
            and (isinstance(arr.dtype, types.Float)
                 or isinstance(arr.dtype, types.Integer) and arr.dtype.signed)
            and isinstance(op, types.Integer) and isinstance(p, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        opv, data, pv = args[0], context.make_array(sig.args[1])(context, builder, args[1]).data, args[2]
        dtype = sig.args[1].dtype
        base = builder.bitcast(data, ir.VectorType(context.get_value_type(dtype), CHUNK).as_pointer())
        fn, results = builder.function, []
        done = fn.append_basic_block("vtree.done")
        op_blocks = {o: fn.append_basic_block(f"vtree.op{o}") for o in (R_SUM, R_PROD, R_MAX, R_MIN)}
        sw = builder.switch(opv, op_blocks[R_MIN])
        for o in (R_SUM, R_PROD, R_MAX):
            sw.add_case(ir.Constant(opv.type, o), op_blocks[o])
        for o, block in op_blocks.items():
            builder.position_at_end(block)
            p_blocks = {w: fn.append_basic_block(f"vtree.op{o}.p{w}") for w in WIDTHS}
            swp = builder.switch(pv, p_blocks[VTREE_MAX])
            for w in WIDTHS[:-1]:
                swp.add_case(ir.Constant(pv.type, w), p_blocks[w])
            for w, pb in p_blocks.items():
                builder.position_at_end(pb)
                results.append((_tree_ir(builder, base, o, w, dtype.bitwidth // 8,
                                         isinstance(dtype, types.Float)), builder.block))
                builder.branch(done)
        builder.position_at_end(done)
        phi = builder.phi(context.get_value_type(dtype))
        for value, block in results:
            phi.add_incoming(value, block)
        return phi
    return arr.dtype(types.int64, arr, types.int64), codegen
