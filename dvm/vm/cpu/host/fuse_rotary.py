"""The plan of the CPU VM's rotary row form (FK_ROTARY, run by jit/fused/rotary): RoPE as the torch
frontend writes it, y = x * cos + (x_swapped * sign) * sin, from its five loads to its store.
"""
from __future__ import annotations

from ..abi import FK_ROTARY, ROT_R_SWAP, ROT_Y_SWAP
from .fuse_flow import Flow, is_op, self_contained, writes_in


def _product_of_loads(instrs, specs, pc: int, sec) -> tuple[int, list[int]] | None:
    """load a, oa ; load b, ob ; mul p, a, b (either order, kept)  ->  (p, [the first factor's
    operand, the second's]) for two distinct registers a and b."""
    if pc + 3 > sec[1] or not (is_op(specs[pc], "load") and is_op(specs[pc + 1], "load")
                               and is_op(specs[pc + 2], "ew", "mul")):
        return None
    loaded = {int(instrs[pc, 1]): int(instrs[pc, 2]), int(instrs[pc + 1, 1]): int(instrs[pc + 1, 2])}
    p, u, v = (int(w) for w in instrs[pc + 2, 1:4])
    if len(loaded) != 2 or {u, v} != set(loaded):
        return None
    return p, [loaded[u], loaded[v]]


def _scaled_product(instrs, specs, pc: int, sec) -> tuple[int, list[int], int, int] | None:
    """load c ; load d ; mul q, c, d ; load e ; mul r, q, e (either order, kept)  ->  (r, [c's, d's
    operands], e's operand, ROT_R_SWAP where r = e * q)."""
    first = _product_of_loads(instrs, specs, pc, sec)
    if first is None or pc + 5 > sec[1] or not (is_op(specs[pc + 3], "load") and is_op(specs[pc + 4], "ew", "mul")):
        return None
    q, cd = first
    e, oe = int(instrs[pc + 3, 1]), int(instrs[pc + 3, 2])
    r, u, v = (int(w) for w in instrs[pc + 4, 1:4])
    if q == e or {u, v} != {q, e}:
        return None
    return r, cd, oe, ROT_R_SWAP if u == e else 0


def rotary(instrs, specs, flow: Flow, pc: int, sec) -> list[int] | None:
    """A product of two loads p = a * b and a scaled product r = (c * d) * e (_scaled_product), in
    either order, then add y, p, r ; store y   (every product's and the sum's operands in either
    order, kept)  ->  (FK_ROTARY, 10, a's, b's, c's, d's and e's operands in their products' order,
    ROT_R_SWAP | ROT_Y_SWAP): y = x * cos + (x_swapped * sign) * sin, a rotary embedding with its
    halves swapped by a view (frontend fx_rotate_pairs / fx_rolled_blocks), as the CPU VM's row
    form (jit/fused/rotary) computes it from the operands' rows; every register it writes is dead
    after it."""
    end = pc + 9
    if end >= sec[1] or not (is_op(specs[pc + 8], "ew", "add") and is_op(specs[end], "store")):
        return None
    first, scaled = _product_of_loads(instrs, specs, pc, sec), _scaled_product(instrs, specs, pc + 3, sec)
    if first is None or scaled is None:   # the scaled product first, then the product of loads
        scaled, first = _scaled_product(instrs, specs, pc, sec), _product_of_loads(instrs, specs, pc + 5, sec)
        if first is None or scaled is None or scaled[0] in writes_in(flow, pc + 5, pc + 8):
            return None
    elif first[0] in writes_in(flow, pc + 3, pc + 8):
        return None
    (p, ab), (r, cd, oe, r_swap) = first, scaled
    y, s, t = (int(w) for w in instrs[pc + 8, 1:4])
    if p == r or {s, t} != {p, r} or int(instrs[end, 1]) != y or not self_contained(flow, pc, end, sec):
        return None
    return [FK_ROTARY, end + 1 - pc, *ab, *cd, oe, r_swap | (ROT_Y_SWAP if s == r else 0)]

