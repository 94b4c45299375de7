"""The fused runs inside a tile (jit/fused/tile, jit/fused/unbin) as host/fuse_plan finds them at an
instruction: each finder returns the run's plan row (kind, instructions covered, fields...) or
None. The register flow is checked statically (host/fuse_flow); states at run time, by the pieces.
"""
from __future__ import annotations

from ..abi import (DT_BF16, DT_F16, FK_ADDSUM, FK_APPLY, FK_CSQACC, FK_CSQSUM, FK_EXPSUM, FK_LOADACC, FK_LOADRED,
                   FK_SQSUM, FK_UNBIN, FUSED_BIN, FUSED_UN, NO_CAST, NO_LOAD, NO_SRC, R_ARGMAX, RED_NAMES,
                   UNBIN_C_SHIFT, UNBIN_SWAP, UNBIN_USWAP, UNBIN_X_SHIFT, UNBIN_ZDEAD)
from .fuse_flow import Flow, is_op


def rounding_cast(instrs, specs, pc: int, sec, x: int) -> int | None:
    """Instruction pc is `cast.f32.f32 y, x, T` with T float16 or bfloat16 (x rounded to T's
    precision, kept in f32: a 16-bit model's intermediate, as eager rounds it) -> y."""
    if pc >= sec[1] or specs[pc].name != "cast.f32.f32" or int(instrs[pc, 2]) != x:
        return None
    return int(instrs[pc, 1]) if int(instrs[pc, 3]) in (DT_F16, DT_BF16) else None


def sqsum(instrs, specs, flow: Flow, pc: int, sec) -> list[int] | None:
    """mul t, x, x ; rowred.sum r, t  ->  (FK_SQSUM, 2, x, r)"""
    if pc + 2 > sec[1] or not (is_op(specs[pc], "ew", "mul") and is_op(specs[pc + 1], "rowred", "sum")):
        return None
    t, x, x2 = (int(v) for v in instrs[pc, 1:4])
    r, t2 = int(instrs[pc + 1, 1]), int(instrs[pc + 1, 2])
    if x != x2 or t2 != t or t in (x, r) or r == x or not flow.dead_after(t, pc, pc + 2, sec):
        return None
    return [FK_SQSUM, 2, x, r]


def sub_then_sum(instrs, specs, flow: Flow, pc: int, sec, row_form: bool = False) -> list[int] | None:
    """sub d, x, m ; mul t, d, d ; rowred.sum r, t  ->  (FK_CSQSUM, 3, x, m, d, t, r)
       sub t, x, m ; exp e, t ; rowred.sum r, e     ->  (FK_EXPSUM, 3, x, m, e, t, r)
    row_form: inside a row form (_row_norm), which reads x's rows from memory: r may reuse x's
    register (dead after the sub)."""
    if pc + 3 > sec[1] or not (is_op(specs[pc], "ew", "sub") and is_op(specs[pc + 2], "rowred", "sum")):
        return None
    d, x, m = (int(v) for v in instrs[pc, 1:4])
    t, d1, d2 = (int(v) for v in instrs[pc + 1, 1:4])
    r, t2 = int(instrs[pc + 2, 1]), int(instrs[pc + 2, 2])
    if t2 != t or (r == x and not row_form):
        return None
    if is_op(specs[pc + 1], "ew", "mul"):   # the centered sum of squares; d is kept, t is dead
        if (d1, d2) != (d, d) or d in (x, m, t) or r in (d, t) or not flow.dead_after(t, pc, pc + 3, sec):
            return None
        return [FK_CSQSUM, 3, x, m, d, t, r]
    if is_op(specs[pc + 1], "ew", "exp"):   # exp(x - m) and its sum; e (here t) is kept, d is dead
        if d1 != d or d in (x, m) or t in (m, r) or not flow.dead_after(d, pc, pc + 3, sec):
            return None
        return [FK_EXPSUM, 3, x, m, t, d, r]
    return None


def _add_then_sum(instrs, specs, flow: Flow, pc: int, sec) -> list[int] | None:
    """add h, a, b ; rowred.sum s, h  ->  (FK_ADDSUM, 2, a, b, h, s): each row of h summed while
    it is in cache (a residual sum a norm reads; h stays live)"""
    if pc + 2 > sec[1] or not (is_op(specs[pc], "ew", "add") and is_op(specs[pc + 1], "rowred", "sum")):
        return None
    h, a, b = (int(v) for v in instrs[pc, 1:4])
    s, h2 = int(instrs[pc + 1, 1]), int(instrs[pc + 1, 2])
    if h2 != h or s == h:
        return None
    return [FK_ADDSUM, 2, a, b, h, s]


