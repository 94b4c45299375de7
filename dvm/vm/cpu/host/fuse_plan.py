"""Where a kernel's instructions can run fused: decided once per instruction stream, in Python
(cached by host/stream).

fuse[pc] (fuse_plan, executed by the fused pieces: jit/fused/, jit/rowtree) = (kind, instructions
covered, fields...) for a
run starting at pc, kind FK_NONE elsewhere. The plan checks what it can see statically: the
opcodes, the register flow inside the run, and that every register the run only passes through
(an intermediate, a loaded weight) is dead after it. Register states (full / compact / row
vector) and whether a loaded operand is a row vector (jit/addr.row_uniform; a load instruction
outside a run tests it per tile, tile_row_uniform) are checked at run time, by the fused pieces. The
row forms of norms and softmax (_row_norm, _row_softmax: a whole load-to-store run) contain
smaller runs, which are planned too: a tile the row form cannot take runs them.
"""
from __future__ import annotations

import numpy as np

from ....codegen import isa
from ..abi import (CHAIN_OPS, EW_NAMES, FK_ADDSUM, FK_APPLY, FK_CSQACC, FK_CSQSUM, FK_EXPSUM, FK_LOADACC,
                   FK_LOADRED, FK_NONE, FK_ROWNORM, FK_ROWSOFTMAX, FK_SQSUM, FK_UNBIN, FUSE_WIDTH, FUSED_BIN,
                   FUSED_UN, NO_LOAD, NO_SRC, R_ARGMAX, RED_NAMES, ROWNORM_MAX_TERMS, UNBIN_C_SHIFT, UNBIN_SWAP,
                   UNBIN_USWAP, UNBIN_X_SHIFT, UNBIN_ZDEAD)
from .fuse_flow import Flow, is_op, self_contained, writes_in
from .fuse_rotary import rotary

SCALAR_CHAIN_OPS = {EW_NAMES[op] for op in CHAIN_OPS}   # the row forms replay them on a row's scalars


def _sqsum(instrs, specs, flow: Flow, pc: int, sec) -> list[int] | None:
    """mul t, x, x ; rowred.sum r, t  ->  (FK_SQSUM, 2, x, r)"""
    if pc + 2 > sec[1] or not (is_op(specs[pc], "ew", "mul") and is_op(specs[pc + 1], "rowred", "sum")):
        return None
    t, x, x2 = (int(v) for v in instrs[pc, 1:4])
    r, t2 = int(instrs[pc + 1, 1]), int(instrs[pc + 1, 2])
    if x != x2 or t2 != t or t in (x, r) or r == x or not flow.dead_after(t, pc, pc + 2, sec):
        return None
    return [FK_SQSUM, 2, x, r]


def _sub_then_sum(instrs, specs, flow: Flow, pc: int, sec, row_form: bool = False) -> list[int] | None:
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


