"""Bytecode that knows its ISA: opcode numbers pinned by name, the ISA table pinned by a golden
file, and the table's hash carried by every Program (the verifier rejects another ISA's).

Regenerate the golden table with DVM_UPDATE_GOLDEN=1 (then read the diff: a changed line is a
changed meaning of saved Programs' opcodes; only appended lines are a compatible change, and
every change of the table changes isa.ISA_HASH, so Programs saved before it are rejected).
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

import dvm
from dvm.codegen import isa, isa_codes
from dvm.codegen.program import ISA_HASH_WORD, VERSION
from dvm.frontend.library import softmax

GOLDEN = Path(__file__).parent / "golden" / "isa_table.txt"
UPDATE = os.environ.get("DVM_UPDATE_GOLDEN") == "1"


def test_isa_table_is_pinned():
    text = isa.table_text()
    if UPDATE:
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text(), "the ISA table changed: see this module's docstring"


def test_hash_is_the_hash_of_the_pinned_table():
    assert isa.ISA_HASH == isa.table_hash(GOLDEN.read_text())
    assert isa.table_hash(isa.table_text() + "x") != isa.ISA_HASH


def test_every_program_carries_version_and_isa_hash():
    w = softmax.program(np.ones((3, 5), np.float32)).words
    assert int(w[1]) == VERSION and int(w[ISA_HASH_WORD]) == isa.ISA_HASH


def test_numbers_come_from_the_pinned_table():
    for spec in isa.ISA:
        assert isa_codes.OPCODES[spec.name] == spec.code
    assert [s.code for s in isa.ISA] == sorted(s.code for s in isa.ISA)


def test_inserting_an_instruction_renumbers_nothing():
    """An instruction inserted anywhere in the build order keeps every other number; one
    without a pinned number is refused at import, naming the next free number."""
    specs = isa._build()
    new = ("frobnicate.f32", "ew", "frobnicate", isa.F, (isa.Field("d", isa.F), isa.Field("s", isa.F)), "BF")
    pinned = dict(isa_codes.OPCODES, **{new[0]: isa.MAX_OPCODE + 1})
    grown = isa.assign_codes([new] + specs, pinned)   # inserted first: enumeration would shift all
    by_name = {s.name: s.code for s in grown}
    assert all(by_name[s.name] == s.code for s in isa.ISA)
    assert by_name["frobnicate.f32"] == isa.MAX_OPCODE + 1
    assert isa.table_hash(isa.table_text(tuple(grown))) != isa.ISA_HASH
    with pytest.raises(AssertionError, match=f"from {isa.MAX_OPCODE + 1} on"):
        isa.assign_codes([new] + specs, isa_codes.OPCODES)


def test_duplicate_numbers_are_refused():
    pinned = dict(isa_codes.OPCODES)
    pinned["load.f64"] = pinned["load.f32"]
    with pytest.raises(AssertionError, match="unique"):
        isa.assign_codes(isa._build(), pinned)


def test_program_of_another_isa_is_rejected():
    w = np.array(softmax.program(np.ones((3, 5), np.float32)).words)
    w[ISA_HASH_WORD] = isa.table_hash("an ISA table with one more op")
    with pytest.raises(dvm.VerifyError) as ei:
        dvm.verify(dvm.Program(w))
    assert ei.value.rule == "isa"