def _load_then_reduce(instrs, specs, flow: Flow, pc: int, sec) -> list[int] | None:
    """load x, o ; rowred.op r, x  ->  (FK_LOADRED, 2, o, x, r, op), and
       load x, o ; acc.op +r, x     ->  (FK_LOADACC, 2, o, x, r, op)
    for sum/prod/max/min when x is dead after: the tile is never made, the reduction reads the
    operand's rows (or a column-major tile's columns) where they are."""
    if pc + 2 > sec[1] or not is_op(specs[pc], "load"):
        return None
    kind = FK_LOADRED if is_op(specs[pc + 1], "rowred") else FK_LOADACC if is_op(specs[pc + 1], "acc") else None
    if kind is None:
        return None
    op = RED_NAMES.index(specs[pc + 1].op)
    x, j = int(instrs[pc, 1]), int(instrs[pc, 2])
    r, x2 = int(instrs[pc + 1, 1]), int(instrs[pc + 1, 2])
    if op >= R_ARGMAX or x2 != x or r == x or not flow.dead_after(x, pc, pc + 2, sec):
        return None
    return [kind, 2, j, x, r, op]


def _centered_squares_acc(instrs, specs, flow: Flow, pc: int, sec) -> list[int] | None:
    """sub d, x, m ; mul t, d, d ; acc.sum +a, t  ->  (FK_CSQACC, 3, x, m, a, d, t) when d and t
    are dead after (a LayerNorm's variance over the sweeps of long rows)."""
    if pc + 3 > sec[1] or not (is_op(specs[pc], "ew", "sub") and is_op(specs[pc + 1], "ew", "mul")
                               and is_op(specs[pc + 2], "acc", "sum")):
        return None
    d, x, m = (int(v) for v in instrs[pc, 1:4])
    t, d1, d2 = (int(v) for v in instrs[pc + 1, 1:4])
    a, t2 = int(instrs[pc + 2, 1]), int(instrs[pc + 2, 2])
    if (d1, d2) != (d, d) or t2 != t or a in (x, m, d, t):
        return None
    if not (flow.dead_after(d, pc, pc + 3, sec) and flow.dead_after(t, pc, pc + 3, sec)):
        return None
    return [FK_CSQACC, 3, x, m, a, d, t]


def apply_run(instrs, specs, flow: Flow, pc: int, sec, rounding: bool = False) -> list[int] | None:
    """mul y, a, b ; [load w] ; mul y, y, w ; [load c] ; [add y, y, c]  (either operand order)
    -> (FK_APPLY, n, a, b, w source, c source or NO_SRC, y): one of a, b is compact at run time.
    A source is an operand index (>= 0, loaded by the run) or -2 - register (a row vector then).
    rounding (a row form's, fuse_plan._row_norm): a rounding cast of the first product may follow
    it (`mul y0, a, b ; cast y, y0, T ; ...`); the run's pc or NO_CAST is then appended."""
    if not is_op(specs[pc], "ew", "mul"):
        return None
    y, a, b = (int(v) for v in instrs[pc, 1:4])
    if a in flow.constants or b in flow.constants:   # a constant, not a row's scale
        return None
    loaded: dict[int, int] = {}     # register -> the operand the run loaded into it
    written = {y}                   # registers a stage of the run wrote
    targets: set[int] = set()       # registers the run loaded into
    srcs: list[int] = []
    end, cast = pc + 1, NO_CAST
    rounded = rounding_cast(instrs, specs, end, sec, y) if rounding else None
    if rounded is not None:
        written.add(rounded)
        y, end, cast = rounded, end + 1, end
    for op in ("mul", "add"):
        k, load = end, None
        if k < sec[1] and is_op(specs[k], "load"):   # a row vector? checked at run time
            load = (int(instrs[k, 1]), int(instrs[k, 2]))
            if load[0] == y:   # the load overwrites the run's value: not this pattern
                break
            k += 1
        if k >= sec[1] or not is_op(specs[k], "ew", op):
            break
        d, u, v = (int(w) for w in instrs[k, 1:4])
        if (u == y) == (v == y):
            break
        other = v if u == y else u
        if load is not None and other == load[0]:
            src = load[1]
        elif other in loaded and other not in written:
            src = loaded[other]
        elif other in written or other in flow.constants:   # (a constant: never a row vector)
            break
        else:
            src = -2 - other
        if load is not None:
            loaded[load[0]] = load[1]
            targets.add(load[0])
            written.discard(load[0])
        srcs.append(src)
        written.add(d)
        y = d
        end = k + 1
    if not srcs:
        return None
    for r in (written | targets) - {y}:
        if not flow.dead_after(r, pc, end, sec):
            return None
    return [FK_APPLY, end - pc, a, b, srcs[0], srcs[1] if len(srcs) > 1 else NO_SRC, y] + ([cast] if rounding else [])


def _row_level(specs, flow: Flow, reg: int, pc: int, sec, depth: int = 4) -> bool:
    """reg's value at pc is one per row as far as the section shows: a row reduction's result, or
    an op on such values and the prologue's (a norm's chain between its sums and its scale)."""
    for q in range(pc - 1, sec[0] - 1, -1):
        if reg in flow.writes[q]:
            if specs[q].group == "rowred":
                return True
            return specs[q].group == "ew" and depth > 0 and all(
                r in flow.constants or _row_level(specs, flow, r, q, sec, depth - 1) for r in flow.reads[q])
    return False


