"""Mutation fuzzing of Programs: every mutant of a valid program is either rejected with
dvm.VerifyError (by dvm.verify or dvm.execute) or runs to completion on the VM under test (conftest runs it on both VMs),
touching nothing outside the buffers it was given.

Accepted exceptions besides VerifyError: ZeroDivisionError, only from a mutant that contains an
integer-bank division instruction (floor_divide.i64 / remainder.i64): integer division by zero is
an error in PyTorch too, and the reference VM raises it from the op table's reference semantics.
Observed: besides the int32 program, float programs with i64 registers (argmax's index
accumulators) reach it when a mutation turns an i64 instruction into floor_divide.i64.
Anything else (IndexError, ValueError, TypeError, KeyError, a hang, a write into a guard region)
is a DVM bug.
"""
from __future__ import annotations

import signal
from dataclasses import dataclass

import numpy as np
import pytest

import dvm
from dvm.frontend.library import layernorm, softmax
from dvm.codegen import isa
from dvm.codegen.verifier import check_buffers
from dvm.codegen.program import (ARG_IN, ARG_WORDS, CONST_WORDS, HEADER_WORDS, KHEAD_WORDS,
                                 KTABLE_WORDS, OPND_FIXED_WORDS, SWEEP_WORDS)
from dvm.graph.dtypes import DType
from dvm.codegen import encoder


@pytest.fixture(autouse=True)
def _multi_sweep_programs(monkeypatch):
    """This module pins the multi-sweep stream (its corpus and goldens index into it); the
    single-tile stream has its own tests in test_single_tile.py."""
    monkeypatch.setattr(encoder, "SINGLE_TILE_COLS", 0)


SEED = 20240611
MUTANTS_PER_PROGRAM = 1000
GUARD = 37                  # guard elements on each side of every buffer
MAX_BUFFER = 1 << 20        # mutants that need bigger buffers are verified but not run
MAX_TILE_STEPS = 40000      # ... and so are mutants whose domain would take this many tile steps
RUN_TIMEOUT_S = 5
INT_DIV = {isa.opcode("floor_divide.i64"), isa.opcode("remainder.i64")}


# ---------------------------------------------------------------------------------------------
# Programs


@dvm.kernel
def ew_chain(k, x, b):
    x = k.load(x)
    y = k.gelu(k.add(x, k.load(b)))
    return k.store(k.sub(k.mul(y, 2.0), k.where(k.gt(x, 0.0), x, 0.5)))


@dvm.kernel
def argmax0(k, x):
    return k.store(k.argmax(k.load(x), axis=0))


@dvm.kernel
def int32_ops(k, a, b):
    a, b = k.load(a), k.load(b)
    i = k.iota(a.shape, 1)
    return k.store(k.add(k.floor_divide(a, b), k.mul(i, 3)))


@dvm.kernel
def multi_out(k, x):
    x = k.load(x)
    return k.store(k.exp(x)), k.store(k.add(x, 1.0)), k.store(k.max(x, axis=-1))


@dvm.kernel
def two_sums(k, x):
    x = k.load(x)
    return k.store(k.sum(x, axis=0)), k.store(k.sum(x, axis=1))


def _rng_inputs(seed, *specs):
    rng = np.random.default_rng(seed)
    out = []
    for shape, dt in specs:
        if np.dtype(dt).kind == "f":
            out.append(rng.standard_normal(shape).astype(dt))
        else:
            out.append(rng.integers(-5, 6, shape).astype(dt))   # includes zeros: division by zero
    return out


PROGRAMS = {
    "softmax": (softmax, lambda: _rng_inputs(1, ((3, 5), np.float32))),
    "layernorm": (layernorm, lambda: _rng_inputs(2, ((4, 8), np.float32), ((8,), np.float32), ((8,), np.float32))),
    "ew_chain": (ew_chain, lambda: _rng_inputs(3, ((4, 6), np.float32), ((6,), np.float32))),
    "argmax0": (argmax0, lambda: _rng_inputs(4, ((6, 4), np.float32))),
    "int32_ops": (int32_ops, lambda: _rng_inputs(5, ((3, 4), np.int32), ((3, 4), np.int32))),
    "multi_out": (multi_out, lambda: _rng_inputs(6, ((3, 7), np.float64))),
    "two_sums": (two_sums, lambda: _rng_inputs(7, ((3, 5), np.float32))),
    "wide_softmax": (softmax, lambda: _rng_inputs(8, ((2, 4100), np.float32))),  # 2 column tiles
}


