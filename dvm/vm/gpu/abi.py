"""Constants shared by the GPU VM's host code (image.py, launch.py) and its Triton kernels.

The device image (image.py) is an int64 array: per kernel block of the Program, a header of
KH words, a sweep table, an operand table and the instructions, pre-decoded from the verified
ISA words into IW words each. All offsets in a header are in words from the block's start.
"""
from __future__ import annotations

from ...codegen.program import MAX_DIMS
from ...graph.dtypes import Bank, DType
from ...graph.ops import BINARY, TERNARY, UNARY, VM_REDUCTIONS

# --- the compiled VM ---------------------------------------------------------------------------
TILE = 1024          # lanes of one tile register (a Program's BM * BN may not exceed it)
NUM_WARPS = 8        # 4 lanes per thread and register at TILE = 1024
OPTIONS = {"num_warps": NUM_WARPS, "enable_fp_fusion": False}   # every launch's and compile's options
N_SLOTS = 16         # buffer addresses passed as kernel arguments; more go through a table
# the kernels' arguments, every one an int64 address: the device image's kernel block, the slots,
# the table of further addresses, scratch (interp.vm_kernel and the specialised kernels)
ARG_NAMES = ("blk", *(f"a{k}" for k in range(N_SLOTS)), "ext", "scratch")
# compiled variants: hot registers per bank (F32, F64, I64, B8), higher register numbers live in
# scratch memory; a Program runs on "float" when it has no F64 or I64 registers (fewer live tiles)
VARIANTS = {"full": (8, 2, 4, 4), "float": (8, 0, 0, 4)}
SCRATCH_ITEM = 8     # bytes of one spilled lane (every bank's value fits 8 bytes)

# --- kernel block header (KH words) ------------------------------------------------------------
# work items: a row block with all its column tiles, or (H_PAR = 1: kernels whose column tiles
# are independent: one sweep, no init or fin, no accumulator) a single tile
(H_ROWS, H_COLS, H_BM, H_BN, H_NRB, H_NCT, H_NSW, H_PRO_S, H_PRO_E, H_SWEEPS, H_OPNDS, H_INSTRS,
 H_NR, H_NC, H_SPILL_F, H_SPILL_D, H_SPILL_I, H_SPILL_B, H_CTA_WORDS, H_PAR, H_ITEMS) = range(21)
H_SIZES = 22                      # MAX_DIMS sizes: row dims then col dims
KH = H_SIZES + MAX_DIMS + 2       # 32
SWEEP_W = 6                       # init s, e, body s, e, fin s, e
# operand table entry: slot (argument), dtype code, element offset, kind, strides per dim
O_SLOT, O_DTYPE, O_OFFSET, O_KIND = range(4)
O_STRIDES = 4
OW = O_STRIDES + MAX_DIMS + 4     # 16

# --- instructions: IW words ---------------------------------------------------------------------
# w0 = kind | bank << 8 | op << 16 | obank << 32; w1 = f1 | f2 << 16 | f3 << 32 | f4 << 48;
# w2 = aux (operand index, target dtype code, or a constant's bits)
IW = 4
(K_CONST, K_LOAD, K_STORE, K_STOREROW, K_INDEX, K_CAST, K_EW1, K_EW2, K_EW3,
 K_ACCINIT, K_ACC, K_RFIN, K_ROWRED) = range(13)
GROUP_KIND = {"const": K_CONST, "load": K_LOAD, "store": K_STORE, "storerow": K_STOREROW,
              "index": K_INDEX, "cast": K_CAST, "accinit": K_ACCINIT, "acc": K_ACC, "rfin": K_RFIN,
              "rowred": K_ROWRED}
EW_KIND = {1: K_EW1, 2: K_EW2, 3: K_EW3}

B_F32, B_F64, B_I64, B_B8 = int(Bank.F32), int(Bank.F64), int(Bank.I64), int(Bank.B8)
DT_BOOL, DT_I32, DT_I64, DT_F16, DT_BF16, DT_F32, DT_F64 = (int(d) for d in DType)

# op numbers inside a kind: positions in the op table's lists (ops.py switches on them)
UNARY_OP = {name: i for i, name in enumerate(UNARY)}
BINARY_OP = {name: i for i, name in enumerate(BINARY)}
TERNARY_OP = {name: i for i, name in enumerate(TERNARY)}
RED_OP = {name: i for i, name in enumerate(VM_REDUCTIONS)}


def _ids(names, table) -> tuple[int, ...]:
    return tuple(table[n] for n in names)


(U_NEG, U_ABS, U_EXP, U_EXP2, U_EXPM1, U_LOG, U_LOG2, U_LOG1P, U_SQRT, U_RSQRT, U_RECIP, U_SIN, U_COS,
 U_TANH, U_SIGMOID, U_ERF, U_GELU, U_GELU_TANH, U_SILU, U_RELU, U_FLOOR, U_CEIL, U_ROUND, U_TRUNC,
 U_SIGN, U_NOT, U_ISNAN, U_ISINF, U_ISFINITE) = _ids(
    ("neg", "abs", "exp", "exp2", "expm1", "log", "log2", "log1p", "sqrt", "rsqrt", "reciprocal", "sin",
     "cos", "tanh", "sigmoid", "erf", "gelu", "gelu_tanh", "silu", "relu", "floor", "ceil", "round",
     "trunc", "sign", "logical_not", "isnan", "isinf", "isfinite"), UNARY_OP)
(B_ADD, B_SUB, B_MUL, B_DIV, B_FLOORDIV, B_REM, B_POW, B_MAX, B_MIN, B_EQ, B_NE, B_LT, B_LE, B_GT,
 B_GE, B_LAND, B_LOR, B_LXOR, B_BAND, B_BOR, B_BXOR) = _ids(
    ("add", "sub", "mul", "div", "floor_divide", "remainder", "pow", "maximum", "minimum", "eq", "ne",
     "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor", "bitwise_and", "bitwise_or",
     "bitwise_xor"), BINARY_OP)
T_WHERE, T_CLAMP = _ids(("where", "clamp"), TERNARY_OP)
R_SUM, R_PROD, R_MAX, R_MIN, R_ARGMAX, R_ARGMIN = _ids(VM_REDUCTIONS, RED_OP)

assert len(UNARY_OP) == 29 and len(BINARY_OP) == 21 and len(TERNARY_OP) == 2, \
    "the op table changed: update the GPU VM's op switches (vm/gpu/ops.py) and these ids"
