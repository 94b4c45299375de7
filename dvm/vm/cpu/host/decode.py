"""The CPU VM's decode table, derived from the ISA table at import time: every opcode becomes a row
(group, op, bank, source bank, elementwise kind, f32 write) in this VM's own numbering (abi), so a
renumbered ISA never meets stale compiled code. An opcode the VM does not implement decodes to
group -1 (the core reports ERR_UNHANDLED if it meets one)."""
from __future__ import annotations

import numpy as np

from ....codegen import isa
from ....codegen.program import MAX_REGS, OPND_ARG
from ....graph.dtypes import Bank, DType
from .. import abi

BANK_CODE = {Bank.F32: abi.BK_F32, Bank.F64: abi.BK_F64, Bank.I64: abi.BK_I64, Bank.B8: abi.BK_B8}
_GROUP = {"load": abi.G_LOAD, "store": abi.G_STORE, "const": abi.G_CONST, "index": abi.G_INDEX,
          "cast": abi.G_CAST, "ew": abi.G_EW, "accinit": abi.G_ACCINIT, "acc": abi.G_ACC, "rfin": abi.G_RFIN,
          "rowred": abi.G_ROWRED, "storerow": abi.G_STOREROW}
_KIND_NAME = {abi.K_UN: "un", abi.K_PRED: "pred", abi.K_BIN: "bin", abi.K_CMP: "cmp", abi.K_WHERE: "where",
              abi.K_CLAMP: "clamp"}
_REDUCE_GROUPS = ("accinit", "acc", "rfin", "rowred")

# The Program format fixes the dtype codes and the register limit; the compiled code uses them directly.
assert [int(d) for d in (DType.BOOL, DType.INT32, DType.INT64, DType.FLOAT16, DType.BFLOAT16,
                         DType.FLOAT32, DType.FLOAT64)] == [abi.DT_BOOL, abi.DT_I32, abi.DT_I64, abi.DT_F16,
                                                            abi.DT_BF16, abi.DT_F32, abi.DT_F64]
assert abi.MAX_REGS == MAX_REGS and abi.OPND_ARG == OPND_ARG and abi.INSTR_WIDTH == isa.WORDS


def writes_f(spec: isa.InstrSpec) -> int:
    """How the instruction writes field f1 when it is an f32 register: abi.WRITES_F_DEST (written)
    or WRITES_F_RMW (read and written); else WRITES_F_NONE."""
    if not spec.fields or spec.fields[0].bank != Bank.F32:
        return abi.WRITES_F_NONE
    return {"d": abi.WRITES_F_DEST, "m": abi.WRITES_F_RMW}.get(spec.fields[0].role, abi.WRITES_F_NONE)


def _ew_kind(spec: isa.InstrSpec) -> int:
    if spec.op == "where":
        return abi.K_WHERE
    if spec.op == "clamp":
        return abi.K_CLAMP
    n_in = sum(1 for f in spec.fields if f.role == "s")
    same = spec.fields[0].bank == spec.bank
    if n_in == 1:
        return abi.K_UN if same else abi.K_PRED
    return abi.K_BIN if same else abi.K_CMP


def decode(spec: isa.InstrSpec) -> tuple[int, int, int, int, int, int]:
    """The decode row of `spec` (abi.DEC_* columns); group -1 for forms this VM does not know."""
    unknown = (-1, 0, 0, 0, 0, 0)
    if spec.group not in _GROUP or spec.bank not in BANK_CODE:
        return unknown
    bank = BANK_CODE[spec.bank]
    op = src = kind = 0
    if spec.group == "cast":
        src = BANK_CODE[spec.fields[1].bank]
    elif spec.group == "ew":
        if spec.op not in abi.EW_NAMES:
            return unknown
        op, kind = abi.EW_NAMES.index(spec.op), _ew_kind(spec)
    elif spec.group in _REDUCE_GROUPS:
        if spec.op not in abi.RED_NAMES:
            return unknown
        op = abi.RED_NAMES.index(spec.op)
    return _GROUP[spec.group], op, bank, src, kind, writes_f(spec)


def _build_decode_table() -> np.ndarray:
    dec = np.full((isa.MAX_OPCODE + 1, abi.DEC_WIDTH), -1, np.int64)
    for spec in isa.ISA:
        dec[spec.code] = decode(spec)
    return dec


DECODE = _build_decode_table()


def handled(spec: isa.InstrSpec) -> bool:
    """Whether the compiled dispatch implements `spec` (mirrors jit/interp and the pieces)."""
    g, op, bank, _src, kind, _wf = decode(spec)
    if g < 0:
        return False
    if spec.group == "ew":
        return spec.op in abi.HANDLED.get((_KIND_NAME[kind], bank), ())
    if spec.group in _REDUCE_GROUPS:
        return spec.op in abi.REDUCTIONS_HANDLED.get(bank, ())
    return True   # load/store/storerow/const/index/cast: every bank (and source bank) is dispatched
