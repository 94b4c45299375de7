"""The pending graph of one thread: the tensors it will compute, the tensors it reads, and the
recording of ops into it (a walk down lazy_trie).

A recorded op returns placeholders: real CPU tensors, allocated (row-major, or in eager's layout
for results of ops on permuted operands) and left unwritten until the flush (lazy_flush) computes
them. A placeholder and every alias of it with the same
geometry (detach, alias) form one Var; its value is the latest pending value written to it
(in-place ops replace it). Partial views of a placeholder are real PyTorch views of it (so they
alias it as in eager mode), each a Var of its own that DVM reads as a view node. An in-place op
on an ordinary tensor makes it an external Var: the graph reads its old value and the flush
writes the new one back; its storage is "dirty" until then, so any other way of reaching that
storage must flush first (lazy_mode).

Invariants: only weak references to placeholders are held (a placeholder nobody holds is not an
output); input tensors are held strongly until the flush; a failed recording leaves the state as
it was (rollback).
"""
from __future__ import annotations

import functools
import itertools
import weakref

import torch

from ..graph.symbolic import evaluate
from .aten_common import TORCH_TO_DVM
from .lazy_lower import INT64_HUGE, SYMBOL_MIN, symbol_name
from .lazy_ops import Arg
from .lazy_trie import build_inplace, build_record, build_view, child, concrete_shape, root
from .lazy_vars import NotRecorded, Ref, Strong, Var, row_major, storage_ptr
from .torch_launch import _empty_strided_cpu

_Tensor = torch.Tensor
_RECORDABLE_TYPES = (torch.Tensor, torch.nn.Parameter)


def _lit(v):
    if isinstance(v, float):
        return ("F", repr(v))
    if isinstance(v, (list, tuple)):
        return tuple(_lit(x) for x in v)
    return v


