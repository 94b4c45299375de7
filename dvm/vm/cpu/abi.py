"""Every constant shared between the CPU VM's Python side (host/) and its compiled code (jit/),
named, in one place. Numbers here are this VM's own: host/decode.py maps the ISA table onto them
at import time, so a renumbered ISA never meets stale compiled code, and editing this file
recompiles every piece that imports it (host/pieces.py keys each piece's cache by the files it
imports).
"""
from __future__ import annotations

MAX_REGS = 256   # registers per bank (codegen.program.MAX_REGS; checked by host/decode)
ALIASED = 2      # jit/addr.alias_ok: in-place tiles, some of them an input's and an output's at once
OPND_ARG = 0     # an operand-table row reading an argument (codegen.program.OPND_ARG; checked by host/decode)

# --- register banks and stored dtypes (the Program format's dtype codes; checked by host/decode) -
BK_F32, BK_F64, BK_I64, BK_B8 = 0, 1, 2, 3
N_BANKS = 4
DT_BOOL, DT_I32, DT_I64, DT_F16, DT_BF16, DT_F32, DT_F64 = 0, 1, 2, 3, 4, 5, 6

# --- elementwise ops and reductions ---------------------------------------------------------------
EW_NAMES = ("neg", "abs", "exp", "exp2", "expm1", "log", "log2", "log1p", "sqrt", "rsqrt",
            "reciprocal", "sin", "cos", "tanh", "sigmoid", "erf", "gelu", "gelu_tanh", "silu", "relu",
            "floor", "ceil", "round", "trunc", "sign", "logical_not", "isnan", "isinf", "isfinite",
            "add", "sub", "mul", "div", "floor_divide", "remainder", "pow", "maximum", "minimum",
            "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor",
            "bitwise_and", "bitwise_or", "bitwise_xor", "where", "clamp")
(OP_NEG, OP_ABS, OP_EXP, OP_EXP2, OP_EXPM1, OP_LOG, OP_LOG2, OP_LOG1P, OP_SQRT, OP_RSQRT,
 OP_RECIP, OP_SIN, OP_COS, OP_TANH, OP_SIGMOID, OP_ERF, OP_GELU, OP_GELU_TANH, OP_SILU, OP_RELU,
 OP_FLOOR, OP_CEIL, OP_ROUND, OP_TRUNC, OP_SIGN, OP_LNOT, OP_ISNAN, OP_ISINF, OP_ISFINITE,
 OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_FLOORDIV, OP_REM, OP_POW, OP_MAX, OP_MIN,
 OP_EQ, OP_NE, OP_LT, OP_LE, OP_GT, OP_GE, OP_LAND, OP_LOR, OP_LXOR,
 OP_BAND, OP_BOR, OP_BXOR, OP_WHERE, OP_CLAMP) = range(len(EW_NAMES))
RED_NAMES = ("sum", "prod", "max", "min", "argmax", "argmin")
R_SUM, R_PROD, R_MAX, R_MIN, R_ARGMAX, R_ARGMIN = range(len(RED_NAMES))

# what the compiled dispatch implements, per (elementwise kind, bank) and per reduction bank
# (host/decode.handled; the ISA coverage test reads it)
_FMATH = {"neg", "abs", "exp", "exp2", "expm1", "log", "log2", "log1p", "sqrt", "rsqrt", "reciprocal",
          "sin", "cos", "tanh", "sigmoid", "erf", "gelu", "gelu_tanh", "silu", "relu", "floor", "ceil",
          "round", "trunc", "sign"}
_FBIN = {"add", "sub", "mul", "div", "floor_divide", "remainder", "pow", "maximum", "minimum"}
_CMP = {"eq", "ne", "lt", "le", "gt", "ge"}
HANDLED = {
    ("un", BK_F32): _FMATH, ("un", BK_F64): _FMATH, ("un", BK_I64): {"neg", "abs", "relu", "sign"},
    ("un", BK_B8): {"logical_not"},
    ("pred", BK_F32): {"isnan", "isinf", "isfinite"}, ("pred", BK_F64): {"isnan", "isinf", "isfinite"},
    ("bin", BK_F32): _FBIN, ("bin", BK_F64): _FBIN,
    ("bin", BK_I64): {"add", "sub", "mul", "floor_divide", "remainder", "pow", "maximum", "minimum",
                      "bitwise_and", "bitwise_or", "bitwise_xor"},
    ("bin", BK_B8): {"logical_and", "logical_or", "logical_xor", "bitwise_and", "bitwise_or", "bitwise_xor"},
    ("cmp", BK_F32): _CMP, ("cmp", BK_F64): _CMP, ("cmp", BK_I64): _CMP,
    ("where", BK_F32): {"where"}, ("where", BK_F64): {"where"}, ("where", BK_I64): {"where"},
    ("where", BK_B8): {"where"},
    ("clamp", BK_F32): {"clamp"}, ("clamp", BK_F64): {"clamp"}, ("clamp", BK_I64): {"clamp"},
}
REDUCTIONS_HANDLED = {BK_F32: set(RED_NAMES), BK_F64: set(RED_NAMES), BK_I64: set(RED_NAMES)}

