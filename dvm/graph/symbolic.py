"""Symbolic sizes: a small polynomial expression type over named, ranged symbols.

Invariants: a SymExpr is canonical (sorted monomials, no zero coefficients), so structural equality
is algebraic equality for polynomials; an expression that is constant is always returned as a plain
`int`, never as a SymExpr. Opaque atoms (floor-div, mod, max) keep polynomial arguments.
The hot path (encoding) only calls `evaluate`, which is a few dictionary lookups.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Union

INF = math.inf


@dataclass(frozen=True, order=True)
class Symbol:
    """A named size with a known range [lo, hi] (hi may be math.inf)."""
    name: str
    lo: int = 0
    hi: float = INF

    def __repr__(self) -> str:
        return self.name


@dataclass(frozen=True)
class _Opaque:
    kind: str  # "//", "%", "max"
    a: "Dim"
    b: "Dim"

    def sort_key(self) -> str:
        return f"~{self.kind}({self.a},{self.b})"

    def __repr__(self) -> str:
        if self.kind == "max":
            return f"max({self.a}, {self.b})"
        return f"({self.a} {self.kind} {self.b})"

    def evaluate(self, env: Mapping[str, int]) -> int:
        a, b = evaluate(self.a, env), evaluate(self.b, env)
        if self.kind == "//":
            return a // b
        if self.kind == "%":
            return a % b
        return max(a, b)

    def bounds(self) -> tuple[float, float]:
        (alo, ahi), (blo, bhi) = bounds(self.a), bounds(self.b)
        if self.kind == "max":
            return max(alo, blo), max(ahi, bhi)
        if self.kind == "%":
            return 0, max(bhi - 1, 0)
        if alo >= 0 and blo >= 1:
            return alo // bhi if bhi != INF else 0, ahi / blo if ahi != INF else INF
        return -INF, INF


Atom = Union[Symbol, _Opaque]


def _atom_key(a: Atom) -> str:
    return a.name if isinstance(a, Symbol) else a.sort_key()


class SymExpr:
    """sum(coef * prod(atoms)) + const, canonical. Build with `sym(...)` and arithmetic operators."""
    __slots__ = ("terms", "const", "_hash")

    def __init__(self, terms: tuple[tuple[tuple[Atom, ...], int], ...], const: int):
        self.terms = terms
        self.const = const
        self._hash = hash((terms, const))

    # -- construction -------------------------------------------------------------------
    @staticmethod
    def _make(terms: dict, const: int) -> "Dim":
        items = tuple(sorted(((m, c) for m, c in terms.items() if c != 0),
                             key=lambda mc: tuple(_atom_key(a) for a in mc[0])))
        if not items:
            return const
        return SymExpr(items, const)

    def _as_dict(self) -> dict:
        return dict(self.terms)

    # -- arithmetic ------------------------------------------------------------------------
    def __add__(self, other: "Dim") -> "Dim":
        if isinstance(other, int):
            return SymExpr._make(self._as_dict(), self.const + other)
        if not isinstance(other, SymExpr):
            return NotImplemented
        d = self._as_dict()
        for m, c in other.terms:
            d[m] = d.get(m, 0) + c
        return SymExpr._make(d, self.const + other.const)

    __radd__ = __add__

    def __neg__(self) -> "Dim":
        return SymExpr._make({m: -c for m, c in self.terms}, -self.const)

    def __sub__(self, other: "Dim") -> "Dim":
        return self + (-other)

    def __rsub__(self, other: "Dim") -> "Dim":
        return (-self) + other

    def __mul__(self, other: "Dim") -> "Dim":
        if isinstance(other, int):
            return SymExpr._make({m: c * other for m, c in self.terms}, self.const * other)
        if not isinstance(other, SymExpr):
            return NotImplemented
        d: dict = {}
        mine = list(self.terms) + ([((), self.const)] if self.const else [])
        theirs = list(other.terms) + ([((), other.const)] if other.const else [])
        const = 0
        for m1, c1 in mine:
            for m2, c2 in theirs:
                m = tuple(sorted(m1 + m2, key=_atom_key))
                if m:
                    d[m] = d.get(m, 0) + c1 * c2
                else:
                    const += c1 * c2
        return SymExpr._make(d, const)

    __rmul__ = __mul__

    def __floordiv__(self, other: "Dim") -> "Dim":
        return floordiv(self, other)

    def __rfloordiv__(self, other: "Dim") -> "Dim":
        return floordiv(other, self)

    def __mod__(self, other: "Dim") -> "Dim":
        return mod(self, other)

    def __rmod__(self, other: "Dim") -> "Dim":
        return mod(other, self)

    # -- identity ------------------------------------------------------------------------
    def __eq__(self, other: object) -> bool:
        return isinstance(other, SymExpr) and self._hash == other._hash and \
            self.terms == other.terms and self.const == other.const

    def __hash__(self) -> int:
        return self._hash

    def __bool__(self) -> bool:
        raise TypeError(f"the truth of symbolic size {self} is not known at trace time; "
                        "use dvm.graph.symbolic.decide_eq / is_one")

    def __repr__(self) -> str:
        parts = []
        for m, c in self.terms:
            mono = "*".join(repr(a) for a in m)
            parts.append(mono if c == 1 else f"{c}*{mono}")
        if self.const:
            parts.append(str(self.const))
        return " + ".join(parts).replace("+ -", "- ")

    # -- queries -------------------------------------------------------------------------
    def symbols(self) -> set[Symbol]:
        out: set[Symbol] = set()
        for m, _ in self.terms:
            for a in m:
                if isinstance(a, Symbol):
                    out.add(a)
                else:
                    out |= free_symbols(a.a) | free_symbols(a.b)
        return out

    def as_symbol(self) -> Symbol | None:
        """The symbol itself when the expression is exactly one symbol."""
        if self.const == 0 and len(self.terms) == 1:
            m, c = self.terms[0]
            if c == 1 and len(m) == 1 and isinstance(m[0], Symbol):
                return m[0]
        return None


Dim = Union[int, SymExpr]


def sym(name: str, lo: int = 0, hi: float = INF) -> SymExpr:
    return SymExpr((((Symbol(name, lo, hi),), 1),), 0)


def _opaque(kind: str, a: Dim, b: Dim) -> SymExpr:
    return SymExpr((((_Opaque(kind, a, b),), 1),), 0)


def floordiv(a: Dim, b: Dim) -> Dim:
    if isinstance(a, int) and isinstance(b, int):
        return a // b
    if b == 1:
        return a
    if isinstance(b, int) and isinstance(a, SymExpr) and a.const % b == 0 \
            and all(c % b == 0 for _, c in a.terms):
        return SymExpr._make({m: c // b for m, c in a.terms}, a.const // b)
    if isinstance(a, SymExpr) and isinstance(b, SymExpr) and a == b:
        return 1
    return _opaque("//", a, b)


def mod(a: Dim, b: Dim) -> Dim:
    if isinstance(a, int) and isinstance(b, int):
        return a % b
    if b == 1:
        return 0
    return _opaque("%", a, b)


def sym_max(a: Dim, b: Dim) -> Dim:
    if isinstance(a, int) and isinstance(b, int):
        return max(a, b)
    lo, hi = bounds(a - b)
    if lo >= 0:
        return a
    if hi <= 0:
        return b
    return _opaque("max", a, b)


def free_symbols(x: Dim) -> set[Symbol]:
    return x.symbols() if isinstance(x, SymExpr) else set()


def evaluate(x: Dim, env: Mapping[str, int]) -> int:
    """Concrete value of `x` given symbol values by name (KeyError names a missing symbol)."""
    if isinstance(x, int):
        return x
    total = x.const
    for m, c in x.terms:
        p = c
        for a in m:
            p *= env[a.name] if isinstance(a, Symbol) else a.evaluate(env)
        total += p
    return total


def bounds(x: Dim) -> tuple[float, float]:
    """A sound interval [lo, hi] for `x` from the symbols' ranges."""
    if isinstance(x, int):
        return x, x
    lo = hi = float(x.const)
    for m, c in x.terms:
        mlo, mhi = 1.0, 1.0
        for a in m:
            alo, ahi = (a.lo, a.hi) if isinstance(a, Symbol) else a.bounds()
            if alo < 0:  # only non-negative atoms are multiplied soundly below
                mlo, mhi = -INF, INF
                break
            mlo, mhi = mlo * alo, (mhi * ahi if mhi and ahi else (INF if INF in (mhi, ahi) else 0.0))
        if c >= 0:
            lo, hi = lo + c * mlo, hi + c * mhi
        else:
            lo, hi = lo + c * mhi, hi + c * mlo
    return lo, hi


def decide_eq(a: Dim, b: Dim) -> bool | None:
    """True/False when `a == b` is decided for every value of the symbols, None when not."""
    diff = a - b
    if isinstance(diff, int):
        return diff == 0
    lo, hi = bounds(diff)
    if lo > 0 or hi < 0:
        return False
    return None


def is_one(d: Dim) -> bool:
    return isinstance(d, int) and d == 1


def prod(dims) -> Dim:
    out: Dim = 1
    for d in dims:
        out = out * d
    return out


def render(shape) -> str:
    return "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"
