"""Mutations of valid Programs for `dvm fuzz programs`: blind ones (bit flips, word swaps,
truncation, appended words, splices from other Programs) and ones aimed at the layout (opcodes,
register and operand fields, sizes, strides, offsets, tiles, counts, argument table), with
extreme values (0, -1, int32 and int64 edges, DVM's size limits, tile limits) among them.

`mutant(corpus, seed, index)` is a pure function of its arguments: mutant `index` of a run can be
rebuilt alone (`dvm fuzz programs --replay INDEX`).
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..codegen import isa
from ..codegen.limits import MAX_ELEMS
from ..codegen.program import ARG_WORDS, KHEAD_WORDS, MAX_TILE, OPND_FIXED_WORDS, SWEEP_WORDS
from .fuzz_corpus import Seed, word_layout

EXTREMES = (0, 1, -1, 2, 3, 7, 8, 255, 256, 4096, 65536, MAX_TILE, MAX_TILE + 1, 2**31 - 1, 2**31, -2**31,
            2**32, MAX_ELEMS - 1, MAX_ELEMS, MAX_ELEMS + 1, 2**48, 2**62, 2**63 - 1, -2**63, -2**62)
Mutation = Callable[[np.random.Generator, np.ndarray, dict, list], tuple[np.ndarray, str]]


def _int64(v: int) -> int:
    """v wrapped to int64, as a word holds it."""
    return (v + 2**63) % 2**64 - 2**63


def _extreme(rng, old: int | None = None) -> int:
    if old is not None and rng.random() < 0.3:
        return _int64(int(rng.choice([old - 1, old + 1, old * 2, -old, old // 2])))
    return int(EXTREMES[int(rng.integers(len(EXTREMES)))])


def _kernel(rng, L):
    return L["kernels"][int(rng.integers(len(L["kernels"])))]


def m_bitflip(rng, w, L, corpus):
    u = w.view(np.uint64)
    for _ in range(int(rng.integers(1, 4))):
        i = int(rng.integers(len(w)))
        u[i] ^= np.uint64(1) << np.uint64(int(rng.integers(64)))
    return w, "bitflip"


def m_swap_words(rng, w, L, corpus):
    a, b = (int(x) for x in rng.integers(len(w), size=2))
    w[a], w[b] = w[b], w[a]
    return w, f"swap words {a},{b}"


def m_swap_rows(rng, w, L, corpus):
    """Swap two instructions, two operands or two constants of a kernel."""
    k = _kernel(rng, L)
    part, width = [("instr", isa.WORDS), ("opnd", OPND_FIXED_WORDS + k["nd"]), ("const", 2)][int(rng.integers(3))]
    rows = k[part]
    if len(rows) < 2:
        return w, "noop"
    a, b = rng.choice(len(rows), 2, replace=False)
    ra, rb = w[rows[a]:rows[a] + width].copy(), w[rows[b]:rows[b] + width].copy()
    w[rows[a]:rows[a] + width], w[rows[b]:rows[b] + width] = rb, ra
    return w, f"swap {part} {a},{b}"


def m_truncate(rng, w, L, corpus):
    n = int(rng.integers(0, len(w)))
    return w[:n].copy(), f"truncate to {n}"


def m_append(rng, w, L, corpus):
    extra = rng.integers(-3, 200, int(rng.integers(1, 13))).astype(np.int64)
    return np.concatenate([w, extra]), f"append {len(extra)}"


def m_splice(rng, w, L, corpus):
    """A run of words from another corpus Program, written over or inserted into this one."""
    other = corpus[int(rng.integers(len(corpus)))].program.words
    n = int(rng.integers(1, min(len(other), 64) + 1))
    src = int(rng.integers(len(other) - n + 1))
    dst = int(rng.integers(len(w) + 1))
    piece = np.array(other[src:src + n], np.int64)
    if rng.random() < 0.5:
        end = min(len(w), dst + n)
        w = w.copy()
        w[dst:end] = piece[:end - dst]
        return w, f"splice {n} words over {dst}"
    return np.concatenate([w[:dst], piece, w[dst:]]), f"splice {n} words in at {dst}"


def _instr(rng, L):
    """A random instruction: (its kernel's layout, its index), or None when the kernel has none."""
    k = _kernel(rng, L)
    return (k, int(rng.integers(len(k["instr"])))) if k["instr"] else None


def m_opcode(rng, w, L, corpus):
    pick = _instr(rng, L)
    if pick is None:
        return w, "noop"
    k, i = pick
    spec = isa.BY_CODE.get(int(w[k["instr"][i]]))
    if spec is not None and rng.random() < 0.5:   # same field roles: more likely to pass
        same = [s.code for s in isa.ISA if [f.role for f in s.fields] == [f.role for f in spec.fields]]
        w[k["instr"][i]] = int(rng.choice(same))
    else:
        w[k["instr"][i]] = int(rng.integers(0, isa.MAX_OPCODE + 2))
    return w, f"opcode of {i} -> {int(w[k['instr'][i]])}"


def m_field(rng, w, L, corpus):
    pick = _instr(rng, L)
    if pick is None:
        return w, "noop"
    k, i = pick
    f = int(rng.integers(1, isa.WORDS))
    w[k["instr"][i] + f] = int(rng.integers(-1, 9)) if rng.random() < 0.8 else _extreme(rng)
    return w, f"instr {i} field {f} -> {int(w[k['instr'][i] + f])}"


def m_operand(rng, w, L, corpus):
    k = _kernel(rng, L)
    if not k["opnd"]:
        return w, "noop"
    j = int(rng.integers(len(k["opnd"])))
    f = int(rng.integers(0, OPND_FIXED_WORDS + k["nd"]))
    at = k["opnd"][j] + f
    w[at] = int(rng.integers(-30, 30)) if rng.random() < 0.4 else _extreme(rng, int(w[at]))
    return w, f"operand {j} word {f} -> {int(w[at])}"


def m_size(rng, w, L, corpus):
    """A domain size, or BM / BN, set to an extreme or nearby value."""
    k = _kernel(rng, L)
    spots = k["dims"] + [k["head"] + 2, k["head"] + 3]
    at = spots[int(rng.integers(len(spots)))]
    w[at] = _extreme(rng, int(w[at]))
    return w, f"size word {at} -> {int(w[at])}"


def m_kernel_header(rng, w, L, corpus):
    k = _kernel(rng, L)
    h = int(rng.integers(KHEAD_WORDS))
    old = int(w[k["head"] + h])
    w[k["head"] + h] = _extreme(rng, old) if rng.random() < 0.5 else _int64(int(rng.choice([0, 1, 2, old - 1, old + 1])))
    return w, f"kernel head {h}: {old} -> {int(w[k['head'] + h])}"


def m_sections(rng, w, L, corpus):
    k = _kernel(rng, L)
    spots = [k["prologue"], k["prologue"] + 1] + [s + d for s in k["sweeps"] for d in range(SWEEP_WORDS)]
    at = spots[int(rng.integers(len(spots)))]
    w[at] = _int64(int(w[at]) + int(rng.choice([-2, -1, 1, 2])))
    return w, f"section word {at} -> {int(w[at])}"


def m_args(rng, w, L, corpus):
    if not L["args"]:
        return w, "noop"
    a = int(rng.integers(len(L["args"])))
    f = int(rng.integers(ARG_WORDS))
    at = L["args"][a] + f
    w[at] = int(rng.integers(-1, 9)) if f < 2 else _extreme(rng, int(w[at]))
    return w, f"arg {a} word {f} -> {int(w[at])}"


def m_small_word(rng, w, L, corpus):
    i = int(rng.integers(len(w)))
    w[i] = int(rng.integers(-2, 12))
    return w, f"word {i} -> {int(w[i])}"


BLIND = [m_bitflip, m_swap_words, m_truncate, m_append, m_splice, m_small_word]
AIMED = [m_swap_rows, m_opcode, m_opcode, m_field, m_field, m_operand, m_operand, m_size, m_size,
         m_kernel_header, m_sections, m_args]


def mutate(rng: np.random.Generator, words: np.ndarray, corpus: list[Seed]) -> tuple[np.ndarray, str]:
    """One to three mutations of `words` (aimed ones use its layout and stop once the length
    changed); then, half the time, the header's length word is set to the new length."""
    w = np.array(words, np.int64)
    L = word_layout(words)
    descs = []
    for _ in range(int(rng.choice([1, 1, 1, 2, 3]))):
        if len(w) == 0:
            break
        pool = BLIND if len(w) != len(words) or rng.random() < 0.35 else AIMED
        fn = pool[int(rng.integers(len(pool)))]
        w, d = fn(rng, w, L, corpus)
        descs.append(d)
    if len(w) > 2 and rng.random() < 0.5:
        w[2] = len(w)
    return w, "; ".join(descs)


def mutant(corpus: list[Seed], seed: int, index: int) -> tuple[Seed, np.ndarray, str]:
    """Mutant `index` of the run with this seed: (the Program it came from, its words, what was done)."""
    rng = np.random.default_rng([seed, index])
    base = corpus[int(rng.integers(len(corpus)))]
    w, desc = mutate(rng, base.program.words, corpus)
    return base, w, desc