def _apply(instrs, specs, flow: Flow, pc: int, sec) -> list[int] | None:
    """mul y, a, b ; [load w] ; mul y, y, w ; [load c] ; [add y, y, c]  (either operand order)
    -> (FK_APPLY, n, a, b, w source, c source or NO_SRC, y): one of a, b is compact at run time.
    A source is an operand index (>= 0, loaded by the run) or -2 - register (a row vector then)."""
    if not is_op(specs[pc], "ew", "mul"):
        return None
    y, a, b = (int(v) for v in instrs[pc, 1:4])
    if a in flow.constants or b in flow.constants:   # a constant, not a row's scale
        return None
    loaded: dict[int, int] = {}     # register -> the operand the run loaded into it
    written = {y}                   # registers a stage of the run wrote
    targets: set[int] = set()       # registers the run loaded into
    srcs: list[int] = []
    end = pc + 1
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
    return [FK_APPLY, end - pc, a, b, srcs[0], srcs[1] if len(srcs) > 1 else NO_SRC, y]


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
    NO_LOAD, swap | uswap | zdead | (c + 1) << UNBIN_C_SHIFT) for U in FUSED_UN (c = -1) or U =
    `op t, x, c` (or `op t, c, x`: uswap) with op in FUSED_BIN, c set by the prologue (a constant:
    a scaling before a sum, an optimizer's `b * 0.9 + g`) and x not row-level, B in FUSED_BIN, when
    t is dead after the run and feeds one side of B only, z not the prologue's (jit/fused/unbin).
    zdead: z is loaded by the run and dead after it (its rows may be read where they lie). A
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
    if c >= 0 and any(find(instrs, specs, flow, k, sec) for find in _TILE_RUNS if find is not _un_then_bin):
        return None
    zdead = load is not None and (z == y or flow.dead_after(z, pc, k + 1, sec))
    return [FK_UNBIN, k + 1 - pc, x, t, z, y, load[1] if load else NO_LOAD,
            (UNBIN_SWAP if a != t else 0) | uswap | (UNBIN_ZDEAD if zdead else 0) | (c + 1) << UNBIN_C_SHIFT]


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
    return [*run[:1], run[1] + 1, *run[2:7], run[7] | (ox + 1) << UNBIN_X_SHIFT]


def without_x_load(run: list[int]) -> list[int]:
    """A _load_un_then_bin run as _un_then_bin planned it, one instruction after x's load."""
    return [run[0], run[1] - 1, *run[2:7], run[7] & ((1 << UNBIN_X_SHIFT) - 1)]


def _scalar_chain(instrs, specs, flow: Flow, q: int, sec, full: set[int]) -> int:
    """The end of the run of SCALAR_CHAIN_OPS from q that reads none of the registers `full` and
    writes none of them (a norm's chain of compact ops between its sums and its scale)."""
    while (q < sec[1] and is_op(specs[q], "ew") and specs[q].op in SCALAR_CHAIN_OPS
           and not (flow.reads[q] | flow.writes[q]) & full):
        q += 1
    return q


def _residual(instrs, specs, flow: Flow, pc: int, sec) -> tuple[int, int] | None:
    """load a, oa ; load b, ob ; add x, a, b, then up to ROWNORM_MAX_TERMS - 2 of
    load c, oc ; add x', x, c (each add's operands in either order): a residual sum of loaded
    terms, the row a norm then takes. Each term and partial sum is read by nothing after the add
    that takes it (but as that add's result), and a term's load leaves the partial sum alone.
    -> (the sum's register, the pc after it)."""
    if pc + 3 > sec[1] or not (is_op(specs[pc], "load") and is_op(specs[pc + 1], "load")):
        return None
    x = _sum_step(instrs, specs, flow, pc + 2, sec, int(instrs[pc, 1]), int(instrs[pc + 1, 1]))
    if x is None:
        return None
    q, terms = pc + 3, 2
    while terms < ROWNORM_MAX_TERMS and q + 2 <= sec[1] and is_op(specs[q], "load"):
        y = _sum_step(instrs, specs, flow, q + 1, sec, x, int(instrs[q, 1]))
        if y is None:
            break
        x, q, terms = y, q + 2, terms + 1
    return x, q


def _sum_step(instrs, specs, flow: Flow, pc: int, sec, a: int, b: int) -> int | None:
    """Instruction pc is `add x, a, b` (either order) of two distinct registers, neither read after
    it but as x -> x."""
    if not is_op(specs[pc], "ew", "add"):
        return None
    x, u, v = (int(w) for w in instrs[pc, 1:4])
    if a == b or {u, v} != {a, b}:
        return None
    if any(r != x and not flow.dead_after(r, pc, pc + 1, sec) for r in (a, b)):
        return None
    return x


def _row_norm(instrs, specs, flow: Flow, pc: int, sec) -> list[int] | None:
    """load x, o ; rowred.sum s1, x ; chain A ; an FK_CSQSUM run of x and m   (LayerNorm)
       load x, o ; an FK_SQSUM run of x                                     (RMSNorm)
    then chain B ; an FK_APPLY run of (d or x) and rs ; store y
    -> (FK_ROWNORM, n, o, pc of the CSQSUM run or -1, pc of the FK_APPLY run, rs, w and b sources
    as FK_APPLY's) when m and rs are the chains' results (or the sums themselves) and the run is
    self-contained. Chains: compact ops only (_scalar_chain), replayed per row by jit/fused/rows.
    A residual sum (_residual: loads and adds) may stand for `load x, o`, its row stored or
    not by `store x` right after `store y`: then the field o is -1 - the offset of that store in
    the run (0: not stored)."""
    if not is_op(specs[pc], "load"):
        return None
    x, q = int(instrs[pc, 1]), pc + 1
    res = _residual(instrs, specs, flow, pc, sec)
    if res is not None:
        x, q = res
    if q < sec[1] and is_op(specs[q], "rowred", "sum") and int(instrs[q, 2]) == x and int(instrs[q, 1]) != x:
        cpc = _scalar_chain(instrs, specs, flow, q + 1, sec, {x})
        run = _sub_then_sum(instrs, specs, flow, cpc, sec, row_form=True)
        if run is None or run[0] != FK_CSQSUM or run[2] != x:
            return None
        m, src, s2 = run[3], run[4], run[6]
        if m not in writes_in(flow, q, cpc):
            return None
        q = cpc + 3
    else:
        run = _sqsum(instrs, specs, flow, q, sec)
        if run is None or run[2] != x:
            return None
        cpc, src, s2 = -1, x, run[3]
        q += 2
    apc = _scalar_chain(instrs, specs, flow, q, sec, {src})
    app = _apply(instrs, specs, flow, apc, sec)
    if app is None or src not in app[2:4] or app[2] == app[3]:
        return None
    rs = app[3] if app[2] == src else app[2]
    end = apc + app[1]
    if rs != s2 and rs not in writes_in(flow, q, apc):
        return None
    if end >= sec[1] or not is_op(specs[end], "store") or int(instrs[end, 1]) != app[6]:
        return None
    o = int(instrs[pc, 2])
    if res is not None:
        stored = end + 1 < sec[1] and is_op(specs[end + 1], "store") and int(instrs[end + 1, 1]) == x
        o = -1 - (end + 1 - pc) if stored else -1
        end += stored
    if not self_contained(flow, pc, end, sec):
        return None
    return [FK_ROWNORM, end + 1 - pc, o, cpc, apc, rs, app[4], app[5]]


def _row_softmax(instrs, specs, flow: Flow, pc: int, sec) -> list[int] | None:
    """load x, o ; rowred.max m, x ; an FK_EXPSUM run of x and m (e, s) ; chain ;
    mul y, e, r (either order) or div y, e, r ; store y
    -> (FK_ROWSOFTMAX, n, o, pc of the mul or div, r) when r is the chain's result or s, and the
    run is self-contained (_self_contained)."""
    if pc + 6 > sec[1] or not (is_op(specs[pc], "load") and is_op(specs[pc + 1], "rowred", "max")):
        return None
    x, m = int(instrs[pc, 1]), int(instrs[pc + 1, 1])
    run = _sub_then_sum(instrs, specs, flow, pc + 2, sec)
    if m == x or int(instrs[pc + 1, 2]) != x or run is None or run[0] != FK_EXPSUM or run[2:4] != [x, m]:
        return None
    e, s = run[4], run[6]
    fpc = _scalar_chain(instrs, specs, flow, pc + 5, sec, {e})
    if fpc + 1 >= sec[1] or not (is_op(specs[fpc], "ew", "mul") or is_op(specs[fpc], "ew", "div")):
        return None
    y, a, b = (int(v) for v in instrs[fpc, 1:4])
    r = b if a == e else (a if b == e and specs[fpc].op == "mul" else -1)
    if r in (-1, e) or (r != s and r not in writes_in(flow, pc + 5, fpc)):
        return None
    if not is_op(specs[fpc + 1], "store") or int(instrs[fpc + 1, 1]) != y or not self_contained(flow, pc, fpc + 1, sec):
        return None
    return [FK_ROWSOFTMAX, fpc + 2 - pc, int(instrs[pc, 2]), fpc, r]


# the runs tried at each pc, in this order (the first that matches is planned)
_TILE_RUNS = (_sub_then_sum, _sqsum, _apply, _load_then_reduce, _centered_squares_acc, _load_un_then_bin, _un_then_bin,
              _add_then_sum)


def fuse_plan(instrs: np.ndarray, sections: list[tuple[int, int]]) -> np.ndarray:
    plan = np.zeros((len(instrs), FUSE_WIDTH), np.int64)
    plan[:, 0] = FK_NONE
    specs = [isa.BY_CODE.get(int(r[0])) for r in instrs]
    if any(sp is None for sp in specs):
        return plan
    flow = Flow(instrs, specs, sections)
    for sec in sections:
        pc = sec[0]
        while pc < sec[1]:
            norm = _row_norm(instrs, specs, flow, pc, sec) or _row_softmax(instrs, specs, flow, pc, sec)
            if norm:   # the runs inside it are planned as well, for tiles it cannot take
                plan[pc, :len(norm)] = norm
                pc += 1
                continue
            rot = rotary(instrs, specs, flow, pc, sec)
            if rot:    # (no tile run inside it would take a tile: its products' operands are full)
                plan[pc, :len(rot)] = rot
                pc += rot[1]
                continue
            found = next(filter(None, (find(instrs, specs, flow, pc, sec) for find in _TILE_RUNS)), None)
            if found:
                plan[pc, :len(found)] = found
                if found[0] == FK_UNBIN and found[7] >> UNBIN_X_SHIFT:   # the run after the load as
                    plan[pc + 1, :len(found)] = without_x_load(found)        # well, for tiles whose x
                    #                                                          it cannot read in place
                pc += found[1]
            else:
                pc += 1
    return plan


def whole_row_forms(instrs: np.ndarray, sections: list[tuple[int, int]]) -> bool:
    """Every instruction but the prologue's constants lies in a row form (FK_ROWNORM,
    FK_ROWSOFTMAX): a tile these take is never held in registers, each row is read from its buffer
    and written to the output's, so its width is not bounded by the caches (the encoder's
    WIDE_ROW_COLS: rows wider than a cache-resident tile still take the single-tile stream)."""
    plan = fuse_plan(instrs, sections)
    for s, e in sections:
        pc = s
        while pc < e:
            if plan[pc, 0] in (FK_ROWNORM, FK_ROWSOFTMAX):
                pc += int(plan[pc, 1])
            elif isa.BY_CODE[int(instrs[pc, 0])].group == "const":
                pc += 1
            else:
                return False
    return True
