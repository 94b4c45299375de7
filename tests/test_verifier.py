"""Must-reject corpus for the verifier, plus ISA / disassembler / reference-VM / op-table agreement.

Every case takes the words of a valid Program, makes one targeted edit (located by parsing the
layout documented in dvm/codegen/program.py) and asserts the exact VerifyError rule id and, for
rules about one instruction, its index (and kernel).
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pytest

import dvm
from dvm.frontend.library import layernorm
from dvm.codegen import isa, verifier
from dvm.codegen.disasm import format_instr
from dvm.codegen import verifier_dataflow, verifier_stream
from dvm.codegen.limits import MAX_ELEMS
from dvm.codegen.program import (ARG_WORDS, CONST_WORDS, HEADER_WORDS, KHEAD_WORDS, KTABLE_WORDS,
                                 MAGIC, MAX_REGS, MAX_TILE, OPND_FIXED_WORDS, SWEEP_WORDS, VERSION)
from dvm.graph import ops
from dvm.graph.dtypes import Bank, DType
from dvm.vm import reference
from dvm.codegen import encoder


@pytest.fixture(autouse=True)
def _multi_sweep_programs(monkeypatch):
    """This module pins the multi-sweep stream (its corpus and goldens index into it); the
    single-tile stream has its own tests in test_single_tile.py."""
    monkeypatch.setattr(encoder, "SINGLE_TILE_COLS", 0)


# ---------------------------------------------------------------------------------------------
# Locating words in a Program


def parse(words) -> dict:
    """Word offsets of every part of a (well-formed) program. Offsets are absolute."""
    w = [int(x) for x in words]
    n_args, n_kernels = w[3], w[4]
    pos = HEADER_WORDS
    out = {"args": [], "ktable": [], "kernels": []}
    for _ in range(n_args):
        out["args"].append(pos)           # role, dtype, numel
        pos += ARG_WORDS
    for _ in range(n_kernels):
        out["ktable"].append(pos)         # offset, length
        pos += KTABLE_WORDS
    for kt in out["ktable"]:
        off = w[kt]
        nr, nc, bm, bn, n_opnd, n_const, n_instr, n_sweeps = w[off:off + 8]
        nd = nr + nc
        k = {"off": off, "nr": nr, "nc": nc, "n_opnd": n_opnd, "n_const": n_const,
             "n_instr": n_instr, "n_sweeps": n_sweeps,
             "head": {name: off + i for i, name in enumerate(
                 ("nr", "nc", "bm", "bn", "n_opnd", "n_const", "n_instr", "n_sweeps",
                  "nregs_f32", "nregs_f64", "nregs_i64", "nregs_b8"))}}
        p = off + KHEAD_WORDS
        k["dims"] = p
        p += nd
        k["prologue"] = p
        p += 2
        k["sweeps"] = [p + SWEEP_WORDS * s for s in range(n_sweeps)]   # init s,e, body s,e, fin s,e
        p += SWEEP_WORDS * n_sweeps
        k["opnd"] = [p + (OPND_FIXED_WORDS + nd) * j for j in range(n_opnd)]  # kind, arg, dtype, off, strides
        p += (OPND_FIXED_WORDS + nd) * n_opnd
        k["const"] = [p + CONST_WORDS * j for j in range(n_const)]     # bank, bits
        p += CONST_WORDS * n_const
        k["instr"] = [p + isa.WORDS * i for i in range(n_instr)]        # opcode, f1..f5
        p += isa.WORDS * n_instr
        assert p == off + w[kt + 1], "parse() disagrees with the kernel table"
        out["kernels"].append(k)
    return out


# ---------------------------------------------------------------------------------------------
# Valid programs


@dvm.kernel
def argmax0(k, x):
    return k.store(k.argmax(k.load(x), axis=0))


@dvm.kernel
def to_bf16(k, x):
    return k.store(k.cast(k.cast(k.load(x), "bfloat16"), "float32"))  # keeps one rounding cast


@dvm.kernel
def iota_div(k, x):
    x = k.load(x)
    i = k.iota(x.shape, 1)
    return k.store(k.mul(x, i)), k.store(k.floor_divide(i, 2))


@dvm.kernel
def softmax(k, x):
    """The corpus' softmax divides by the row sum (library.softmax multiplies by its reciprocal):
    the cases below address this program's instructions by index (layout further down)."""
    x = k.load(x)
    e = k.exp(k.sub(x, k.max(x, axis=-1, keepdims=True)))
    return k.store(k.div(e, k.sum(e, axis=-1, keepdims=True)))


@dvm.kernel
def two_sums(k, x):
    x = k.load(x)
    return k.store(k.sum(x, axis=0)), k.store(k.sum(x, axis=1))


