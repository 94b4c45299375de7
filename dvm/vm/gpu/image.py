"""The device image of a verified Program: what the GPU VM's kernel reads on the device.

Per kernel block, in abi.py's layout: a header (domain, tile, row blocks, column tiles, section
bounds, folded sizes, spill areas), the sweep table, the operand table (argument slot, dtype,
offset, one stride per folded dim) and the instructions, each pre-decoded from its ISA words into
IW words (kind, bank, op number, result bank, register fields, and an operand index, target dtype
or a constant's bits). The decode of the instructions depends on the stream alone and is done once
per verified stream (Stream.derived); an instance fills in sizes, strides, offsets and constants.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ...codegen import isa
from ...codegen.program import MAX_DIMS, KernelLayout, ProgramLayout
from ...errors import DeviceError
from ...graph.ops import OP_TABLE
from . import abi


class StreamDecode(NamedTuple):
    instrs: np.ndarray                   # [n_instr, IW] int64, constants' bits still 0
    const_rows: np.ndarray               # instruction rows of const instructions
    const_index: np.ndarray              # their constant-pool indices
    sweeps: np.ndarray                   # [n_sweeps * SWEEP_W]
    tile_parallel: bool                  # column tiles independent: one sweep, no init/fin/acc


class KernelImage(NamedTuple):
    words: np.ndarray                    # the block, int64
    items: int                           # work items (abi.py: row blocks, or tiles)
    spills: bool                         # some register lives in scratch memory
    cta_words: int                       # scratch words (8 bytes) one program instance needs
    variant: str                         # the compiled kernel variant (abi.VARIANTS) it runs on


def _decode_one(spec: isa.InstrSpec, fields: list[int]) -> tuple[int, int, int, int, list[int], int]:
    """(kind, bank, op, result bank, register fields, aux) of one ISA instruction."""
    regs = [v for v, f in zip(fields, spec.fields) if f.is_reg]
    other = [v for v, f in zip(fields, spec.fields) if not f.is_reg]
    bank, obank = int(spec.bank), int(spec.fields[0].bank) if spec.fields[0].is_reg else int(spec.bank)
    if spec.group == "ew":
        arity = OP_TABLE[spec.op].arity
        table = {1: abi.UNARY_OP, 2: abi.BINARY_OP, 3: abi.TERNARY_OP}[arity]
        return abi.EW_KIND[arity], bank, table[spec.op], obank, regs, 0
    kind = abi.GROUP_KIND[spec.group]
    op = abi.RED_OP.get(spec.op, 0)
    if spec.group == "cast":
        src = int(spec.fields[1].bank)
        return kind, bank, src, obank, regs, other[0]      # op: the source bank; aux: target dtype
    aux = other[0] if other else 0                          # operand index or constant index
    return kind, bank, op, obank, regs, aux


def decode_stream(kl: KernelLayout) -> StreamDecode:
    """The pre-decoded instructions of kl's stream (cached on the verifier's Stream)."""
    derived = kl.stream.derived
    out = derived.get("gpu_decode")
    if out is not None:
        return out
    n = len(kl.instrs)
    words = np.zeros((n, abi.IW), np.int64)
    const_rows, const_index = [], []
    for i, row in enumerate(kl.instrs.tolist()):
        spec = isa.BY_CODE[row[0]]
        kind, bank, op, obank, regs, aux = _decode_one(spec, row[1:])
        packed = 0
        for k, r in enumerate(regs):
            packed |= r << (16 * k)
        if kind == abi.K_CONST:
            const_rows.append(i)
            const_index.append(aux)
            aux = 0
        words[i] = (kind | bank << 8 | op << 16 | obank << 32, packed, aux, 0)
    sweeps = np.array([w for sw in kl.sweeps for part in sw for w in part], np.int64)
    (i0, i1), body, (f0, f1) = kl.sweeps[0]
    parallel = len(kl.sweeps) == 1 and i0 == i1 and f0 == f1 and \
        not any(int(words[i, 0]) & 255 == abi.K_ACC for i in range(*body))
    out = StreamDecode(words, np.array(const_rows, np.intp), np.array(const_index, np.intp), sweeps,
                       parallel)
    for a in out[:4]:
        a.flags.writeable = False
    derived["gpu_decode"] = out
    return out


def variant_of(nregs) -> str:
    """The kernel variant for a kernel with these register counts per bank."""
    return "float" if nregs[1] == 0 and nregs[2] == 0 else "full"


def _spill_words(nregs, hot) -> tuple[list[int], int]:
    """Per bank, the word offset of its spill area in one program instance's scratch, and the total."""
    offsets, total = [], 0
    for bank, n in enumerate(nregs):
        offsets.append(total)
        total += max(0, n - hot[bank]) * abi.TILE
    return offsets, total


