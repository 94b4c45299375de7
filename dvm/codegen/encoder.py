"""Encode a compiled graph for concrete sizes and layouts into a Program, in microseconds.

Per kernel: evaluate the domain, give every operand one stride per domain axis (0 where it
broadcasts), order axes as rows (kept) then cols (reduced), drop unit axes, fold neighbours
that are contiguous for every operand, pick the tile, and write the header. The instruction
stream is copied from the template unchanged.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from ..graph.dtypes import Bank, DType
from ..graph.symbolic import Dim, SymExpr, evaluate
from ..graph.views import Layout, apply_chain, contiguous_strides
from .lower import KernelTemplate
from .program import (ARG_IN, ARG_OUT, ARG_WS, HEADER_WORDS, MAGIC, OPND_INDEX, VERSION, Program,
                      float_bits)

TILE_ELEMS = 4096   # elements per tile register (16 KiB of f32): L1/L2 resident
MAX_BN = 4096


class NeedsCopy(Exception):
    """An input's layout cannot express a view chain; the caller copies that input and retries."""

    def __init__(self, slot: int):
        self.slot = slot


@dataclass
class ArgSpec:
    role: int
    dtype: DType
    shape: tuple[Dim, ...] | None  # outputs and workspaces (contiguous); None for inputs


def _pow2_at_least(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def _operand_strides(t: KernelTemplate, spec, dom: list[int], env, inputs: Sequence[Layout]) -> tuple[list[int], int]:
    if spec.base_shape is None:
        layout = inputs[spec.slot]
    else:
        shape = tuple(evaluate(d, env) for d in spec.base_shape)
        if spec.unit_axis is not None:
            strides = tuple(1 if (i == spec.unit_axis and n != 1) else 0 for i, n in enumerate(shape))
        else:
            strides = contiguous_strides(shape)
        layout = (shape, strides, 0)
    if spec.chain:
        layout = apply_chain(layout, spec.chain, env)
        if layout is None:
            raise NeedsCopy(spec.slot)
    shape, strides, offset = layout
    pad = len(dom) - len(shape)
    out = [0] * pad
    for n, s in zip(shape, strides):
        out.append(0 if n == 1 else s)
    return out, offset


def encode_kernel(t: KernelTemplate, env: Mapping[str, int], inputs: Sequence[Layout]) -> list[int]:
    dom = [evaluate(d, env) for d in t.shape]
    n = len(dom)
    per_opnd = [_operand_strides(t, spec, dom, env, inputs) for spec in t.operands]
    if t.axes:
        row_axes = [i for i in range(n) if i not in t.axes]
        col_axes = [i for i in range(n) if i in t.axes]
    else:
        row_axes, col_axes = list(range(n)), []
    rows = _fold([dom[i] for i in row_axes], [[s[i] for i in row_axes] for s, _ in per_opnd])
    cols = _fold([dom[i] for i in col_axes], [[s[i] for i in col_axes] for s, _ in per_opnd])
    if not t.axes and rows[0]:  # elementwise: the innermost folded dim becomes the column dim
        cols = ([rows[0].pop()], [[st.pop()] for st in rows[1]])
    row_sizes, row_strides = rows
    col_sizes, col_strides = cols
    R = int(np.prod(row_sizes, dtype=np.int64)) if row_sizes else 1
    C = int(np.prod(col_sizes, dtype=np.int64)) if col_sizes else 1
    bn = min(_pow2_at_least(max(C, 1)), MAX_BN)
    bm = max(1, min(TILE_ELEMS // bn, _pow2_at_least(max(R, 1))))
    words = [len(row_sizes), len(col_sizes), bm, bn, len(t.operands), len(t.consts), len(t.instrs),
             len(t.sweeps), *t.nregs, *row_sizes, *col_sizes, *t.prologue]
    for sw in t.sweeps:
        words.extend(sw)
    for j, spec in enumerate(t.operands):
        words += [spec.kind, spec.slot, int(spec.dtype), per_opnd[j][1], *row_strides[j], *col_strides[j]]
    for bank, value in t.consts:
        if isinstance(value, SymExpr):
            value = evaluate(value, env)
        words += [int(bank), float_bits(value) if bank in (Bank.F32, Bank.F64) else int(value)]
    return words


def _fold(sizes: list[int], strides: list[list[int]]) -> tuple[list[int], list[list[int]]]:
    """Drop unit dims and merge neighbours (i, i+1) with stride[i] == stride[i+1] * size[i+1]
    for every operand. Returns (sizes, per-operand strides)."""
    keep = [i for i, d in enumerate(sizes) if d != 1]
    out_sizes: list[int] = []
    out_strides: list[list[int]] = [[] for _ in strides]
    for i in keep:
        if out_sizes and all(st[-1] == s[i] * sizes[i] for st, s in zip(out_strides, strides)):
            out_sizes[-1] *= sizes[i]
            for st, s in zip(out_strides, strides):
                st[-1] = s[i]
        else:
            out_sizes.append(sizes[i])
            for st, s in zip(out_strides, strides):
                st.append(s[i])
    return out_sizes, out_strides


def encode_program(templates: Sequence[KernelTemplate], args: Sequence[ArgSpec], env: Mapping[str, int],
                   inputs: Sequence[Layout]) -> Program:
    blocks = [encode_kernel(t, env, inputs) for t in templates]
    arg_words: list[int] = []
    for a in args:
        numel = 0
        if a.role != ARG_IN:
            numel = 1
            for d in a.shape:
                numel *= evaluate(d, env)
        arg_words += [a.role, int(a.dtype), numel]
    start = HEADER_WORDS + len(arg_words) + 2 * len(blocks)
    table: list[int] = []
    for t, b in zip(templates, blocks):
        size = len(b) + t.instrs.size
        table += [start, size]
        start += size
    parts = [np.array([MAGIC, VERSION, start, len(args), len(blocks), 0, *arg_words, *table], np.int64)]
    for t, b in zip(templates, blocks):
        parts.append(np.array(b, np.int64))
        parts.append(t.instrs.reshape(-1))
    words = np.concatenate(parts)
    words.flags.writeable = False
    return Program(words)


__all__ = ["ArgSpec", "NeedsCopy", "encode_program", "encode_kernel", "ARG_IN", "ARG_OUT", "ARG_WS",
           "OPND_INDEX"]