INPUTS = {
    "softmax": (softmax, lambda: [np.empty((3, 5), np.float32)]),
    "layernorm": (layernorm, lambda: [np.empty((4, 8), np.float32), np.empty(8, np.float32),
                                      np.empty(8, np.float32)]),
    "argmax0": (argmax0, lambda: [np.empty((6, 4), np.float32)]),
    "to_bf16": (to_bf16, lambda: [np.empty((2, 3), np.float32)]),
    "iota_div": (iota_div, lambda: [np.empty((3, 4), np.int32)]),
    "two_sums": (two_sums, lambda: [np.empty((3, 5), np.float32)]),
}


@functools.lru_cache(maxsize=None)
def program(name: str) -> dvm.Program:
    fn, make = INPUTS[name]
    return fn.program(*make())


def words_of(name: str) -> np.ndarray:
    return np.array(program(name).words, dtype=np.int64)  # a writable copy


def make_buffers(layout, inputs_numel: dict[int, int] | None = None):
    bufs = []
    for a, info in enumerate(layout.args):
        dt = DType(info.dtype).np_dtype
        n = info.numel if info.numel else (inputs_numel or {}).get(a, 0)
        if n == 0 and layout.extents[a] is not None:
            n = layout.extents[a][1] + 1
        bufs.append(np.zeros(n, dt))
    return bufs


# ---------------------------------------------------------------------------------------------
# The corpus

Edit = Callable[[np.ndarray, dict], "np.ndarray | None"]


@dataclass(frozen=True)
class Case:
    id: str
    prog: str | None          # base program name (None: `edit` builds the words itself)
    edit: Edit
    rule: str
    index: int = -1           # instruction index, -1 for rules not about one instruction
    kernel: int | None = None  # checked when not None


def ins(i: int, field: int, value: int, kernel: int = 0) -> Edit:
    """Set word `field` (0 = opcode, 1..5 = fields) of instruction i."""
    def edit(w, L):
        w[L["kernels"][kernel]["instr"][i] + field] = value
    return edit


def ins_row(i: int, row: list[int], kernel: int = 0) -> Edit:
    def edit(w, L):
        o = L["kernels"][kernel]["instr"][i]
        w[o:o + isa.WORDS] = row + [0] * (isa.WORDS - len(row))
    return edit


def khead(name: str, value, kernel: int = 0) -> Edit:
    def edit(w, L):
        o = L["kernels"][kernel]["head"][name]
        w[o] = value(w[o]) if callable(value) else value
    return edit


def opnd(j: int, field: int, value: int, kernel: int = 0) -> Edit:
    """field: 0 kind, 1 arg, 2 dtype, 3 offset, 4+d stride of dim d."""
    def edit(w, L):
        w[L["kernels"][kernel]["opnd"][j] + field] = value
    return edit


def word(index: int, value) -> Edit:
    def edit(w, L):
        w[index] = value(w[index]) if callable(value) else value
    return edit


def seq(*edits: Edit) -> Edit:
    def edit(w, L):
        for e in edits:
            r = e(w, L)
            if r is not None:
                w = r
        return w
    return edit


def op(name: str) -> int:
    return isa.opcode(name)


def _append_word(w, L):
    w = np.append(w, 0)
    w[2] = len(w)
    return w


def _truncate_keep_header(w, L):
    w = w[:-1].copy()
    w[2] = len(w)
    return w


def _short_header(w, L):
    return np.zeros(3, np.int64)


def _zero_args_index_operand(w, L):
    """A hand-built program: no arguments, one kernel whose only operand is an index operand.
    Valid by every rule (no loads or stores), so verify must either accept it or raise VerifyError."""
    blk = [0, 1, 1, 1, 1, 0, 0, 1, 0, 0, 0, 0,   # nr nc BM BN n_opnd n_const n_instr n_sweeps nregs
           1,                                    # cols [1]
           0, 0,                                 # prologue
           0, 0, 0, 0, 0, 0,                     # sweep 0
           1, 0, int(DType.INT64), 0, 0]         # o0: index, arg 0, int64, +0, coef 0
    out = [MAGIC, VERSION, 0, 0, 1, isa.ISA_HASH, HEADER_WORDS + KTABLE_WORDS, len(blk)] + blk
    out[2] = len(out)
    return np.array(out, np.int64)


def _const_bank(j, bank):
    def edit(w, L):
        w[L["kernels"][0]["const"][j]] = bank
    return edit


def _sweep_word(s, field, value, kernel=0):
    def edit(w, L):
        o = L["kernels"][kernel]["sweeps"][s] + field
        w[o] = value(w[o]) if callable(value) else value
    return edit


