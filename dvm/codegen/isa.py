"""The ISA spec table: every opcode, its operand fields with their register classes, and the
program sections it may appear in. Derived from the op table; the encoder, verifier,
disassembler and every VM's dispatch read this table and nothing else.

Opcode numbers are pinned by name in isa_codes.OPCODES (adding an op never renumbers another);
`table_text()` is the canonical text of the table (tests/golden/isa_table.txt pins it) and
ISA_HASH, a hash of that text, is written into every Program's header: the verifier rejects a
Program encoded for another ISA (rule "isa").

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

import hashlib
from dataclasses import dataclass
from typing import Optional

from ..graph.dtypes import Bank
from ..graph.ops import OP_TABLE, UNARY, BINARY, TERNARY, VM_REDUCTIONS, Promo
from .isa_codes import OPCODES

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


def _build() -> list[tuple]:
    """Every instruction as (name, group, op, bank, fields, sections), without its number."""
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
    return specs


def assign_codes(specs: list[tuple], pinned: dict[str, int]) -> list[InstrSpec]:
    """The instructions with their pinned numbers, in number order. An instruction without a
    number is an error (pin it at the next free number); a pinned name without an instruction
    keeps its number reserved (a retired op)."""
    missing = [s[0] for s in specs if s[0] not in pinned]
    if missing:
        nxt = max(pinned.values(), default=0) + 1
        raise AssertionError(f"instructions {missing} have no opcode number: add them to isa_codes.OPCODES "
                             f"from {nxt} on (numbers are never reused or shifted)")
    if len(set(pinned.values())) != len(pinned) or min(pinned.values(), default=1) < 1:
        raise AssertionError("isa_codes.OPCODES: numbers must be unique and >= 1")
    return sorted((InstrSpec(pinned[s[0]], *s) for s in specs), key=lambda spec: spec.code)


def _field_text(f: Field) -> str:
    return f.role + (f":{f.bank.short}" if f.bank is not None else "")


def table_text(specs: tuple[InstrSpec, ...] | None = None) -> str:
    """The canonical text of the ISA table: the instruction width, then one line per opcode
    (number, mnemonic, group, op, bank, operand fields role[:bank], sections)."""
    lines = [f"words {WORDS}"]
    for s in ISA if specs is None else specs:
        bank = s.bank.short if s.bank is not None else "-"
        fields = " ".join(_field_text(f) for f in s.fields) or "-"
        lines.append(f"{s.code} {s.name} {s.group} {s.op} {bank} [{fields}] {s.sections}")
    return "\n".join(lines) + "\n"


def table_hash(text: str) -> int:
    """A signed 64-bit hash of a table text (the first 8 bytes of its SHA-256)."""
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little", signed=True)


ISA: tuple[InstrSpec, ...] = tuple(assign_codes(_build(), OPCODES))
BY_CODE: dict[int, InstrSpec] = {s.code: s for s in ISA}
BY_NAME: dict[str, InstrSpec] = {s.name: s for s in ISA}
assert len(BY_NAME) == len(ISA), "duplicate mnemonic"
assert all(len(s.fields) <= MAX_FIELDS for s in ISA)
MAX_OPCODE = max(BY_CODE)
ISA_HASH = table_hash(table_text())


def opcode(name: str) -> int:
    return BY_NAME[name].code
