"""The plan of the CPU VM's rotary row form (FK_ROTARY, run by jit/fused/rotary): RoPE as the torch
frontend writes it, y = x * cos + (x_swapped * sign) * sin, from its loads to its store.

A run's five factors are loads inside it, or registers that a load earlier in the section left
(q's and k's rotations of equal shapes in one kernel share the loads of cos, the signs and sin:
the second run reads those operands' rows itself). A run whose loaded registers a later run reads
that way is planned with ROT_THEN: the piece takes it only where it can take the runs after it
as well, so that no register the first left unloaded is read by instructions.
"""
from __future__ import annotations

from ..abi import FK_ROTARY, ROT_R_SWAP, ROT_THEN, ROT_Y_SWAP
from .fuse_flow import Flow, is_op

_MAX_RUN = 10   # five loads, three products, the sum and the store


def _last_load(instrs, specs, flow: Flow, reg: int, pc: int, sec) -> int | None:
    """The operand of the load that last wrote reg before pc in section sec, if a load did."""
    for q in range(pc - 1, sec[0] - 1, -1):
        if reg in flow.writes[q]:
            return int(instrs[q, 2]) if is_op(specs[q], "load") else None
    return None


def _window(instrs, specs, flow: Flow, pc: int, sec):
    """The instructions from pc to the first store as expressions: (end, y's expression, the
    registers read before written and resolved to earlier loads, the registers written), or None
    where an instruction is not an f32 load, mul or add, or a factor cannot be resolved. An
    expression is ("o", operand) or (op, left, right)."""
    val: dict = {}
    resolved: set = set()
    for q in range(pc, min(pc + _MAX_RUN, sec[1])):
        spec = specs[q]
        if is_op(spec, "store"):
            y = int(instrs[q, 1])
            return (q, val[y], resolved, set().union(*flow.writes[pc:q])) if y in val else None
        if is_op(spec, "load"):
            val[int(instrs[q, 1])] = ("o", int(instrs[q, 2]))
            continue
        if not (is_op(spec, "ew", "mul") or is_op(spec, "ew", "add")):
            return None
        args = []
        for r in (int(instrs[q, 2]), int(instrs[q, 3])):
            if r not in val:
                o = _last_load(instrs, specs, flow, r, pc, sec)
                if o is None:
                    return None
                val[r] = ("o", o)
                resolved.add(r)
            args.append(val[r])
        val[int(instrs[q, 1])] = (spec.op, *args)
    return None


def _factors(e):
    """(left, right) operands of a product of two operands, else None."""
    if e[0] == "mul" and e[1][0] == "o" and e[2][0] == "o":
        return e[1][1], e[2][1]
    return None


def _form(y) -> list[int] | None:
    """y = p + r (or r + p), p = a * b, r = (c * d) * e (or e * (c * d)) -> [a, b, c, d, e, flags]."""
    if y[0] != "add":
        return None
    for p, r, y_swap in ((y[1], y[2], 0), (y[2], y[1], ROT_Y_SWAP)):
        ab = _factors(p)
        if ab is None or r[0] != "mul":
            continue
        for q, e, r_swap in ((r[1], r[2], 0), (r[2], r[1], ROT_R_SWAP)):
            cd = _factors(q) if e[0] == "o" else None
            if cd is not None:
                return [*ab, *cd, e[1], r_swap | y_swap]
    return None


def _match(instrs, specs, flow: Flow, pc: int, sec):
    """(end, [a, b, c, d, e, flags], resolved, written) for a rotary run from pc whose every
    instruction feeds its store (none left over), else None."""
    w = _window(instrs, specs, flow, pc, sec)
    if w is None:
        return None
    end, y, resolved, written = w
    form = _form(y)
    loads = sum(1 for q in range(pc, end) if is_op(specs[q], "load"))
    if form is None or end - pc != loads + 4:   # three products and the sum
        return None
    return end, form, resolved, written


def _read_after(flow: Flow, reg: int, start: int, end: int, sec) -> bool:
    return not flow.dead_after(reg, start, end, sec)


def rotary(instrs, specs, flow: Flow, pc: int, sec) -> list[int] | None:
    """(FK_ROTARY, n, a's, b's, c's, d's and e's operands in their products' order, ROT_R_SWAP |
    ROT_Y_SWAP | ROT_THEN) for a rotary run from pc (_match) whose registers are dead after it, or
    (ROT_THEN) are read after it only by the rotary run right after it (planned itself), as factors
    that run resolves to their loads, and are dead after that run."""
    m = _match(instrs, specs, flow, pc, sec)
    if m is None:
        return None
    end, form, _, written = m
    live = {r for r in written if _read_after(flow, r, pc, end + 1, sec)}
    if not live:
        return [FK_ROTARY, end + 1 - pc, *form]
    nxt = rotary(instrs, specs, flow, end + 1, sec)
    if nxt is None:
        return None
    n_end, _, n_resolved, n_written = _match(instrs, specs, flow, end + 1, sec)
    for r in live:   # read by that run only as a factor, then overwritten or dead
        if r not in n_resolved or (r not in n_written and _read_after(flow, r, end + 1, n_end + 1, sec)):
            return None
    return [FK_ROTARY, end + 1 - pc, *form[:5], form[5] | ROT_THEN]