def _un_then_bin(instrs, specs, flow: Flow, pc: int, sec) -> list[int] | None:
    """un t, x ; [load z, o] ; bin y, t, z (or bin y, z, t)  ->  (FK_UNBIN, n, x, t, z, y, o or
    NO_LOAD, swap | uswap | zdead | (c + 1) << UNBIN_C_SHIFT, s + 1 or 0) for U in FUSED_UN (c = -1) or U =
    `op t, x, c` (or `op t, c, x`: uswap) with op in FUSED_BIN, c set by the prologue (a constant:
    a scaling before a sum, an optimizer's `b * 0.9 + g`) and x not row-level, B in FUSED_BIN, when
    t is dead after the run and feeds one side of B only, z not the prologue's (jit/fused/unbin).
    zdead: z is loaded by the run and dead after it (its rows may be read where they lie). s: the
    operand of `store y, s` right after the run when nothing else reads y (abi: field 8). A
    binary U leaves B to a run that starts at B (B and a sum after it, say)."""
    spec = specs[pc]
    if not (is_op(spec, "ew") and spec.op in FUSED_UN + FUSED_BIN):
        return None
    t, x = int(instrs[pc, 1]), int(instrs[pc, 2])
    c, uswap = -1, 0
    if spec.op in FUSED_BIN:   # x U c or c U x, c the prologue's
        c = int(instrs[pc, 3])
        if x in flow.constants and c not in flow.constants:
            x, c, uswap = c, x, UNBIN_USWAP
        if c not in flow.constants or x in flow.constants or _row_level(specs, flow, x, pc, sec):
            return None
    k, load = pc + 1, None
    if k < sec[1] and is_op(specs[k], "load"):
        load = (int(instrs[k, 1]), int(instrs[k, 2]))
        k += 1
    if k >= sec[1] or not (is_op(specs[k], "ew") and specs[k].op in FUSED_BIN):
        return None
    y, a, b = (int(v) for v in instrs[k, 1:4])
    if (a == t) == (b == t) or y == t:
        return None
    z = b if a == t else a
    if load is not None and (load[0] != z or z == t):
        return None
    if (load is None and z in flow.constants) or not flow.dead_after(t, pc, k + 1, sec):
        return None
    if c >= 0 and any(find(instrs, specs, flow, k, sec) for find in TILE_RUNS if find is not _un_then_bin):
        return None
    zdead = load is not None and (z == y or flow.dead_after(z, pc, k + 1, sec))
    stored = k + 1 < sec[1] and is_op(specs[k + 1], "store") and int(instrs[k + 1, 1]) == y and \
        flow.dead_after(y, pc, k + 2, sec)
    return [FK_UNBIN, k + 1 - pc, x, t, z, y, load[1] if load else NO_LOAD,
            (UNBIN_SWAP if a != t else 0) | uswap | (UNBIN_ZDEAD if zdead else 0) | (c + 1) << UNBIN_C_SHIFT,
            int(instrs[k + 1, 2]) + 1 if stored else 0]


def _load_un_then_bin(instrs, specs, flow: Flow, pc: int, sec) -> list[int] | None:
    """load x, ox ; un t, x ; [load z, o] ; bin y, t, z  ->  the FK_UNBIN run of _un_then_bin from
    the load, (ox + 1) << UNBIN_X_SHIFT in its last field, for a math op U whose x the run's load
    alone gives and nothing reads after it: x's tile, like z's, may be read where it lies."""
    if pc + 3 > sec[1] or not is_op(specs[pc], "load"):
        return None
    run = _un_then_bin(instrs, specs, flow, pc + 1, sec)
    x, ox = int(instrs[pc, 1]), int(instrs[pc, 2])
    if run is None or run[2] != x or run[7] >> UNBIN_C_SHIFT != 0 or (run[4] == x and run[6] == NO_LOAD) or \
            not flow.dead_after(x, pc, pc + 1 + run[1], sec):
        return None
    return [*run[:1], run[1] + 1, *run[2:7], run[7] | (ox + 1) << UNBIN_X_SHIFT, *run[8:]]


def without_x_load(run: list[int]) -> list[int]:
    """A _load_un_then_bin run as _un_then_bin planned it, one instruction after x's load."""
    return [run[0], run[1] - 1, *run[2:7], run[7] & ((1 << UNBIN_X_SHIFT) - 1), *run[8:]]


# the runs tried at each pc, in this order (the first that matches is planned)
TILE_RUNS = (sub_then_sum, sqsum, apply_run, _load_then_reduce, _centered_squares_acc, _load_un_then_bin,
             _un_then_bin, _add_then_sum)
