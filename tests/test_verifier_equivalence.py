"""The verifier's fast stream checks (array expressions for the static checks, one specialized
pass for the register dataflow) give exactly the verdict of the plain form: every instruction
checked one at a time, in order, with the straightforward dataflow below. Compared on mutants of
the fuzz corpus (rule, instruction and kernel of the first error, or acceptance)."""
from __future__ import annotations

import functools

import numpy as np
import pytest

import dvm
from dvm.codegen import isa, verifier_stream
from dvm.codegen.program import MAX_REGS
from dvm.errors import VerifyError
from dvm.tools.fuzz_corpus import build_corpus
from dvm.tools.fuzz_mutate import mutate

MUTANTS = 3000

pytestmark = pytest.mark.vm_once


def _plain_static(stream, sec, args):
    for i in range(len(stream.instrs)):
        try:
            verifier_stream._check_instruction(stream, i, sec, args, -1)
        except VerifyError:
            return i
    return len(stream.instrs)


def _plain_dataflow(rows, ranges, regs, k):
    """The dataflow check in its plain form (the verifier's before the specialized pass)."""
    UNDEF, KEEP, LOCAL = 0, 1, 2
    state = [UNDEF] * (len(isa.BANKS) * MAX_REGS)
    from_prologue, rowloop_reads = set(), set()
    for sec, s, e in ranges:
        outer_reads = set()
        for i in range(s, min(e, len(rows))):
            row = rows[i]
            dsts, srcs, accs = regs[row[0]]
            d = [b + row[f] for f, b in dsts]
            src = [b + row[f] for f, b in srcs]
            m = [b + row[f] for f, b in accs]
            writes = d + m
            if len(set(writes)) != len(writes) or set(writes) & set(src):
                raise VerifyError("dst_alias", "", i, k)
            for g in src + m:
                if state[g] == UNDEF:
                    raise VerifyError("read_before_write", "", i, k)
                if sec == verifier_stream.SEC_B and state[g] == KEEP:
                    outer_reads.add(g)
                if sec != verifier_stream.SEC_P and g in from_prologue:
                    rowloop_reads.add(g)
            for g in m:
                if sec != verifier_stream.SEC_B or state[g] != KEEP:
                    raise VerifyError("read_before_write", "", i, k)
            for g in d:
                if sec == verifier_stream.SEC_B and g in outer_reads:
                    raise VerifyError("loop_carried", "", i, k)
                if sec != verifier_stream.SEC_P and g in rowloop_reads:
                    raise VerifyError("loop_carried", "", i, k)
                state[g] = LOCAL if sec == verifier_stream.SEC_B else KEEP
                (from_prologue.add if sec == verifier_stream.SEC_P else from_prologue.discard)(g)
        if sec == verifier_stream.SEC_B:
            state = [UNDEF if st == LOCAL else st for st in state]


def _verdict(words):
    verifier_stream.STREAMS.clear()
    try:
        dvm.verify(dvm.Program(words))
    except VerifyError as e:
        return e.rule, e.index, e.kernel
    return "accepted"


@functools.lru_cache(maxsize=1)
def _mutants():
    corpus = build_corpus()
    out = []
    for m in range(MUTANTS):
        rng = np.random.default_rng([99, m])
        out.append(mutate(rng, corpus[m % len(corpus)].program.words, corpus)[0])
    return out


def test_fast_and_plain_stream_checks_agree(monkeypatch):
    fast = [_verdict(w) for w in _mutants()]
    monkeypatch.setattr(verifier_stream, "_first_static_fault", _plain_static)
    monkeypatch.setattr(verifier_stream, "check_dataflow", _plain_dataflow)
    plain = [_verdict(w) for w in _mutants()]
    diffs = [(i, f, p) for i, (f, p) in enumerate(zip(fast, plain)) if f != p]
    assert not diffs, diffs[:10]
    rules = {v[0] for v in fast if v != "accepted"}
    # the comparison reaches the stream rules (not only header and length errors)
    assert {"opcode", "register", "read_before_write", "dst_alias", "unused_field"} <= rules, rules
