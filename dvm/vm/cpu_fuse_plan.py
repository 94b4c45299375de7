"""Where a kernel's instructions can run fused: decided once per kernel layout, in Python.

peep[pc] (in_place_plan): an f32 op writes straight into the tile of the store after it.
fuse[pc] (fuse_plan, executed by cpu_fused.py) = (kind, instructions covered, fields...) for a run starting at pc, kind FK_NONE
elsewhere. The plan checks what it can see statically: the opcodes, the register flow inside
the run, and that every register the run only passes through (an intermediate, a loaded
weight) is dead after it. Register states (full / compact / row vector) and whether a loaded
operand is a row vector (cpu_mem._row_uniform, the test every load makes) are checked at run
time, by cpu_fused.
"""
from __future__ import annotations

import numpy as np

from ..codegen import isa
from ..codegen.program import KernelLayout
from ..graph.dtypes import Bank, DType
from .cpu_fused import FK_APPLY, FK_CSQSUM, FK_EXPSUM, FK_LOADRED, FK_NONE, FK_SQSUM, FUSE_WIDTH, NO_SRC
from .cpu_kernels import R_ARGMAX, RED_NAMES



def _f32_regs(spec: isa.InstrSpec, row, roles: str) -> set[int]:
    return {int(row[1 + i]) for i, f in enumerate(spec.fields) if f.role in roles and f.bank == Bank.F32}


class _Flow:
    """Per instruction: the f32 registers it reads ('s' and 'm' fields) and overwrites ('d')."""

    def __init__(self, instrs: np.ndarray, specs: list, sections: list[tuple[int, int]]):
        self.reads = [_f32_regs(sp, r, "sm") for sp, r in zip(specs, instrs)]
        self.writes = [_f32_regs(sp, r, "d") for sp, r in zip(specs, instrs)]
        self.sections = sections

    def _first_access(self, reg: int, lo: int, hi: int) -> str:
        for q in range(lo, hi):
            if reg in self.reads[q]:
                return "read"
            if reg in self.writes[q]:
                return "write"
        return ""

    def dead_after(self, reg: int, start: int, end: int, sec: tuple[int, int]) -> bool:
        """No instruction reads reg's value as left at `end` (the run is [start, end) in section
        sec). A section may run again (a sweep body per tile): its prefix counts after its end."""
        first = self._first_access(reg, end, sec[1]) or self._first_access(reg, sec[0], start)
        if first:
            return first == "write"
        return not any(reg in self.reads[q] for s, e in self.sections if (s, e) != sec for q in range(s, e))


def _is(spec, group: str, op: str | None = None) -> bool:
    return (spec is not None and spec.group == group and spec.bank == Bank.F32
            and (op is None or spec.op == op))


def _sqsum(instrs, specs, flow: _Flow, pc: int, sec) -> list[int] | None:
    """mul t, x, x ; rowred.sum r, t  ->  (FK_SQSUM, 2, x, r)"""
    if pc + 2 > sec[1] or not (_is(specs[pc], "ew", "mul") and _is(specs[pc + 1], "rowred", "sum")):
        return None
    t, x, x2 = (int(v) for v in instrs[pc, 1:4])
    r, t2 = int(instrs[pc + 1, 1]), int(instrs[pc + 1, 2])
    if x != x2 or t2 != t or t in (x, r) or r == x or not flow.dead_after(t, pc, pc + 2, sec):
        return None
    return [FK_SQSUM, 2, x, r]


def _sub_then_sum(instrs, specs, flow: _Flow, pc: int, sec) -> list[int] | None:
    """sub d, x, m ; mul t, d, d ; rowred.sum r, t  ->  (FK_CSQSUM, 3, x, m, d, t, r)
       sub t, x, m ; exp e, t ; rowred.sum r, e     ->  (FK_EXPSUM, 3, x, m, e, t, r)"""
    if pc + 3 > sec[1] or not (_is(specs[pc], "ew", "sub") and _is(specs[pc + 2], "rowred", "sum")):
        return None
    d, x, m = (int(v) for v in instrs[pc, 1:4])
    t, d1, d2 = (int(v) for v in instrs[pc + 1, 1:4])
    r, t2 = int(instrs[pc + 2, 1]), int(instrs[pc + 2, 2])
    if t2 != t or r == x:
        return None
    if _is(specs[pc + 1], "ew", "mul"):   # the centered sum of squares; d is kept, t is dead
        if (d1, d2) != (d, d) or d in (x, m, t) or r in (d, t) or not flow.dead_after(t, pc, pc + 3, sec):
            return None
        return [FK_CSQSUM, 3, x, m, d, t, r]
    if _is(specs[pc + 1], "ew", "exp"):   # exp(x - m) and its sum; e (here t) is kept, d is dead
        if d1 != d or d in (x, m) or t in (m, r) or not flow.dead_after(d, pc, pc + 3, sec):
            return None
        return [FK_EXPSUM, 3, x, m, t, d, r]
    return None


