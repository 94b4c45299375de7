"""Linears of one input (sibling linears) as one matrix product, in inference graphs.

Attention's q, k and v projections and an MLP's gate and up projections read the same input:
at the ATen level `view(mm(view(x, [M, K]), t(W_i)), [..., N_i])` (or `addmm(b_i, ...)`) for
each i. `rewrite(gm, weights)` replaces such a group by one product with the weights (and biases)
concatenated, `F.linear(x, cat(W_i), cat(b_i))`, whose last axis is sliced into the members'
results: one matrix product call instead of several (each a PyTorch call of ~10-30 µs in a
forward at 8 tokens), and a wider one, which BLAS runs faster where the weights are small (1024 x
128 by three 128 x 128 weights: 0.65x the time of the three products on one thread) and slower
where they are large (MAX_GROUP_BYTES: such groups are left alone). Each result is the product of the
same row and column, so the values are the separate products' (bitwise, with the BLAS PyTorch
ships, in every size measured).

The concatenations are one PyTorch step of the run graph, after its inputs (`WeightCats`, reason
REASON: one call a forward), which remembers them while every weight is the same tensor with the
same version counter and data pointer (as fx_sizeonly's size-only values): an in-place update
(`copy_`, `load_state_dict`, an optimizer step) makes it concatenate that group again. It holds a
copy of the groups' weights; groups are merged while the process's total stays within
`DVM_SIBLING_MB` (default 256 MiB; 0: off), reserved at compile time and held while the graph
lives. Only the graph inputs AOTAutograd marks as parameters or
buffers take part, so training graphs (whose weights need their own gradients) are left alone.

The members' results become strided views (slices of the wide product's last axis). Views read
from them are traced again on the new layout before anything changes: a group whose views cannot
be taken on it (a merge of the sliced axis with another), or whose results (or views of them) the
graph returns, is left as it was.
"""
from __future__ import annotations

import operator
import threading
import weakref

import torch
import torch.fx as fx

from ..config import config
from ..runtime import counters
from . import aten_table as T
from .fx_sizeonly import _same, _stamps

aten = torch.ops.aten
REASON = ("sibling linears of one input: their weights concatenated once (remembered while unchanged) "
          "for one matrix product, sliced into each linear's result")
ENABLED = True   # off: every linear is its own product (tests compare the two)
# Groups whose weights (and biases) exceed this stay separate products: with the BLAS PyTorch
# ships, one product of a large concatenated weight is slower than the separate ones (one
# thread, M 8-64 rows: 7 MiB of weights 1.26x their time, 22 MiB 1.18x, 48 MiB 1.36x; up to
# 4 MiB within 0.95-1.07x), so merging pays only in calls saved, where weights are small.
MAX_GROUP_BYTES = 4 << 20
_budget_lock = threading.Lock()
_bytes_used = [0]   # bytes of concatenated weights the rewrites of this process may keep


class WeightCats:
    """The concatenations (along axis 0) of a graph's groups of weights, remembered while the
    tensors are unchanged: one call a forward for all of them (each call in a forward costs
    10-30 µs at small sizes). An object per graph, so that explain and counters name it."""
    __name__ = "concat_weights"   # FX names a call_function node after its target

    def __init__(self) -> None:
        self.counts: list[int] = []   # tensors per concatenation, in argument order
        self._memo: tuple = (None, ())   # (the tensors' stamps or None, the concatenations): one
        # attribute, so that a thread never reads one call's stamps with another's results

    def hold(self, reserved: int) -> None:
        """Keep `reserved` bytes of the process's budget while this object lives."""
        weakref.finalize(self, _release, reserved)

    def __call__(self, *tensors: torch.Tensor) -> tuple:
        old, made = self._memo
        if old is not None and _same(old, tensors, "torch_sibling_weights_stale"):
            return made
        outs, at = [], 0
        for k, n in enumerate(self.counts):   # concatenated again: the groups that changed
            group, at = tensors[at:at + n], at + n
            if old is not None and _same(old[at - n:at], group, None):
                outs.append(made[k])
            else:
                outs.append(torch.cat(group))
                counters.bump("torch_sibling_weights_concatenated")
        made = tuple(outs)
        self._memo = (_stamps(tensors), made)   # (stamps None: inference tensors, made each call)
        return made

    def __repr__(self) -> str:
        return "dvm.concat_weights"


