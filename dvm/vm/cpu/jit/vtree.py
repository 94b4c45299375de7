"""The pairwise-halving tree over 16 to 512 lanes in vector registers (CPU VM, numba).

The spec's tree (docs/DECISIONS.md) over p lanes, p a power of two, combines lane k with lane
k + p/2, then k with k + p/4, ... down to one lane. Over whole 16-lane chunks that is chunk i with
chunk i + m/2 (m chunks), until one chunk is left; the last four levels (8, 4, 2, 1) are halves of
that one vector. `vtree(op, x, p)` emits exactly those combines as LLVM vector instructions: the
same operations in the same order as jit/reduce.tree, so bitwise the same results, with max/min
as ops.fmax/fmin (NaN propagates, b on ties).

`vtree_n(op, x, n)` is the tree over a row of any 1 <= n <= VTREE_MAX lanes. The spec's tree over
the next power of two leaves the lanes past n out (a lane without a partner keeps its value).
Here masked loads (lanes past n are never read) fill them with the op's pass-through value,
which every combine maps to its partner bit for bit: -0.0 for a float sum (+0.0 would turn a
-0.0 into +0.0), 1 for a product, the lowest / highest value for max / min. A tree over more
lanes than the next power of two is then the same tree, so rows of 1 to 16 lanes take p = 16.
`vtree_pad(op, x, n, p)` is the tree over p lanes of which those past n > p/2 hold the op's
identity (+0.0 for a float sum), as a partial tile's row is padded.

Why intrinsics: written as loops, a level of 16-64 lanes fell below the trip count LLVM's
vectorizer needs (16 lanes x 4 interleaved) and ran scalar, and the last levels were scalar
loads and adds; in registers a 64-lane row costs a few nanoseconds.
"""
from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from ....graph.dtypes import Bank
from ....graph.ops import reduce_identity
from ..abi import R_MAX, R_MIN, R_PROD, R_SUM, RED_NAMES

CHUNK = 16          # lanes per vector
VTREE_MAX = 512     # the widest row reduced in registers (32 vectors; wider rows: one staged pass
                    # of three levels first, so MAX_BN = 4096 lanes end here after one pass)
WIDTHS = tuple(CHUNK << k for k in range(VTREE_MAX.bit_length() - CHUNK.bit_length() + 1))   # 16 ... 512
_I32, _I64 = ir.IntType(32), ir.IntType(64)


def _combine_ir(builder: ir.IRBuilder, op: int, lo, hi, is_float: bool):
    """reduce.combine on vectors."""
    if op == R_SUM:
        return builder.fadd(lo, hi) if is_float else builder.add(lo, hi)
    if op == R_PROD:
        return builder.fmul(lo, hi) if is_float else builder.mul(lo, hi)
    cmp = ">" if op == R_MAX else "<"
    if not is_float:   # a if a > b else b (ties: the same value)
        return builder.select(builder.icmp_signed(cmp, lo, hi), lo, hi)
    # ops.fmax / ops.fmin: max(b, a) (b on ties) where both are ordered, else a + b (the NaN)
    m = builder.select(builder.fcmp_ordered(cmp, lo, hi), lo, hi)
    return builder.select(builder.fcmp_ordered("ord", lo, hi), m, builder.fadd(lo, hi))


WHOLE, EXACT, PADDED = 0, 1, 2   # the rows of vtree, vtree_n and vtree_pad


def _identity(op: int, dtype) -> float | int:
    """The op's identity (the op table's), as a partial tile's row is padded."""
    if isinstance(dtype, types.Float):
        return float(reduce_identity(RED_NAMES[op], Bank.F64))
    return int(reduce_identity(RED_NAMES[op], Bank.I64))


def _pass_through(op: int, dtype) -> float | int:
    """The value v with combine(op, x, v) == x bit for bit, for every x of dtype: the identity,
    except -0.0 for a float sum (+0.0 + -0.0 is +0.0)."""
    return -0.0 if op == R_SUM and isinstance(dtype, types.Float) else _identity(op, dtype)


def _chunk(builder: ir.IRBuilder, base, i: int, p: int, n, op: int, dtype, align: int, mode: int):
    """Chunk i of a p-lane tree: a plain load (WHOLE rows; the chunks below p/2 of a row of
    n > p/2 lanes), else a masked load of its lanes below n (n an i64 value), the others the
    pass-through value (EXACT) or the identity (PADDED). Masking every chunk of a padded row made
    it much slower than a whole one."""
    ptr = builder.gep(base, [ir.Constant(_I64, i)])
    if mode == WHOLE or (i + 1) * CHUNK <= p // 2:
        return builder.load(ptr, align=align)
    vty = ptr.type.pointee
    lanes = ir.Constant(ir.VectorType(_I64, CHUNK), [i * CHUNK + k for k in range(CHUNK)])
    one = builder.insert_element(ir.Constant(ir.VectorType(_I64, 1), ir.Undefined), n, ir.Constant(_I32, 0))
    n_vec = builder.shuffle_vector(one, one, ir.Constant(ir.VectorType(_I32, CHUNK), [0] * CHUNK))
    mask = builder.icmp_signed("<", lanes, n_vec)
    kind = "f" if isinstance(dtype, types.Float) else "i"
    name = f"llvm.masked.load.v{CHUNK}{kind}{dtype.bitwidth}.p0"
    fn = builder.module.globals.get(name)
    if fn is None:
        fn = ir.Function(builder.module, ir.FunctionType(vty, [vty.as_pointer(), _I32, mask.type, vty]), name=name)
    fill = ir.Constant(vty, [(_identity if mode == PADDED else _pass_through)(op, dtype)] * CHUNK)
    return builder.call(fn, [ptr, ir.Constant(_I32, align), mask, fill])