def _arg(a, field, value):
    def edit(w, L):
        w[L["args"][a] + field] = value
    return edit


def _ktable(k, field, value):
    def edit(w, L):
        o = L["ktable"][k] + field
        w[o] = value(w[o]) if callable(value) else value
    return edit


def _dim(d, value, kernel=0):
    def edit(w, L):
        w[L["kernels"][kernel]["dims"] + d] = value
    return edit


# softmax (3x5 f32), for reference:
#   o0 arg0 f32 strides [5, 1]; o1 arg1 f32 strides [5, 1]; regs f32=4
#   0 accinit.max f0 | 1 load f1,o0  2 acc.max +f0,f1 | 3 rfin.max f1,f0
#   4 accinit.sum f0 | 5 load f2,o0  6 sub f3,f2,f1  7 exp f2,f3  8 acc.sum +f0,f2 | 9 rfin.sum f2,f0
#   10 load f0,o0  11 sub f3,f0,f1  12 exp f0,f3  13 div f3,f0,f2  14 store f3,o1
# layernorm (4x8): k0 = 8.0, k1 = 1e-5; prologue 0 const f0,k0  1 const f1,k1; ... 6 div f2,f3,f0;
#   13 div f3,f4,f0  14 add f4,f3,f1  15 rsqrt f3,f4; 16 load f4,o0 ... 23 store f5,o3
# argmax0: 0 accinit.argmax f0,i0 | 1 load f1,o0  2 acc.argmax +f0,+i0,f1 | 3 rfin i1,f0,i0  4 store.i64 i1,o1
# to_bf16: 0 load f0,o0  1 cast.f32.f32 f1,f0,bfloat16  2 store f1,o1
# iota_div: o0 arg0 int32, o1 index, o2/o3 int64 outputs; 0 const.i64 i0,k0 | 1 load.i64 i1,o0
#   2 index.i64 i2,o1  3 mul i3,i1,i2  4 store i3,o2  5 floor_divide i1,i2,i0  6 store i1,o3

