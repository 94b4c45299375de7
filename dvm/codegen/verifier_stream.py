"""The verifier's stream checks: a kernel's instruction stream with its sections, operand kinds,
constant banks and the arguments' roles and dtypes, checked once and memoized (Stream).

Cost: linear in the stream's length. The per-instruction checks that need no order (opcodes,
sections, unused fields, register, operand, constant and dtype-code ranges and classes) are
whole-array NumPy expressions over the instruction table; the register dataflow (dst_alias,
read_before_write, loop_carried) is one pass over the instructions with per-opcode field tables.
Where the array checks find an instruction at fault, the pass stops there and that instruction's
checks run one by one, so the error reported is the first in instruction order, with the same
rule a one-instruction-at-a-time check gives.
"""
from __future__ import annotations

import numpy as np

from ..errors import VerifyError
from ..graph.dtypes import DType
from . import isa, lru
from .program import (ARG_IN, CONST_WORDS, KHEAD_WORDS, MAX_REGS, OPND_ARG, OPND_FIXED_WORDS, OPND_INDEX,
                      SWEEP_WORDS, ArgInfo, Sweep)
from .verifier_dataflow import SEC_B, SEC_F, SEC_I, SEC_P, check_dataflow

N_DTYPES = len(DType)
STREAM_CACHE_ENTRIES = 4096
VERIFIER_CACHE_BYTES = 64 << 20   # the verifier's caches together (streams, instance-word indexes)
CACHES = lru.family("verifier", VERIFIER_CACHE_BYTES)
STREAMS = lru.BoundedDict(CACHES, STREAM_CACHE_ENTRIES)
STREAM_OVERHEAD_BYTES = 2048      # a Stream's objects besides its arrays (slots, tuples, dicts)

# -- per-opcode tables (index: opcode; row 0 stands for every invalid opcode) -------------------
_SEC_BIT = {"P": SEC_P, "I": SEC_I, "B": SEC_B, "F": SEC_F}
R_NONE, R_D, R_S, R_M, R_O, R_K, R_T = range(7)
_ROLE_CODE = {"d": R_D, "s": R_S, "m": R_M, "o": R_O, "k": R_K, "t": R_T}
G_OTHER, G_LOAD, G_STORE, G_STOREROW, G_INDEX, G_ROWRED = range(6)
_GROUP_CODE = {"load": G_LOAD, "store": G_STORE, "storerow": G_STOREROW, "index": G_INDEX, "rowred": G_ROWRED}


def _tables():
    n = isa.MAX_OPCODE + 1
    sec = np.zeros(n, np.int64)
    role = np.zeros((n, isa.MAX_FIELDS), np.int64)
    fbank = np.zeros((n, isa.MAX_FIELDS), np.int64)
    bank = np.full(n, -1, np.int64)
    group = np.zeros(n, np.int64)
    regs: list = [None] * n   # per opcode: (dst, src, acc) tuples of (word index, bank * MAX_REGS)
    for s in isa.ISA:
        sec[s.code] = sum(_SEC_BIT[c] for c in s.sections)
        bank[s.code] = -1 if s.bank is None else int(s.bank)
        group[s.code] = _GROUP_CODE.get(s.group, G_OTHER)
        for f, fld in enumerate(s.fields):
            role[s.code, f] = _ROLE_CODE[fld.role]
            fbank[s.code, f] = int(fld.bank) if fld.bank is not None else 0
        regs[s.code] = tuple(tuple((1 + f, int(fld.bank) * MAX_REGS) for f, fld in enumerate(s.fields)
                                   if fld.role == r) for r in "dsm")
    return sec, role, fbank, bank, group, regs


_SEC_MASK, _ROLE, _FBANK, _BANK, _GROUP, _REGS = _tables()
_DTYPE_BANK = np.array([int(DType(c).bank) for c in range(N_DTYPES)], np.int64)


def cached_stream(kw: np.ndarray, instance_idx: np.ndarray, args_key: bytes, args: list[ArgInfo], k: int,
                  counts: tuple) -> "Stream":
    """The checked stream of kernel block kw (whose header, length and sizes were checked). Its
    checks read only the block's instance-independent words and the arguments' roles and dtypes,
    so they are memoized on exactly those: a kernel encoded at a new size costs a lookup."""
    masked = kw.copy()
    masked[instance_idx] = 0
    key = args_key + masked.tobytes()
    stream = STREAMS.get(key)
    if stream is not None:   # (no touch: first in, first out; an evicted stream is checked again)
        return stream
    stream = Stream(masked, args, k, counts)
    return STREAMS.put(key, stream, len(key) + stream.nbytes())


