"""What a VM asks of the Programs encoded for it. codegen/ never imports a VM: the runtime hands the
encoder the Target of the VM that will run the Program (vm.contract.VM.target).

A Target changes only choices the ISA leaves open (tile sizes, which stream of a kernel to take),
never semantics: every VM runs every valid Program with the same results.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from .program import MAX_TILE

# (instruction words [n, WORDS], sections [(start, end), ...], the operands' dtype codes) ->
# whether the VM runs every instruction of that stream in its row forms (whole rows read from their
# buffers, never held in tile registers); the encoder then takes the single-tile stream for rows
# wider than a tile
RowFormsHook = Callable[[np.ndarray, Sequence[tuple[int, int]], Sequence[int]], bool]


@dataclass(frozen=True)
class Target:
    name: str                                  # the VM's name (part of the Program cache key)
    whole_row_forms: RowFormsHook | None = None
    # (as RowFormsHook) whether the VM takes a single-tile stream's rows in tiles as wide as the
    # row rounded up (encoder.TIGHT_LANES) as well as in the next power of two (none of its forms
    # that need a power of two would take that stream): the encoder's tight rows (_single_bn)
    tight_rows: RowFormsHook | None = None
    # (as RowFormsHook) whether that single-tile stream reads its rows again after reducing them (a
    # norm's x - mean, a softmax's exp(x - max)), which the VM then takes in row-major tiles, its
    # strided rows read in blocks, faster than column-major tiles re-read them sweep by sweep: the
    # encoder keeps the single-tile stream where it would take column-major tiles (the reduced axis
    # strided, the kept one contiguous: a norm over the channels of a channels-first image)
    rereads_rows: RowFormsHook | None = None
    # the most lanes (BM * BN) a tile may have on this VM: the encoder caps every tile choice,
    # and the single-tile stream, by it (a GPU VM compiles one tile size into its kernel)
    max_tile: int = MAX_TILE
    # kernels whose lanes x sweeps are below this run on one thread on this VM: their tiles need
    # not be shared among threads (the encoder may then make fewer, larger ones); 0: never
    serial_lanes: int = 0


GENERIC = Target("generic")   # no VM-specific choices: the encoder's defaults
