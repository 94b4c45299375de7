"""The verifier's register dataflow check: one pass over a stream's instructions.

Rules: dst_alias (no destination is also a source or another destination), read_before_write
(every read sees a write that reaches it; an accumulator was initialized in this sweep),
loop_carried (a body overwrites no value it read from outside the body, which the next column
tile would read again; the row-block loop overwrites no prologue value it has read, which the
next row block reads again). Registers are numbered bank * MAX_REGS + index; per opcode, `regs`
gives its (destination, source, accumulator) fields as (word index, bank * MAX_REGS) pairs.
The instructions are statically valid (registers in range, opcodes and sections right).
"""
from __future__ import annotations

from ..errors import VerifyError
from . import isa
from .program import MAX_REGS

SEC_P, SEC_I, SEC_B, SEC_F = 1, 2, 4, 8
UNDEF, KEEP, LOCAL = 0, 1, 2   # never written (or a body-local value gone) / kept across tiles / this tile's


def _reg_name(g: int) -> str:
    return f"{isa.BANKS[g // MAX_REGS].short}:{g % MAX_REGS}"


def _name(row) -> str:
    return isa.BY_CODE[row[0]].name


def _alias(row, dsts, srcs, accs, i: int, k: int) -> None:
    """dst_alias: no destination (or accumulator) is a source or another destination."""
    if len(dsts) == 1 and not accs:   # the common case
        f, b = dsts[0]
        w = b + row[f]
        for f, b in srcs:
            if b + row[f] == w:
                raise VerifyError("dst_alias", f"{_name(row)}: a destination register is also a source", i, k)
        return
    if not dsts and not accs:
        return
    writes = [b + row[f] for f, b in dsts] + [b + row[f] for f, b in accs]
    reads = {b + row[f] for f, b in srcs}
    if len(set(writes)) != len(writes) or reads.intersection(writes):
        raise VerifyError("dst_alias", f"{_name(row)}: a destination register is also a source", i, k)


def _unwritten(row, g: int, i: int, k: int) -> VerifyError:
    return VerifyError("read_before_write", f"{_name(row)} reads {_reg_name(g)} before any write that reaches it", i, k)


def check_dataflow(rows: list, ranges: list, regs: list, k: int) -> None:
    """Check instructions `rows` (lists of words; the stream's first len(rows) instructions)
    over `ranges`, the (section kind, start, end) of every section in order."""
    state = bytearray(len(isa.BANKS) * MAX_REGS)
    from_prologue: set = set()   # registers still holding the value the prologue wrote
    rowloop_reads: set = set()   # ... of which the row-block loop has read
    stop = len(rows)
    for sec, s, e in ranges:
        e = min(e, stop)
        if s < e:
            if sec == SEC_P:
                _prologue(rows, s, e, regs, state, from_prologue, k)
            elif sec == SEC_B:
                _body(rows, s, e, regs, state, from_prologue, rowloop_reads, k)
            else:
                _per_row(rows, s, e, regs, state, from_prologue, rowloop_reads, k)
        if e >= stop:
            return


def _prologue(rows, s, e, regs, state, from_prologue, k) -> None:
    for i in range(s, e):
        row = rows[i]
        dsts, srcs, accs = regs[row[0]]
        _alias(row, dsts, srcs, accs, i, k)
        for f, b in srcs:
            if not state[b + row[f]]:
                raise _unwritten(row, b + row[f], i, k)
        for f, b in dsts:
            g = b + row[f]
            state[g] = KEEP
            from_prologue.add(g)


def _per_row(rows, s, e, regs, state, from_prologue, rowloop_reads, k) -> None:
    """A sweep's init or fin: once per row block."""
    for i in range(s, e):
        row = rows[i]
        dsts, srcs, accs = regs[row[0]]
        _alias(row, dsts, srcs, accs, i, k)
        for f, b in srcs:
            g = b + row[f]
            if not state[g]:
                raise _unwritten(row, g, i, k)
            if g in from_prologue:
                rowloop_reads.add(g)
        for f, b in dsts:
            g = b + row[f]
            if g in rowloop_reads:
                raise VerifyError("loop_carried", f"{_name(row)} overwrites {_reg_name(g)}, a prologue value "
                                                  "the next row block reads again", i, k)
            state[g] = KEEP
            from_prologue.discard(g)


def _body(rows, s, e, regs, state, from_prologue, rowloop_reads, k) -> None:
    """A sweep's body: once per column tile. Values it writes are this tile's (LOCAL) and gone
    after it; values from outside it (KEEP) that it reads must not change inside it."""
    outer_reads: set = set()
    written: list = []
    for i in range(s, e):
        row = rows[i]
        dsts, srcs, accs = regs[row[0]]
        _alias(row, dsts, srcs, accs, i, k)
        for fields in (srcs, accs) if accs else (srcs,):
            for f, b in fields:
                g = b + row[f]
                st = state[g]
                if not st:
                    raise _unwritten(row, g, i, k)
                if st == KEEP:
                    outer_reads.add(g)
                if g in from_prologue:
                    rowloop_reads.add(g)
        for f, b in accs:
            if state[b + row[f]] != KEEP:
                raise VerifyError("read_before_write", f"{_name(row)}: accumulator {_reg_name(b + row[f])} is "
                                                       "not initialized in this sweep", i, k)
        for f, b in dsts:
            g = b + row[f]
            if g in outer_reads:
                raise VerifyError("loop_carried", f"{_name(row)} overwrites {_reg_name(g)}, which this body "
                                                  "read earlier (a value carried across tiles)", i, k)
            if g in rowloop_reads:
                raise VerifyError("loop_carried", f"{_name(row)} overwrites {_reg_name(g)}, a prologue value "
                                                  "the next row block reads again", i, k)
            state[g] = LOCAL
            written.append(g)
            from_prologue.discard(g)
    for g in written:   # body-local values do not survive the body
        if state[g] == LOCAL:
            state[g] = UNDEF