# A replay entry (one recorded call, in Pending.log): (OpInfo, args, kwargs, the value indices it
# produced, weak references to its placeholders)
class Pending:
    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.prefix = root()
        self.env: dict = {}          # symbol name -> size
        self.sym_vals: list = []     # symbol k -> size
        self.sym_of: dict = {}       # size -> k
        self.slots: list = []        # input slot -> tensor or Python scalar
        self.slot_of: dict = {}      # id(tensor) -> slot
        self.in_storages: set = set()   # storages the graph reads
        self.by_id: dict = {}        # id(tensor) -> (Var, ref)
        self.dirty: set = set()      # storages with a pending write (external Vars)
        self.vars: list = []         # placeholder and external Vars, in order
        self.log: list = []          # Entries in program order
        self.n_ops = 0

    @property
    def empty(self) -> bool:
        return not self.log

    # -- lookups ------------------------------------------------------------------------------
    def var_of(self, t) -> Var | None:
        e = self.by_id.get(id(t))
        return e[0] if e is not None and e[1]() is t else None

    def touches(self, info, args, kwargs) -> bool:
        """A call not recorded needs the pending graph computed first: it reads or writes a pending
        value, reaches a dirty storage, or writes a storage the graph reads."""
        for a in _tensors(args, kwargs):
            if self.var_of(a) is not None or (self.dirty and storage_ptr(a) in self.dirty):
                return True
        if info.writes and self.in_storages:
            for name in info.writes:
                i = info.pos.get(name)
                w = args[i] if i is not None and i < len(args) else kwargs.get(name)
                for t in _tensors((w,), {}):
                    if storage_ptr(t) in self.in_storages:
                        return True
        return False

    # -- encoding (the hot path: one call per recorded op) --------------------------------------
    def _sym(self, v: int) -> int:
        k = self.sym_of.get(v)
        if k is None:
            k = self.sym_of[v] = len(self.sym_vals)
            self.sym_vals.append(v)
            self.env[symbol_name(k)] = v
        return k

    def _size(self, v):
        if v is None or type(v) is not int or v < SYMBOL_MIN or v >= INT64_HUGE:
            return v
        return ("z", self._sym(v))

    def _tensor(self, a):
        e = self.by_id.get(id(a))
        if e is not None and e[1]() is a:
            j = e[0].value
            if j is None:
                raise NotRecorded("reads a view DVM cannot take", flush=True)
            return ("v", j), Ref(j)
        if self.dirty and storage_ptr(a) in self.dirty:   # (an input read before the write too)
            raise NotRecorded("reads a storage with a pending write through another tensor", flush=True,
                              kind="inplace")
        slot = self.slot_of.get(id(a))
        if slot is not None and self.slots[slot] is a:
            return ("i", slot), a
        if type(a) not in _RECORDABLE_TYPES or not a.is_cpu or a.dtype not in TORCH_TO_DVM or a.is_neg() \
                or a.is_conj() or a.layout is not torch.strided:
            raise NotRecorded(f"a {type(a).__name__} of {a.dtype} on {a.device}")
        codes = tuple([d if d < SYMBOL_MIN else -1 - self._sym(d) for d in a.shape])
        self.slot_of[id(a)] = len(self.slots)
        self.slots.append(a)
        return ("n", a.dtype, codes, None if a.is_contiguous() else _dim_order(a)), a

    def _scalar(self, info, name, v, args, kwargs):
        rule = info.scalars.get(name) if info.scalars else None
        if rule is not None and type(v) is float:
            i = info.pos[rule[0]]
            partner = args[i] if i < len(args) else kwargs.get(rule[0])
            i = info.pos.get("alpha")
            alpha = 1 if i is None else args[i] if i < len(args) else kwargs.get("alpha", 1)
            if isinstance(partner, _Tensor) and partner.dtype.is_floating_point and partner.dim() >= 1 \
                    and partner.dtype in TORCH_TO_DVM and (name != "other" or alpha == 1) \
                    and (len(rule) < 3 or all(getattr(_arg_of(info, n, args, kwargs), "dtype", None) == partner.dtype
                                              for n in rule[2])):
                self.slots.append(v)
                return ("f", rule[0], rule[1]), v
        if isinstance(v, bool):
            return ("k", "b", v), v
        if isinstance(v, int):
            return ("k", "i", v), v
        if isinstance(v, float):
            return ("k", "f", repr(v)), v
        raise NotRecorded(f"scalar of type {type(v).__name__}")

    def _arg(self, info, kind, name, v, args, kwargs):
        """(encoding, replay value) of one argument that is not a tensor and not None."""
        if kind is Arg.TENSOR or kind is Arg.SCALAR:
            return self._scalar(info, name, v, args, kwargs)
        if kind is Arg.TENSORS:
            pairs = [self._tensor(t) if t is not None else (None, None) for t in v]
            return tuple([p[0] for p in pairs]), [p[1] for p in pairs]
        if kind is Arg.SIZE:
            if isinstance(v, (list, tuple)):
                return tuple([self._size(x) for x in v]), v
            return self._size(v), v
        if isinstance(v, (list, tuple)) and any(isinstance(x, _Tensor) for x in v):
            raise NotRecorded("tensors where the schema takes none")
        return _lit(v), v

    def _encode(self, info, args, kwargs) -> tuple:
        spec = info.args
        enc = [None] * len(args)
        rep = list(args)
        for i, v in enumerate(args):
            if isinstance(v, _Tensor):
                enc[i], rep[i] = self._tensor(v)
            elif v is not None:
                enc[i], rep[i] = self._arg(info, spec[i][1], spec[i][0], v, args, kwargs)
        # which end a slice stops at is structure (lazy_lower._slice derives its length from it)
        case = (_slice_case(args),) if info.func is _SLICE else ()
        if not kwargs:
            return (id(info.func), tuple(enc), ()) + case, rep, kwargs
        enc_kw, rep_kw = [], {}
        for k in sorted(kwargs):
            v = kwargs[k]
            if isinstance(v, _Tensor):
                e, r = self._tensor(v)
            elif v is None:
                e = r = None
            else:
                e, r = self._arg(info, info.kinds.get(k, Arg.LITERAL), k, v, args, kwargs)
            enc_kw.append((k, e))
            rep_kw[k] = r
        return (id(info.func), tuple(enc), tuple(enc_kw)) + case, rep, rep_kw

    # -- recording ------------------------------------------------------------------------------
    def _rollback(self, n_slots: int, n_syms: int) -> None:
        for t in self.slots[n_slots:]:
            if isinstance(t, _Tensor):
                self.slot_of.pop(id(t), None)
        del self.slots[n_slots:]
        for v in self.sym_vals[n_syms:]:
            k = self.sym_of.pop(v)
            self.env.pop(symbol_name(k), None)
        del self.sym_vals[n_syms:]

    def _commit(self, mark: tuple, node) -> None:
        n_slots = mark[0]
        if len(self.slots) != n_slots:
            for t in self.slots[n_slots:]:
                if isinstance(t, _Tensor):
                    self.in_storages.add(storage_ptr(t))
        self.prefix = node

    def _checks_ok(self, node) -> bool:
        env = self.env
        for c in node.new_checks:
            lhs = evaluate(c.lhs, env)
            if (lhs == 0) if c.rhs is None else lhs != evaluate(c.rhs, env):
                return False
        return True

    def _walk(self, info, args, kwargs, make) -> tuple:
        """Encode the call and step down the trie: (node, replay args, replay kwargs, slot mark).
        A call that cannot be recorded leaves the state as it was and raises NotRecorded."""
        n_slots, n_syms = len(self.slots), len(self.sym_vals)
        try:
            sig, rargs, rkwargs = self._encode(info, args, kwargs)
            prefix = self.prefix
            node = prefix.children.get(sig)
            if node is None:
                node = child(prefix, sig, functools.partial(make, prefix, info, sig, args, kwargs, self.env))
            if node.failed is not None:
                raise NotRecorded(node.failed)
            if node.new_checks and not self._checks_ok(node):
                raise NotRecorded("a shape check fails at these sizes")
        except NotRecorded:
            self._rollback(n_slots, n_syms)
            raise
        return node, rargs, rkwargs, (n_slots, n_syms)

    def record(self, info, args, kwargs):
        """Record a table op; its placeholder result(s)."""
        node, rargs, rkwargs, mark = self._walk(info, args, kwargs, build_record)
        self._commit(mark, node)
        by_id, sym_vals, n_outs = self.by_id, self.sym_vals, len(node.outs)
        base = len(node.nodes) - n_outs
        outs, refs = [], []
        for k in range(n_outs):
            code, shape, dtype, perm = node.outs[k]
            size = tuple([c if c >= 0 else sym_vals[-1 - c] for c in code]) if code is not None else \
                concrete_shape(None, shape, sym_vals, self.env)
            if perm is None:
                t = _empty_strided_cpu(size, row_major(size), dtype)
                strides = None
            else:                               # eager's layout: row-major in perm's order
                dense = row_major(tuple(size[d] for d in perm))
                strides = [0] * len(size)
                for d, st in zip(perm, dense):
                    strides[d] = st
                strides = tuple(strides)
                t = _empty_strided_cpu(size, strides, dtype)
            ref = weakref.ref(t)
            var = Var(base + k, [ref], size, dtype, perm=perm, strides=strides)
            by_id[id(t)] = (var, ref)
            self.vars.append(var)
            outs.append(t)
            refs.append(ref)
        self.log.append((info, rargs, rkwargs, range(base, base + n_outs), refs))
        self.n_ops += 1
        return outs[0] if info.single else tuple(outs)

    def record_view(self, info, args, kwargs, real) -> None:
        """Track `real`, the view PyTorch took of pending args[0], as an alias of its Var."""
        var = self.var_of(args[0])
        root = var.root or var
        outs = real if isinstance(real, (list, tuple)) else (real,)
        if len(outs) == 1 and var.root is None and _same_geometry(outs[0], args[0]):
            ref = weakref.ref(outs[0])
            var.members.append(ref)           # detach / alias: the same variable
            self.by_id[id(outs[0])] = (var, ref)
            return
        values = (None,) * len(outs)
        if var.value is not None:
            try:
                node, rargs, rkwargs, mark = self._walk(
                    info, args, kwargs, lambda p, i, s, a, k, env: build_view(p, i, s, real, env))
            except NotRecorded:
                node = None
            if node is not None and node.nodes[-1] is not None:
                self._commit(mark, node)
                values = tuple(range(len(node.nodes) - len(outs), len(node.nodes)))
                self.log.append((info, rargs, rkwargs, values, ()))
            elif node is not None:
                self._rollback(*mark)
        for t, j in zip(outs, values):
            ref = weakref.ref(t)
            root.add_view(ref)
            self.by_id[id(t)] = (Var(j, [ref], root=root), ref)

    def record_inplace(self, info, args, kwargs):
        """Record `self.op_(...)`: self's new value. NotRecorded(flush=True) for a write that
        must see the pending graph computed first (through a view, or aliased)."""
        target = args[0]
        var = self.var_of(target)
        if var is not None:
            if var.root is not None:
                raise NotRecorded("write through a view of a pending tensor", flush=True, kind="inplace")
            if var.views_alive():
                raise NotRecorded("write to a pending tensor that has live views", flush=True, kind="inplace")
        elif self.dirty and storage_ptr(target) in self.dirty:
            raise NotRecorded("write through an alias of a tensor with a pending write", flush=True, kind="inplace")
        node, rargs, rkwargs, mark = self._walk(info, args, kwargs, build_inplace)
        self._commit(mark, node)
        j = len(node.nodes) - 1
        if var is None:
            ref = Strong(target)
            var = Var(j, [ref], tuple(target.shape), target.dtype, external=True)
            self.by_id[id(target)] = (var, ref)
            self.dirty.add(storage_ptr(target))
            self.vars.append(var)
        else:
            var.value = j
        self.log.append((info, rargs, rkwargs, (j,), ()))
        self.n_ops += 1
        return target