def _check_sections(prologue, sweeps, n_instr, k) -> None:
    ranges = [prologue]
    for sw in sweeps:
        ranges += [sw.init, sw.body, sw.fin]
    expect = 0
    for i, (s, e) in enumerate(ranges):
        if s != expect or e < s:
            name = "prologue" if i == 0 else f"sweep {(i - 1) // 3} {('init', 'body', 'fin')[(i - 1) % 3]}"
            raise VerifyError("sections", f"{name} is [{s}, {e}), expected to start at {expect}", kernel=k)
        expect = e
    if expect != n_instr:
        raise VerifyError("sections", f"sections cover {expect} of {n_instr} instructions", kernel=k)


def _check_operands(opnd: list, args: list[ArgInfo], k: int) -> None:
    for j, (kind, arg, dt) in enumerate(opnd):
        if kind == OPND_INDEX:
            if dt != DType.INT64 or arg != 0:
                raise VerifyError("operand_table", f"index operand {j} must be int64 with arg 0", kernel=k)
        elif kind == OPND_ARG:
            if not 0 <= arg < len(args):
                raise VerifyError("operand_table", f"operand {j} names argument {arg} of {len(args)}", kernel=k)
            if dt != args[arg].dtype:
                raise VerifyError("operand_table", f"operand {j} has dtype {dt}, argument {arg} has "
                                                   f"{args[arg].dtype}", kernel=k)
        else:
            raise VerifyError("operand_table", f"operand {j} has unknown kind {kind}", kernel=k)


