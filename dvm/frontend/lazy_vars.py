"""The values of lazy mode's pending graph: Var (a tensor variable the graph computes, with its
placeholders and views), Ref (a pending value in a replay entry), and the small helpers the
recorder and the flush share. Invariant: a Var holds only weak references to its placeholders and
views (Strong stands in for an external Var's tensor, held until the flush).
"""
from __future__ import annotations

import torch

from ..graph.views import contiguous_strides

_Tensor = torch.Tensor


class NotRecorded(Exception):
    """This call is not recorded; `reason` says why, `flush` whether pending values are involved
    (the caller computes them first), `kind` the flush reason to count when it does."""

    def __init__(self, reason: str, flush: bool = False, kind: str = "unsupported"):
        super().__init__(reason)
        self.reason, self.flush, self.kind = reason, flush, kind


class Ref:
    """A pending value in a replay entry (the eager replay resolves it)."""
    __slots__ = ("j",)

    def __init__(self, j: int):
        self.j = j


class Strong:
    """A strong reference with weakref's call interface (external Vars are held until the flush)."""
    __slots__ = ("obj",)

    def __init__(self, obj):
        self.obj = obj

    def __call__(self):
        return self.obj


class Var:
    """A tensor variable the pending graph computes (see the module docstring). perm: the dim
    order of a placeholder laid out as eager lays out that op's result (None: row-major)."""
    __slots__ = ("value", "members", "views", "external", "root", "shape", "dtype", "perm", "strides")

    def __init__(self, value, members, shape=None, dtype=None, external=False, root=None, perm=None, strides=None):
        self.value, self.members, self.shape, self.dtype = value, members, shape, dtype
        self.external, self.root, self.views, self.perm, self.strides = external, root, None, perm, strides

    def alive(self) -> bool:
        if self.external:
            return True
        for r in self.members:
            if r() is not None:
                return True
        return self.views_alive()

    def views_alive(self) -> bool:
        return self.views is not None and any(r() is not None for r in self.views)

    def add_view(self, ref) -> None:
        if self.views is None:
            self.views = []
        self.views.append(ref)

    def tensor(self) -> _Tensor | None:
        """A tensor with the placeholder's geometry over its storage (None: nothing holds it)."""
        for r in self.members:
            t = r()
            if t is not None:
                return t
        for r in self.views or ():
            v = r()
            if v is not None:
                return v.as_strided(self.shape, self.strides or contiguous_strides(self.shape), 0)
        return None


def row_major(shape: tuple) -> tuple:
    n = len(shape)
    if n == 1:
        return (1,)
    if n == 2:
        return (shape[1], 1)
    out, acc = [0] * n, 1
    for i in range(n - 1, -1, -1):
        out[i] = acc
        acc *= shape[i]
    return tuple(out)


_untyped_storage = torch._C.TensorBase.untyped_storage   # the C method: never lazy_mode's hook


def storage_ptr(t: _Tensor) -> int:
    return _untyped_storage(t).data_ptr()
