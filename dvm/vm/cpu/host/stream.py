"""What the CPU VM derives from a kernel's instruction stream alone, computed once per stream.

A kernel traced once and launched at many shapes (every new sequence length of a model) gets a
new KernelLayout per shape, but usually the same instructions: the register flow (rio), the
in-place and fused-run plans (host/in_place, host/fuse_plan) and which arguments the kernel stores depend only on
the instructions, the section bounds, the operands' dtypes and arguments. They are computed once
per checked stream of the verifier (codegen.verifier.Stream, whose key holds all of those and the
argument count) and kept in its `derived`, as read-only arrays shared by every descriptor built
from the stream.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ....codegen import isa
from ....codegen.program import KernelLayout
from .decode import BANK_CODE
from .fuse_plan import fuse_plan, rereads_rows
from .in_place import in_place_plan


class StreamPlan(NamedTuple):
    instrs: np.ndarray   # [n_instr, isa.WORDS]
    rio: np.ndarray      # _reg_io
    peep: np.ndarray     # in_place.in_place_plan
    fuse: np.ndarray     # fuse_plan.fuse_plan
    argst: np.ndarray    # per argument: 1 stored by the kernel, 2 stored and loaded, else 0
    argld: np.ndarray    # per argument: 1 loaded by the kernel, else 0
    reduces: bool        # a reduction and no argmax/argmin: column-major registers allowed
    rereads: bool        # rows read again after their reduction (fuse_plan.rereads_rows)


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


def _arg_access(instrs: np.ndarray, opnd_arg: np.ndarray, n_args: int) -> tuple[np.ndarray, np.ndarray]:
    """Per argument: 1 stored by this kernel, 2 stored and loaded (no in-place tiles then); and per
    argument: 1 loaded by this kernel. Loads and stores are in the body and finalize sections
    only (isa: the prologue holds constants), so these are every access the kernel makes."""
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
    argld = np.zeros(n_args, np.int64)
    for a in loaded:
        argld[a] = 1
        if argst[a]:
            argst[a] = 2
    return argst, argld


def _reduces(instrs: np.ndarray) -> bool:
    groups = set()
    for row in instrs:
        sp = isa.BY_CODE.get(int(row[0]))
        if sp is None or (sp.group in ("acc", "rfin", "rowred") and sp.op.startswith("arg")):
            return False
        groups.add(sp.group)
    return bool(groups & {"acc", "rfin", "rowred"})


def _plan(kl: KernelLayout, n_args: int) -> StreamPlan:
    sections = [kl.prologue] + [sec for sw in kl.sweeps for sec in (sw.init, sw.body, sw.fin)]
    instrs = kl.instrs   # the stream's read-only array
    plan = StreamPlan(instrs, _reg_io(instrs), in_place_plan(instrs, kl.opnd_dtype, kl.opnd_arg, sections),
                      fuse_plan(instrs, sections), *_arg_access(instrs, kl.opnd_arg, n_args),
                      _reduces(instrs), rereads_rows(instrs, sections))
    for a in plan:
        if isinstance(a, np.ndarray):
            a.setflags(write=False)
    return plan


def stream_plan(kl: KernelLayout, n_args: int) -> StreamPlan:
    """The stream-derived parts of kl's descriptor (the arrays are read-only), once per stream."""
    derived = kl.stream.derived
    plan = derived.get("cpu_plan")
    if plan is None:
        plan = derived["cpu_plan"] = _plan(kl, n_args)
    return plan
