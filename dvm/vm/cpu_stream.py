"""What the CPU VM derives from a kernel's instruction stream alone, computed once per stream.

A kernel traced once and launched at many shapes (every new sequence length of a model) gets a
new KernelLayout per shape, but usually the same instructions: the register flow (rio), the
in-place and fused-run plans (cpu_fuse_plan) and which arguments the kernel stores depend only on
the instructions, the section bounds, the operands' dtypes and arguments. They are cached here,
keyed on exactly those, as read-only arrays shared by every descriptor built from the stream.
"""
from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

import numpy as np

from ..codegen import isa
from ..codegen.program import KernelLayout
from ..graph.dtypes import Bank
from . import cpu_kernels as ck
from .cpu_fuse_plan import fuse_plan, in_place_plan

BANK_CODE = {Bank.F32: ck.BK_F32, Bank.F64: ck.BK_F64, Bank.I64: ck.BK_I64, Bank.B8: ck.BK_B8}
STREAM_CACHE_SIZE = 1024   # instruction streams kept (each a few KB)


class StreamPlan(NamedTuple):
    instrs: np.ndarray   # [n_instr, isa.WORDS]
    rio: np.ndarray      # _reg_io
    peep: np.ndarray     # cpu_fuse_plan.in_place_plan
    fuse: np.ndarray     # cpu_fuse_plan.fuse_plan
    argst: np.ndarray    # per argument: 1 stored by the kernel, 2 stored and loaded, else 0
    reduces: bool        # has a reduction and no argmax/argmin (column-major registers allowed)


def _reg_io(instrs: np.ndarray) -> np.ndarray:
    """Per instruction and field: 1 + the bank of a register it reads (columns 0-4) or writes
    (columns 5-9), else 0 ('m' fields count as both). The VM tracks compact registers with it."""
    rio = np.zeros((len(instrs), 10), np.int64)
    for pc, row in enumerate(instrs):
        sp = isa.BY_CODE.get(int(row[0]))
        if sp is None:
            continue
        for f, fld in enumerate(sp.fields):
            if fld.is_reg and fld.bank in BANK_CODE:
                if fld.role in "sm":
                    rio[pc, f] = 1 + BANK_CODE[fld.bank]
                if fld.role in "dm":
                    rio[pc, 5 + f] = 1 + BANK_CODE[fld.bank]
    return rio


def _arg_stores(instrs: np.ndarray, opnd_arg: np.ndarray, n_args: int) -> np.ndarray:
    """Per argument: 1 stored by this kernel, 2 stored and loaded (no in-place tiles then)."""
    argst = np.zeros(n_args, np.int64)
    loaded = set()
    for row in instrs:
        sp = isa.BY_CODE.get(int(row[0]))
        if sp is None or sp.group not in ("load", "store", "storerow"):
            continue
        j = int(row[2])
        if not 0 <= j < len(opnd_arg):
            continue
        a = int(opnd_arg[j])
        if 0 <= a < n_args:
            if sp.group == "load":
                loaded.add(a)
            else:
                argst[a] = 1
    for a in loaded:
        if argst[a]:
            argst[a] = 2
    return argst


def _reduces(instrs: np.ndarray) -> bool:
    groups = set()
    for row in instrs:
        sp = isa.BY_CODE.get(int(row[0]))
        if sp is None or (sp.group in ("acc", "rfin", "rowred") and sp.op.startswith("arg")):
            return False
        groups.add(sp.group)
    return bool(groups & {"acc", "rfin", "rowred"})


@lru_cache(maxsize=STREAM_CACHE_SIZE)
def _plan(instr_bytes: bytes, sections: tuple, dtype_bytes: bytes, arg_bytes: bytes, n_args: int) -> StreamPlan:
    instrs = np.frombuffer(instr_bytes, np.int64).reshape(-1, isa.WORDS).copy()
    opnd_dtype = np.frombuffer(dtype_bytes, np.int64)
    plan = StreamPlan(instrs, _reg_io(instrs), in_place_plan(instrs, opnd_dtype, list(sections)),
                      fuse_plan(instrs, list(sections)), _arg_stores(instrs, np.frombuffer(arg_bytes, np.int64), n_args),
                      _reduces(instrs))
    for a in plan[:-1]:
        a.setflags(write=False)
    return plan


def stream_plan(kl: KernelLayout, n_args: int) -> StreamPlan:
    """The stream-derived parts of kl's descriptor (cached; the arrays are read-only): kept with
    the verifier's checked stream, which every layout of the same stream shares (its key holds
    the instructions, sections, operand arguments and dtypes, and the argument count)."""
    derived = kl.stream.derived if kl.stream is not None else None
    plan = derived.get("cpu_plan") if derived is not None else None
    if plan is None:
        sections = (kl.prologue,) + tuple(sec for sw in kl.sweeps for sec in (sw.init, sw.body, sw.fin))
        sections = tuple((int(a), int(b)) for a, b in sections)
        instrs = np.ascontiguousarray(kl.instrs, np.int64)
        plan = _plan(instrs.tobytes(), sections, np.ascontiguousarray(kl.opnd_dtype, np.int64).tobytes(),
                     np.ascontiguousarray(kl.opnd_arg, np.int64).tobytes(), n_args)
        if derived is not None:
            derived["cpu_plan"] = plan
    return plan