class _Member:
    """One linear of a group: its mm / addmm node, the view that flattened its input (or None:
    a 2-D input), t(W), W, the bias (or None), the view back to the input's leading axes (or
    None: the product is the result) and its width N."""
    __slots__ = ("mm", "flat", "tw", "w", "bias", "back", "n")

    def __init__(self, mm, flat, tw, w, bias, back, n: int):
        self.mm, self.flat, self.tw, self.w, self.bias, self.back, self.n = mm, flat, tw, w, bias, back, n

    @property
    def result(self) -> fx.Node:
        return self.mm if self.back is None else self.back

    def key(self) -> tuple:
        """What members of one group share: the input (and how it was flattened), the op, the
        weights' dtype, device and reduction size, the leading axes of the view back."""
        w, src = _val(self.w), self.mm.args[-2]
        flat = (src.args[0], repr(src.args[1:])) if self.flat is not None else (src, None)
        back = repr(self.back.args[1][:-1]) if self.back is not None else None
        return (*flat, self.mm.target, w.dtype, w.device, w.shape[1], back)


def _val(a):
    return a.meta.get("val") if isinstance(a, fx.Node) else a


def _view_back(mm: fx.Node, n: int) -> fx.Node | None:
    """mm's only reader when it is a reshape to [..., n] (a linear of a 3-D or wider input)."""
    if len(mm.users) != 1:
        return None
    (back,) = mm.users
    if back.target in T.RESHAPE_OPS and len(back.args) == 2 and isinstance(back.args[1], (list, tuple)) and \
            back.args[1] and isinstance(back.args[1][-1], int) and back.args[1][-1] == n:
        return back
    return None


def _member(mm: fx.Node, weights: frozenset) -> _Member | None:
    """mm as a member of a group, or None: `mm(x, t(W))` (or addmm with a 1-D bias), x maybe a
    flattening view read once, the result maybe viewed back; W (and the bias) a weight of static
    shape, t(W) read once."""
    bias = mm.args[0] if mm.target is aten.addmm.default else None
    if mm.kwargs or (bias is not None and (len(mm.args) != 3 or bias not in weights)):
        return None
    src, tw = mm.args[-2:]
    if not (isinstance(src, fx.Node) and isinstance(tw, fx.Node)) or tw.target is not aten.t.default or \
            len(tw.users) != 1 or tw.args[0] not in weights:
        return None
    w, x = _val(tw.args[0]), _val(src)
    if not (isinstance(w, torch.Tensor) and isinstance(x, torch.Tensor)) or w.ndim != 2 or x.ndim != 2 or \
            not all(isinstance(d, int) for d in w.shape):
        return None
    if bias is not None:
        b = _val(bias)
        if not (isinstance(b, torch.Tensor) and tuple(b.shape) == (w.shape[0],) and b.dtype == w.dtype):
            return None
    flat = src if src.target in T.RESHAPE_OPS and len(src.users) == 1 else None
    return _Member(mm, flat, tw, tw.args[0], bias, _view_back(mm, w.shape[0]), w.shape[0])


def _groups(gm: fx.GraphModule, weights: frozenset) -> list[list[_Member]]:
    """Members with the same key (_Member.key), two or more, in graph order."""
    by_key: dict = {}
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.target in (aten.mm.default, aten.addmm.default):
            m = _member(n, weights)
            if m is not None:
                by_key.setdefault(m.key(), []).append(m)
    return [g for g in by_key.values() if len(g) > 1]


def _fake(target, args: tuple, kwargs: dict | None = None):
    """target's value on the fake values of its arguments (FakeTensor runs it in its own mode)."""
    return target(*fx.node.map_arg(args, _val), **fx.node.map_arg(kwargs or {}, _val))


def _retrace_views(node: fx.Node, value, out: dict) -> bool:
    """The new fake values of the views read (transitively) from node when node's value becomes
    `value`, into out; False when one of them cannot be taken on value's layout, or when the
    graph returns one of them (a caller gets eager's layout)."""
    for u in node.users:
        if u.op == "output":
            return False
        if u.op != "call_function" or u.target not in T.VIEW_OPS:
            continue
        args = fx.node.map_arg(u.args, lambda a: value if a is node else _val(a))
        kwargs = fx.node.map_arg(u.kwargs, lambda a: value if a is node else _val(a))
        try:
            got = u.target(*args, **kwargs)
        except (RuntimeError, ValueError):   # (a view the new strides do not allow)
            return False
        if not isinstance(got, torch.Tensor):
            return False   # (split-like views return lists: their getitems are not retraced)
        out[u] = got
        if not _retrace_views(u, got, out):
            return False
    return True


def _nbytes(members: list[_Member]) -> int:
    """Bytes of the group's weights and biases (what their concatenations hold)."""
    vals = [_val(a) for m in members for a in (m.w, m.bias) if a is not None]
    return sum(v.numel() * v.element_size() for v in vals)


def _take_budget(nbytes: int) -> bool:
    """Reserve nbytes of DVM_SIBLING_MB for a group's concatenation (held until the graph's
    WeightCats is freed with it); False when they do not fit."""
    with _budget_lock:
        if _bytes_used[0] + nbytes > config().sibling_mb << 20:
            return False
        _bytes_used[0] += nbytes
        return True