def _load_then_reduce(instrs, specs, flow: _Flow, pc: int, sec) -> list[int] | None:
    """load x, o ; rowred.op r, x  ->  (FK_LOADRED, 2, o, x, r, op) for sum/prod/max/min when x
    is dead after (the tile is never made: the reduction reads the operand's rows)."""
    if pc + 2 > sec[1] or not (_is(specs[pc], "load") and _is(specs[pc + 1], "rowred")):
        return None
    op = RED_NAMES.index(specs[pc + 1].op)
    x, j = int(instrs[pc, 1]), int(instrs[pc, 2])
    r, x2 = int(instrs[pc + 1, 1]), int(instrs[pc + 1, 2])
    if op >= R_ARGMAX or x2 != x or r == x or not flow.dead_after(x, pc, pc + 2, sec):
        return None
    return [FK_LOADRED, 2, j, x, r, op]


def _apply(instrs, specs, flow: _Flow, pc: int, sec) -> list[int] | None:
    """mul y, a, b ; [load w] ; mul y, y, w ; [load c] ; [add y, y, c]  (either operand order)
    -> (FK_APPLY, n, a, b, w source, c source or NO_SRC, y): one of a, b is compact at run time.
    A source is an operand index (>= 0, loaded by the run) or -2 - register (a row vector then)."""
    if not _is(specs[pc], "ew", "mul"):
        return None
    y, a, b = (int(v) for v in instrs[pc, 1:4])
    loaded: dict[int, int] = {}     # register -> the operand the run loaded into it
    written = {y}                   # registers a stage of the run wrote
    targets: set[int] = set()       # registers the run loaded into
    srcs: list[int] = []
    end = pc + 1
    for op in ("mul", "add"):
        k, load = end, None
        if k < sec[1] and _is(specs[k], "load"):   # a row vector? checked at run time
            load = (int(instrs[k, 1]), int(instrs[k, 2]))
            k += 1
        if k >= sec[1] or not _is(specs[k], "ew", op):
            break
        d, u, v = (int(w) for w in instrs[k, 1:4])
        if (u == y) == (v == y):
            break
        other = v if u == y else u
        if load is not None and other == load[0]:
            src = load[1]
        elif other in loaded and other not in written:
            src = loaded[other]
        elif other in written:
            break
        else:
            src = -2 - other
        if load is not None:
            loaded[load[0]] = load[1]
            targets.add(load[0])
            written.discard(load[0])
        srcs.append(src)
        written.add(d)
        y = d
        end = k + 1
    if not srcs:
        return None
    for r in (written | targets) - {y}:
        if not flow.dead_after(r, pc, end, sec):
            return None
    return [FK_APPLY, end - pc, a, b, srcs[0], srcs[1] if len(srcs) > 1 else NO_SRC, y]


def writes_f(spec: isa.InstrSpec) -> int:
    """1: field f1 is an f32 register the instruction writes; 2: one it reads and writes."""
    if not spec.fields or spec.fields[0].bank != Bank.F32:
        return 0
    return {"d": 1, "m": 2}.get(spec.fields[0].role, 0)


def in_place_plan(kl: KernelLayout, sections: list[tuple[int, int]]) -> np.ndarray:
    """peep[pc] = operand of the store right after pc when instruction pc (an f32 elementwise op or
    cast) may write its result straight into that store's tile: the store is then skipped. Only when
    the register is read by nothing but that store (until it is written again)."""
    instrs = np.asarray(kl.instrs).reshape(-1, isa.WORDS)
    peep = np.full(len(instrs), -1, np.int64)
    specs = [isa.BY_CODE.get(int(r[0])) for r in instrs]
    if any(sp is None for sp in specs):
        return peep
    flow = _Flow(instrs, specs, sections)
    reads, writes = flow.reads, flow.writes
    for s, e in sections:
        for pc in range(s, e - 1):
            sp, nx = specs[pc], specs[pc + 1]
            if sp.group not in ("ew", "cast") or writes_f(sp) != 1:
                continue
            r = int(instrs[pc, 1])
            if nx.group != "store" or nx.bank != Bank.F32 or int(instrs[pc + 1, 1]) != r or r in reads[pc]:
                continue
            j = int(instrs[pc + 1, 2])
            if int(kl.opnd_dtype[j]) != int(DType.FLOAT32):
                continue
            ok, dead = True, False
            for q in range(pc + 2, e):
                if r in reads[q]:
                    ok = False
                    break
                if r in writes[q]:
                    dead = True
                    break
            if ok and not dead:   # live out of the section: only if no other section reads it
                ok = not any(r in reads[q] for s2, e2 in sections if (s2, e2) != (s, e) for q in range(s2, e2))
            if ok:
                peep[pc] = j
    return peep


def fuse_plan(kl: KernelLayout, sections: list[tuple[int, int]]) -> np.ndarray:
    instrs = np.asarray(kl.instrs).reshape(-1, isa.WORDS)
    plan = np.zeros((len(instrs), FUSE_WIDTH), np.int64)
    plan[:, 0] = FK_NONE
    specs = [isa.BY_CODE.get(int(r[0])) for r in instrs]
    if any(sp is None for sp in specs):
        return plan
    flow = _Flow(instrs, specs, sections)
    for sec in sections:
        pc = sec[0]
        while pc < sec[1]:
            found = (_sub_then_sum(instrs, specs, flow, pc, sec) or _sqsum(instrs, specs, flow, pc, sec)
                     or _apply(instrs, specs, flow, pc, sec) or _load_then_reduce(instrs, specs, flow, pc, sec))
            if found:
                plan[pc, :len(found)] = found
                pc += found[1]
            else:
                pc += 1
    return plan
