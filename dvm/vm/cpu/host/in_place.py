"""peep[pc]: where an f32 op may write its result straight into the tile of the store of it,
decided once per instruction stream, in Python (cached by host/stream; executed by
jit/interp.exec_tile): the store right after it (skipped then), or a later one (PEEP_LATER)."""
from __future__ import annotations

import numpy as np

from ....codegen import isa
from ....graph.dtypes import Bank, DType
from ..abi import PEEP_LATER, WRITES_F_DEST
from .decode import writes_f
from .fuse_flow import f32_regs, Flow


def in_place_plan(instrs: np.ndarray, opnd_dtype: np.ndarray, opnd_arg: np.ndarray,
                  sections: list[tuple[int, int]]) -> np.ndarray:
    """peep[pc] = operand of the store right after pc when instruction pc (an f32 elementwise op or
    cast) may write its result straight into that store's tile: the store is then skipped. Only when
    the register is read by nothing but that store (until it is written again).
    peep[pc] = PEEP_LATER - operand where the store comes later or the register is read besides (a
    residual sum that a norm reads, stored after the norm): it points at the store's tile from pc
    on, and the store finds its tile written. Only when no instruction between pc and the
    register's last read writes it or stores into that store's argument (while tiles are in place,
    another argument overlaps it only as the input of an in-place update, whose registers are read
    no later than the instruction computing the stored value: jit/addr.alias_ok)."""
    peep = np.full(len(instrs), -1, np.int64)
    specs = [isa.BY_CODE.get(int(r[0])) for r in instrs]
    if any(sp is None for sp in specs):
        return peep
    flow = Flow(instrs, specs, sections)
    modifies = [flow.writes[q] | f32_regs(sp, row, "m") for q, (sp, row) in enumerate(zip(specs, instrs))]
    stores_to = [int(opnd_arg[int(row[2])]) if sp.group in ("store", "storerow") else -1
                 for sp, row in zip(specs, instrs)]
    for s, e in sections:
        for pc in range(s, e - 1):
            sp, r = specs[pc], int(instrs[pc, 1])
            if sp.group not in ("ew", "cast") or writes_f(sp) != WRITES_F_DEST or r in flow.reads[pc]:
                continue
            st = _first_store(instrs, specs, modifies, r, pc + 1, e)
            if st < 0 or int(opnd_dtype[int(instrs[st, 2])]) != int(DType.FLOAT32):
                continue
            if any(stores_to[q] == stores_to[st] for q in range(pc + 1, st)):
                continue
            after = _reads_after(flow, modifies, stores_to, r, st, (s, e))
            if after is None:
                continue
            j = int(instrs[st, 2])
            peep[pc] = j if st == pc + 1 and not after else PEEP_LATER - j
    return peep


def _first_store(instrs, specs, modifies, r: int, start: int, end: int) -> int:
    """The first f32 store of register r in [start, end), or -1 where an instruction before it
    writes r."""
    for q in range(start, end):
        sp = specs[q]
        if sp.group == "store" and sp.bank == Bank.F32 and int(instrs[q, 1]) == r:
            return q
        if r in modifies[q]:
            return -1
    return -1


def _reads_after(flow: Flow, modifies, stores_to, r: int, st: int, sec) -> bool | None:
    """Whether register r is read after its store at st (until written again); None where such a
    read is a store or comes after a store into st's argument, or another section reads the
    value r keeps."""
    stored = False
    read = False
    for q in range(st + 1, sec[1]):
        if r in flow.reads[q]:
            if stored or stores_to[q] >= 0:
                return None
            read = True
        if r in modifies[q]:
            return read
        stored |= stores_to[q] == stores_to[st]
    if any(r in flow.reads[q] for s2, e2 in flow.sections if (s2, e2) != sec for q in range(s2, e2)):
        return None   # live out of the section: only if no other section reads it
    return read
