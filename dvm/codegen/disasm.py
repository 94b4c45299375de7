"""Readable text for any verified Program (the form golden tests pin)."""
from __future__ import annotations

from ..graph.dtypes import Bank, DType
from . import isa
from .program import ARG_ROLES, OPND_INDEX, VERSION, KernelLayout, Program, bits_float
from .verifier import verify


def disasm(program: Program) -> str:
    layout = verify(program)
    lines = [f"program v{VERSION}: {len(layout.kernels)} kernel(s), {len(layout.args)} arg(s), "
             f"{len(program)} words, sha {program.digest}"]
    for a, info in enumerate(layout.args):
        numel = f" numel={info.numel}" if info.numel else ""
        lines.append(f"  arg{a} {ARG_ROLES[info.role]:<3} {DType(info.dtype).short}{numel}")
    for k, kl in enumerate(layout.kernels):
        lines += _kernel_lines(k, kl)
    return "\n".join(lines)


def _kernel_lines(k: int, kl: KernelLayout) -> list[str]:
    regs = " ".join(f"{b.short}={n}" for b, n in zip(Bank, kl.nregs))
    out = [f"kernel {k}: rows {list(kl.row_sizes)} x cols {list(kl.col_sizes)}  tile {kl.bm}x{kl.bn}  "
           f"sweeps {len(kl.sweeps)}  regs {regs}"]
    for j in range(len(kl.opnd_kind)):
        strides = [int(s) for s in kl.opnd_strides[j]]
        if int(kl.opnd_kind[j]) == OPND_INDEX:
            out.append(f"  o{j} index  +{int(kl.opnd_offset[j])} coefs {strides}")
        else:
            out.append(f"  o{j} arg{int(kl.opnd_arg[j])} {DType(int(kl.opnd_dtype[j])).short} "
                       f"+{int(kl.opnd_offset[j])} strides {strides}")
    for j in range(len(kl.const_bank)):
        bank, bits = Bank(int(kl.const_bank[j])), int(kl.const_bits[j])
        value = bits_float(bits) if bank in (Bank.F32, Bank.F64) else (bool(bits) if bank is Bank.B8 else bits)
        out.append(f"  k{j} {bank.short} {value!r}")
    sections = [("prologue", kl.prologue)]
    for s, sw in enumerate(kl.sweeps):
        sections += [(f"sweep {s} init", sw.init), (f"sweep {s} body", sw.body), (f"sweep {s} fin", sw.fin)]
    for name, (s, e) in sections:
        if e > s:
            out.append(f"  {name}:")
            out += [f"    {i:04d}  {format_instr(kl.instrs[i])}" for i in range(s, e)]
    return out


REG_PREFIX = {Bank.F32: "f", Bank.F64: "d", Bank.I64: "i", Bank.B8: "b"}


def format_instr(row) -> str:
    spec = isa.BY_CODE[int(row[0])]
    parts = []
    for f, fld in enumerate(spec.fields):
        v = int(row[1 + f])
        if fld.is_reg:
            parts.append(("+" if fld.role == "m" else "") + f"{REG_PREFIX[fld.bank]}{v}")
        elif fld.role == "o":
            parts.append(f"o{v}")
        elif fld.role == "k":
            parts.append(f"k{v}")
        else:
            parts.append(DType(v).short)
    return f"{spec.name:<22} {', '.join(parts)}"