def test_fuzz_corpus_shapes():
    """The corpus really contains what the fuzz test claims: several kernels, several outputs,
    integer code, column sweeps over more than one tile."""
    progs = {n: fn.program(*make()) for n, (fn, make) in PROGRAMS.items()}
    assert len(dvm.verify(progs["two_sums"]).kernels) > 1
    assert sum(a.role != ARG_IN for a in dvm.verify(progs["multi_out"]).args) >= 3
    assert "floor_divide.i64" in dvm.disasm(progs["int32_ops"])
    wl = dvm.verify(progs["wide_softmax"]).kernels[0]
    assert wl.cols > wl.bn


# ---------------------------------------------------------------------------------------------
# Layout (same word layout as documented in dvm/codegen/program.py)


def _layout(w) -> dict:
    w = [int(x) for x in w]
    pos = HEADER_WORDS + ARG_WORDS * w[3]
    kt = [pos + KTABLE_WORDS * k for k in range(w[4])]
    kernels = []
    for t in kt:
        off = w[t]
        nr, nc, _, _, n_opnd, n_const, n_instr, n_sweeps = w[off:off + 8]
        nd = nr + nc
        p = off + KHEAD_WORDS
        dims = list(range(p, p + nd))
        p += nd + 2 + SWEEP_WORDS * n_sweeps
        opnds = [p + (OPND_FIXED_WORDS + nd) * j for j in range(n_opnd)]
        p += (OPND_FIXED_WORDS + nd) * n_opnd + CONST_WORDS * n_const
        instrs = [p + isa.WORDS * i for i in range(n_instr)]
        kernels.append({"off": off, "nd": nd, "dims": dims, "opnd": opnds, "instr": instrs})
    return {"args": [HEADER_WORDS + ARG_WORDS * a for a in range(w[3])], "kernels": kernels}


# ---------------------------------------------------------------------------------------------
# Mutations


def m_bitflip(rng, w, L):
    u = w.view(np.uint64)
    for _ in range(int(rng.integers(1, 4))):
        i = int(rng.integers(len(w)))
        u[i] ^= np.uint64(1) << np.uint64(int(rng.integers(64)))
    return w, "bitflip"


def m_truncate(rng, w, L):
    n = int(rng.integers(0, len(w)))
    w = w[:n].copy()
    if rng.random() < 0.5 and n > 2:
        w[2] = n
    return w, f"truncate to {n}"


def m_append(rng, w, L):
    extra = rng.integers(-3, 200, int(rng.integers(1, 13)))
    w = np.concatenate([w, extra.astype(np.int64)])
    if rng.random() < 0.7 and len(w) > 2:
        w[2] = len(w)
    return w, f"append {len(extra)}"


def _pick_kernel(rng, L):
    return L["kernels"][int(rng.integers(len(L["kernels"])))]


def m_swap_instr(rng, w, L):
    k = _pick_kernel(rng, L)
    if len(k["instr"]) < 2:
        return w, "noop"
    a, b = rng.choice(len(k["instr"]), 2, replace=False)
    oa, ob = k["instr"][a], k["instr"][b]
    ra, rb = w[oa:oa + isa.WORDS].copy(), w[ob:ob + isa.WORDS].copy()
    w[oa:oa + isa.WORDS], w[ob:ob + isa.WORDS] = rb, ra
    return w, f"swap instr {a},{b}"


def m_opcode(rng, w, L):
    k = _pick_kernel(rng, L)
    i = int(rng.integers(len(k["instr"])))
    w[k["instr"][i]] = int(rng.integers(1, isa.MAX_OPCODE + 1))
    return w, f"opcode of {i} -> {int(w[k['instr'][i]])}"


def m_similar_opcode(rng, w, L):
    """Replace an opcode with another of the same field signature (more likely to pass)."""
    k = _pick_kernel(rng, L)
    i = int(rng.integers(len(k["instr"])))
    spec = isa.BY_CODE.get(int(w[k["instr"][i]]))
    if spec is None:
        return w, "noop"
    same = [s.code for s in isa.ISA if [f.role for f in s.fields] == [f.role for f in spec.fields]]
    w[k["instr"][i]] = int(rng.choice(same))
    return w, f"opcode of {i} -> {isa.BY_CODE[int(w[k['instr'][i]])].name}"


def m_field(rng, w, L):
    k = _pick_kernel(rng, L)
    i = int(rng.integers(len(k["instr"])))
    f = int(rng.integers(1, isa.WORDS))
    w[k["instr"][i] + f] = int(rng.integers(-1, 9))
    return w, f"instr {i} field {f} -> {int(w[k['instr'][i] + f])}"