def _tree_ir(builder: ir.IRBuilder, base, op: int, p: int, n, dtype, mode: int):
    """The tree over the p lanes at base (a pointer to CHUNK-lane vectors), straight-line."""
    is_float = isinstance(dtype, types.Float)
    vs = [_chunk(builder, base, i, p, n, op, dtype, dtype.bitwidth // 8, mode) for i in range(p // CHUNK)]
    while len(vs) > 1:   # whole-chunk levels: chunk i . chunk i + m/2
        h = len(vs) // 2
        vs = [_combine_ir(builder, op, vs[i], vs[i + h], is_float) for i in range(h)]
    v, w = vs[0], CHUNK // 2
    while w >= 1:        # the last levels, inside one vector: lanes [0, w) . [w, 2w)
        def lanes(lo):
            return ir.Constant(ir.VectorType(_I32, w), list(range(lo, lo + w)))
        v = _combine_ir(builder, op, builder.shuffle_vector(v, v, lanes(0)),
                        builder.shuffle_vector(v, v, lanes(w)), is_float)
        w //= 2
    return builder.extract_element(v, ir.Constant(_I32, 0))


def _typed_row(arr, op, p) -> bool:
    return (isinstance(arr, types.Array) and arr.ndim == 1 and arr.layout == "C"
            and (isinstance(arr.dtype, types.Float) or arr.dtype == types.int64)
            and isinstance(op, types.Integer) and isinstance(p, types.Integer))


def _codegen(mode: int):
    """One straight-line tree per (op, p), chosen by two switches: inlined where op is a constant,
    LLVM keeps that op's trees only. WHOLE and PADDED rows switch on p; EXACT rows on p = the
    next power of two of n, at least 16 (a compare chain)."""
    def codegen(context, builder, sig, args):
        opv, data, n = args[0], context.make_array(sig.args[1])(context, builder, args[1]).data, args[2]
        width = args[3] if mode == PADDED else n
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
            if mode == EXACT:
                for w in WIDTHS[:-1]:
                    nxt = fn.append_basic_block(f"vtree.op{o}.gt{w}")
                    builder.cbranch(builder.icmp_signed("<=", width, ir.Constant(width.type, w)), p_blocks[w], nxt)
                    builder.position_at_end(nxt)
                builder.branch(p_blocks[VTREE_MAX])
            else:
                swp = builder.switch(width, p_blocks[VTREE_MAX])
                for w in WIDTHS[:-1]:
                    swp.add_case(ir.Constant(width.type, w), p_blocks[w])
            for w, pb in p_blocks.items():
                builder.position_at_end(pb)
                results.append((_tree_ir(builder, base, o, w, n, dtype, mode), builder.block))
                builder.branch(done)
        builder.position_at_end(done)
        phi = builder.phi(context.get_value_type(dtype))
        for value, block in results:
            phi.add_incoming(value, block)
        return phi
    return codegen


@intrinsic
def vtree(typingctx, op, arr, p):
    """The tree over arr[:p] of a contiguous 1-D float or int64 array, p a power of two
    in [16, VTREE_MAX] (another p: VTREE_MAX); op one of R_SUM/PROD/MAX (another op: R_MIN)."""
    if not _typed_row(arr, op, p):
        return None
    return arr.dtype(types.int64, arr, types.int64), _codegen(WHOLE)


@intrinsic
def vtree_n(typingctx, op, arr, n):
    """The tree over arr[:n], 1 <= n <= VTREE_MAX lanes (a larger n: VTREE_MAX), lanes past n
    left out as the spec's tree leaves them; arr[n:] is never read (it may end at n)."""
    if not _typed_row(arr, op, n):
        return None
    return arr.dtype(types.int64, arr, types.int64), _codegen(EXACT)


@intrinsic
def vtree_pad(typingctx, op, arr, n, p):
    """The tree over p lanes (as vtree) of which those past n hold the identity: arr[:n] padded,
    p/2 < n <= p; arr[n:] is never read."""
    if not (_typed_row(arr, op, n) and isinstance(p, types.Integer)):
        return None
    return arr.dtype(types.int64, arr, types.int64, types.int64), _codegen(PADDED)
