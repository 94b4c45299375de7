"""Tier 2 of the GPU VM: a kernel's instruction stream as straight-line Triton source.

The source is generated from a verified stream (the instance-independent part of a kernel
block: instructions, sections, operand kinds, dtypes and slots, the folded dims' count), so one
specialised kernel serves every shape of that structure: sizes, strides, offsets, tiles and
constants are still read from the device image, and its arguments are the interpreter's. There is
no decode and no register selection: registers become Python variables (f3, b1, ...), each
instruction one call of the same op functions the interpreter runs (ops.py, tiles.py) with its
op number as a literal, so the compiler folds every switch and both tiers compute the same bits.
Operand addresses are split into a row part (once per work item) and a column part (once per
tile).
"""
from __future__ import annotations

import hashlib
import importlib.util
import os

import numpy as np

from ...codegen import isa
from ...codegen.program import KernelLayout
from ...config import config
from ...graph.dtypes import Bank
from ...graph.ops import OP_TABLE
from . import abi
from .image import decode_stream

GENERATOR_VERSION = 2
REG = {Bank.F32: "f", Bank.F64: "d", Bank.I64: "i", Bank.B8: "b"}
ZERO = {Bank.F32: "tl.full([TILE], 0, tl.float32)", Bank.F64: "tl.full([TILE], 0, tl.float64)",
        Bank.I64: "tl.full([TILE], 0, tl.int64)", Bank.B8: "lanes < 0"}
LOAD = {Bank.F32: "t.load_f32(p{j}, {dt}, {idx}, {mask}{a})", Bank.F64: "t.load_f64(p{j}, {idx}, {mask}{a})",
        Bank.I64: "t.load_i64(p{j}, {dt}, {idx}, {mask}{a})", Bank.B8: "t.load_b8(p{j}, {idx}, {mask}{a})"}
STORE = {Bank.F32: "t.store_f32(p{j}, {dt}, {idx}, {v}, {mask}{a})",
         Bank.F64: "t.store_f64(p{j}, {idx}, {v}, {mask}{a})",
         Bank.I64: "t.store_i64(p{j}, {dt}, {idx}, {v}, {mask}{a})", Bank.B8: "t.store_b8(p{j}, {idx}, {v}, {mask}{a})"}
ALIGNED = ", True"   # {a} on the fast path (tiles.py's ALIGNED); "" elsewhere
VEC = 4   # lanes per thread at TILE = 1024 and 8 warps: the fast path's element alignment


def structure_key(kl: KernelLayout) -> str:
    """The structure of a kernel block: everything the generated source depends on (DVM_GPU_VECTOR
    among it), never a size."""
    h = hashlib.sha256()
    for part in (kl.instrs, np.array(kl.prologue), np.array([w for sw in kl.sweeps for p in sw for w in p]),
                 kl.opnd_kind, kl.opnd_arg, kl.opnd_dtype, kl.const_bank, np.array(kl.nregs),
                 np.array([len(kl.row_sizes), len(kl.col_sizes), abi.TILE, GENERATOR_VERSION, config().gpu_vector])):
        h.update(np.ascontiguousarray(part, np.int64).tobytes())
        h.update(b"|")
    return h.hexdigest()[:20]


def _full_index(j: int) -> str:
    """Operand j's element index over a contiguous tile of one row (body()'s fast path)."""
    return f"tl.multiple_of(off{j} + ras{j} + ct * bnv, {VEC}) + lanes"


def _r(bank: Bank, r: int) -> str:
    return f"{REG[bank]}{r}"


