"""Lower one fusion group to a KernelTemplate: the size-independent instruction stream.

Emission works on virtual registers; `allocate` then maps them to physical registers with a
linear scan in which a value read inside a sweep body but defined before it stays live to the
body's end, and a destination never shares a register with a source of the same instruction.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..graph.dtypes import Bank, DType
from ..graph.node import Node
from ..graph.ops import OP_TABLE, Kind
from ..graph.symbolic import Dim, is_one
from ..fusion.partition import LEAF_OPS, VIEW_OPS, Group, Plan, is_reduce
from . import isa
from .program import OPND_ARG, OPND_INDEX


@dataclass(frozen=True)
class OperandSpec:
    kind: int                        # OPND_ARG / OPND_INDEX
    slot: int                        # argument slot (0 for index operands)
    dtype: DType
    base_shape: tuple | None         # None: the argument's own layout (inputs); else contiguous
    unit_axis: int | None            # iota: the axis whose index is the value
    chain: tuple[Node, ...]          # views applied to the base, innermost first


@dataclass
class KernelTemplate:
    shape: tuple[Dim, ...]
    axes: frozenset[int]
    operands: list[OperandSpec]
    consts: list[tuple[Bank, object]]
    instrs: np.ndarray
    prologue: tuple[int, int]
    sweeps: list[tuple[int, int, int, int, int, int]]
    nregs: tuple[int, int, int, int]
    group: Group
    # the single-tile stream (reductions in the body, no sweeps), chosen when a row fits one tile
    single: "KernelTemplate | None" = None


def cast_is_noop(src: DType, dst: DType) -> bool:
    """Within a bank, widening keeps the register value (f16/bf16 values are already f32)."""
    return src.bank == dst.bank and (src == dst or dst in (DType.FLOAT32, DType.FLOAT64, DType.INT64))


class _Emitter:
    def __init__(self, plan: Plan, group: Group, slot_dtypes: list[DType], single: bool = False):
        self.plan, self.g, self.slot_dtypes, self.single = plan, group, slot_dtypes, single
        self.n_sweeps = 0
        self.sections: list[list[list]] = [[]]  # prologue, then init/body/fin per sweep
        self.vbank: list[Bank] = []
        self.memo: dict = {}
        self.operands: list[OperandSpec] = []
        self.consts: list[tuple[Bank, object]] = []
        self._red_sweep: dict[Node, int] = {}
        # registers live to the end of the body (uniforms_first: a row form's chain replays its
        # instructions row by row, so a source it reads must not share a register it writes)
        self.pinned: list[int] = []

    # -- bookkeeping ----------------------------------------------------------------------------
    def ensure_sweeps(self, n: int) -> None:
        while self.n_sweeps < n:
            self.n_sweeps += 1
            self.sections += [[], [], []]

    def sec(self, part: str, sweep: int) -> int:
        if self.single:
            part, sweep = "B", 0
        self.ensure_sweeps(sweep + 1)
        return 1 + 3 * sweep + "IBF".index(part)

    def new(self, bank: Bank) -> int:
        self.vbank.append(bank)
        return len(self.vbank) - 1

    def emit(self, sec: int, name: str, *fields) -> None:
        self.sections[sec].append([isa.BY_NAME[name].code, *fields])

    def operand(self, spec: OperandSpec) -> int:
        if spec not in self.operands:
            self.operands.append(spec)
        return self.operands.index(spec)

    # -- classification -------------------------------------------------------------------------
    def aligned(self, node: Node) -> tuple:
        return (1,) * (len(self.g.shape) - node.ndim) + tuple(node.shape)

    def is_row(self, node: Node) -> bool:
        """Row-level: constant along every reduced axis (computed once per row block)."""
        return bool(self.g.axes) and all(is_one(self.aligned(node)[a]) for a in self.g.axes)

    def red_sweep(self, node: Node) -> int:
        """Latest sweep of this group's reductions that `node` reads (-1: none)."""
        if node in self._red_sweep:
            return self._red_sweep[node]
        if is_reduce(node) and self.plan.group_of.get(node) == self.g.index:
            out = self.plan.sweep_of[node]
        elif node.op in VIEW_OPS or node.op in LEAF_OPS or self.from_workspace(node):
            out = -1
        else:
            out = max((self.red_sweep(i) for i in node.inputs), default=-1)
        self._red_sweep[node] = out
        return out

    def exact(self, node: Node) -> bool:
        """The register of `node` holds a value exactly representable in node.dtype: loads and
        constants, and narrowing casts (which round)."""
        return node.op in ("const", "input", "iota") or node.op in VIEW_OPS or self.from_workspace(node) \
            or (node.op == "cast" and not cast_is_noop(node.inputs[0].dtype, node.dtype))

    def is_load(self, node: Node) -> bool:
        """compute() emits node as a load (of an input, a workspace, an index)."""
        return node.op != "const" and (self.from_workspace(node) or node.op in VIEW_OPS or node.op in LEAF_OPS)

    def is_uniform(self, node: Node) -> bool:
        """One value for the whole domain (every aligned size 1), not a constant, read from no
        reduction of this group: a 0-d input (a float Dynamo passes as a tensor) and what is
        computed from such values alone."""
        return node.op != "const" and node.ndim <= len(self.g.shape) and all(is_one(d) for d in self.aligned(node)) \
            and self.red_sweep(node) < 0

    def from_workspace(self, node: Node) -> bool:
        slot = self.plan.slot_of.get(node)
        return slot is not None and self.plan.group_of[node] < self.g.index

    # -- values ---------------------------------------------------------------------------------
    def value(self, node: Node, sec: int) -> int:
        if node.op == "const":
            key = ("const", node)
        elif self.single:
            key = (sec, node)
        elif (is_reduce(node) and self.plan.group_of.get(node) == self.g.index) or \
                (self.is_row(node) and self.red_sweep(node) >= 0 and not self.from_workspace(node)):
            key = ("home", node)
        else:
            key = (sec, node)
        reg = self.memo.get(key)
        if reg is None:
            reg = self.compute(node, sec if key[0] not in ("const", "home") else
                               (0 if key[0] == "const" else self.sec("F", self.red_sweep(node))))
            self.memo[key] = reg
        return reg

    def compute(self, node: Node, sec: int) -> int:
        if node.op == "const":
            bank = node.dtype.bank
            self.consts.append((bank, node.attr("value")))
            reg = self.new(bank)
            self.emit(0, f"const.{bank.short}", reg, len(self.consts) - 1)
            return reg
        if self.is_load(node):
            return self.load(node, sec)
        op = OP_TABLE[node.op]
        if op.kind is Kind.CAST:
            src = node.inputs[0]
            reg_in = self.value(src, sec)
            if cast_is_noop(src.dtype, node.dtype):
                if src.dtype in (DType.FLOAT16, DType.BFLOAT16) and node.dtype != src.dtype \
                        and not self.exact(src):
                    # a computed f16/bf16 value is held at f32 precision; widening it must give
                    # the f16/bf16 value, as in eager: round to the source dtype first
                    reg = self.new(Bank.F32)
                    self.emit(sec, "cast.f32.f32", reg, reg_in, int(src.dtype))
                    return reg
                return reg_in
            if src.dtype in (DType.FLOAT16, DType.BFLOAT16) and not self.exact(src):
                rounded = self.new(Bank.F32)   # any other cast too sees the f16/bf16 value
                self.emit(sec, "cast.f32.f32", rounded, reg_in, int(src.dtype))
                reg_in = rounded
            reg = self.new(node.dtype.bank)
            self.emit(sec, f"cast.{src.dtype.bank.short}.{node.dtype.bank.short}", reg, reg_in, int(node.dtype))
            return reg
        if op.kind is Kind.REDUCE:
            raise AssertionError(f"reduction {node} reached outside its group")
        # loads last: a load sits right before its first use (the fused runs of host/fuse_plan
        # take an operand's load next to the op that reads it)
        regs: dict[int, int] = {}
        for k in sorted(range(len(node.inputs)), key=lambda k: self.is_load(node.inputs[k])):
            regs[k] = self.value(node.inputs[k], sec)
        ins = [regs[k] for k in range(len(node.inputs))]
        bank = node.inputs[-1].dtype.bank
        spec = isa.BY_NAME[f"{node.op}.{bank.short}"]
        reg = self.new(spec.fields[0].bank)
        self.emit(sec, spec.name, reg, *ins)
        if node.dtype is DType.INT32 and op.int32_overflows:
            wrapped = self.new(Bank.I64)
            self.emit(sec, "cast.i64.i64", wrapped, reg, int(DType.INT32))
            reg = wrapped
        return reg

    def load(self, node: Node, sec: int) -> int:
        chain = []
        base = node
        while not self.from_workspace(base) and base.op in VIEW_OPS:
            chain.append(base)
            base = base.inputs[0]
        chain = tuple(chain[::-1])
        if self.from_workspace(base):
            spec = OperandSpec(OPND_ARG, self.plan.slot_of[base], base.dtype, tuple(base.shape), None, chain)
        elif base.op == "input":
            spec = OperandSpec(OPND_ARG, base.attr("index"), base.dtype, None, None, chain)
        elif base.op == "iota":
            spec = OperandSpec(OPND_INDEX, 0, DType.INT64, tuple(base.shape), base.attr("axis"), chain)
        else:
            raise AssertionError(f"cannot load {node}")
        reg = self.new(spec.dtype.bank)
        self.emit(sec, "index.i64" if spec.kind == OPND_INDEX else f"load.{spec.dtype.bank.short}",
                  reg, self.operand(spec))
        return reg

    # -- roots ----------------------------------------------------------------------------------
    def uniforms_first(self) -> None:
        """The single-tile stream's uniform values (is_uniform) that a non-uniform value reads,
        computed at the start of the body: a norm's epsilon passed as a 0-d tensor is then a
        ready source of the per-row chain (host/fuse_plan's row forms), not a load inside it."""
        roots = [r.inputs[0] for r in self.g.reductions] + [st.value for st in self.g.stores]
        seen, tops, stack = set(), [], list(roots)
        while stack:
            n = stack.pop()
            if n in seen:
                continue
            seen.add(n)
            if self.is_uniform(n):
                tops.append(n)
            elif not self.is_load(n) and n.op != "const" and not is_reduce(n):
                stack.extend(n.inputs)
        body = self.sec("B", 0)
        for n in tops:   # (discovery order: deterministic per graph)
            self.pinned.append(self.value(n, body))

    def reductions(self) -> None:
        for r in sorted(self.g.reductions, key=lambda r: self.plan.sweep_of[r]):
            s, src = self.plan.sweep_of[r], r.inputs[0]
            bank = src.dtype.bank
            init, body, fin = self.sec("I", s), self.sec("B", s), self.sec("F", s)
            x = self.value(src, body)
            out = self.new(Bank.I64 if r.op.startswith("arg") else bank)
            if self.single:
                self.emit(body, f"rowred.{r.op}.{bank.short}", out, x)
                self.memo[(body, r)] = out
                continue
            if r.op.startswith("arg"):
                v, i = self.new(bank), self.new(Bank.I64)
                self.emit(init, f"accinit.{r.op}.{bank.short}", v, i)
                self.emit(body, f"acc.{r.op}.{bank.short}", v, i, x)
                self.emit(fin, f"rfin.{r.op}.{bank.short}", out, v, i)
            else:
                acc = self.new(bank)
                self.emit(init, f"accinit.{r.op}.{bank.short}", acc)
                self.emit(body, f"acc.{r.op}.{bank.short}", acc, x)
                self.emit(fin, f"rfin.{r.op}.{bank.short}", out, acc)
            self.memo[("home", r)] = out

    def stores(self) -> None:
        for st in self.g.stores:
            v = st.value
            shape = tuple(v.shape)
            m = self.red_sweep(v)
            row = self.is_row(v)
            sec = self.sec("F", max(m, 0)) if row else self.sec("B", m + 1)
            src = v
            while src.op == "cast" and src.dtype == v.dtype and src.inputs[0].dtype.bank == v.dtype.bank \
                    and not cast_is_noop(src.inputs[0].dtype, src.dtype):
                src = src.inputs[0]  # the store rounds/wraps exactly like this narrowing cast
            reg = self.value(src, sec)
            if st.fills_slice:   # a concat's piece: into its slice of the concat's row-major buffer
                spec = OperandSpec(OPND_ARG, st.slot, v.dtype, tuple(st.view.inputs[0].shape), None, (st.view,))
            else:
                spec = OperandSpec(OPND_ARG, st.slot, v.dtype, shape, None, ())
            kind = "storerow" if self.single and row else "store"
            self.emit(sec, f"{kind}.{v.dtype.bank.short}", reg, self.operand(spec))


