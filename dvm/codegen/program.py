"""The Program: one contiguous int64 NumPy array, and its layout.

    header   MAGIC, VERSION, total length, n_args, n_kernels, ISA hash (isa.ISA_HASH)
    args     per argument: role (ARG_IN/ARG_OUT/ARG_WS), dtype code, required numel (0 = any)
    kernels  per kernel: offset, length (of its block, in words)
    blocks   per kernel (sequence-stacked: kernel i+1 starts after kernel i finished):
             n_row_dims, n_col_dims, BM, BN, n_operands, n_consts, n_instr, n_sweeps,
             registers per bank (f32, f64, i64, b8),
             row sizes..., col sizes...,
             prologue [start, end),
             per sweep: init [s, e), body [s, e), fin [s, e),
             per operand: kind (OPND_ARG/OPND_INDEX), arg, dtype, offset, one stride per dim,
             per constant: bank, bits (float64 bit pattern for float banks, value otherwise),
             instructions (isa.WORDS words each)

The domain of a kernel is rows x cols (each possibly several folded dims, row-major); reductions
reduce over cols. A Program owns its words: an int64 array over an immutable bytes object (no
one, the Program included, can write to it; any other array is copied into one), so the layout
the verifier computed from them (views of those words) describes exactly what runs. Programs are
verified before they run (codegen/verifier.py).
"""
from __future__ import annotations

import hashlib
import os
import struct
from dataclasses import dataclass, field
from math import prod
from typing import NamedTuple

import numpy as np

MAGIC = 0x44564D5F42433031  # "DVM_BC01"
VERSION = 2    # 2: header word 5 holds the ISA hash (1: a reserved 0)
ISA_HASH_WORD = 5
HEADER_WORDS = 6
ARG_WORDS = 3
KTABLE_WORDS = 2
KHEAD_WORDS = 12
SWEEP_WORDS = 6
CONST_WORDS = 2
OPND_FIXED_WORDS = 4
MAX_DIMS = 8
MAX_TILE = 1 << 18
MAX_REGS = 256
MAX_SWEEPS = 64
MAX_ARGS = 1024      # arguments (inputs, outputs, workspaces) of one Program
MAX_KERNELS = 1024   # kernels of one Program

ARG_IN, ARG_OUT, ARG_WS = 0, 1, 2
ARG_ROLES = {ARG_IN: "in", ARG_OUT: "out", ARG_WS: "ws"}
OPND_ARG, OPND_INDEX = 0, 1


class Sweep(NamedTuple):   # tuples of ints: the garbage collector stops tracking them
    init: tuple[int, int]
    body: tuple[int, int]
    fin: tuple[int, int]


@dataclass(frozen=True)
class KernelLayout:
    """A parsed kernel block (produced by the verifier; VMs consume this)."""
    row_sizes: tuple[int, ...]
    col_sizes: tuple[int, ...]
    bm: int
    bn: int
    nregs: tuple[int, int, int, int]
    prologue: tuple[int, int]
    sweeps: tuple[Sweep, ...]
    opnd_kind: np.ndarray    # [n_operands]
    opnd_arg: np.ndarray
    opnd_dtype: np.ndarray
    opnd_offset: np.ndarray
    opnd_strides: np.ndarray  # [n_operands, n_row_dims + n_col_dims]
    const_bank: np.ndarray
    const_bits: np.ndarray
    instrs: np.ndarray       # [n_instr, WORDS]
    # the verifier's checked stream (codegen.verifier.Stream): the instance-independent parts,
    # shared by every layout of the same stream, with what VMs derive from them (its `derived`)
    stream: object = field(compare=False, repr=False)

    rows: int = field(init=False)   # product of row_sizes (1 when there are none)
    cols: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "rows", prod(self.row_sizes))
        object.__setattr__(self, "cols", prod(self.col_sizes))


class ArgInfo(NamedTuple):   # a tuple of ints: the garbage collector stops tracking it
    role: int
    dtype: int
    numel: int


@dataclass(frozen=True)
class ProgramLayout:
    args: tuple[ArgInfo, ...]
    kernels: tuple[KernelLayout, ...]
    # per argument: (min element index, max element index) any kernel can touch; None if untouched
    extents: tuple[tuple[int, int] | None, ...]
    # per argument: (NumPy dtype, written?, extent), what check_buffers tests before every run
    arg_checks: tuple = ()
    # the verified words (immutable): the layout's operand offsets, strides and constants are views of them
    words: np.ndarray | None = field(default=None, compare=False, repr=False)
    # an upper bound of the lane-instruction steps a VM makes running the program (closed form:
    # per kernel, row blocks x BM x (per sweep: init + fin + column tiles x BN x body) instructions)
    work: int = 0


def immutable_words(words: np.ndarray) -> np.ndarray:
    """`words` as an int64 array over an immutable bytes object: the array itself when it is one
    already, else a copy. Nothing can write to such an array (its WRITEABLE flag cannot be set)."""
    base = words.base
    while isinstance(base, np.ndarray):
        base = base.base
    if type(base) is bytes and words.dtype == np.int64 and words.ndim == 1:
        return words
    return np.frombuffer(np.ascontiguousarray(words, np.int64).tobytes(), np.int64)


class Program:
    """An encoded DVM program. `words`: the int64 array, owned by the Program (immutable);
    `layout`: the ProgramLayout the verifier computed from exactly these words (None until
    verified)."""
    __slots__ = ("_words", "_layout", "_digest")

    def __init__(self, words: np.ndarray):
        words = np.asarray(words)
        if words.dtype != np.int64 or words.ndim != 1:
            raise TypeError(f"a Program is a 1-D int64 array, got {words.dtype} with {words.ndim} dims")
        self._words = immutable_words(words)
        self._layout: ProgramLayout | None = None
        self._digest: str | None = None

    @property
    def words(self) -> np.ndarray:
        return self._words

    @property
    def layout(self) -> ProgramLayout | None:
        return self._layout

    def attach_layout(self, layout: ProgramLayout) -> None:
        """Called by the verifier only: the layout it computed from this Program's words."""
        if layout.words is not self._words:
            raise ValueError("a layout can only be attached to the Program whose words it was verified from")
        self._layout = layout

    def __len__(self) -> int:
        return len(self.words)

    @property
    def digest(self) -> str:
        if self._digest is None:
            self._digest = hashlib.sha256(self.words.tobytes()).hexdigest()[:16]
        return self._digest

    def save(self, path: str | os.PathLike) -> None:
        """Write the program as a .npy file (no pickle)."""
        with open(path, "wb") as f:
            np.save(f, self.words, allow_pickle=False)

    @staticmethod
    def load(path: str | os.PathLike) -> "Program":
        """Read a program saved with `save`. It is verified before it can run."""
        arr = np.load(path, allow_pickle=False)
        return Program(arr)

    def __repr__(self) -> str:
        return f"<dvm.Program {len(self.words)} words {self.digest}>"


_F64 = struct.Struct("<d")
_I64 = struct.Struct("<q")


def float_bits(value: float) -> int:
    """The float64 bit pattern of `value` as a signed int64 (the constant-pool encoding)."""
    return _I64.unpack(_F64.pack(float(value)))[0]


def bits_float(bits: int | np.integer) -> float:
    return _F64.unpack(_I64.pack(int(bits)))[0]
