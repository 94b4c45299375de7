"""Elementwise ops over constants, computed while the graph is built (constant folding).

An op whose operands are all numeric constants (0-d, not symbolic) is one constant: its value by
the op table's reference semantics (float64 or bool), rounded to the result dtype, which is what
the reference VM computes instruction by instruction, and the CPU VM too for float32 and bool. A
`where` whose condition is a constant is the operand it selects. Decompositions produce such
chains (`lerp` with a Python weight: `abs(w) >= 0.5` and two `where`s on a 0-d constant, a select
per element otherwise). Only float32, float64 and bool compute dtypes fold: a float16 / bfloat16
kernel keeps its values in float32 between ops (rounding a folded value to the result dtype
would change them), and an integer op's division by zero raises when it runs, as PyTorch's.
A folded value stands for a 0-d tensor, so it is never weak: it promotes as the op's result
would.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from .dtypes import DType, round_to_dtype
from .node import Node
from .ops import OP_TABLE
from .symbolic import SymExpr

FOLDED_DTYPES = frozenset({DType.FLOAT32, DType.FLOAT64, DType.BOOL})
ENABLED = True   # off: every op is a node (A/B runs)


def known(x: Node) -> bool:
    """x is a constant with a number for its value (not a size expression)."""
    return ENABLED and x.op == "const" and not isinstance(x.attr("value"), SymExpr)


def strong(x: Node) -> Node:
    """x, or a weak constant x as a 0-d tensor's value (promoted by its dtype, not as a scalar)."""
    if x.op == "const" and x.attr("weak"):
        return Node.make("const", x.dtype, (), value=x.attr("value"), weak=False)
    return x


def folded(name: str, compute: DType, result: DType, inputs: Sequence[Node], cond: Node | None = None) -> Node | None:
    """The constant that op `name` computes from `inputs` (each already cast to `compute`), or for
    a `where` (cond: its condition) of a constant condition the operand it selects; None where
    nothing folds."""
    if cond is not None:
        return strong(inputs[0] if cond.attr("value") else inputs[1]) if known(cond) else None
    ref = OP_TABLE[name].ref
    if compute not in FOLDED_DTYPES or ref is None or not inputs or not all(known(a) for a in inputs):
        return None
    # one-element arrays, as the VMs' operands (NumPy's 0-d arithmetic differs: (-0.0) ** 0.5)
    args = [np.full(1, a.attr("value"), np.bool_ if a.dtype is DType.BOOL else np.float64) for a in inputs]
    with np.errstate(all="ignore"):
        value = np.asarray(ref(*args)).reshape(-1)[0].item()
    return Node.make("const", result, (), value=round_to_dtype(value, result), weak=False)
