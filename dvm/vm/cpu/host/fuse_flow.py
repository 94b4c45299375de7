"""The register flow of a kernel's instruction stream, as the fused-run planners read it
(host/fuse_plan, host/fuse_rotary, host/in_place): which f32 registers each instruction reads and
writes, which hold the prologue's constants, and whether a register is dead after a run.
"""
from __future__ import annotations

import numpy as np

from ....codegen import isa
from ....graph.dtypes import Bank


def f32_regs(spec: isa.InstrSpec, row, roles: str) -> set[int]:
    return {int(row[1 + i]) for i, f in enumerate(spec.fields) if f.role in roles and f.bank == Bank.F32}


class Flow:
    """Per instruction: the f32 registers it reads ('s' and 'm' fields) and overwrites ('d');
    `constants`: the registers only the prologue writes (a constant, uniform or compact, in every
    sweep)."""

    def __init__(self, instrs: np.ndarray, specs: list, sections: list[tuple[int, int]]):
        self.reads = [f32_regs(sp, r, "sm") for sp, r in zip(specs, instrs)]
        self.writes = [f32_regs(sp, r, "d") for sp, r in zip(specs, instrs)]
        self.sections = sections
        later = set().union(*(self.writes[q] for s, e in sections[1:] for q in range(s, e)))
        self.constants = set().union(*self.writes[slice(*sections[0])]) - later

    def _first_access(self, reg: int, lo: int, hi: int) -> str:
        for q in range(lo, hi):
            if reg in self.reads[q]:
                return "read"
            if reg in self.writes[q]:
                return "write"
        return ""

    def dead_after(self, reg: int, start: int, end: int, sec: tuple[int, int]) -> bool:
        """No instruction reads reg's value as left at `end` (the run is [start, end) in section
        sec). After the rest of sec, a section may run again (a sweep body, per tile: its prefix)
        or the sections after it run, in order: the rest of the row block's sweeps, then the next
        row block's (the prologue runs once, before them all). Dead if no path reads it before
        writing it."""
        rest = self._first_access(reg, end, sec[1])
        if rest:
            return rest == "write"
        if self._first_access(reg, sec[0], start) == "read":
            return False
        i = self.sections.index(sec)
        for s, e in self.sections[i + 1:] + self.sections[1:i]:
            first = self._first_access(reg, s, e)
            if first:
                return first == "write"
        return True


def is_op(spec, group: str, op: str | None = None) -> bool:
    return (spec is not None and spec.group == group and spec.bank == Bank.F32
            and (op is None or spec.op == op))


def writes_in(flow: Flow, lo: int, hi: int) -> set[int]:
    return set().union(*flow.writes[lo:hi])


def self_contained(flow: Flow, pc: int, end: int, sec) -> bool:
    """Run [pc, end] (its store at end): every register it writes is dead after it, and none it
    reads before writing (a constant, a weight's row vector) is written by it."""
    every = writes_in(flow, pc, end + 1)
    written: set[int] = set()
    for k in range(pc, end + 1):
        if (flow.reads[k] - written) & every:
            return False
        written |= flow.writes[k]
    return all(flow.dead_after(r, pc, end + 1, sec) for r in written)
