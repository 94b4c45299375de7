"""The valid Programs `dvm fuzz programs` mutates (with their inputs), the word layout of a
Program (where each part of program.py's layout lies), and streams of distinct valid Programs
for the memory check (`dvm fuzz shapes`).

The corpus covers what the verifier must reason about: single-tile and multi-sweep streams,
several column tiles, several kernels (a workspace between them), several outputs, integer code
with division, bool logic, casts through f16/bf16, iota, argmax, a column-major reduction,
strided and reversed inputs, and one long elementwise chain (~3,000 words) for the verifier's
worst case.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np

import dvm
from ..codegen import encoder, isa
from ..codegen.program import (ARG_IN, ARG_WORDS, CONST_WORDS, HEADER_WORDS, KHEAD_WORDS, KTABLE_WORDS,
                               OPND_FIXED_WORDS, SWEEP_WORDS, Program)
from ..frontend.library import layernorm, rmsnorm, softmax
from ..graph.dtypes import DType

LONG_CHAINS, LONG_CHAIN_DEPTH = 16, 12   # the long chain: 16 x 12 x 3 + 31 ops (about 3,700 words)


@dataclass(frozen=True)
class Seed:
    name: str
    program: Program
    inputs: tuple[np.ndarray, ...]   # 1-D buffers of the input arguments, in argument order


@dvm.kernel
def ew_chain(k, x, b):
    x = k.load(x)
    y = k.gelu(k.add(x, k.load(b)))
    return k.store(k.sub(k.mul(y, 2.0), k.where(k.gt(x, 0.0), x, 0.5)))


@dvm.kernel
def argmax0(k, x):
    return k.store(k.argmax(k.load(x), axis=0))


@dvm.kernel
def int32_ops(k, a, b):
    a, b = k.load(a), k.load(b)
    i = k.iota(a.shape, 1)
    return k.store(k.add(k.floor_divide(a, b), k.mul(i, 3))), k.store(k.remainder(a, b))


@dvm.kernel
def multi_out(k, x):
    x = k.load(x)
    return k.store(k.exp(x)), k.store(k.add(x, 1.0)), k.store(k.max(x, axis=-1))


@dvm.kernel
def two_sums(k, x):
    x = k.load(x)
    return k.store(k.sum(x, axis=0)), k.store(k.sum(x, axis=1))


@dvm.kernel
def centered(k, x):
    """x - mean over axis 0, then a row sum: kernels joined by a workspace."""
    x = k.load(x)
    c = k.sub(x, k.mean(x, axis=0, keepdims=True))
    return k.store(k.sum(k.mul(c, c), axis=1))


@dvm.kernel
def half_casts(k, x, m):
    x = k.load(x)
    h = k.cast(k.mul(k.cast(x, "float16"), 3.0), "bfloat16")
    return k.store(k.where(k.load(m), k.cast(h, "float32"), k.neg(x)))


@dvm.kernel
def bool_logic(k, a, b):
    a, b = k.load(a), k.load(b)
    return k.store(k.logical_xor(k.logical_and(k.gt(a, b), k.lt(a, 3)), k.eq(b, 0)))


@dvm.kernel
def column_sum(k, x):
    return k.store(k.sum(k.load(x), axis=0))


@dvm.kernel
def long_chain(k, x, y):
    """LONG_CHAINS chains of 2 x LONG_CHAIN_DEPTH ops each, summed: a long stream whose
    dependency depth stays small (the partitioner recurses along dependencies)."""
    x, y = k.load(x), k.load(y)
    parts = []
    for c in range(LONG_CHAINS):
        t = k.add(x, c * 0.125)   # distinct chains (equal ones would be one), few constants (registers)
        for i in range(LONG_CHAIN_DEPTH):
            t = k.tanh(k.add(k.mul(t, y), (i % 4) * 0.25))
        parts.append(t)
    while len(parts) > 1:
        parts = [k.add(a, b) for a, b in zip(parts[::2], parts[1::2])] + parts[len(parts) // 2 * 2:]
    return k.store(parts[0])


def _rng_inputs(seed: int, *specs) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for shape, dt in specs:
        dt = np.dtype(dt)
        if dt.kind == "f":
            out.append(rng.standard_normal(shape).astype(dt))
        elif dt.kind == "b":
            out.append(rng.random(shape) < 0.5)
        else:
            out.append(rng.integers(-5, 6, shape).astype(dt))   # includes zeros: division by zero
    return out


def _f32(*shape):
    return (shape, np.float32)


# name -> (kernel, inputs, single-tile stream allowed)
SEEDS: dict[str, tuple[Callable, Callable[[], list], bool]] = {
    "softmax": (softmax, lambda: _rng_inputs(1, _f32(3, 5)), True),
    "softmax_sweeps": (softmax, lambda: _rng_inputs(1, _f32(3, 5)), False),
    "wide_softmax": (softmax, lambda: _rng_inputs(8, _f32(2, 4100)), False),
    "layernorm": (layernorm, lambda: _rng_inputs(2, _f32(4, 8), _f32(8), _f32(8)), True),
    "layernorm_sweeps": (layernorm, lambda: _rng_inputs(2, _f32(4, 8), _f32(8), _f32(8)), False),
    "rmsnorm": (rmsnorm, lambda: _rng_inputs(9, _f32(5, 40), _f32(40)), True),
    "ew_chain": (ew_chain, lambda: _rng_inputs(3, _f32(4, 6), _f32(6)), True),
    "argmax0": (argmax0, lambda: _rng_inputs(4, _f32(6, 4)), False),
    "int32_ops": (int32_ops, lambda: _rng_inputs(5, ((3, 4), np.int32), ((3, 4), np.int32)), True),
    "multi_out": (multi_out, lambda: _rng_inputs(6, ((3, 7), np.float64)), True),
    "two_sums": (two_sums, lambda: _rng_inputs(7, _f32(3, 5)), False),
    "centered": (centered, lambda: _rng_inputs(10, _f32(6, 9)), True),
    "half_casts": (half_casts, lambda: _rng_inputs(11, _f32(3, 10), ((3, 10), np.bool_)), True),
    "bool_logic": (bool_logic, lambda: _rng_inputs(12, ((4, 5), np.int64), ((4, 5), np.int64)), True),
    "column_sum": (column_sum, lambda: _rng_inputs(13, _f32(300, 24)), True),
    "strided": (ew_chain, lambda: [_rng_inputs(14, _f32(8, 12))[0][::-2, 1::2].T, _rng_inputs(15, _f32(4))[0]],
                True),
    "long_chain": (long_chain, lambda: _rng_inputs(16, _f32(3, 9), _f32(3, 9)), True),
}


def build_seed(name: str) -> Seed:
    from ..runtime.compiled import as_buffer
    fn, make, single = SEEDS[name]
    inputs = make()
    saved = encoder.SINGLE_TILE_COLS
    encoder.SINGLE_TILE_COLS = saved if single else 0
    try:
        prog = fn.program(*inputs)
    finally:
        encoder.SINGLE_TILE_COLS = saved
    bufs = tuple(np.array(as_buffer(a)[0]) for a in inputs)
    return Seed(name, prog, bufs)


def build_corpus(names: list[str] | None = None) -> list[Seed]:
    return [build_seed(n) for n in (names or list(SEEDS))]


def word_layout(words) -> dict:
    """Word offsets of the parts of a well-formed Program: args (per argument: role, dtype,
    numel), ktable, and per kernel: off, nd, head (12 words), dims, prologue, sweeps, opnd (per
    operand: kind, arg, dtype, offset, strides), const (per constant: bank, bits), instr."""
    w = [int(x) for x in words]
    pos = HEADER_WORDS + ARG_WORDS * w[3]
    ktable = [pos + KTABLE_WORDS * k for k in range(w[4])]
    kernels = []
    for t in ktable:
        off = w[t]
        nr, nc, _, _, n_opnd, n_const, n_instr, n_sweeps = w[off:off + 8]
        nd = nr + nc
        p = off + KHEAD_WORDS
        k = {"off": off, "nd": nd, "head": off, "dims": list(range(p, p + nd)), "prologue": p + nd}
        p += nd + 2
        k["sweeps"] = [p + SWEEP_WORDS * s for s in range(n_sweeps)]
        p += SWEEP_WORDS * n_sweeps
        k["opnd"] = [p + (OPND_FIXED_WORDS + nd) * j for j in range(n_opnd)]
        p += (OPND_FIXED_WORDS + nd) * n_opnd
        k["const"] = [p + CONST_WORDS * j for j in range(n_const)]
        p += CONST_WORDS * n_const
        k["instr"] = [p + isa.WORDS * i for i in range(n_instr)]
        kernels.append(k)
    return {"args": [HEADER_WORDS + ARG_WORDS * a for a in range(w[3])], "ktable": ktable, "kernels": kernels}


def with_extra_inputs(words: np.ndarray, dtypes: list[int]) -> np.ndarray:
    """`words` with unused input arguments of these dtype codes appended to the argument table:
    a valid Program whose streams are distinct for distinct dtype lists (a stream's checks read
    the argument table)."""
    w = [int(x) for x in words]
    n_args, n_kernels = w[3], w[4]
    at = HEADER_WORDS + ARG_WORDS * n_args
    extra = [v for dt in dtypes for v in (ARG_IN, dt, 0)]
    table = w[at:at + KTABLE_WORDS * n_kernels]
    for k in range(n_kernels):
        table[KTABLE_WORDS * k] += len(extra)
    out = w[:at] + extra + table + w[at + KTABLE_WORDS * n_kernels:]
    out[2], out[3] = len(out), n_args + len(dtypes)
    return np.array(out, np.int64)


def distinct_programs(base: Program, count: int, extra: int = 8) -> Iterator[Program]:
    """`count` valid Programs with pairwise distinct streams: `base` with `extra` unused inputs
    whose dtypes spell the index in base len(DType) (7**8 = 5.7 million distinct)."""
    n = len(DType)
    for i in range(count):
        digits = [(i // n ** d) % n for d in range(extra)]
        yield Program(with_extra_inputs(base.words, digits))