def lower(plan: Plan, group: Group, slot_dtypes: list[DType], single: bool = False) -> KernelTemplate:
    em = _Emitter(plan, group, slot_dtypes, single)
    em.ensure_sweeps(1)
    if single:
        em.uniforms_first()
    em.reductions()
    em.stores()
    flat, bounds = [], []
    for sec in em.sections:
        bounds.append((len(flat), len(flat) + len(sec)))
        flat.extend(sec)
    instrs, nregs = allocate(flat, bounds, em.vbank, em.pinned)
    sweeps = [bounds[1 + 3 * s][0:2] + bounds[2 + 3 * s][0:2] + bounds[3 + 3 * s][0:2]
              for s in range(em.n_sweeps)]
    t = KernelTemplate(group.shape, group.axes, em.operands, em.consts, instrs, bounds[0],
                       sweeps, nregs, group)
    if group.reductions and not single:
        t.single = lower(plan, group, slot_dtypes, single=True)
    return t


def allocate(flat: list[list], bounds: list[tuple[int, int]], vbank: list[Bank], pinned: list[int] = ()):
    """Linear-scan register allocation over the concatenated sections; `pinned` registers live
    to the end of the first sweep's body."""
    specs = [isa.BY_CODE[ins[0]] for ins in flat]
    first, last = {}, {}
    for pos, (ins, spec) in enumerate(zip(flat, specs)):
        for f, fld in enumerate(spec.fields):
            if fld.is_reg:
                v = ins[1 + f]
                first.setdefault(v, pos)
                last[v] = pos
    # the row-block loop re-runs every sweep: prologue values read by a sweep live to the end
    pro_end = bounds[0][1]
    for v, p in first.items():
        if p < pro_end and last[v] >= pro_end:
            last[v] = len(flat) - 1
    for v in pinned:
        last[v] = max(last[v], bounds[2][1] - 1)
    bodies = [bounds[2 + 3 * s] for s in range((len(bounds) - 1) // 3)]
    for pos, (ins, spec) in enumerate(zip(flat, specs)):
        for bs, be in bodies:
            if bs <= pos < be:
                for f, fld in enumerate(spec.fields):
                    if fld.is_reg and first[ins[1 + f]] < bs:
                        last[ins[1 + f]] = max(last[ins[1 + f]], be - 1)
    free: list[list[int]] = [[] for _ in Bank]
    count = [0] * len(Bank)
    phys: dict[int, int] = {}
    ends: dict[int, list[int]] = {}
    for v, p in last.items():
        ends.setdefault(p, []).append(v)
    out = np.zeros((len(flat), isa.WORDS), np.int64)
    for pos, (ins, spec) in enumerate(zip(flat, specs)):
        for f, fld in enumerate(spec.fields):
            if fld.role == "d" and ins[1 + f] not in phys:
                bank = vbank[ins[1 + f]]
                if free[bank]:
                    free[bank].sort()
                    phys[ins[1 + f]] = free[bank].pop(0)
                else:
                    phys[ins[1 + f]] = count[bank]
                    count[bank] += 1
        out[pos, 0] = ins[0]
        for f, fld in enumerate(spec.fields):
            out[pos, 1 + f] = phys[ins[1 + f]] if fld.is_reg else ins[1 + f]
        for v in ends.get(pos, ()):
            free[vbank[v]].append(phys[v])
    return out, tuple(count)