# --- decoding: instruction groups, elementwise kinds, the decode table's columns ------------------
G_LOAD, G_STORE, G_CONST, G_INDEX, G_CAST, G_EW, G_ACCINIT, G_ACC, G_RFIN, G_ROWRED, G_STOREROW = range(11)
K_UN, K_PRED, K_BIN, K_CMP, K_WHERE, K_CLAMP = range(6)
DEC_GROUP, DEC_OP, DEC_BANK, DEC_SRC, DEC_KIND, DEC_WRITES_F = range(6)   # a row per opcode
DEC_WIDTH = 6
WRITES_F_NONE, WRITES_F_DEST, WRITES_F_RMW = 0, 1, 2   # DEC_WRITES_F: how an op writes its f32 dest

ERR_OK, ERR_UNHANDLED, ERR_ZERODIV = 0, 1, 2   # what the compiled code returns

# --- register states (st[bank, reg]) and how an instruction meets them (jit/interp._row_mode) ------
RS_FULL = 0         # a full tile
RS_COMPACT = 1      # row r's value in lane r (a reduction result; column 0 of a column-major tile)
RS_UNIFORM = 2      # a constant in lanes [0, BM) only
RS_ROWVEC = 3       # row 0 holds the row every row repeats (row-major tiles)
RS_UNIFORM_ALL = 4  # a constant in every lane (filled when a full-tile reader needed it)
MODE_FULL = 0       # full tiles (compact sources expanded first)
MODE_COMPACT = 1    # every source compact or uniform: computed on BM lanes
MODE_ROWB = 2       # f32 binary op of a full and a compact source, broadcast on the fly
MODE_CONST = 3      # a constant was written (its dest becomes RS_UNIFORM)
MODE_UNIFORM = 4    # f32 binary op of a full and a uniform source (read as a scalar)
MODE_ROWV = 5       # f32 binary op of a full tile and a row vector (row 0 applied to every row)
MODE_ROWLOAD = 6    # a load of row 0 only (its dest becomes RS_ROWVEC)
MODE_CMP_OUTER = 7  # a comparison of a compact register and a row vector: every pair
MODE_EXPAND = 8     # not a mode: the rowlevel piece's request to expand an instruction's sources

# --- a kernel's meta words (host/desc builds them) -------------------------------------------------
M_NR, M_NC, M_BM, M_BN, M_ROWS, M_COLS, M_NF, M_ND, M_NI, M_NB, M_NSW, M_PRO_S, M_PRO_E, M_TL, M_SW = range(15)
SWEEP_META = 6   # per sweep after M_SW: init [s, e), body [s, e), fin [s, e)

# --- the packed kernel descriptor (host/desc._pack): one int64 array per kernel -------------------
# blob[0] = tile_par; blob[1 + 2k], blob[2 + 2k] = offset and length of segment k; blob[H_UNITS] =
# the kernel's work units; blob[H_LEN] = the blob's own length (blobs chain back to back);
# blob[P_HEADER - 1] = the width of an optab row
P_INSTRS, P_PEEP, P_META, P_DIMS, P_OPTAB, P_CONSTS, P_ARGSZ, P_ARGST, P_RIO, P_FUSE = range(10)
N_SEGS = 10
H_UNITS, H_LEN = 1 + 2 * N_SEGS, 2 + 2 * N_SEGS
P_HEADER = 4 + 2 * N_SEGS
INSTR_WIDTH = 6   # opcode + 5 fields (codegen.isa.WORDS)
RIO_WIDTH = 10    # per instruction: 1 + bank of a register read by fields 0-4, written by 5-9
OPTAB_FIXED = 4   # optab row: kind, arg, dtype, offset, then one stride per dim

