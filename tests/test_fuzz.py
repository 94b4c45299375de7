"""Mutation fuzzing of Programs, in this process, on the VM under test (conftest runs both): every
mutant of a valid Program is either rejected with dvm.VerifyError (by dvm.verify or before running)
or runs to completion touching nothing outside its buffers (canary bytes around each), with the
machinery of `dvm fuzz programs` (dvm/tools/fuzz_corpus, fuzz_mutate, fuzz_run; the command runs
the VMs in worker processes, compares them with each other and counts crashes: tests/test_fuzz_cli.py).

Accepted exceptions besides VerifyError: ZeroDivisionError, only from a mutant with an integer
division instruction (floor_divide.i64 / remainder.i64): integer division by zero is an error in
PyTorch too. Anything else (IndexError, ValueError, a write into a canary) is a DVM bug.
"""
from __future__ import annotations

import functools

import numpy as np
import pytest

import dvm
from dvm.codegen.program import ARG_IN
from dvm.tools import fuzz_run
from dvm.tools.fuzz_corpus import SEEDS, build_corpus
from dvm.tools.fuzz_mutate import mutate

SEED = 20240611
MUTANTS_PER_PROGRAM = 500


@functools.lru_cache(maxsize=1)
def corpus():
    return build_corpus()


def _seed(name):
    return next(s for s in corpus() if s.name == name)


def test_fuzz_corpus_shapes():
    """The corpus really contains what the fuzzer claims: several kernels joined by a workspace,
    several outputs, integer code, column sweeps over more than one tile, a long stream."""
    layouts = {s.name: dvm.verify(s.program) for s in corpus()}
    assert len(layouts["two_sums"].kernels) > 1
    assert any(a.role == 2 for a in layouts["centered"].args)   # ARG_WS
    assert sum(a.role != ARG_IN for a in layouts["multi_out"].args) >= 3
    assert "floor_divide.i64" in dvm.disasm(_seed("int32_ops").program)
    wl = layouts["wide_softmax"].kernels[0]
    assert wl.cols > wl.bn
    assert 3000 < len(_seed("long_chain").program.words) < 4096


@pytest.mark.parametrize("name", list(SEEDS))
def test_mutants_are_rejected_or_run_safely(name, vm):
    seed = _seed(name)
    rng = np.random.default_rng([SEED, len(name)])
    out = fuzz_run.run_mutant(seed.program.words, seed.inputs, (vm,), rng)   # the harness itself
    assert (out.kind, out.detail) == ("ran", None)
    counts: dict[str, int] = {}
    bugs = []
    for m in range(MUTANTS_PER_PROGRAM):
        rng = np.random.default_rng([SEED, sum(map(ord, name)), m])
        words, desc = mutate(rng, seed.program.words, corpus())
        out = fuzz_run.run_mutant(words, seed.inputs, (vm,), rng)
        counts[out.kind] = counts.get(out.kind, 0) + 1
        if out.kind in fuzz_run.FAILURES:
            bugs.append(f"mutant {m} ({desc}): {out.kind}: {out.detail}")
    print(name, counts)
    assert not bugs, f"{len(bugs)} bad mutants of {name}:\n" + "\n".join(bugs[:10])
    # not vacuous: most mutants are rejected, some pass verification and run
    assert counts.get("rejected", 0) > MUTANTS_PER_PROGRAM // 2
    assert counts.get("ran", 0) + counts.get("zerodiv", 0) + counts.get("skipped", 0) > 0


def test_canaries_catch_a_write_outside_a_buffer():
    """The harness sees a touched canary byte (else a clean fuzz run would prove nothing)."""
    g = fuzz_run.Guarded(np.zeros(4, np.float32), bytes(range(256)) * 2)
    assert g.intact()
    g.raw[fuzz_run.GUARD_BYTES + 4 * 4] ^= 1   # the first byte after the buffer
    assert not g.intact()


@dvm.kernel
def int32_div(k, a, b):
    return k.store(k.floor_divide(k.load(a), k.load(b)))


@dvm.kernel
def f32_div(k, a, b):
    return k.store(k.div(k.load(a), k.load(b)))


def test_zero_division_is_the_only_int_runtime_error():
    """Documented behaviour: an integer division by zero in the data raises ZeroDivisionError
    (as PyTorch does); float division by zero gives inf/nan."""
    a = np.array([[1, 2, 3, 4]] * 3, np.int32)
    b = np.array([[1, 0, 1, 1]] * 3, np.int32)
    with pytest.raises(ZeroDivisionError):
        int32_div(a, b)
    out = f32_div(np.array([1.0, 0.0], np.float32), np.zeros(2, np.float32))
    assert np.isinf(out[0]) and np.isnan(out[1])