class Stream:
    """A kernel's checked instruction stream with what does not change between its instances:
    sections, operand kinds, arguments and dtypes, constant banks, instructions (read-only arrays
    shared by every KernelLayout of the stream), and the facts later checks need: which operands
    the body and finalize sections load or store (instruction index of each; 'B' whole domain,
    'F' column 0 of every row: finalize loads/stores and storerow), the operands that share an
    argument with a stored one (`shared`: instruction, stored operand, other), the first single-tile
    instruction, if any, and the instruction count of each section kind (for the work bound).
    `derived`: what a VM derives from the stream alone, cached by the VM."""
    __slots__ = ("nregs", "prologue", "sweeps", "opnd_kind", "opnd_arg", "opnd_dtype", "const_bank", "instrs",
                 "used", "stores", "shared", "single_tile_at", "per_row_block", "per_tile", "derived")

    def __init__(self, masked: np.ndarray, args: list[ArgInfo], k: int, counts: tuple):
        nd, n_sweeps, n_opnd, n_const = counts
        lst = masked[:KHEAD_WORDS + nd + 2 + SWEEP_WORDS * n_sweeps].tolist()
        self.nregs = tuple(lst[8:12])
        pos = KHEAD_WORDS + nd
        self.prologue = (lst[pos], lst[pos + 1])
        pos += 2
        sweeps = []
        for _ in range(n_sweeps):
            s = lst[pos:pos + SWEEP_WORDS]
            sweeps.append(Sweep((s[0], s[1]), (s[2], s[3]), (s[4], s[5])))
            pos += SWEEP_WORDS
        self.sweeps = tuple(sweeps)
        n_instr = lst[6]
        _check_sections(self.prologue, sweeps, n_instr, k)
        opnd_words = OPND_FIXED_WORDS + nd
        opnd = masked[pos:pos + opnd_words * n_opnd].reshape(n_opnd, opnd_words)
        _check_operands(opnd[:, :3].tolist(), args, k)
        pos += opnd_words * n_opnd
        const_bank = masked[pos:pos + CONST_WORDS * n_const:CONST_WORDS]
        if n_const and (const_bank.min() < 0 or const_bank.max() >= len(isa.BANKS)):
            raise VerifyError("constant", "constant with an unknown bank", kernel=k)
        pos += CONST_WORDS * n_const
        self.opnd_kind, self.opnd_arg, self.opnd_dtype = (opnd[:, c].copy() for c in range(3))
        self.const_bank = const_bank.copy()
        self.instrs = masked[pos:].reshape(n_instr, isa.WORDS).copy()
        for a in (self.opnd_kind, self.opnd_arg, self.opnd_dtype, self.const_bank, self.instrs):
            a.flags.writeable = False
        self.derived: dict = {}
        sec = self._section_codes()
        first_bad = _first_static_fault(self, sec, args)
        check_dataflow(self.instrs[:first_bad].tolist(), self._ranges(), _REGS, k)
        if first_bad < n_instr:
            _check_instruction(self, first_bad, sec, args, k)
            raise AssertionError(f"verifier: instruction {first_bad} failed an array check that its own "
                                 "checks pass")   # the two forms of the static checks disagree: a DVM bug
        self._find_accesses(sec)
        body = sum(sw.body[1] - sw.body[0] for sw in self.sweeps)
        self.per_tile = body
        self.per_row_block = n_instr - body - (self.prologue[1] - self.prologue[0])

    def nbytes(self) -> int:
        arrays = (self.opnd_kind, self.opnd_arg, self.opnd_dtype, self.const_bank, self.instrs)
        return sum(a.nbytes for a in arrays) + STREAM_OVERHEAD_BYTES

    def _ranges(self) -> list[tuple[int, int, int]]:
        """(section kind, start, end) of every section, in order."""
        out = [(SEC_P, *self.prologue)]
        for sw in self.sweeps:
            out += [(SEC_I, *sw.init), (SEC_B, *sw.body), (SEC_F, *sw.fin)]
        return out

    def _section_codes(self) -> np.ndarray:
        """The section kind (SEC_*) of every instruction."""
        codes, lengths = [SEC_P], [self.prologue[1] - self.prologue[0]]
        for sw in self.sweeps:
            codes += [SEC_I, SEC_B, SEC_F]
            lengths += [sw.init[1] - sw.init[0], sw.body[1] - sw.body[0], sw.fin[1] - sw.fin[0]]
        return np.repeat(np.array(codes, np.int64), lengths)

    def _find_accesses(self, sec: np.ndarray) -> None:
        self.used: dict[int, str] = {}
        self.stores: list[tuple[int, int, str]] = []  # (instruction, operand, section)
        self.shared: list[tuple[int, int, int]] = []
        self.single_tile_at = -1
        if not len(sec):
            return
        group = _GROUP[self.instrs[:, 0]]
        in_loop = (sec == SEC_B) | (sec == SEC_F)
        single = np.flatnonzero(in_loop & ((group == G_ROWRED) | (group == G_STOREROW)))
        if len(single):
            self.single_tile_at = int(single[0])
        mem = np.flatnonzero(in_loop & ((group == G_LOAD) | (group == G_STORE) | (group == G_STOREROW)))
        for i, g, s, j in zip(mem.tolist(), group[mem].tolist(), sec[mem].tolist(), self.instrs[mem, 2].tolist()):
            access = "F" if g == G_STOREROW or s == SEC_F else "B"
            self.used[j] = self.used.get(j, "") + access
            if g != G_LOAD:
                self.stores.append((i, j, access))
        self._find_shared()

    def _find_shared(self) -> None:
        by_arg: dict[int, list[int]] = {}
        kinds, args = self.opnd_kind.tolist(), self.opnd_arg.tolist()
        for j in self.used:
            if kinds[j] == OPND_ARG:
                by_arg.setdefault(args[j], []).append(j)
        pairs = set()
        for i, j, _ in self.stores:
            for other in by_arg[args[j]]:
                if other != j and (j, other) not in pairs and (other, j) not in pairs:
                    pairs.add((j, other))
                    self.shared.append((i, j, other))


