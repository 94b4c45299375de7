"""The ISA spec table: every opcode, its operand fields with their register classes, and the
program sections it may appear in. Derived from the op table; the encoder, verifier,
disassembler and every VM's dispatch read this table and nothing else.

An instruction is WORDS int64 words: [opcode, f1, f2, f3, f4, f5]; unused fields must be 0.
Field roles: 'd' writes a register, 's' reads one, 'm' reads and writes (accumulators),
'o' is an operand-table index, 'k' a constant-pool index, 't' a dtype code.
Sections: 'P' prologue (once per thread), 'I' sweep init and 'F' sweep finalize (once per row
block), 'B' sweep body (once per tile).
Single-tile forms (valid only when a kernel's columns fit one tile, checked by the verifier):
'rowred' reduces a register over its columns (valid columns only) and broadcasts the result;
'storerow' writes column 0 of the valid rows (row-level outputs) from a body.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..graph.dtypes import Bank
from ..graph.ops import OP_TABLE, UNARY, BINARY, TERNARY, VM_REDUCTIONS, Promo

WORDS = 6
MAX_FIELDS = WORDS - 1
BANKS = tuple(Bank)
F, D, I, B = Bank.F32, Bank.F64, Bank.I64, Bank.B8


@dataclass(frozen=True)
class Field:
    role: str                   # 'd', 's', 'm', 'o', 'k', 't'
    bank: Optional[Bank] = None  # register bank for 'd', 's', 'm'

    @property
    def is_reg(self) -> bool:
        return self.role in "dsm"


@dataclass(frozen=True)
class InstrSpec:
    code: int
    name: str        # mnemonic, e.g. "add.f32"
    group: str       # "load", "store", "index", "const", "cast", "ew", "accinit", "acc", "rfin"
    op: str          # op-table name for "ew" / reductions, else the group
    bank: Optional[Bank]
    fields: tuple[Field, ...]
    sections: str

    @property
    def dst_fields(self) -> tuple[int, ...]:
        return tuple(i for i, f in enumerate(self.fields) if f.role in "dm")

    @property
    def src_fields(self) -> tuple[int, ...]:
        return tuple(i for i, f in enumerate(self.fields) if f.role in "sm")


def _build() -> list[InstrSpec]:
    specs: list[tuple] = []
    add = specs.append
    for bank in BANKS:
        add((f"load.{bank.short}", "load", "load", bank, (Field("d", bank), Field("o")), "BF"))
        add((f"store.{bank.short}", "store", "store", bank, (Field("s", bank), Field("o")), "BF"))
        add((f"const.{bank.short}", "const", "const", bank, (Field("d", bank), Field("k")), "P"))
    add(("index.i64", "index", "index", I, (Field("d", I), Field("o")), "BF"))
    for src in BANKS:
        for dst in BANKS:
            add((f"cast.{src.short}.{dst.short}", "cast", "cast", dst,
                 (Field("d", dst), Field("s", src), Field("t")), "BF"))
    for name in UNARY + BINARY + TERNARY:
        op = OP_TABLE[name]
        for bank in op.banks:
            out = B if op.promo in (Promo.ALWAYS_BOOL, Promo.LOGICAL) else bank
            ins = [Field("s", bank)] * op.arity
            if name == "where":
                ins[0] = Field("s", B)
            add((f"{name}.{bank.short}", "ew", name, bank, (Field("d", out), *ins), "BF"))
    for red in VM_REDUCTIONS:
        for bank in OP_TABLE[red].banks:
            if red.startswith("arg"):
                init = (Field("d", bank), Field("d", I))
                acc = (Field("m", bank), Field("m", I), Field("s", bank))
                fin = (Field("d", I), Field("s", bank), Field("s", I))
            else:
                init, acc, fin = (Field("d", bank),), (Field("m", bank), Field("s", bank)), \
                    (Field("d", bank), Field("s", bank))
            add((f"accinit.{red}.{bank.short}", "accinit", red, bank, init, "I"))
            add((f"acc.{red}.{bank.short}", "acc", red, bank, acc, "B"))
            add((f"rfin.{red}.{bank.short}", "rfin", red, bank, fin, "F"))
    # single-tile forms: a row that fits one tile reduces and stores inside the body
    for red in VM_REDUCTIONS:
        for bank in OP_TABLE[red].banks:
            out = I if red.startswith("arg") else bank
            add((f"rowred.{red}.{bank.short}", "rowred", red, bank, (Field("d", out), Field("s", bank)), "B"))
    for bank in BANKS:
        add((f"storerow.{bank.short}", "storerow", "store", bank, (Field("s", bank), Field("o")), "B"))
    return [InstrSpec(code, *s) for code, s in enumerate(specs, start=1)]


ISA: tuple[InstrSpec, ...] = tuple(_build())
BY_CODE: dict[int, InstrSpec] = {s.code: s for s in ISA}
BY_NAME: dict[str, InstrSpec] = {s.name: s for s in ISA}
assert len(BY_NAME) == len(ISA), "duplicate mnemonic"
assert all(len(s.fields) <= MAX_FIELDS for s in ISA)
MAX_OPCODE = max(BY_CODE)


def opcode(name: str) -> int:
    return BY_NAME[name].code
