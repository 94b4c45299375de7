"""View arithmetic on (shape, strides, offset) in elements: the one place that decides whether a
chain of reshape / permute / broadcast_to / slice is expressible as strides (numpy's no-copy rules).
A slice moves the offset by start * stride and multiplies the axis stride by step (negative
steps give negative strides: the encoder and verifier handle them; every element read stays
inside the base view because the slice's start and length were checked when it was built)."""
from __future__ import annotations

from typing import Mapping, Sequence

from .node import Node
from .ops import MOVEMENTS
from .symbolic import evaluate

Layout = tuple[tuple[int, ...], tuple[int, ...], int]  # shape, strides, offset


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= max(d, 1)
    return tuple(reversed(out))


def reshape_strides(shape: Sequence[int], strides: Sequence[int], new: Sequence[int]) -> tuple[int, ...] | None:
    """Strides for viewing (shape, strides) as `new` without a copy, or None if impossible."""
    if 0 in shape or 0 in new:
        return contiguous_strides(new)
    return _split_merge(shape, strides, new)


def _split_merge(shape, strides, new) -> tuple[int, ...] | None:
    """General case (a new dim that splits an old one): numpy's attempt_nocopy_reshape."""
    olds = [(d, s) for d, s in zip(shape, strides) if d != 1]
    od = [d for d, _ in olds]
    os_ = [s for _, s in olds]
    nd = list(new)
    ns = [0] * len(nd)
    oi, oj, ni, nj = 0, 1, 0, 1
    while ni < len(nd) and oi < len(od):
        np_, op = nd[ni], od[oi]
        while np_ != op:
            if np_ < op:
                if nj >= len(nd):
                    return None
                np_ *= nd[nj]
                nj += 1
            else:
                if oj >= len(od):
                    return None
                op *= od[oj]
                oj += 1
        for ok in range(oi, oj - 1):
            if os_[ok] != od[ok + 1] * os_[ok + 1]:
                return None
        ns[nj - 1] = os_[oj - 1]
        for nk in range(nj - 1, ni, -1):
            ns[nk - 1] = ns[nk] * nd[nk]
        ni, nj, oi, oj = nj, nj + 1, oj, oj + 1
    for k in range(ni, len(nd)):
        if nd[k] != 1:
            return None
    return tuple(ns)


def apply_chain(layout: Layout, chain: Sequence[Node], env: Mapping[str, int]) -> Layout | None:
    """Apply view nodes (innermost first) to a concrete layout; None when a reshape needs a copy."""
    shape, strides, offset = layout
    for v in chain:
        if v.op == "permute":
            dims = v.attr("dims")
            shape, strides = tuple(shape[d] for d in dims), tuple(strides[d] for d in dims)
        elif v.op == "broadcast_to":
            new = tuple(evaluate(d, env) for d in v.shape)
            pad = len(new) - len(shape)
            strides = tuple(0 if i < pad or shape[i - pad] != n else strides[i - pad]
                            for i, n in enumerate(new))
            shape = new
        elif v.op == "reshape":
            new = tuple(evaluate(d, env) for d in v.shape)
            ns = reshape_strides(shape, strides, new)
            if ns is None:
                return None
            shape, strides = new, ns
        elif v.op == "slice":
            shape, strides, offset = _slice(shape, strides, offset, v, env)
        else:
            raise ValueError(f"{v.op} is not a view")
    return tuple(shape), tuple(strides), offset


def _slice(shape, strides, offset: int, v: Node, env: Mapping[str, int]):
    a, step = v.attr("axis"), v.attr("step")
    start = evaluate(v.attr("start"), env)
    offset += start * strides[a]
    if not v.attr("keep"):
        return shape[:a] + shape[a + 1:], strides[:a] + strides[a + 1:], offset
    n = evaluate(v.shape[a], env)
    return shape[:a] + (n,) + shape[a + 1:], strides[:a] + (strides[a] * step,) + strides[a + 1:], offset


def split_chain(node: Node) -> tuple[Node, list[Node]]:
    """(base, views innermost first) for a node that is a chain of view ops over `base`."""
    chain = []
    while node.op in MOVEMENTS:
        chain.append(node)
        node = node.inputs[0]
    return node, chain[::-1]