def _first_static_fault(stream: Stream, sec: np.ndarray, args: list[ArgInfo]) -> int:
    """The index of the first instruction that fails a check needing no dataflow (len if none)."""
    ins = stream.instrs
    n = len(ins)
    if n == 0:
        return 0
    op = ins[:, 0]
    valid = (op >= 1) & (op <= isa.MAX_OPCODE)
    opi = np.where(valid, op, 0)
    bad = (_SEC_MASK[opi] & sec) == 0          # unknown opcode (mask 0) or a section it may not use
    fields = ins[:, 1:]
    role, fbank = _ROLE[opi], _FBANK[opi]
    bad |= ((role == R_NONE) & (fields != 0)).any(1)
    is_reg = (role == R_D) | (role == R_S) | (role == R_M)
    limit = np.array(stream.nregs, np.int64)[fbank]
    bad |= (is_reg & ((fields < 0) | (fields >= limit))).any(1)
    bank = _BANK[opi][:, None]
    n_opnd, n_const = len(stream.opnd_kind), len(stream.const_bank)
    is_o = role == R_O
    if is_o.any():
        bad |= (is_o & ((fields < 0) | (fields >= n_opnd))).any(1)
        j = np.clip(fields, 0, max(n_opnd - 1, 0))
        if n_opnd:
            group = _GROUP[opi][:, None]
            kind_index = stream.opnd_kind[j] == OPND_INDEX
            bad |= (is_o & ((group == G_INDEX) != kind_index)).any(1)
            memop = is_o & ((group == G_LOAD) | (group == G_STORE) | (group == G_STOREROW))
            bad |= (memop & (_DTYPE_BANK[np.clip(stream.opnd_dtype[j], 0, N_DTYPES - 1)] != bank)).any(1)
            roles = np.array([a.role for a in args] or [ARG_IN], np.int64)
            writes_input = roles[np.clip(stream.opnd_arg[j], 0, len(roles) - 1)] == ARG_IN
            bad |= (is_o & ((group == G_STORE) | (group == G_STOREROW)) & writes_input).any(1)
    is_k = role == R_K
    if is_k.any():
        bad |= (is_k & ((fields < 0) | (fields >= n_const))).any(1)
        if n_const:
            kb = stream.const_bank[np.clip(fields, 0, n_const - 1)]
            bad |= (is_k & (kb != bank)).any(1)
    is_t = role == R_T
    if is_t.any():
        in_range = (fields >= 0) & (fields < N_DTYPES)
        tb = _DTYPE_BANK[np.clip(fields, 0, N_DTYPES - 1)]
        bad |= (is_t & (~in_range | (tb != bank))).any(1)
    return int(np.argmax(bad)) if bad.any() else n


def _check_instruction(stream: Stream, i: int, sec: np.ndarray, args: list[ArgInfo], k: int) -> None:
    """The checks of instruction i that need no dataflow, one by one (raises the first failing)."""
    row = stream.instrs[i].tolist()
    spec = isa.BY_CODE.get(row[0])
    if spec is None:
        raise VerifyError("opcode", f"unknown opcode {row[0]}", i, k)
    sec_name = {SEC_P: "P", SEC_I: "I", SEC_B: "B", SEC_F: "F"}[int(sec[i])]
    if sec_name not in spec.sections:
        raise VerifyError("section_kind", f"{spec.name} may not appear in section {sec_name}", i, k)
    for f in range(len(spec.fields), isa.MAX_FIELDS):
        if row[1 + f] != 0:
            raise VerifyError("unused_field", f"{spec.name} field {f} must be 0", i, k)
    n_opnd, n_const = len(stream.opnd_kind), len(stream.const_bank)
    for f, fld in enumerate(spec.fields):
        v = row[1 + f]
        if fld.is_reg:
            if not 0 <= v < stream.nregs[fld.bank]:
                raise VerifyError("register", f"{spec.name}: register {fld.bank.short}:{v} out of "
                                              f"range ({stream.nregs[fld.bank]})", i, k)
        elif fld.role == "o":
            _check_operand_use(spec, v, stream, args, n_opnd, i, k)
        elif fld.role == "k":
            if not 0 <= v < n_const:
                raise VerifyError("constant", f"constant {v} of {n_const}", i, k)
            if int(stream.const_bank[v]) != spec.bank:
                raise VerifyError("register_class", f"{spec.name} reads a "
                                                    f"{isa.BANKS[int(stream.const_bank[v])].short} constant", i, k)
        elif fld.role == "t":
            if not 0 <= v < N_DTYPES or DType(v).bank != spec.bank:
                raise VerifyError("dtype_code", f"{spec.name}: target dtype code {v}", i, k)


def _check_operand_use(spec, v, stream, args, n_opnd, i, k) -> None:
    if not 0 <= v < n_opnd:
        raise VerifyError("operand", f"{spec.name}: operand {v} of {n_opnd}", i, k)
    kind = int(stream.opnd_kind[v])
    if (spec.group == "index") != (kind == OPND_INDEX):
        raise VerifyError("operand", f"{spec.name} cannot use operand {v} of kind {kind}", i, k)
    if spec.group in ("load", "store", "storerow") and DType(int(stream.opnd_dtype[v])).bank != spec.bank:
        raise VerifyError("register_class", f"{spec.name} on operand {v} of dtype "
                                            f"{DType(int(stream.opnd_dtype[v])).short}", i, k)
    if spec.group in ("store", "storerow") and args[int(stream.opnd_arg[v])].role == ARG_IN:
        raise VerifyError("store_target", f"{spec.name} writes input argument {int(stream.opnd_arg[v])}", i, k)