def _release(nbytes: int) -> None:
    with _budget_lock:
        _bytes_used[0] -= nbytes


def _merge(gm: fx.GraphModule, members: list[_Member], cats: "_Cats") -> bool:
    """Rewrite one group (see the module docstring); False (nothing changed) where its weights
    exceed MAX_GROUP_BYTES, a view read from a member's result cannot be taken on its slice of the
    wide product, a result is returned, or the budget is spent."""
    nbytes = _nbytes(members)
    if nbytes > MAX_GROUP_BYTES:
        counters.bump("torch_sibling_linears_too_wide")
        return False
    g, first = gm.graph, members[0]
    total = sum(m.n for m in members)
    w_cat = torch.cat([_val(m.w) for m in members])
    b_cat = torch.cat([_val(m.bias) for m in members]) if first.bias is not None else None
    x_v = _val(first.mm.args[-2])
    wide_v = mm_v = _fake(torch.mm, (x_v, w_cat.t()))
    if first.back is not None:
        back_shape = [*first.back.args[1][:-1], total]
        wide_v = _fake(aten.view.default, (mm_v, back_shape))
    axis = wide_v.ndim - 1
    slices, retraced, off = [], {}, 0
    for m in members:
        s_v = aten.slice.Tensor(wide_v, axis, off, off + m.n)
        if not _retrace_views(m.result, s_v, retraced):
            counters.bump("torch_sibling_linears_views_kept")
            return False
        slices.append((m, off, s_v))
        off += m.n
    if not _take_budget(nbytes):
        counters.bump("torch_sibling_linears_over_budget")
        return False
    cats.reserved += nbytes
    w_node = cats.add(tuple(m.w for m in members), w_cat)
    b_node = cats.add(tuple(m.bias for m in members), b_cat) if b_cat is not None else None
    # before the first product: after every member's input, weight and t(W)
    with g.inserting_before(members[0].mm):
        x = first.mm.args[-2]
        if first.flat is not None:   # (each member flattened x alike: one view of it)
            x = _node(g, x.target, x.args, x_v, x.kwargs)
        t_node = _node(g, aten.t.default, (w_node,), w_cat.t())
        if b_cat is None:
            wide = _node(g, aten.mm.default, (x, t_node), mm_v)
        else:
            wide = _node(g, aten.addmm.default, (b_node, x, t_node), mm_v)
        if first.back is not None:
            wide = _node(g, first.back.target, (wide, back_shape), wide_v)
        for m, start, s_v in slices:
            m.result.replace_all_uses_with(_node(g, aten.slice.Tensor, (wide, axis, start, start + m.n), s_v))
    for n, v in retraced.items():
        n.meta["val"] = v
    for m in members:
        for n in (m.back, m.mm, m.flat, m.tw):
            if n is not None:
                g.erase_node(n)
    return True


def _node(g: fx.Graph, target, args: tuple, val, kwargs: dict | None = None) -> fx.Node:
    """A call_function node at g's insertion point with its fake value."""
    n = g.call_function(target, args, kwargs or {})
    n.meta["val"] = val
    return n


class _Cats:
    """The graph's one WeightCats node, after its placeholders, and a getitem per concatenation."""

    def __init__(self, g: fx.Graph):
        self.g, self.fn, self.args, self.reserved = g, WeightCats(), [], 0
        last = [n for n in g.nodes if n.op == "placeholder"][-1]
        with g.inserting_after(last):
            self.node = g.call_function(self.fn, ())
        self.node.meta["val"] = ()

    def add(self, tensors: tuple, val) -> fx.Node:
        """A node of the concatenation of the tensors (FX nodes) whose fake value is val."""
        with self.g.inserting_after(self.node):
            out = _node(self.g, operator.getitem, (self.node, len(self.fn.counts)), val)
        self.fn.counts.append(len(tensors))
        self.args += tensors
        self.node.meta["val"] = (*self.node.meta["val"], val)
        return out

    def finish(self) -> None:
        if self.fn.counts:
            self.node.args = tuple(self.args)
            self.fn.hold(self.reserved)
        else:
            self.g.erase_node(self.node)


def rewrite(gm: fx.GraphModule, weights: frozenset) -> int:
    """Merge the groups of sibling linears of gm (an inference graph; weights: its parameter and
    buffer placeholders). Returns the number of groups merged."""
    if not ENABLED or not weights or config().sibling_mb == 0:
        return 0
    groups = _groups(gm, weights)
    if not groups:
        return 0
    cats, merged = _Cats(gm.graph), 0
    for members in groups:
        if _merge(gm, members, cats):
            merged += 1
            counters.bump("torch_sibling_linears", len(members))
    cats.finish()
    if merged:
        gm.graph.lint()
        gm.recompile()
    return merged