# --- fused runs (host/fuse_plan plans them, jit/fused runs them) -----------------------------------
(FK_NONE, FK_SQSUM, FK_CSQSUM, FK_APPLY, FK_EXPSUM, FK_LOADRED, FK_ROWNORM, FK_ROWSOFTMAX, FK_LOADACC,
 FK_CSQACC, FK_UNBIN, FK_ADDSUM, FK_ROTARY) = range(13)
FUSE_WIDTH = 10   # fuse[pc]: kind, instructions covered, then the kind's fields
NO_SRC = -1       # FK_APPLY (and FK_ROWNORM) without a bias stage
NO_CAST = -1      # FK_ROWNORM without a rounding cast of x (field 8) or of its scale's product (field 9)
# FK_ROWNORM's residual sum: at most this many loaded terms, ((a + b) + c) + ...: the terms past
# the first two keep their row addresses in the frame's si scratch (2 * BN entries, BM <= BN)
ROWNORM_MAX_TERMS = 4
NO_LOAD = -1      # FK_UNBIN whose z is a register (no load between U and B)
PEEP_LATER = -2   # peep[pc] <= PEEP_LATER: operand PEEP_LATER - peep[pc] stores the result later
FUSED_UN = ("exp", "sigmoid", "silu", "tanh", "gelu", "gelu_tanh")   # FK_UNBIN: the math ops a run may start with
FUSED_BIN = ("add", "sub", "mul")                       # and the op that consumes it
# FK_UNBIN's last field: UNBIN_SWAP (B's operands swapped) | UNBIN_USWAP (U's: c U x) |
# UNBIN_ZDEAD (the loaded z is dead after the run) | (c + 1) << UNBIN_C_SHIFT, c the register of
# the prologue's value (a constant) that a U in FUSED_BIN takes besides x; c + 1 = 0 for a math op U |
# (ox + 1) << UNBIN_X_SHIFT, ox the operand of x's load where the run starts with it (else 0)
UNBIN_SWAP = 1
UNBIN_USWAP = 2
UNBIN_ZDEAD = 4
UNBIN_C_SHIFT = 3
UNBIN_X_SHIFT = 24   # (above every register number c + 1 can hold)
# FK_UNBIN's field 8: the operand + 1 of a store of y right after the run that nothing else reads
# y besides (0: none), for its 16-bit form (jit/fused/unbinhalf) to write y into that store's rows
# FK_ROTARY's last field: ROT_R_SWAP (r = e * q, not q * e) | ROT_Y_SWAP (y = r + p, not p + r) |
# ROT_THEN (the rotary run right after this one reads registers this one leaves unloaded: both or neither)
ROT_R_SWAP = 1
ROT_Y_SWAP = 2
ROT_THEN = 4
CHAIN_OPS = (OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_SQRT, OP_RSQRT, OP_RECIP)   # replayed per row (rownorm)

# --- scratch -----------------------------------------------------------------------------------------
SF_ROWS = 6      # sf: BN-lane rows (two for the trees, w, b, two for the row forms) besides its BM lanes
ST_CACHE = 4     # st[ST_CACHE, 2k], st[ST_CACHE, 2k + 1]: pc + 1 and c0 of the row vector in slot k
ST_ROWS = ST_CACHE + 1   # st: the four banks' register states, then the row-vector cache tags