class _Source:
    def __init__(self, kl: KernelLayout):
        self.kl = kl
        self.nr, self.nc = len(kl.row_sizes), len(kl.col_sizes)
        self.lines: list[str] = []
        self.dec = decode_stream(kl)

    def emit(self, depth: int, line: str) -> None:
        self.lines.append("    " * depth + line)

    # -- operands ------------------------------------------------------------------------------
    def operands(self) -> None:
        kl, e = self.kl, self.emit
        for d in range(self.nr + self.nc):
            e(1, f"n{d} = tl.maximum(tl.load(B + H_SIZES + {d}), 1)")
        for j in range(len(kl.opnd_kind)):
            e(1, f"o{j} = B + tl.load(B + H_OPNDS) + {j} * OW")
            if int(kl.opnd_kind[j]) == 0:   # an argument (index operands have no buffer)
                slots = ", ".join(f"a{k}" for k in range(abi.N_SLOTS))
                e(1, f"p{j} = t.slot_address({int(kl.opnd_arg[j])}, {slots}, ext)")
            e(1, f"off{j} = tl.load(o{j} + O_OFFSET)")
            for d in range(self.nr + self.nc):
                e(1, f"s{j}_{d} = tl.load(o{j} + O_STRIDES + {d})")

    def digits(self, depth: int, var: str, first: int, n: int, prefix: str, q: str = "q") -> None:
        """prefix{d} = digit d of the flat index `var` over dims [first, first + n) (`q`: the
        temporary, one per type: a variable keeps its type across a loop)."""
        if n == 0:
            return
        self.emit(depth, f"{q} = {var}")
        for d in range(first + n - 1, first, -1):
            self.emit(depth, f"{prefix}{d} = {q} % n{d}")
            self.emit(depth, f"{q} = {q} // n{d}")
        self.emit(depth, f"{prefix}{first} = {q}")

    def part_address(self, depth: int, first: int, n: int, prefix: str, name: str, empty: str) -> None:
        """name{j} = operand j's address term over dims [first, first + n); `empty` without dims."""
        for j in range(len(self.kl.opnd_kind)):
            terms = " + ".join(f"{prefix}{d} * s{j}_{d}" for d in range(first, first + n)) or empty
            self.emit(depth, f"{name}{j} = {terms}")

    # -- instructions --------------------------------------------------------------------------
    def instr(self, depth: int, i: int, section: str) -> None:
        kl, e = self.kl, self.emit
        spec = isa.BY_CODE[int(kl.instrs[i, 0])]
        f = [int(v) for v in kl.instrs[i, 1:]]
        regs = [_r(fld.bank, v) for v, fld in zip(f, spec.fields) if fld.is_reg]
        g, bank = spec.group, spec.bank
        full = section == "V"   # the body over a contiguous tile of one row (body(): the fast path)
        body = section == "B" or full
        mask = "rvalid & cvalid" if body else "rvalid"
        if g == "const":
            e(depth, f"{regs[0]} = {self.const(bank, i)}")
        elif g in ("load", "index"):
            j = f[1]
            idx = f"off{j} + ra{j} + ca{j}" if body else f"off{j} + ra{j}"
            if g == "index":
                e(depth, f"{regs[0]} = {idx}")
            elif full:
                e(depth, f"{regs[0]} = " + LOAD[bank].format(j=j, dt=int(kl.opnd_dtype[j]), idx=_full_index(j),
                                                               mask="vmask", a=ALIGNED))
            else:
                e(depth, f"{regs[0]} = " + LOAD[bank].format(j=j, dt=int(kl.opnd_dtype[j]), idx=idx, mask=mask, a=""))
        elif g == "store" and full:
            j = f[1]
            e(depth, STORE[bank].format(j=j, dt=int(kl.opnd_dtype[j]), idx=_full_index(j), v=regs[0], mask="vmask",
                                        a=ALIGNED))
        elif g in ("store", "storerow"):
            j = f[1]
            idx, m = (f"off{j} + ra{j} + ca{j}", "rvalid & cvalid") if g == "store" and body else \
                (f"off{j} + ra{j}", "rvalid & cvalid & (lj == 0)")
            e(depth, STORE[bank].format(j=j, dt=int(kl.opnd_dtype[j]), idx=idx, v=regs[0], mask=m, a=""))
        elif g == "cast":
            e(depth, f"{regs[0]} = {self.cast(spec, regs[1], f[2])}")
        elif g == "ew":
            e(depth, f"{regs[0]} = {self.elementwise(spec, regs[1:])}")
        else:
            self.reduction(depth, spec, regs)

    def const(self, bank: Bank, i: int) -> str:
        bits = f"tl.load(ins + {i} * IW + 2)"
        return {Bank.F32: f"{ZERO[bank]} + {bits}.to(tl.float64, bitcast=True).to(tl.float32)",
                Bank.F64: f"{ZERO[bank]} + {bits}.to(tl.float64, bitcast=True)",
                Bank.I64: f"{ZERO[bank]} + {bits}", Bank.B8: f"({ZERO[Bank.I64]} + {bits}) != 0"}[bank]

    def cast(self, spec, x: str, dt: int) -> str:
        src, dst = spec.fields[1].bank, spec.bank
        if dst is Bank.F32:
            return f"{x}.to(tl.float32)" if src is Bank.B8 else f"ops.to_f32_bank({x}, {dt})"
        if dst is Bank.F64:
            return x if src is Bank.F64 else f"{x}.to(tl.float64)"
        if dst is Bank.I64:
            return {Bank.F32: f"ops.float_to_int({x}, {dt})", Bank.F64: f"ops.float_to_int({x}, {dt})",
                    Bank.I64: f"ops.int_to_int({x}, {dt})", Bank.B8: f"{x}.to(tl.int64)"}[src]
        return x if src is Bank.B8 else f"{x} != 0"

    def elementwise(self, spec, srcs: list[str]) -> str:
        name, bank = spec.op, spec.bank
        arity = OP_TABLE[name].arity
        out = spec.fields[0].bank
        if arity == 1:
            k = abi.UNARY_OP[name]
            if bank is Bank.B8:
                return f"{srcs[0]} == 0"
            if out is Bank.B8:
                return f"ops.float_pred({k}, {srcs[0]})"
            fn = "ops.unary_i64" if bank is Bank.I64 else "ops.unary_float"
            return f"{fn}({k}, {srcs[0]})"
        if arity == 2:
            k = abi.BINARY_OP[name]
            if bank is Bank.B8:
                return f"ops.binary_b8({k}, {srcs[0]}, {srcs[1]})"
            if out is Bank.B8:
                return f"ops.compare({k}, {srcs[0]}, {srcs[1]})"
            fn = "ops.binary_i64" if bank is Bank.I64 else "ops.float_binary"
            return f"{fn}({k}, {srcs[0]}, {srcs[1]})"
        if name == "where":
            return f"tl.where({srcs[0]}, {srcs[1]}, {srcs[2]})"
        return f"ops.clamp({srcs[0]}, {srcs[1]}, {srcs[2]})"

    def reduction(self, depth: int, spec, regs: list[str]) -> None:
        e, k = self.emit, abi.RED_OP[spec.op]
        arg = spec.op.startswith("arg")
        tree = "lanes, li, lj, bn, TILE"
        if spec.group == "accinit":
            e(depth, f"{regs[0]} = ops.identity_like({ZERO[spec.bank]}, {k})")
            if arg:
                e(depth, f"{regs[1]} = {ZERO[Bank.I64]}")
        elif spec.group == "acc" and arg:
            v, i, x = regs
            e(depth, f"take = cvalid & ops.arg_better({k}, {x}, col, {v}, {i}, False)")
            e(depth, f"{v} = tl.where(take, {x}, {v})")
            e(depth, f"{i} = tl.where(take, col, {i})")
        elif spec.group == "acc":
            e(depth, f"{regs[0]} = tl.where(cvalid, ops.combine({k}, {regs[0]}, {regs[1]}), {regs[0]})")
        elif spec.group == "rfin":
            if arg:
                e(depth, f"{regs[0]} = t.arg_tree({regs[1]}, {regs[2]}, {k}, {tree})")
            else:
                e(depth, f"{regs[0]} = t.tree({regs[1]}, {k}, {tree})")
        else:   # rowred
            x = f"tl.where(cvalid, {regs[1]}, ops.identity_like({regs[1]}, {k}))"
            if arg:
                e(depth, f"{regs[0]} = t.arg_tree({x}, tl.where(cvalid, col, ops.I64_MAX), {k}, {tree})")
            else:
                e(depth, f"{regs[0]} = t.tree({x}, {k}, {tree})")

    def section(self, depth: int, rng: tuple[int, int], section: str) -> None:
        for i in range(*rng):
            self.instr(depth, i, section)

    def full_operands(self) -> list[int]:
        """The operands a body loads or stores tile by tile, where body()'s fast path can serve
        them (one column dim); [] where it cannot."""
        kl, out = self.kl, set()
        if self.nc != 1 or not config().gpu_vector:
            return []
        for sw in kl.sweeps:
            for i in range(*sw.body):
                if isa.BY_CODE[int(kl.instrs[i, 0])].group in ("load", "store"):
                    out.add(int(kl.instrs[i, 2]))
        return sorted(j for j in out if int(kl.opnd_kind[j]) == 0)

    def body(self, depth: int, rng: tuple[int, int], full: list[int]) -> None:
        """A sweep's body. With `full` operands, a tile of one row inside the columns whose
        operands are all contiguous along the columns and aligned (a 16-byte base, offsets and
        the tile width multiples of VEC: checked per kernel and item, `vec`) loads and stores
        them with those facts as compiler hints (VEC lanes per thread at once); other tiles take
        the general form. The same instructions either way: the same bits."""
        if not full:
            self.section(depth, rng, "B")
            return
        self.emit(depth, "if vec & ((ct + 1) * bn <= cols):")
        self.emit(depth + 1, f"bnv = tl.multiple_of(bn, {VEC})")
        self.emit(depth + 1, "vmask = lanes < bnv")
        self.section(depth + 1, rng, "V")
        self.emit(depth, "else:")
        self.section(depth + 1, rng, "B")

    # -- the kernel ----------------------------------------------------------------------------
    def kernel(self, name: str) -> str:
        kl, e = self.kl, self.emit
        args = ", ".join(f"{a}: tl.int64" for a in abi.ARG_NAMES)
        e(0, f"@triton.jit(do_not_specialize={list(abi.ARG_NAMES)!r})")
        e(0, f"def {name}({args}, TILE: tl.constexpr):")
        e(1, "B = blk.to(tl.pointer_type(tl.int64))")
        for var, word in (("rows", "H_ROWS"), ("cols", "H_COLS"), ("nct", "H_NCT"), ("items", "H_ITEMS")):
            e(1, f"{var} = tl.load(B + {word})")
        e(1, "bm = tl.load(B + H_BM).to(tl.int32)")
        e(1, "bn = tl.load(B + H_BN).to(tl.int32)")
        e(1, "ins = B + tl.load(B + H_INSTRS)")
        self.operands()
        e(1, "lanes = tl.arange(0, TILE)")
        e(1, "li = lanes // bn")
        e(1, "lj = lanes - li * bn")
        e(1, "pid = tl.program_id(0).to(tl.int64)")
        e(1, "grid = tl.num_programs(0).to(tl.int64)")
        self.section(1, kl.prologue, "P")
        full = self.full_operands()
        if full:   # body()'s fast path: what holds for every item
            e(1, f"vecp = (bm == 1) & (bn % {VEC} == 0)" + "".join(
                f" & (s{j}_{self.nr} == 1) & (off{j} % {VEC} == 0) & (p{j} % 16 == 0)" for j in full))
        e(1, "item = pid")
        e(1, "while item < items:")
        e(2, f"rb, lo, hi = interp._item(item, nct, {int(self.dec.tile_parallel)})")
        e(2, "row = rb * bm + li")
        e(2, "rvalid = (li < bm) & (row < rows)")
        self.digits(2, "row", 0, self.nr, "rd")
        self.part_address(2, 0, self.nr, "rd", "ra", "0")
        if full:   # (a tile of one row: its row addresses as scalars)
            self.digits(2, "rb", 0, self.nr, "rs", "qs")
            self.part_address(2, 0, self.nr, "rs", "ras", "0")
            e(2, "vec = vecp" + "".join(f" & (ras{j} % {VEC} == 0)" for j in full))
        for sw in kl.sweeps:
            self.section(2, sw.init, "I")
            e(2, "for ct in range(lo, hi):")
            e(3, "col = (lo * 0 + ct) * bn + lj   # (int64 in both modes: the interpreter's range yields ints)")
            e(3, "cvalid = col < cols")
            self.digits(3, "col", self.nr, self.nc, "cd")
            # (a tile of lanes even where no operand has a dim: a 0-d load or store is one per lane)
            self.part_address(3, self.nr, self.nc, "cd", "ca", "lj * 0")
            self.body(3, sw.body, full)
            e(3, "pass")
            e(2, "col = tl.full([TILE], 0, tl.int64)")
            e(2, "cvalid = lanes >= 0")
            self.section(2, sw.fin, "F")
        e(2, "item += grid")
        return "\n".join(self.lines) + "\n"


KERNEL_NAME = "specialised"
HEADER = '''"""Generated by dvm.vm.gpu.specialize from a verified stream (structure {key}); do not edit."""
import triton
import triton.language as tl

from dvm.vm.gpu import interp, ops
from dvm.vm.gpu import tiles as t
from dvm.vm.gpu.kabi import *  # noqa: F401,F403


'''


def kernel_from(path: str):
    """The specialised kernel of a generated source file, imported as a module of its own name."""
    spec = importlib.util.spec_from_file_location(os.path.splitext(os.path.basename(path))[0], path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, KERNEL_NAME)


def source(kl: KernelLayout) -> str:
    """The Python module (Triton source) of kl's structure; its kernel is named KERNEL_NAME."""
    return HEADER.format(key=structure_key(kl)) + _Source(kl).kernel(KERNEL_NAME)
