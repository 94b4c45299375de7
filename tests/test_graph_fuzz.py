"""Random differential testing of whole graphs: random chains of elementwise ops, reductions
over random axes, keepdims, views and several outputs, built with the builder API and mirrored
in NumPy (float64, so any mismatch is a DVM bug, not rounding)."""
from __future__ import annotations

import random

import numpy as np
import pytest

import dvm

UNARY = {"exp": lambda x: np.exp(np.clip(x, -20, 20)), "tanh": np.tanh, "neg": np.negative, "abs": np.abs}
BINARY = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "maximum": np.maximum}
REDUCE = {"sum": np.sum, "max": np.max, "min": np.min, "mean": np.mean}


def _random_program(rng: random.Random, shape: tuple):
    """A list of steps over a value pool; each step works for both DVM (k) and NumPy."""
    steps = []
    pool_shapes = [shape]
    for _ in range(rng.randint(2, 7)):
        kind = rng.choice(["unary", "binary", "reduce", "reduce", "permute", "reshape"])
        src = rng.randrange(len(pool_shapes))
        s = pool_shapes[src]
        if kind == "unary":
            steps.append(("unary", rng.choice(list(UNARY)), src))
            pool_shapes.append(s)
        elif kind == "binary":
            other = rng.randrange(len(pool_shapes))
            try:
                out = np.broadcast_shapes(s, pool_shapes[other])
            except ValueError:
                continue
            steps.append(("binary", rng.choice(list(BINARY)), src, other))
            pool_shapes.append(out)
        elif kind == "reduce" and len(s) > 0:
            axes = tuple(sorted(rng.sample(range(len(s)), rng.randint(1, len(s)))))
            keep = rng.random() < 0.6
            steps.append(("reduce", rng.choice(list(REDUCE)), src, axes, keep))
            pool_shapes.append(tuple(1 if i in axes else d for i, d in enumerate(s)) if keep
                               else tuple(d for i, d in enumerate(s) if i not in axes))
        elif kind == "permute" and len(s) > 1:
            perm = list(range(len(s)))
            rng.shuffle(perm)
            steps.append(("permute", tuple(perm), src))
            pool_shapes.append(tuple(s[p] for p in perm))
        elif kind == "reshape" and len(s) > 0:
            n = int(np.prod(s))
            steps.append(("reshape", (n,), src))
            pool_shapes.append((n,))
    n_out = rng.randint(1, min(3, len(pool_shapes)))
    outs = rng.sample(range(1, len(pool_shapes)), min(n_out, len(pool_shapes) - 1)) or [0]
    return steps, outs


def _apply(steps, outs, first, ops):
    pool = [first]
    for st in steps:
        pool.append(ops(st, pool))
    return [pool[i] for i in outs]


def _np_step(st, pool):
    if st[0] == "unary":
        return UNARY[st[1]](pool[st[2]])
    if st[0] == "binary":
        return BINARY[st[1]](pool[st[2]], pool[st[3]])
    if st[0] == "reduce":
        return REDUCE[st[1]](pool[st[2]], axis=st[3], keepdims=st[4])
    if st[0] == "permute":
        return np.transpose(pool[st[2]], st[1])
    return np.reshape(pool[st[2]], (-1,))


def _k_step(k):
    def step(st, pool):
        if st[0] == "unary":
            x = pool[st[2]]
            return getattr(k, st[1])(k.clamp(x, -20.0, 20.0) if st[1] == "exp" else x)
        if st[0] == "binary":
            return getattr(k, st[1])(pool[st[2]], pool[st[3]])
        if st[0] == "reduce":
            return getattr(k, st[1])(pool[st[2]], axis=st[3], keepdims=st[4])
        if st[0] == "permute":
            return k.permute(pool[st[2]], st[1])
        return k.reshape(pool[st[2]], (-1,))
    return step


@pytest.mark.parametrize("seed", range(60))
def test_random_graph_matches_numpy(seed):
    rng = random.Random(seed)
    shape = tuple(rng.choice([1, 2, 3, 5, 8]) for _ in range(rng.randint(1, 3)))
    steps, outs = _random_program(rng, shape)

    def fn(k, x):
        res = _apply(steps, outs, k.load(x), _k_step(k))
        return tuple(k.store(r) for r in res)
    kern = dvm.kernel(fn)
    x = np.random.default_rng(seed).standard_normal(shape)
    if rng.random() < 0.3 and x.ndim > 1:
        x = np.ascontiguousarray(x.T).T  # a transposed layout
    expect = _apply(steps, outs, x, _np_step)
    got = kern(x)
    for g, e in zip(got, expect):
        assert g.shape == np.shape(e)
        np.testing.assert_allclose(g, e, rtol=1e-12, atol=1e-12)
    # a second shape reuses the trace (only the sizes differ)
    x2 = np.random.default_rng(seed + 1000).standard_normal(tuple(d + 2 if d > 1 else d for d in shape))
    for g, e in zip(kern(x2), _apply(steps, outs, x2, _np_step)):
        np.testing.assert_allclose(g, e, rtol=1e-12, atol=1e-12)