def m_operand(rng, w, L):
    k = _pick_kernel(rng, L)
    if not k["opnd"]:
        return w, "noop"
    j = int(rng.integers(len(k["opnd"])))
    f = int(rng.integers(0, OPND_FIXED_WORDS + k["nd"]))
    choices = [-1, 0, 1, 2, 3, 5, 7, 8, 15, 4096, -4096, int(rng.integers(-30, 30))]
    w[k["opnd"][j] + f] = int(rng.choice(choices))
    return w, f"operand {j} word {f} -> {int(w[k['opnd'][j] + f])}"


def m_dims(rng, w, L):
    k = _pick_kernel(rng, L)
    if not k["dims"]:
        return w, "noop"
    d = int(rng.integers(len(k["dims"])))
    w[k["dims"][d]] = int(rng.choice([0, 1, 2, 3, 4, 6, 9, 17, 4097, int(w[k["dims"][d]]) * 2]))
    return w, f"dim {d} -> {int(w[k['dims'][d]])}"


def m_kernel_header(rng, w, L):
    k = _pick_kernel(rng, L)
    h = int(rng.integers(KHEAD_WORDS))
    old = int(w[k["off"] + h])
    w[k["off"] + h] = int(rng.choice([0, 1, 2, old - 1, old + 1, old * 2, 8, 64, 4096]))
    return w, f"kernel head {h}: {old} -> {int(w[k['off'] + h])}"


def m_args(rng, w, L):
    if not L["args"]:
        return w, "noop"
    a = int(rng.integers(len(L["args"])))
    f = int(rng.integers(ARG_WORDS))
    w[L["args"][a] + f] = int(rng.integers(-1, 40))
    return w, f"arg {a} word {f} -> {int(w[L['args'][a] + f])}"


def m_small_word(rng, w, L):
    i = int(rng.integers(len(w)))
    w[i] = int(rng.integers(-2, 12))
    return w, f"word {i} -> {int(w[i])}"


MUTATIONS = [m_bitflip, m_truncate, m_append, m_swap_instr, m_opcode, m_similar_opcode, m_field,
             m_field, m_operand, m_operand, m_dims, m_kernel_header, m_args, m_small_word]


def mutate(rng, words, L):
    """One to three mutations; `L` is the layout of the unmutated words (word-level mutations
    are used once the length has changed)."""
    w = np.array(words, np.int64)
    descs = []
    for _ in range(int(rng.choice([1, 1, 1, 2, 3]))):
        if len(w) == 0:
            break
        fn = MUTATIONS[int(rng.integers(len(MUTATIONS)))]
        if len(w) != len(words) and fn not in (m_bitflip, m_truncate, m_append, m_small_word):
            fn = m_small_word
        w, d = fn(rng, w, L)
        descs.append(d)
    return w, "; ".join(descs)


# ---------------------------------------------------------------------------------------------
# Running a mutant with guarded buffers


class _Timeout(Exception):
    pass


def _alarm(signum, frame):
    raise _Timeout()


@dataclass
class Guarded:
    full: np.ndarray
    n: int
    pattern: bytes

    @property
    def view(self) -> np.ndarray:
        return self.full[GUARD:GUARD + self.n]

    def guards_intact(self) -> bool:
        b = self.full.view(np.uint8)
        item = self.full.itemsize
        return bytes(b[:GUARD * item]) + bytes(b[(GUARD + self.n) * item:]) == self.pattern


def _guarded(rng, n, dtype, fill=None, writeable=True) -> Guarded:
    full = np.empty(n + 2 * GUARD, dtype)
    raw = full.view(np.uint8)
    raw[:] = rng.integers(0, 256, raw.size, dtype=np.uint8)
    if fill is not None:
        full[GUARD:GUARD + n] = fill
    item = full.itemsize
    pattern = bytes(raw[:GUARD * item]) + bytes(raw[(GUARD + n) * item:])
    g = Guarded(full, n, pattern)
    if not writeable:
        full.flags.writeable = False
    return g