def kernel_image(kl: KernelLayout) -> KernelImage:
    """The device block of one verified kernel."""
    if kl.bm * kl.bn > abi.TILE:
        raise DeviceError(f"the GPU VM runs tiles of at most {abi.TILE} lanes; this Program has "
                          f"{kl.bm}x{kl.bn} tiles (encode it for the GPU VM's target)")
    dec = decode_stream(kl)
    nd = len(kl.row_sizes) + len(kl.col_sizes)
    n_sw, n_op, n_in = len(kl.sweeps), len(kl.opnd_kind), len(kl.instrs)
    sw_at = abi.KH
    op_at = sw_at + n_sw * abi.SWEEP_W
    in_at = op_at + n_op * abi.OW
    block = np.zeros(in_at + n_in * abi.IW, np.int64)
    rows, cols = kl.rows, kl.cols
    row_blocks = -(-rows // kl.bm)   # (an empty row still runs its sweeps: fin writes identities)
    col_tiles = -(-cols // kl.bn)
    items = row_blocks * col_tiles if dec.tile_parallel else row_blocks
    variant = variant_of(kl.nregs)
    spill_at, cta_words = _spill_words(kl.nregs, abi.VARIANTS[variant])
    head = [rows, cols, kl.bm, kl.bn, row_blocks, col_tiles, n_sw, *kl.prologue, sw_at, op_at,
            in_at, len(kl.row_sizes), len(kl.col_sizes), *spill_at, cta_words, int(dec.tile_parallel), items]
    block[:len(head)] = head
    block[abi.H_SIZES:abi.H_SIZES + nd] = kl.row_sizes + kl.col_sizes
    block[sw_at:op_at] = dec.sweeps
    ops = block[op_at:in_at].reshape(n_op, abi.OW)
    ops[:, abi.O_SLOT] = kl.opnd_arg
    ops[:, abi.O_DTYPE] = kl.opnd_dtype
    ops[:, abi.O_OFFSET] = kl.opnd_offset
    ops[:, abi.O_KIND] = kl.opnd_kind
    ops[:, abi.O_STRIDES:abi.O_STRIDES + nd] = kl.opnd_strides
    ins = block[in_at:].reshape(n_in, abi.IW)
    ins[:] = dec.instrs
    if len(dec.const_rows):
        ins[dec.const_rows, 2] = kl.const_bits[dec.const_index]
    assert nd <= MAX_DIMS
    return KernelImage(block, items, cta_words > 0, cta_words, variant)


def program_image(layout: ProgramLayout) -> tuple[np.ndarray, list[tuple[int, KernelImage]]]:
    """All kernel blocks of a Program in one array, and (word offset, image) per kernel."""
    images = [kernel_image(kl) for kl in layout.kernels]
    offsets, at = [], 0
    for im in images:
        offsets.append(at)
        at += len(im.words)
    words = np.concatenate([im.words for im in images]) if images else np.zeros(0, np.int64)
    return words, list(zip(offsets, images))
