"""Tiles of a reduction whose reduced axis is strided and whose kept axis is contiguous (a sum, a
softmax over the first axis): whether a kernel is one, and the height and size of its tiles."""
from __future__ import annotations

from .limits import pow2_at_least

# column-major reductions (reduced axis strided, kept axis contiguous): when the kept axis has at
# most COLUMN_MAJOR_WHOLE rows, tiles of up to COLUMN_MAJOR_TILE elements hold all of them (a tile
# is then one contiguous run of the operand, which the CPU VM reads in place), or, for a larger
# reduction, a block of them: up to COLUMN_MAJOR_BLOCKS blocks of about COLUMN_MAJOR_MIN_BM rows
# or more and COLUMN_MAJOR_BLOCK_ELEMS elements or more (rows x reduced length), the work units
# the CPU VM's threads share (a tile column is then a contiguous run; the CPU VM's FK_LOADACC reads
# it in place; shorter runs cost more per element, hence the minimum block height); longer kept
# axes get row blocks of COLUMN_MAJOR_BM rows
COLUMN_MAJOR_WHOLE = 4096
COLUMN_MAJOR_TILE = 16384
COLUMN_MAJOR_BM = 1024
COLUMN_MAJOR_BLOCK_ELEMS = 1 << 17
COLUMN_MAJOR_BLOCKS = 8
COLUMN_MAJOR_MIN_BM = 512
# a stream that re-reads its rows after reducing them (softmax, a norm, x minus its sum: Target.
# rereads_rows) keeps the single-tile stream over a strided reduced axis, unless its tiles would
# hold at most SPARSE_TILE_ROWS kept rows (a quarter of each cache line it reads: over 2048 f32
# columns), the kept axis has STRIP_MIN_ROWS or more and the data at most STRIP_MOST_BYTES: then
# the sweeps run over strips of kept rows, each about a core's L2 (the encoder's
# STREAM_REGISTER_BYTES) so that every sweep after the first re-reads it from there (softmax over
# axis 0 of 8192x64, 4096x512: 2-3x faster; 2048 or fewer columns, or 16 MiB of data: slower, the
# single-tile stream's lines then stay cached between the tiles that share them)
SPARSE_TILE_ROWS = 4
STRIP_MIN_ROWS = 32
STRIP_MOST_BYTES = 1 << 23
# a re-reading stream with no row form (no softmax or norm the CPU VM runs row by row: x minus its
# mean, x over its sum) over at most WHOLE_REREAD_ROWS kept rows takes tiles of every kept row
# (COLUMN_MAJOR_TILE elements) where the single-tile stream's would not hold them all: with no
# operand varying along the strided axis only, each tile is one contiguous run, which the CPU VM
# reads and writes in place (column-major registers), where strips or the single-tile stream copy
# short runs (x - x.mean(0) over 4096x64 .. 65536x16, 256x1024 .. 4096x4096: 2-5x faster, one
# work unit against their two)
WHOLE_REREAD_ROWS = COLUMN_MAJOR_WHOLE


def is_column_major(row_strides: list[list[int]], col_strides: list[list[int]]) -> bool:
    """A reduction whose operands are contiguous along the kept (row) axis and strided along the
    reduced one (e.g. a sum over axis 0): tiles of many rows and few columns read whole cache lines."""
    for rs, cs in zip(row_strides, col_strides):
        if rs and cs and rs[-1] == 1 and cs[-1] != 0 and cs[-1] != 1:
            return True
    return False


def column_major_rows(R: int, C: int, block_tile: int) -> tuple[int, int]:
    """(BM, tile elements) of a column-major reduction keeping R rows and reducing C; row blocks
    of COLUMN_MAJOR_BM rows take tiles of `block_tile` elements. Blocks are a multiple of 16 rows
    (each starts 64 bytes after the previous one's start)."""
    if R > COLUMN_MAJOR_WHOLE:
        return COLUMN_MAJOR_BM, block_tile
    blocks = min(COLUMN_MAJOR_BLOCKS, R * C // COLUMN_MAJOR_BLOCK_ELEMS, -(-R // COLUMN_MAJOR_MIN_BM))
    if blocks < 2:
        return max(1, R), COLUMN_MAJOR_TILE
    return -(-R // (16 * blocks)) * 16, COLUMN_MAJOR_TILE


def whole_rereads(R: int, C: int, row_tile: int, row_strides: list[list[int]], col_strides: list[list[int]]) -> bool:
    """Whether a re-reading stream with no row form, keeping R rows of C strided columns, takes
    tiles of all the kept rows (WHOLE_REREAD_ROWS) where the single-tile stream's tiles of
    `row_tile` elements would not hold them (those reduce a whole tile in one sweep); no operand
    may vary along the reduced axis only (a weight there)."""
    return (0 < R <= WHOLE_REREAD_ROWS and R * pow2_at_least(max(C, 1)) > row_tile
            and not any(cs and any(cs) and not any(rs) for rs, cs in zip(row_strides, col_strides)))


def strips_pay(R: int, C: int, itemsize: int, row_tile: int) -> bool:
    """Whether a stream re-reading its R rows of C strided columns runs faster as sweeps over
    strips of rows than as the single-tile stream, whose tiles hold `row_tile` elements
    (SPARSE_TILE_ROWS)."""
    return (R >= STRIP_MIN_ROWS and row_tile // pow2_at_least(max(C, 1)) <= SPARSE_TILE_ROWS
            and R * C * itemsize <= STRIP_MOST_BYTES)


def strip_rows(R: int, C: int, itemsize: int, strip_bytes: int) -> tuple[int, int]:
    """(BM, tile elements) of strips_pay's sweeps: strips of a multiple of 16 rows, about
    `strip_bytes` of data each, and at least two (the threads' work units)."""
    fits = max(16, strip_bytes // (itemsize * C) // 16 * 16)
    return min(fits, -(-R // 32) * 16), COLUMN_MAJOR_TILE
