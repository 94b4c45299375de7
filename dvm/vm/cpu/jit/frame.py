"""The frame through which the CPU VM's core hands a kernel run to its pieces (abi.FR_*), and the
call of a piece through the VM table.

A piece is a C function int64(frame, pc, a, b), compiled and cached on its own (host/pieces); the
core calls it by address (`call_piece`), so no piece's code is ever compiled into another's. A
piece rebuilds the views it needs from the frame: raw views without a meminfo (carray over an
address), which are never reference-counted.
"""
from __future__ import annotations

from llvmlite import ir
from numba import carray, njit, types
from numba.extending import intrinsic

from ..abi import (DEC_WIDTH, FR_ADDRS, FR_ARGST, FR_ARGSZ, FR_B, FR_CONSTS, FR_D, FR_DEC, FR_DIMS, FR_F, FR_FP,
                   FR_FZ, FR_I, FR_INSTRS, FR_IX, FR_META, FR_NARGS, FR_NB, FR_NCONST, FR_ND, FR_NDEC, FR_NDIMS,
                   FR_NF, FR_NFP, FR_NI, FR_NINSTR, FR_NIX, FR_NMETA, FR_NOPND, FR_NSD, FR_NSF, FR_NSI, FR_NSI2,
                   FR_NUMELS, FR_OPTAB, FR_OPW, FR_PEEP, FR_RIO, FR_SD, FR_SF, FR_SI, FR_SI2, FR_ST, FR_T, FR_TAB,
                   FRAME_WORDS, FUSE_WIDTH, INSTR_WIDTH, MAX_REGS, N_PIECES, RIO_WIDTH, ST_ROWS)
from .bits import OPTS, ptr_f32, ptr_f64, ptr_i64, ptr_u8

_I64 = ir.IntType(64)


@intrinsic
def call_piece(typingctx, addr, frame, pc, a, b):
    """(*(int64 (*)(int64, int64, int64, int64)) addr)(frame, pc, a, b)."""
    if not all(isinstance(t, types.Integer) for t in (addr, frame, pc, a, b)):
        return None

    def codegen(context, builder, sig, args):
        fnty = ir.FunctionType(_I64, [_I64] * 4)
        vals = [context.cast(builder, v, t, types.int64) for v, t in zip(args[1:], sig.args[1:])]
        return builder.call(builder.inttoptr(args[0], fnty.as_pointer()), vals)
    return types.int64(addr, frame, pc, a, b), codegen


@njit(inline='always', **OPTS)   # views: inlined where they are used (no call per view)
def frame(addr):
    return carray(ptr_i64(addr), FRAME_WORDS)


@njit(inline='always', **OPTS)
def table(fr):
    """The piece addresses of the VM table (0: not loaded)."""
    return carray(ptr_i64(fr[FR_TAB]), N_PIECES)


@njit(inline='always', **OPTS)
def instrs(fr):
    return carray(ptr_i64(fr[FR_INSTRS]), (fr[FR_NINSTR], INSTR_WIDTH))


@njit(inline='always', **OPTS)
def decode(fr):
    return carray(ptr_i64(fr[FR_DEC]), (fr[FR_NDEC], DEC_WIDTH))


@njit(inline='always', **OPTS)
def peep(fr):
    return carray(ptr_i64(fr[FR_PEEP]), fr[FR_NINSTR])


@njit(inline='always', **OPTS)
def meta(fr):
    return carray(ptr_i64(fr[FR_META]), fr[FR_NMETA])


@njit(inline='always', **OPTS)
def dims(fr):
    return carray(ptr_i64(fr[FR_DIMS]), fr[FR_NDIMS])


@njit(inline='always', **OPTS)
def optab(fr):
    return carray(ptr_i64(fr[FR_OPTAB]), (fr[FR_NOPND], fr[FR_OPW]))


@njit(inline='always', **OPTS)
def consts(fr):
    return carray(ptr_i64(fr[FR_CONSTS]), fr[FR_NCONST])


@njit(inline='always', **OPTS)
def addrs(fr):
    return carray(ptr_i64(fr[FR_ADDRS]), fr[FR_NARGS])


@njit(inline='always', **OPTS)
def numels(fr):
    return carray(ptr_i64(fr[FR_NUMELS]), fr[FR_NARGS])


@njit(inline='always', **OPTS)
def argsz(fr):
    return carray(ptr_i64(fr[FR_ARGSZ]), fr[FR_NARGS])


@njit(inline='always', **OPTS)
def argst(fr):
    return carray(ptr_i64(fr[FR_ARGST]), fr[FR_NARGS])


@njit(inline='always', **OPTS)
def rio(fr):
    return carray(ptr_i64(fr[FR_RIO]), (fr[FR_NINSTR], RIO_WIDTH))


@njit(inline='always', **OPTS)
def fuse(fr):
    return carray(ptr_i64(fr[FR_FZ]), (fr[FR_NINSTR], FUSE_WIDTH))


@njit(inline='always', **OPTS)
def bank_f(fr):
    return carray(ptr_f32(fr[FR_F]), (fr[FR_NF], fr[FR_T]))


@njit(inline='always', **OPTS)
def bank_d(fr):
    return carray(ptr_f64(fr[FR_D]), (fr[FR_ND], fr[FR_T]))


@njit(inline='always', **OPTS)
def bank_i(fr):
    return carray(ptr_i64(fr[FR_I]), (fr[FR_NI], fr[FR_T]))


@njit(inline='always', **OPTS)
def bank_b(fr):
    return carray(ptr_u8(fr[FR_B]), (fr[FR_NB], fr[FR_T]))


@njit(inline='always', **OPTS)
def fptr(fr):
    """fp[k]: the address f32 register k aliases (0: its bank row)."""
    return carray(ptr_i64(fr[FR_FP]), fr[FR_NFP])


@njit(inline='always', **OPTS)
def ix(fr):
    return carray(ptr_i64(fr[FR_IX]), fr[FR_NIX])


@njit(inline='always', **OPTS)
def sf(fr):
    return carray(ptr_f32(fr[FR_SF]), fr[FR_NSF])


@njit(inline='always', **OPTS)
def sd(fr):
    return carray(ptr_f64(fr[FR_SD]), fr[FR_NSD])


@njit(inline='always', **OPTS)
def si(fr):
    return carray(ptr_i64(fr[FR_SI]), fr[FR_NSI])


@njit(inline='always', **OPTS)
def si2(fr):
    return carray(ptr_i64(fr[FR_SI2]), fr[FR_NSI2])


@njit(inline='always', **OPTS)
def states(fr):
    return carray(ptr_i64(fr[FR_ST]), (ST_ROWS, MAX_REGS))
