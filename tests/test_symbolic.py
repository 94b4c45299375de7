"""SymExpr: canonical forms, decisions on ranges, evaluation."""
import math

import pytest

from dvm.graph.symbolic import bounds, decide_eq, evaluate, floordiv, mod, prod, sym, sym_max


pytestmark = pytest.mark.vm_once   # runs no program

s0, s1 = sym("s0", lo=2), sym("s1", lo=2)


def test_canonical_polynomials_compare_equal():
    assert s0 * s1 == s1 * s0
    assert s0 + s0 == 2 * s0
    assert (s0 + 1) * (s0 + 1) == s0 * s0 + 2 * s0 + 1
    assert s0 - s0 == 0 and isinstance(s0 - s0, int)
    assert hash(s0 * s1 + 3) == hash(3 + s1 * s0)


def test_decisions_use_ranges():
    assert decide_eq(s0, s0) is True
    assert decide_eq(s0, 1) is False          # s0 >= 2
    assert decide_eq(s0 + 1, s0) is False
    assert decide_eq(s0, s1) is None          # only known at run time
    assert bounds(s0 * s1) == (4, math.inf)
    with pytest.raises(TypeError):
        bool(s0)  # a SymExpr has no truth value


def test_floordiv_mod_max_and_evaluate():
    env = {"s0": 12, "s1": 5}
    assert floordiv(4 * s0, 2) == 2 * s0
    assert floordiv(s0, s0) == 1
    e = floordiv(s0 * s1, s1 + 1)
    assert evaluate(e, env) == 60 // 6
    assert evaluate(mod(s0, 5), env) == 2
    assert evaluate(sym_max(s0, s1), env) == 12
    assert sym_max(s0 + 1, s0) == s0 + 1
    assert evaluate(prod([s0, s1, 3]), env) == 180
    with pytest.raises(KeyError):
        evaluate(s0, {})