CASES: list[Case] = [
    # header ---------------------------------------------------------------------------------
    Case("header/bad-magic", "softmax", word(0, lambda v: v ^ 1), "header"),
    Case("header/too-short", None, _short_header, "header"),
    Case("header/zero-kernels", "softmax", word(4, 0), "header"),
    Case("header/negative-args", "softmax", word(3, -1), "header"),
    # version --------------------------------------------------------------------------------
    Case("version/1-before-isa-hash", "softmax", word(1, 1), "version"),
    Case("version/next", "softmax", word(1, VERSION + 1), "version"),
    Case("version/0", "softmax", word(1, 0), "version"),
    # isa (header word 5: the hash of the ISA table the program was encoded for) ----------------
    Case("isa/another-table", "softmax", word(5, lambda v: v ^ 1), "isa"),
    Case("isa/v1-reserved-zero", "softmax", word(5, 0), "isa"),
    # length ---------------------------------------------------------------------------------
    Case("length/header-says-more", "softmax", word(2, lambda v: v + 1), "length"),
    Case("length/truncated", "softmax", lambda w, L: w[:-1].copy(), "length"),
    Case("length/trailing-word", "softmax", _append_word, "length"),
    Case("length/tables-past-end", "softmax", word(3, 1000), "length"),
    Case("length/kernel-block-vs-header", "softmax", khead("n_instr", lambda v: v + 1), "length", kernel=0),
    # args -----------------------------------------------------------------------------------
    Case("args/bad-role", "softmax", _arg(0, 0, 7), "args"),
    Case("args/bad-dtype", "softmax", _arg(1, 1, len(DType)), "args"),
    Case("args/negative-numel", "softmax", _arg(1, 2, -1), "args"),
    # kernel_table ---------------------------------------------------------------------------
    Case("kernel_table/offset-gap", "softmax", _ktable(0, 0, lambda v: v + 1), "kernel_table"),
    Case("kernel_table/length-below-header", "softmax", _ktable(0, 1, KHEAD_WORDS - 1), "kernel_table"),
    Case("kernel_table/second-kernel-overlaps", "two_sums", _ktable(1, 0, lambda v: v - 1), "kernel_table"),
    Case("kernel_table/past-end", "softmax", _ktable(0, 1, lambda v: v + 1), "kernel_table"),
    # domain ---------------------------------------------------------------------------------
    Case("domain/bm-zero", "softmax", khead("bm", 0), "domain", kernel=0),
    Case("domain/tile-too-big", "softmax", seq(khead("bm", MAX_TILE), khead("bn", 2)), "domain", kernel=0),
    Case("domain/zero-sweeps", "softmax", khead("n_sweeps", 0), "domain", kernel=0),
    Case("domain/too-many-regs", "softmax", khead("nregs_f32", MAX_REGS + 1), "domain", kernel=0),
    Case("domain/too-many-dims", "softmax", khead("nr", 9), "domain", kernel=0),
    Case("domain/negative-size", "softmax", _dim(0, -3), "domain", kernel=0),
    Case("domain/kernel-1", "two_sums", khead("bn", 0, kernel=1), "domain", kernel=1),
    # sections -------------------------------------------------------------------------------
    Case("sections/init-not-contiguous", "softmax", _sweep_word(0, 0, 1), "sections", kernel=0),
    Case("sections/reversed-range", "softmax", seq(_sweep_word(0, 2, 2), _sweep_word(0, 3, 1)),
         "sections", kernel=0),
    Case("sections/uncovered-tail", "softmax", _sweep_word(2, 5, 14), "sections", kernel=0),
    Case("sections/prologue-past-start", "layernorm",
         lambda w, L: w.__setitem__(L["kernels"][0]["prologue"], 1), "sections", kernel=0),
    # opcode ---------------------------------------------------------------------------------
    Case("opcode/zero", "softmax", ins(5, 0, 0), "opcode", 5, 0),
    Case("opcode/past-max", "softmax", ins(0, 0, isa.MAX_OPCODE + 1), "opcode", 0, 0),
    Case("opcode/negative", "softmax", ins(14, 0, -1), "opcode", 14, 0),
    Case("opcode/in-kernel-1", "two_sums", ins(1, 0, 10 ** 6, kernel=1), "opcode", 1, 1),
    # section_kind ---------------------------------------------------------------------------
    Case("section_kind/const-in-body", "layernorm", ins_row(16, [op("const.f32"), 4, 0]), "section_kind", 16, 0),
    Case("section_kind/accinit-in-body", "softmax", ins_row(2, [op("accinit.max.f32"), 0]), "section_kind", 2, 0),
    Case("section_kind/load-in-prologue", "layernorm", ins_row(0, [op("load.f32"), 0, 0]), "section_kind", 0, 0),
    Case("section_kind/acc-in-fin", "softmax", ins_row(3, [op("acc.max.f32"), 0, 1]), "section_kind", 3, 0),
    Case("section_kind/rfin-in-init", "softmax", ins_row(4, [op("rfin.sum.f32"), 0, 1]), "section_kind", 4, 0),
    # unused_field ---------------------------------------------------------------------------
    Case("unused_field/load-field-3", "softmax", ins(1, 3, 1), "unused_field", 1, 0),
    Case("unused_field/last-word", "softmax", ins(14, 5, -7), "unused_field", 14, 0),
    Case("unused_field/accinit-field-2", "softmax", ins(0, 2, 1), "unused_field", 0, 0),
    # register -------------------------------------------------------------------------------
    Case("register/dst-ge-nregs", "softmax", ins(1, 1, 4), "register", 1, 0),
    Case("register/src-negative", "softmax", ins(6, 2, -1), "register", 6, 0),
    Case("register/empty-bank", "softmax", ins_row(1, [op("load.f64"), 0, 0]), "register", 1, 0),
    Case("register/i64-in-argmax", "argmax0", ins(3, 1, 2), "register", 3, 0),
    # register_class -------------------------------------------------------------------------
    Case("register_class/load-f32-of-int32", "softmax", seq(_arg(0, 1, int(DType.INT32)),
                                                            opnd(0, 2, int(DType.INT32))),
         "register_class", 1, 0),
    Case("register_class/const-bank-mismatch", "layernorm", _const_bank(0, int(Bank.F64)),
         "register_class", 0, 0),
    Case("register_class/store-f32-to-int64", "argmax0", ins(4, 0, op("store.f32")), "register_class", 4, 0),
    # read_before_write ----------------------------------------------------------------------
    Case("read_before_write/body-local-read-in-fin", "softmax", ins(9, 2, 3), "read_before_write", 9, 0),
    Case("read_before_write/never-written", "softmax", seq(khead("nregs_f32", 5), ins(13, 3, 4)),
         "read_before_write", 13, 0),
    Case("read_before_write/acc-of-local", "softmax", ins(8, 1, 3), "read_before_write", 8, 0),
    Case("read_before_write/acc-never-init", "softmax", ins(2, 1, 2), "read_before_write", 2, 0),
    # loop_carried ---------------------------------------------------------------------------
    Case("loop_carried/body-overwrites-read", "softmax", ins(12, 1, 1), "loop_carried", 12, 0),
    Case("loop_carried/fin-clobbers-prologue", "layernorm", ins(14, 1, 0), "loop_carried", 14, 0),
    # dst_alias ------------------------------------------------------------------------------
    Case("dst_alias/dst-eq-src", "softmax", ins(6, 1, 2), "dst_alias", 6, 0),
    Case("dst_alias/dst-eq-second-src", "layernorm", ins(6, 1, 0), "dst_alias", 6, 0),
    Case("dst_alias/cast-in-place", "to_bf16", ins(1, 1, 0), "dst_alias", 1, 0),
    # operand --------------------------------------------------------------------------------
    Case("operand/index-out-of-range", "softmax", ins(1, 2, 2), "operand", 1, 0),
    Case("operand/negative", "softmax", ins(14, 2, -1), "operand", 14, 0),
    Case("operand/index-op-on-arg-operand", "iota_div", ins(2, 2, 0), "operand", 2, 0),
    Case("operand/load-of-index-operand", "iota_div", ins(1, 2, 1), "operand", 1, 0),
    # operand_table --------------------------------------------------------------------------
    Case("operand_table/bad-kind", "softmax", opnd(0, 0, 5), "operand_table", kernel=0),
    Case("operand_table/arg-out-of-range", "softmax", opnd(0, 1, 9), "operand_table", kernel=0),
    Case("operand_table/dtype-vs-arg", "softmax", opnd(1, 2, int(DType.FLOAT64)), "operand_table", kernel=0),
    Case("operand_table/index-not-int64", "iota_div", opnd(1, 2, int(DType.INT32)), "operand_table", kernel=0),
    Case("operand_table/index-arg-nonzero", "iota_div", opnd(1, 1, 1), "operand_table", kernel=0),
    # constant -------------------------------------------------------------------------------
    Case("constant/index-out-of-range", "layernorm", ins(0, 2, 2), "constant", 0, 0),
    Case("constant/unknown-bank", "layernorm", _const_bank(1, 9), "constant", kernel=0),
    # dtype_code -----------------------------------------------------------------------------
    Case("dtype_code/int32-in-f32-cast", "to_bf16", ins(1, 3, int(DType.INT32)), "dtype_code", 1, 0),
    Case("dtype_code/unknown", "to_bf16", ins(1, 3, 99), "dtype_code", 1, 0),
    Case("dtype_code/negative", "to_bf16", ins(1, 3, -1), "dtype_code", 1, 0),
    # store_target ---------------------------------------------------------------------------
    Case("store_target/store-to-input", "softmax", ins(14, 2, 0), "store_target", 14, 0),
    Case("store_target/int32-input-via-i64-store", "iota_div", ins(6, 2, 0), "store_target", 6, 0),
    # store_broadcast ------------------------------------------------------------------------
    Case("store_broadcast/body-col-stride-0", "softmax", opnd(1, 5, 0), "store_broadcast", 14, 0),
    Case("store_broadcast/fin-row-stride-0", "argmax0", opnd(1, 4, 0), "store_broadcast", 4, 0),
    # store_overlap (results that would depend on the order a VM visits the domain) -----------
    Case("store_overlap/rows-overlap", "softmax", opnd(1, 4, 4), "store_overlap", 14, 0),
    Case("store_overlap/fin-rows-overlap", "two_sums", opnd(1, 4, 0, kernel=1), "store_broadcast", 4, 1),
    Case("store_overlap/two-stores-one-arg", "iota_div", seq(opnd(3, 1, 1), opnd(3, 3, 1)), "store_overlap", 4, 0),
    Case("store_overlap/load-of-stored-arg", "softmax", seq(opnd(0, 1, 1), opnd(0, 3, 1)), "store_overlap", 14, 0),
    # bounds (at verify: outputs have a declared numel) ---------------------------------------
    Case("bounds/output-offset+1", "softmax", opnd(1, 3, 1), "bounds"),
    Case("bounds/output-negative-offset", "softmax", opnd(1, 3, -1), "bounds"),
    Case("bounds/output-row-stride", "softmax", opnd(1, 4, 6), "bounds"),
    Case("bounds/output-numel-short", "softmax", _arg(1, 2, 14), "bounds"),
    Case("bounds/fin-store-offset", "argmax0", opnd(1, 3, 1), "bounds"),
    Case("bounds/kernel-1-output", "two_sums", opnd(1, 3, 1, kernel=1), "bounds"),
    # size_limit (codegen.limits: no size, stride or index may approach int64) ------------------
    Case("size_limit/output-numel", "softmax", _arg(1, 2, MAX_ELEMS + 1), "size_limit"),
    Case("size_limit/one-size", "softmax", _dim(1, MAX_ELEMS + 1), "size_limit", kernel=0),
    Case("size_limit/size-beyond-int64-products", "softmax", seq(_dim(0, 0), _dim(1, 1 << 62)), "size_limit",
         kernel=0),
    Case("size_limit/domain-product", "softmax", seq(_dim(0, 1 << 22), _dim(1, 1 << 23)), "size_limit", kernel=0),
    Case("size_limit/stride-of-unit-dim", "argmax0", opnd(0, 4, 1 << 62), "size_limit", kernel=0),
    Case("size_limit/offset-plus-reach", "softmax", opnd(0, 3, MAX_ELEMS - 4), "size_limit", kernel=0),
    Case("size_limit/negative-stride", "softmax", opnd(0, 5, -(1 << 62)), "size_limit", kernel=0),
    # tile_shape (a tile no larger than the domain, each side rounded up to a power of two) --------
    Case("tile_shape/bm-over-rows", "softmax", khead("bm", 16), "tile_shape", kernel=0),
    Case("tile_shape/bn-over-cols", "softmax", khead("bn", 32), "tile_shape", kernel=0),
    Case("tile_shape/tall-tile-on-one-row", "softmax", seq(_dim(0, 1), _arg(1, 2, 5), khead("bm", 4096)),
         "tile_shape", kernel=0),
    # a well-formed program with no arguments and an index operand (see report: IndexError) -----
    Case("zero-args/index-operand", None, _zero_args_index_operand, "<accept>"),
]


