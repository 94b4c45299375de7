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
from ..abi import (CHAIN_OPS, DT_BF16, DT_F16, DT_F32, EW_NAMES, FK_CSQSUM, FK_EXPSUM, FK_NONE, FK_ROWNORM,
                   FK_ROWSOFTMAX, FK_UNBIN, FUSE_WIDTH, NO_CAST, ROWNORM_MAX_TERMS, UNBIN_X_SHIFT)
from .fuse_flow import Flow, is_op, self_contained, writes_in
from .fuse_rotary import rotary
from .fuse_runs import TILE_RUNS, apply_run, rounding_cast, sqsum, sub_then_sum, without_x_load

SCALAR_CHAIN_OPS = {EW_NAMES[op] for op in CHAIN_OPS}   # the row forms replay them on a row's scalars


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
    as FK_APPLY's, pc of x's rounding cast, pc of the FK_APPLY run's) when m and rs are the chains'
    results (or the sums themselves) and the run is self-contained. Chains: compact ops only
    (_scalar_chain), replayed per row by jit/fused/rows. A residual sum (_residual: loads and adds)
    may stand for `load x, o`, its row stored or not by `store x` right after `store y`: then the
    field o is -1 - the offset of that store in the run (0: not stored). Roundings (a 16-bit
    model's, fuse_runs.rounding_cast; NO_CAST where there is none): x's, `cast x, x0, T` right
    after its load or sum (the stored row may be x0 or x), and the FK_APPLY run's."""
    if not is_op(specs[pc], "load"):
        return None
    x, q = int(instrs[pc, 1]), pc + 1
    res = _residual(instrs, specs, flow, pc, sec)
    if res is not None:
        x, q = res
    x0, xcast, kept = x, NO_CAST, set()   # kept: x0 when read after its rounding (by its store)
    rounded = rounding_cast(instrs, specs, q, sec, x)
    if rounded is not None and rounded != x:
        x, xcast, q = rounded, q, q + 1
        kept = set() if flow.dead_after(x0, pc, q, sec) else {x0}
    if q < sec[1] and is_op(specs[q], "rowred", "sum") and int(instrs[q, 2]) == x and int(instrs[q, 1]) != x:
        cpc = _scalar_chain(instrs, specs, flow, q + 1, sec, {x} | kept)
        run = sub_then_sum(instrs, specs, flow, cpc, sec, row_form=True)
        if run is None or run[0] != FK_CSQSUM or run[2] != x:
            return None
        m, src, s2 = run[3], run[4], run[6]
        if m not in writes_in(flow, q, cpc):
            return None
        q = cpc + 3
    else:
        run = sqsum(instrs, specs, flow, q, sec)
        if run is None or run[2] != x:
            return None
        cpc, src, s2 = -1, x, run[3]
        q += 2
    apc = _scalar_chain(instrs, specs, flow, q, sec, {src} | kept)
    app = apply_run(instrs, specs, flow, apc, sec, rounding=True)
    if app is None or src not in app[2:4] or app[2] == app[3] or {-2 - r for r in kept} & set(app[4:6]):
        return None
    rs = app[3] if app[2] == src else app[2]
    end = apc + app[1]
    if rs != s2 and rs not in writes_in(flow, q, apc):
        return None
    if end >= sec[1] or not is_op(specs[end], "store") or int(instrs[end, 1]) != app[6]:
        return None
    o = int(instrs[pc, 2])
    if res is not None:
        stored = end + 1 < sec[1] and is_op(specs[end + 1], "store") and int(instrs[end + 1, 1]) in {x} | kept
        o = -1 - (end + 1 - pc) if stored else -1
        end += stored
    if not self_contained(flow, pc, end, sec):
        return None
    return [FK_ROWNORM, end + 1 - pc, o, cpc, apc, rs, app[4], app[5], xcast, app[7]]


def _row_softmax(instrs, specs, flow: Flow, pc: int, sec) -> list[int] | None:
    """load x, o ; rowred.max m, x ; an FK_EXPSUM run of x and m (e, s) ; chain ;
    mul y, e, r (either order) or div y, e, r ; store y
    -> (FK_ROWSOFTMAX, n, o, pc of the mul or div, r) when r is the chain's result or s, and the
    run is self-contained (_self_contained)."""
    if pc + 6 > sec[1] or not (is_op(specs[pc], "load") and is_op(specs[pc + 1], "rowred", "max")):
        return None
    x, m = int(instrs[pc, 1]), int(instrs[pc + 1, 1])
    run = sub_then_sum(instrs, specs, flow, pc + 2, sec)
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
            found = next(filter(None, (find(instrs, specs, flow, pc, sec) for find in TILE_RUNS)), None)
            if found:
                plan[pc, :len(found)] = found
                if found[0] == FK_UNBIN and found[7] >> UNBIN_X_SHIFT:   # the run after the load as
                    plan[pc + 1, :len(found)] = without_x_load(found)        # well, for tiles whose x
                    #                                                          it cannot read in place
                pc += found[1]
            else:
                pc += 1
    return plan


def _row_reads(instrs: np.ndarray, sections: list[tuple[int, int]]) -> tuple[bool, bool]:
    """(an elementwise instruction or cast reads a value of whole rows: loaded, or computed from
    loaded values; one reads such a value together with one reduced from rows: rowred, rfin, or
    computed from those, as a norm's x - mean or a softmax's exp(x - max)). Instructions in stream
    order; a write ends what the register held. (False, False) where an opcode is unknown."""
    specs = [isa.BY_CODE.get(int(r[0])) for r in instrs]
    if any(sp is None for sp in specs):
        return False, False
    flow, full, reduced, on_rows, rereads = Flow(instrs, specs, sections), set(), set(), False, False
    for s, e in sections:
        for pc in range(s, e):
            group, reads, writes = specs[pc].group, flow.reads[pc], flow.writes[pc]
            computes = group in ("ew", "cast")
            on_full, on_reduced = computes and bool(reads & full), computes and bool(reads & reduced)
            on_rows |= on_full
            rereads |= on_full and on_reduced
            full, reduced = full - writes, reduced - writes
            if group == "load" or on_full:
                full |= writes
            elif group in ("rowred", "rfin") or on_reduced:
                reduced |= writes
    return on_rows, rereads


def tight_rows(instrs: np.ndarray, sections: list[tuple[int, int]], dtypes: list[int]) -> bool:
    """The stream computes on whole rows (_row_reads) and no row form (FK_ROWNORM, FK_ROWSOFTMAX:
    tiles of a power of two, jit/fused/rowchain.rows_fit) is planned in it: its rows may take
    tiles of their width rounded up (codegen's Target.tight_rows), in which those instructions
    compute no lanes past it. A stream that only loads and reduces keeps the power of two: the row
    trees read a power-of-two tile's valid lanes in place (jit/rowtree.rowred_at), another tile's
    through a padded copy."""
    if not _row_reads(instrs, sections)[0]:
        return False
    return not has_row_forms(fuse_plan(instrs, sections))


def has_row_forms(plan: np.ndarray) -> bool:
    """A row form (FK_ROWNORM, FK_ROWSOFTMAX: a norm or softmax run row by row) is in fuse_plan's plan."""
    return bool(np.isin(plan[:, 0], (FK_ROWNORM, FK_ROWSOFTMAX)).any())


def rereads_rows(instrs: np.ndarray, sections: list[tuple[int, int]], dtypes=None) -> bool:
    """The stream reads its rows again after reducing them (_row_reads): codegen's
    Target.rereads_rows; host/stream: such a stream keeps row-major registers."""
    return _row_reads(instrs, sections)[1]


def whole_row_forms(instrs: np.ndarray, sections: list[tuple[int, int]], dtypes: list[int]) -> bool:
    """Every instruction but the prologue's constants lies in a row form (FK_ROWNORM,
    FK_ROWSOFTMAX) that takes operands of these dtypes (by operand index; the norms take 16-bit
    ones, the terms of a sum past its first two of one dtype; the softmax f32 only): a tile these take is
    never held in registers, each row is read from its buffer and written to the output's, so its
    width is not bounded by the caches (the encoder's WIDE_ROW_COLS: rows wider than a
    cache-resident tile still take the single-tile stream)."""
    halves = any(d != DT_F32 for d in dtypes)
    if halves and any(d not in (DT_F32, DT_F16, DT_BF16) for d in dtypes):
        return False
    plan = fuse_plan(instrs, sections)
    for s, e in sections:
        pc = s
        while pc < e:
            if _takes(instrs, plan, pc, dtypes, halves):
                pc += int(plan[pc, 1])
            elif isa.BY_CODE[int(instrs[pc, 0])].group == "const":
                pc += 1
            else:
                return False
    return True


def _takes(instrs: np.ndarray, plan: np.ndarray, pc: int, dtypes: list[int], halves: bool) -> bool:
    """The row form at pc takes any tile of such operands (jit/fused/rows, rownorm)."""
    if plan[pc, 0] == FK_ROWSOFTMAX:
        return not halves
    return plan[pc, 0] == FK_ROWNORM and len({dtypes[int(instrs[q, 2])] for q in _later_terms(instrs, plan, pc)}) <= 1


def _later_terms(instrs: np.ndarray, plan: np.ndarray, pc: int) -> list[int]:
    """The pcs of the loads of an FK_ROWNORM's residual terms past its first two (_residual)."""
    if plan[pc, 2] >= 0:
        return []
    q, loads = pc + 3, []
    while isa.BY_CODE[int(instrs[q, 0])].group == "load":
        loads.append(q)
        q += 2
    return loads