# --- threads: a worker's spin call, its mailbox, a parallel launch's schedule (jit/sync) ----------
WORKER = -7   # run_units(WORKER, spin_ticks, mailbox, table, mailbox, mailbox, False): a worker's spin
TSC_NOW = -8  # run_units(TSC_NOW, ...) returns the time-stamp counter (host/threads calibrates with it)
SLEEPING, SPINNING, POSTED, TAKEN = 0, 1, 2, 3
MB_STATE, MB_BLOB, MB_BLOB_N, MB_BUFS, MB_BUFS_N, MB_SCHED, MB_SCHED_N, MB_U0, MB_U1, MB_TAKEN, MB_YIELD = range(11)
# MB_YIELD: the address of a C function int(void) a spinning worker calls at each turn (the C
# library's sched_yield; 0: none), written by host/threads when it makes the mailbox
SPIN_ALONE = 8   # a worker spins the first 1 / SPIN_ALONE of DVM_SPIN_US without yielding the core
MB_WIDTH = 16
S_NEXT, S_DONE, S_ERR, S_CHUNK, S_NPOST, S_POST = range(6)
# A job run by an OpenMP team (jit/team.team_body, called by every thread of the team): one int64
# array, 64-byte aligned, written by host/openmp: the kernel's blob and the VM table as (address,
# length), its units [J_U0, J_U1) and the number of buffers; at J_SCHED (its own cache line) the
# sched words S_NEXT..S_CHUNK; at J_BUFS the launch's bufs (addresses, then element counts)
J_BLOB, J_BLOB_N, J_TAB, J_TAB_N, J_U0, J_U1, J_NBUFS = range(7)
J_SCHED = 8
J_BUFS = 16
# A stacked launch (parallel stacking: every kernel of a Program in one parallel job, host/run):
# J_U0 (or run_units' u0, a mailbox's MB_U0) is STACK, J_U1 (u1, MB_U1) the address of the stack's
# records, J_BLOB the kernels' blobs back to back. Records (int64, 64-byte aligned): G_NK (the
# kernel count) and G_ERR (an error code a thread met, 0: none) in the first line, then from G_REC
# one line (G_WIDTH words) per kernel: its sched words S_NEXT..S_CHUNK, its units (G_UNITS) and
# G_WAIT (1: its threads first wait until every kernel since the last wait is done, for it reads
# or writes what they write, or writes what they read; 0: it runs beside them); after the kernels'
# lines, per argument the kernel that stores it, then per argument the kernel that loads or stores
# it (-1: none, -2: several; jit/entry._aliases_ordered).
STACK = -9
G_NK, G_ERR = 0, 1
G_REC = 8
G_UNITS, G_WAIT = 4, 5
G_WIDTH = 8

# --- pieces: separately compiled functions the core calls through the VM table ---------------------
# The VM table (host/pieces.vm_table) is one int64 array: N_PIECES piece addresses (0: not loaded;
# the core then takes the generic path), then the decode table (DEC_WIDTH words per opcode).
# Every piece is a C function int64(frame, pc, a, b); what a and b mean is the piece's own.
(PC_EW_F32, PC_EW_F64, PC_EW_I64, PC_EW_B8, PC_CAST, PC_MEM, PC_MEM_T, PC_ROWLEVEL, PC_REDUCE,
 PC_ROWTREE, PC_FUSED_TILE, PC_FUSED_ROWS, PC_FUSED_ROTARY) = range(13)
N_PIECES = 13      # table slots (a piece may fill several: the slots of the banks it serves)
FUSED_RUN = -1  # a piece's `a` when the core calls it for the fused run at pc (fuse[pc])
ROWS_AT = -1   # PC_ROWTREE's pc for a fused run's call (its arguments in the frame's FR_ARGS)
MEM_LOAD, MEM_STORE, MEM_STOREROW, MEM_COMPACT, MEM_INDEX = range(5)   # PC_MEM's and PC_MEM_T's `a`

# The frame: a kernel run's views and state as one int64 array, built once per kernel run by the
# core (jit/entry) and read by every piece (jit/frame): addresses with their sizes, then the state
# of the tile being run (written by jit/interp per tile).
(FR_TAB, FR_INSTRS, FR_NINSTR, FR_DEC, FR_NDEC, FR_PEEP, FR_META, FR_NMETA, FR_DIMS, FR_NDIMS, FR_OPTAB,
 FR_NOPND, FR_OPW, FR_CONSTS, FR_NCONST, FR_ADDRS, FR_NUMELS, FR_NARGS, FR_ARGSZ, FR_ARGST, FR_RIO, FR_FZ,
 FR_F, FR_D, FR_I, FR_B, FR_NF, FR_ND, FR_NI, FR_NB, FR_T, FR_FP, FR_NFP, FR_IX, FR_NIX, FR_SF, FR_NSF,
 FR_SD, FR_NSD, FR_SI, FR_NSI, FR_SI2, FR_NSI2, FR_ST, FR_R0, FR_C0, FR_FIN, FR_AOK, FR_ARGS) = range(49)
N_ARGS = 8         # FR_ARGS .. FR_ARGS + N_ARGS: a call's arguments from one piece to another
FRAME_WORDS = FR_ARGS + N_ARGS