def _case_words(case: Case) -> np.ndarray:
    if case.prog is None:
        return case.edit(None, None)
    w = words_of(case.prog)
    L = parse(w)
    r = case.edit(w, L)
    return w if r is None else r


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_reject(case: Case):
    words = _case_words(case)
    # the edit must actually change something
    if case.prog is not None:
        base = program(case.prog).words
        assert len(words) != len(base) or not np.array_equal(words, base)
    prog = dvm.Program(words)
    if case.rule == "<accept>":
        try:
            dvm.verify(prog)
        except dvm.VerifyError:
            pass
        return
    with pytest.raises(dvm.VerifyError) as ei:
        dvm.verify(prog)
    err = ei.value
    assert err.rule == case.rule, str(err)
    assert err.index == case.index, str(err)
    if case.kernel is not None:
        assert err.kernel == case.kernel, str(err)
    # rejected again (a failed check is not memoized as a success) and disasm refuses too
    with pytest.raises(dvm.VerifyError) as ei2:
        dvm.verify(dvm.Program(words))
    assert ei2.value.rule == case.rule
    with pytest.raises(dvm.VerifyError):
        dvm.disasm(dvm.Program(words))


def test_store_target_is_its_own_rule():
    """store_target fires before anything else when a store names an input operand of its bank."""
    w = words_of("softmax")
    L = parse(w)
    w[L["kernels"][0]["instr"][14] + 2] = 0
    with pytest.raises(dvm.VerifyError) as ei:
        dvm.verify(dvm.Program(w))
    assert (ei.value.rule, ei.value.index) == ("store_target", 14)


