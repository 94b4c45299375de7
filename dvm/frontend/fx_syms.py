"""PyTorch sizes (ints, SymInts and their SymPy expressions) as DVM dims (SymExpr), converted
once per FX graph; each symbol keeps the lower bound of its range in the shape environment."""
from __future__ import annotations

import torch

from ..graph.symbolic import floordiv, mod, sym
from .aten_table import Unsupported


class Syms:
    """Converts PyTorch sizes (int / SymInt) to DVM dims; remembers each symbol's range."""

    def __init__(self) -> None:
        self.cache: dict = {}

    def dim(self, d):
        if isinstance(d, int):
            return d
        if isinstance(d, torch.SymInt):
            node = d.node
            expr = node.expr
            if node.shape_env is not None:
                expr = node.shape_env.simplify(expr)
            return self.expr(expr, node.shape_env)
        raise Unsupported(f"size of type {type(d).__name__}")

    def shape(self, t) -> tuple:
        return tuple(self.dim(d) for d in t.shape)

    def expr(self, e, shape_env=None):
        import sympy
        from torch.utils._sympy.functions import FloorDiv, Mod, PythonMod
        if e.is_Integer:
            return int(e)
        if e.is_Symbol:
            name = str(e)
            if name not in self.cache:
                self.cache[name] = sym(name, lo=_lower_bound(name, shape_env.var_to_range.get(e)
                                                             if shape_env is not None else None))
            return self.cache[name]
        args = [self.expr(a, shape_env) for a in e.args]
        if isinstance(e, sympy.Add):
            out = 0
            for a in args:
                out = out + a
            return out
        if isinstance(e, sympy.Mul):
            out = 1
            for a in args:
                out = out * a
            return out
        if isinstance(e, FloorDiv):
            return floordiv(args[0], args[1])
        if isinstance(e, (Mod, PythonMod)):
            return mod(args[0], args[1])
        if isinstance(e, sympy.Pow) and isinstance(args[1], int) and args[1] >= 0:
            out = 1
            for _ in range(args[1]):
                out = out * args[0]
            return out
        raise Unsupported(f"size expression {e}")


def _lower_bound(name: str, rng) -> int:
    """The lower bound of a size symbol's value range (0 without a range). DVM's symbols are
    never negative: a symbol whose range reaches below 0 (PyTorch's unbacked symbols from data,
    with an infinite lower bound among them) is refused with its reason, never clamped to 0."""
    if rng is None:
        return 0
    import sympy
    lower = rng.lower     # (PyTorch's int_oo says it is finite: only a sympy.Integer is a number here)
    if not isinstance(lower, sympy.Integer) or int(lower) < 0:
        raise Unsupported(f"size symbol {name} may be negative (its range is {rng})")
    return int(lower)
