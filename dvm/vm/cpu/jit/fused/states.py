"""Register states around a fused row form (jit/fused/rows, jit/fused/rotary)."""
from __future__ import annotations

from numba import njit

from ..bits import OPTS


@njit(inline='always', **OPTS)
def bracket(fp, st, instrs, pc, n, state):
    """Every f32 register the run of n instructions at pc writes (those before its store): dead
    after the run (the plan checked), so they only need consistent states: compact while a row
    form keeps row r's scalars in lane r, a full tile after it."""
    for q in range(pc, pc + n - 1):
        fp[instrs[q, 1]] = 0
        st[0, instrs[q, 1]] = state