def test_stream_cache_does_not_hide_store_broadcast():
    """The stream check is memoized by content; shape-dependent rules must still run."""
    dvm.verify(dvm.Program(words_of("softmax")))   # caches the stream facts
    w = words_of("softmax")
    L = parse(w)
    w[L["kernels"][0]["opnd"][1] + 5] = 0
    with pytest.raises(dvm.VerifyError) as ei:
        dvm.verify(dvm.Program(w))
    assert ei.value.rule == "store_broadcast"


def test_stream_cache_respects_roles():
    """Same instruction stream, but the stored operand now names an input: must not be a cache hit."""
    dvm.verify(dvm.Program(words_of("two_sums")))
    w = words_of("two_sums")
    L = parse(w)
    w[L["kernels"][1]["opnd"][1] + 1] = 0    # kernel 1 stores to arg0 (an input, same dtype)
    with pytest.raises(dvm.VerifyError) as ei:
        dvm.verify(dvm.Program(w))
    assert (ei.value.rule, ei.value.index, ei.value.kernel) == ("store_target", 4, 1)


def test_instances_of_one_stream_share_its_checked_stream():
    """A kernel at a new size differs only in its instance words (BM, BN, sizes, operand offsets
    and strides, constant values): its stream checks are a lookup, and its layout shares the
    stream's read-only instruction array."""
    a = dvm.verify(softmax.program(np.empty((3, 5), np.float32)))
    b = dvm.verify(softmax.program(np.empty((7, 9), np.float32)))
    assert a.kernels[0].stream is b.kernels[0].stream
    assert a.kernels[0].instrs is b.kernels[0].instrs and not a.kernels[0].instrs.flags.writeable
    assert (a.kernels[0].col_sizes, b.kernels[0].col_sizes) == ((5,), (9,))


