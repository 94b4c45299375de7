"""tests/helpers.pairwise, which thins parametrized grids: every pair of values of any two factors
is in some row, tuple values spread over several parameters, and the rows are fewer than the
grid's."""
import itertools

import pytest

from helpers import pairwise

pytestmark = pytest.mark.vm_once


@pytest.mark.parametrize("sizes", [(2, 2), (3, 2, 2), (4, 4, 2, 3), (3, 2, 2, 4), (5, 1, 3, 2, 2)])
def test_every_pair_of_values_is_in_some_row(sizes):
    factors = [[f"f{i}v{k}" for k in range(n)] for i, n in enumerate(sizes)]
    rows = pairwise(*factors)
    assert all(len(r) == len(sizes) and all(v in f for v, f in zip(r, factors)) for r in rows)
    for i, j in itertools.combinations(range(len(sizes)), 2):
        assert {(r[i], r[j]) for r in rows} == set(itertools.product(factors[i], factors[j]))
    product = 1
    for n in sizes:
        product *= n
    assert len(rows) <= product and len(set(rows)) == len(rows)
    assert rows == pairwise(*factors)   # deterministic


def test_tuple_values_spread_over_parameters():
    rows = pairwise(["a", "b"], [("where", "min"), ("none", "")], [(1, 2, 3), (4, 5, 6)])
    assert all(len(r) == 1 + 2 + 3 for r in rows)
    assert {r[1:3] for r in rows} == {("where", "min"), ("none", "")}
    assert len(rows) == 4   # 2 x 2 pairs: a full grid would be 8 rows