_SLICE = torch.ops.aten.slice.Tensor


def _slice_case(args) -> tuple:
    """("end", True) when x[..., start:end] with a finite end stops at the axis' end (end past
    the size), ("end", False) when at `end`; part of a slice's signature."""
    x, dim = args[0], args[1] if len(args) > 1 else 0
    end = args[3] if len(args) > 3 else None
    return ("end", end is None or end >= x.shape[dim % max(x.dim(), 1)])


def _dim_order(a: _Tensor) -> tuple:
    """a's dims by decreasing stride: part of a new input's structure, as eager lays out results
    after their operands' layouts (the placeholders follow, lazy_trie._grow)."""
    st = a.stride()
    return tuple(sorted(range(a.dim()), key=lambda i: -st[i]))


def _arg_of(info, name: str, args, kwargs):
    i = info.pos.get(name)
    return args[i] if i is not None and i < len(args) else kwargs.get(name)


def _same_geometry(a: _Tensor, b: _Tensor) -> bool:
    return a.shape == b.shape and a.stride() == b.stride() and a.storage_offset() == b.storage_offset() \
        and a.dtype == b.dtype


def _tensors(args, kwargs):
    """The tensors among args and kwargs' values, and inside their lists."""
    for a in itertools.chain(args, kwargs.values()):
        if isinstance(a, _Tensor):
            yield a
        elif isinstance(a, (list, tuple)):
            for x in a:
                if isinstance(x, _Tensor):
                    yield x