def test_stream_cache_does_not_hide_a_changed_instruction_at_a_new_size():
    """The stream key holds every word but the instance words: a program at a cached stream's
    new size with one instruction changed (a destination that is also a source) is checked."""
    dvm.verify(softmax.program(np.empty((3, 5), np.float32)))
    w = np.array(softmax.program(np.empty((7, 9), np.float32)).words, np.int64)
    L = parse(w)
    w[L["kernels"][0]["instr"][6] + 1] = 2    # 6 sub f3,f2,f1 -> sub f2,f2,f1
    with pytest.raises(dvm.VerifyError) as ei:
        dvm.verify(dvm.Program(w))
    assert (ei.value.rule, ei.value.index) == ("dst_alias", 6)


# ---------------------------------------------------------------------------------------------
# Execution-time checks (dvm.execute = verify + check_buffers + run)


def _softmax_bufs():
    return [np.zeros(15, np.float32), np.zeros(15, np.float32)]


def _ro(a):
    a.flags.writeable = False
    return a


_shared = np.zeros(30, np.float32)

EXEC_CASES = [
    ("buffers/too-few", lambda: _softmax_bufs()[:1], "buffers"),
    ("buffers/too-many", lambda: _softmax_bufs() + [np.zeros(1, np.float32)], "buffers"),
    ("buffers/wrong-dtype", lambda: [np.zeros(15, np.float64), np.zeros(15, np.float32)], "buffers"),
    ("buffers/2-d", lambda: [np.zeros((3, 5), np.float32), np.zeros(15, np.float32)], "buffers"),
    ("buffers/not-ndarray", lambda: [[0.0] * 15, np.zeros(15, np.float32)], "buffers"),
    ("buffers/read-only-output", lambda: [np.zeros(15, np.float32), _ro(np.zeros(15, np.float32))], "buffers"),
    ("buffers/output-overlaps-input", lambda: [_shared[:15], _shared[10:25]], "buffers"),
    ("buffers/output-is-input", lambda: [_shared[:15], _shared[:15]], "buffers"),
    ("bounds/input-too-short", lambda: [np.zeros(14, np.float32), np.zeros(15, np.float32)], "bounds"),
    ("bounds/output-too-short", lambda: [np.zeros(15, np.float32), np.zeros(14, np.float32)], "bounds"),
    ("bounds/empty-input", lambda: [np.zeros(0, np.float32), np.zeros(15, np.float32)], "bounds"),
]


@pytest.mark.parametrize("make,rule", [(m, r) for _, m, r in EXEC_CASES], ids=[i for i, _, _ in EXEC_CASES])
def test_execute_rejects(make, rule):
    bufs = make()
    before = [np.array(b, copy=True) for b in bufs]
    with pytest.raises(dvm.VerifyError) as ei:
        dvm.execute(program("softmax"), bufs)
    assert ei.value.rule == rule, str(ei.value)
    for b, old in zip(bufs, before):   # nothing ran
        np.testing.assert_array_equal(np.asarray(b), old)


def test_execute_bounds_with_negative_input_offset():
    w = words_of("softmax")
    L = parse(w)
    w[L["kernels"][0]["opnd"][0] + 3] = -1   # input offset -1: only check_buffers can see it
    prog = dvm.Program(w)
    dvm.verify(prog)   # inputs have no declared size, so verify alone accepts this
    with pytest.raises(dvm.VerifyError) as ei:
        dvm.execute(prog, _softmax_bufs())
    assert ei.value.rule == "bounds"


def test_execute_bounds_with_input_stride():
    w = words_of("softmax")
    L = parse(w)
    w[L["kernels"][0]["opnd"][0] + 4] = 6    # row stride 6: last row reads up to element 16
    prog = dvm.Program(w)
    with pytest.raises(dvm.VerifyError) as ei:
        dvm.execute(prog, _softmax_bufs())
    assert ei.value.rule == "bounds"
    dvm.execute(prog, [np.zeros(17, np.float32), np.zeros(15, np.float32)])  # large enough: runs


def test_valid_programs_verify_and_run():
    for name in INPUTS:
        prog = program(name)
        layout = dvm.verify(prog)
        sizes = {a: int(np.prod(x.shape)) for a, x in enumerate(INPUTS[name][1]())}
        bufs = make_buffers(layout, sizes)
        dvm.execute(prog, bufs)


# ---------------------------------------------------------------------------------------------
# Corpus coverage