def _tile_steps(layout) -> int:
    steps = 0
    for kl in layout.kernels:
        rows, cols = max(kl.rows, 0), max(kl.cols, 0)
        steps += -(-rows // kl.bm) * len(kl.sweeps) * (1 + -(-cols // kl.bn))
    return steps


def run_mutant(words, inputs, rng):
    """Returns (outcome, detail). outcome: 'rejected', 'ran', 'skipped', 'zerodiv' or 'BUG'."""
    prog = dvm.Program(words)
    try:
        layout = dvm.verify(prog)
    except dvm.VerifyError:
        return "rejected", None
    except Exception as e:  # noqa: BLE001 - any other exception is the bug we look for
        return "BUG", f"verify raised {type(e).__name__}: {e}"
    try:
        dvm.disasm(prog)
    except Exception as e:  # noqa: BLE001
        return "BUG", f"disasm of a verified program raised {type(e).__name__}: {e}"
    bufs = []
    for a, info in enumerate(layout.args):
        dt = DType(info.dtype).np_dtype
        if info.role == ARG_IN:
            if a < len(inputs) and inputs[a].dtype == dt:
                bufs.append(_guarded(rng, inputs[a].size, dt, inputs[a].reshape(-1), writeable=False))
            else:   # the mutant changed the input's dtype: give it data of its dtype, same size
                n = inputs[a].size if a < len(inputs) else 16
                bufs.append(_guarded(rng, n, dt, np.ones(n, dt), writeable=False))
        else:
            n = info.numel
            if n > MAX_BUFFER:   # a mutated, huge numel: the touched extent is what must fit
                ext = layout.extents[a]
                n = 0 if ext is None else ext[1] + 1
                if n > MAX_BUFFER:
                    return "skipped", "output too large"
            bufs.append(_guarded(rng, n, dt, np.zeros(n, dt)))
    try:
        check_buffers(layout, [b.view for b in bufs])
    except dvm.VerifyError:
        return "rejected", None
    except Exception as e:  # noqa: BLE001
        return "BUG", f"check_buffers raised {type(e).__name__}: {e}"
    if _tile_steps(layout) > MAX_TILE_STEPS:
        # accepted, but the domain is huge (operands broadcast over it): too slow to run here
        return "skipped", "domain too large to run"
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(RUN_TIMEOUT_S)
    try:
        dvm.execute(prog, [b.view for b in bufs])
        outcome, detail = "ran", None
    except dvm.VerifyError:
        outcome, detail = "rejected", None
    except ZeroDivisionError as e:
        codes = {int(c) for kl in layout.kernels for c in kl.instrs[:, 0]}
        if codes & INT_DIV:
            outcome, detail = "zerodiv", None
        else:
            outcome, detail = "BUG", f"ZeroDivisionError without integer division: {e}"
    except _Timeout:
        outcome, detail = "BUG", f"did not finish within {RUN_TIMEOUT_S}s"
    except Exception as e:  # noqa: BLE001
        outcome, detail = "BUG", f"execute raised {type(e).__name__}: {e}"
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    if outcome in ("ran", "zerodiv"):
        for a, b in enumerate(bufs):
            if not b.guards_intact():
                return "BUG", f"buffer {a} was written outside its slice"
    return outcome, detail


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_mutants_are_rejected_or_run_safely(name):
    fn, make = PROGRAMS[name]
    inputs = make()
    base = fn.program(*inputs)
    # the unmutated program runs and the guards hold (sanity check of the harness)
    rng = np.random.default_rng([SEED, len(name)])
    assert run_mutant(base.words, inputs, rng) == ("ran", None)
    rng = np.random.default_rng([SEED, sum(map(ord, name))])
    layout = _layout(base.words)
    counts: dict[str, int] = {}
    bugs = []
    for m in range(MUTANTS_PER_PROGRAM):
        words, desc = mutate(rng, base.words, layout)
        outcome, detail = run_mutant(words, inputs, rng)
        counts[outcome] = counts.get(outcome, 0) + 1
        if outcome == "BUG":
            bugs.append(f"mutant {m} ({desc}): {detail}")
    print(name, counts)
    assert not bugs, f"{len(bugs)} bad mutants of {name}:\n" + "\n".join(bugs[:10])
    # the fuzzer is not vacuous: some mutants pass verification and run, most are rejected
    assert counts.get("rejected", 0) > MUTANTS_PER_PROGRAM // 4
    assert counts.get("ran", 0) + counts.get("zerodiv", 0) > 0


def test_zero_division_is_the_only_int_runtime_error():
    """Documented behaviour: an integer division by zero in the data raises ZeroDivisionError
    (as PyTorch does) from the reference VM; float division by zero gives inf/nan."""
    a = np.array([[1, 2, 3, 4]] * 3, np.int32)
    b = np.array([[1, 0, 1, 1]] * 3, np.int32)
    with pytest.raises(ZeroDivisionError):
        int32_ops(a, b)
    out = ew_chain(np.zeros((4, 6), np.float32), np.zeros(6, np.float32))
    assert out.shape == (4, 6)
