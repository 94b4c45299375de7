"""Hash-consed graph nodes: equal (op, dtype, shape, inputs, attrs) is the same object."""
from __future__ import annotations

import math
import weakref
from typing import Any, Iterable

from .dtypes import DType
from .symbolic import Dim, render

_INTERN: "weakref.WeakValueDictionary[tuple, Node]" = weakref.WeakValueDictionary()


def _key_of(value: Any) -> Any:
    """An attribute value as part of an intern key. Python's -0.0 == 0.0 (with equal hashes), but
    a constant -0.0 is not 0.0 (x / -0.0 is -inf): floats carry their sign bit."""
    if isinstance(value, float):
        return (float, value, math.copysign(1.0, value))
    if isinstance(value, tuple):
        return tuple(_key_of(v) for v in value)
    return value


class Node:
    """One immutable graph node. Build with `Node.make`; never mutate."""
    __slots__ = ("op", "dtype", "shape", "inputs", "attrs", "_key", "__weakref__")

    op: str
    dtype: DType
    shape: tuple[Dim, ...]
    inputs: tuple["Node", ...]
    attrs: tuple[tuple[str, Any], ...]

    @staticmethod
    def make(op: str, dtype: DType, shape: Iterable[Dim], inputs: Iterable["Node"] = (),
             **attrs: Any) -> "Node":
        shape, inputs = tuple(shape), tuple(inputs)
        items = tuple(sorted(attrs.items()))
        key = (op, dtype, shape, tuple(id(i) for i in inputs), tuple((k, _key_of(v)) for k, v in items))
        node = _INTERN.get(key)
        if node is None:
            node = object.__new__(Node)
            for name, val in (("op", op), ("dtype", dtype), ("shape", shape), ("inputs", inputs),
                              ("attrs", items), ("_key", key)):
                object.__setattr__(node, name, val)
            _INTERN[key] = node
        return node

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Node is immutable")

    def attr(self, name: str, default: Any = None) -> Any:
        for k, v in self.attrs:
            if k == name:
                return v
        return default

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __repr__(self) -> str:
        a = ", ".join(f"{k}={v}" for k, v in self.attrs)
        return f"{self.op}:{self.dtype.short}{render(self.shape)}" + (f"[{a}]" if a else "")


def topo_order(roots: Iterable[Node]) -> list[Node]:
    """All nodes reachable from `roots`, each after its inputs (iterative DFS)."""
    order: list[Node] = []
    seen: set[int] = set()
    for root in roots:
        stack = [(root, False)]
        while stack:
            node, expanded = stack.pop()
            if expanded:
                order.append(node)
                continue
            if id(node) in seen:
                continue
            seen.add(id(node))
            stack.append((node, True))
            stack.extend((i, False) for i in reversed(node.inputs) if id(i) not in seen)
    return order
