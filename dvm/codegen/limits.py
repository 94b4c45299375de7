"""Size limits and the one checked arithmetic for sizes, strides and element counts.

Every element count, element index and byte offset DVM computes stays far inside int64: a shape
whose element count exceeds MAX_ELEMS, or an array that spans more than MAX_BYTES of memory, is
rejected before any work (ShapeError from the builder and the encoder, VerifyError "size_limit"
from the verifier). Python integers do not overflow, so the checks here are comparisons against
the limits; what they buy is that the int64 arithmetic of every VM cannot overflow either:

  |offset| + sum over dims of (size - 1) * |stride| <= MAX_ELEMS   (any element index, any order
                                                                     of summation)
  MAX_ELEMS * 8 (the widest element) = MAX_BYTES = 2**47           (byte offsets)
  |stride| * MAX_TILE <= 2**44 * 2**18 = 2**62                     (a stride times a tile extent)
"""
from __future__ import annotations

from typing import Sequence

from ..errors import ShapeError

MAX_ELEMS = 1 << 44          # elements of any buffer, domain or touched extent (16 Ti elements)
MAX_BYTES = MAX_ELEMS * 8    # bytes any array may span (128 TiB: the x86-64 user address space)


def checked_numel(shape: Sequence[int], what: str = "shape") -> int:
    """The element count of `shape`, or ShapeError when it exceeds MAX_ELEMS (or a size is
    negative). A zero size makes the count 0 whatever the other sizes are, but every size must
    still be within the limit itself."""
    n = 1
    for d in shape:
        if d < 0 or d > MAX_ELEMS:
            raise ShapeError(f"{what} {tuple(shape)}: size {d} is outside [0, {MAX_ELEMS}] (2**44, DVM's limit)")
        n *= d
    if n > MAX_ELEMS:
        raise ShapeError(f"{what} {tuple(shape)} has {n} elements; DVM's limit is {MAX_ELEMS} (2**44)")
    return n


def checked_span(shape: Sequence[int], strides: Sequence[int], itemsize: int, what: str = "array") -> int:
    """Bytes an array of this shape and these strides (in bytes) spans, or ShapeError when it
    exceeds MAX_BYTES or its element count exceeds MAX_ELEMS. 0 for an empty array."""
    n = checked_numel(shape, what)
    if n == 0:
        return 0
    span = itemsize + sum((d - 1) * abs(s) for d, s in zip(shape, strides))
    if span > MAX_BYTES:
        raise ShapeError(f"{what} of shape {tuple(shape)} and strides {tuple(strides)} spans {span} bytes; "
                         f"DVM's limit is {MAX_BYTES} (2**47)")
    return span


def reach(sizes: Sequence[int], strides: Sequence[int]) -> int:
    """sum over dims of (size - 1) * |stride|: how far (in elements) an operand's indices spread
    from its offset over a domain of these sizes (empty dims contribute nothing)."""
    return sum((d - 1) * abs(s) for d, s in zip(sizes, strides) if d > 1)


def pow2_at_least(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1)."""
    return 1 << max(n - 1, 0).bit_length()