def _docstring_rules() -> set[str]:
    doc = verifier.__doc__
    m = re.search(r"Rules \(stable ids\):\s*(.*?)(?:\n\s*\n|\Z)", doc, re.S)
    assert m, "verifier docstring lists no rules"
    return {r.strip() for r in m.group(1).replace("\n", " ").split(",") if r.strip()}


def test_corpus_covers_every_rule():
    rules = _docstring_rules()
    assert len(rules) == 28, rules
    # single_tile is exercised in test_single_tile.py (this module pins the multi-sweep stream)
    covered = {c.rule for c in CASES} | {r for _, _, r in EXEC_CASES} | {"single_tile"}
    missing = rules - covered
    assert not missing, f"no must-reject case for rules {sorted(missing)}"
    unknown = covered - rules - {"<accept>"}
    assert not unknown, f"corpus uses rules the verifier does not document: {sorted(unknown)}"


def test_every_documented_rule_is_raised_somewhere_in_the_source():
    import inspect
    src = "".join(inspect.getsource(m) for m in (verifier, verifier_stream, verifier_dataflow))
    raised = set(re.findall(r'VerifyError\("([a-z_]+)"', src))
    assert raised == _docstring_rules()


# ---------------------------------------------------------------------------------------------
# ISA / disassembler / reference VM / op table agree


def test_opcodes_are_dense_and_unique():
    codes = [s.code for s in isa.ISA]
    assert codes == list(range(1, len(codes) + 1))
    assert isa.MAX_OPCODE == len(codes)
    assert len({s.name for s in isa.ISA}) == len(codes)


@pytest.mark.parametrize("spec", isa.ISA, ids=[s.name for s in isa.ISA])
def test_every_opcode_has_vm_handler_and_disasm(spec):
    assert callable(getattr(reference._Kernel, "op_" + spec.group, None)), \
        f"reference VM has no op_{spec.group} for {spec.name}"
    row = [spec.code] + [0] * isa.MAX_FIELDS
    for f, fld in enumerate(spec.fields):
        if fld.role == "t":
            row[1 + f] = int(next(d for d in DType if d.bank == spec.bank))
    text = format_instr(np.array(row, np.int64))
    assert text.split()[0] == spec.name
    operands = text[len(spec.name):].strip()
    assert len(operands.split(", ")) == len(spec.fields) if spec.fields else operands == ""
    assert spec.sections and set(spec.sections) <= set("PIBF")
    for fld in spec.fields:
        assert fld.role in "dsmokt"
        assert fld.is_reg == (fld.bank is not None)
    if any(f.role == "o" for f in spec.fields):
        assert spec.group in ("load", "store", "storerow", "index")
    if spec.group in ("ew", "accinit", "acc", "rfin"):
        assert spec.op in ops.OP_TABLE


def test_every_elementwise_op_has_isa_entries_for_its_banks():
    for name, o in ops.OP_TABLE.items():
        if o.kind is not ops.Kind.ELEMENTWISE:
            continue
        assert o.banks, name
        assert o.ref is not None, name
        for bank in o.banks:
            spec = isa.BY_NAME.get(f"{name}.{bank.short}")
            assert spec is not None, f"no ISA entry {name}.{bank.short}"
            assert spec.group == "ew" and spec.op == name and spec.bank == bank
            assert sum(f.role == "s" for f in spec.fields) == o.arity
            assert [f.role for f in spec.fields].count("d") == 1


def test_every_vm_reduction_has_init_acc_fin():
    for red in ops.VM_REDUCTIONS:
        for bank in ops.OP_TABLE[red].banks:
            for group in ("accinit", "acc", "rfin"):
                spec = isa.BY_NAME.get(f"{group}.{red}.{bank.short}")
                assert spec is not None and spec.group == group and spec.op == red


def test_memory_and_cast_ops_cover_every_bank():
    for bank in isa.BANKS:
        for group in ("load", "store", "const"):
            assert isa.BY_NAME[f"{group}.{bank.short}"].bank == bank
        for src in isa.BANKS:
            spec = isa.BY_NAME[f"cast.{src.short}.{bank.short}"]
            assert spec.fields[0].bank == bank and spec.fields[1].bank == src
    assert "index.i64" in isa.BY_NAME


def test_isa_has_nothing_the_op_table_does_not_define():
    ew = {s.op for s in isa.ISA if s.group == "ew"}
    assert ew == {n for n, o in ops.OP_TABLE.items() if o.kind is ops.Kind.ELEMENTWISE}
    for s in isa.ISA:
        if s.group == "ew":
            assert s.bank in ops.OP_TABLE[s.op].banks
