"""Chains of views of PyTorch values as one call of the run graph (a pass over the run graph).

Hugging Face attention takes v as `transpose(view(slice(qkv, ...), [b, L, heads, d]), 1, 2)` and
its output back as `view(transpose(attn, 1, 2), [b, L, -1])`: a PyTorch call per view, each
~2-3 us warm and 3-5x that inside a forward. A view's sizes, strides and storage offset follow
from its input's and from the view's arguments alone, so the chain's result is remembered per
(input sizes, strides, offset, argument values) and later calls take it in one `as_strided`.

Invariant: the remembered view is the chain's own result, element for element the same memory
(storage, sizes, strides, offset); only results that share their input's storage are
remembered (a reshape that had to copy runs its chain every time). An input that requires grad
(autograd would see an as_strided) always runs its chain.

The chain last taken is checked first in one C++ call (the tensor's dtype, sizes, strides and
dispatch keys, as a segment's quick path), then its offset and argument values. Where every
reader of the chain's result only reads it into fresh results (a matrix product, attention, a
segment that updates no input: PURE_READERS), the view is taken by reinterpretation (Inductor's
`_reinterpret_tensor`, ~1 us less than as_strided): a tensor on the same storage that is no
autograd view of its input and has its own version counter, which no such reader looks at.
Elsewhere (a graph output, an in-place update, any other call) it is an as_strided view.

The chains of one value (attention's q, k and v views of one product) are then one call that
returns their views (getitems take them apart; `SIBLINGS`): one check of the value and one memo
entry for all, the views taken by one `map` of `_reinterpret_tensor` where each may be. They are
remembered only where every one shares the value's storage (else each call runs every chain).

A split's pieces (`split`, `split_with_sizes`, `unbind`: GPT-2's q / k / v) are narrows or
selects of its input, the same views split takes: where each piece goes on into a chain of
views, or only one piece is read, the split and its getitems become one view call per piece
(`_split_piece`, heading or ending a chain where there is one), and the split call goes. (Pieces
a segment reads are replayed in the segment: fx_segment_lower.) Before the chains, `merge_views`
makes a plain view of a plain view read only by it one view.
"""
from __future__ import annotations

import operator
from itertools import repeat
from typing import Callable

import torch
import torch.fx as fx

from ..runtime import counters
from .gelu_size import addmm_activation, gelu
from .fx_attention_math import SDPA, SDPA_CALL
from .fx_sdpa import sdpa_keep_mask
from .torch_calls import _slice, _view_or_reshape, linear_activation, linear_kxm
from .torch_launch import tensor_check
from .torch_segment import SegmentRunner

try:   # Inductor's view without autograd bookkeeping (see the module docstring)
    from torch._C._dynamo.guards import _reinterpret_tensor
except ImportError:  # pragma: no cover - a PyTorch without it
    _reinterpret_tensor = None


def _split_piece(x: torch.Tensor, size: int, dim: int, i: int) -> torch.Tensor:
    """Piece i of `x.split(size, dim)`: the same view (split narrows x so)."""
    if size > 0:
        start = i * size
        return x.narrow(dim, start, min(size, x.shape[dim] - start))
    return x.split(size, dim)[i]


def _sizes_piece(x: torch.Tensor, sizes: list, dim: int, i: int) -> torch.Tensor:
    """Piece i of `x.split_with_sizes(sizes, dim)`: the same view; sizes that do not add up to
    x's extent raise as split_with_sizes does."""
    if sum(sizes) != x.shape[dim]:
        return x.split_with_sizes(sizes, dim)[i]
    return x.narrow(dim, sum(sizes[:i]), sizes[i])


def _unbind_piece(x: torch.Tensor, dim: int, i: int) -> torch.Tensor:
    """Piece i of `x.unbind(dim)`: the same view."""
    return x.select(dim, i)


# Run-graph callables whose result is a view of their first argument (_view_or_reshape: or a copy).
VIEW_CALLS = frozenset({torch.Tensor.view, _view_or_reshape, _slice, torch.Tensor.t, torch.Tensor.unsqueeze,
                        torch.Tensor.squeeze, torch.Tensor.transpose, torch.Tensor.permute, torch.Tensor.expand,
                        torch.Tensor.select, _split_piece, _sizes_piece, _unbind_piece})
ENABLED = True   # off: one call per view (the tests and the A/B compare the two)
REINTERPRET = True   # off: every remembered view is an as_strided (the tests compare the two)
SIBLINGS = True      # off: each chain its own call, where several read one value (the tests compare)
_MEMO_MAX = 64   # remembered views per chain (one per tuple of sizes seen)
# Run-graph callables that read their tensor arguments into fresh results only: they neither write
# them nor return them (nor a view of them), and keep no reference to them.
PURE_READERS = frozenset({torch.nn.functional.linear, linear_kxm, linear_activation, torch.addmm, torch.mm, torch.bmm,
                          torch.matmul, addmm_activation, gelu, SDPA, SDPA_CALL, sdpa_keep_mask})


# run-graph split calls -> (the piece function, the split's default arguments after the tensor);
# (the run graph calls split_with_sizes as its Tensor method: torch_calls._SAME_OP)
_SPLITS = {torch.ops.aten.split.Tensor: (_split_piece, (None, 0)),
           torch.Tensor.split_with_sizes: (_sizes_piece, (None, 0)),
           torch.ops.aten.unbind.int: (_unbind_piece, (0,))}


class _Slot(int):
    """The place of a run-time argument (a run-graph node) in a chain step's arguments."""


def _remap(a, fn: Callable):
    """A chain step's arguments with fn applied to each leaf (lists and tuples kept)."""
    if isinstance(a, list):
        return [_remap(b, fn) for b in a]
    if isinstance(a, tuple):
        return tuple(_remap(b, fn) for b in a)
    return fn(a)


def _taker(reinterprets: tuple) -> Callable:
    """take(x, spec, offset): the remembered views of x (one view where there is one chain, else
    their tuple); spec: (sizes, strides, storage offsets less x's offset), a tuple each, one entry
    per chain; offset: x's storage offset. A view is a reinterpretation where its chain's flag is
    set, else an as_strided view."""
    flags = tuple(bool(r and _reinterpret_tensor is not None) for r in reinterprets)
    n = len(flags)
    if all(flags) and n == 1:
        return lambda x, spec, offset: _reinterpret_tensor(x, spec[0][0], spec[1][0], spec[2][0])
    if all(flags):   # (map and repeat: no Python frame per view)
        return lambda x, spec, offset: tuple(map(_reinterpret_tensor, repeat(x, n), *spec))

    def take(x, spec, offset):
        views = tuple(_reinterpret_tensor(x, s, st, r) if f else x.as_strided(s, st, r + offset)
                      for f, s, st, r in zip(flags, *spec))
        return views[0] if n == 1 else views
    return take


def _chain_call(chains: list) -> Callable:
    """view_chain(x, *values): each chain's view of x (the view itself for one chain, else their
    tuple). chains: (steps, reinterpret) per chain, steps: (callable, args after the first, with
    _Slot(i) for values[i]); reinterpret: its remembered views by _reinterpret_tensor (every
    reader of its result is a pure one), else by as_strided. The views are remembered together:
    only where every one shares x's storage."""
    memo: dict = {}
    last: list = [None]   # (tensor check, offset, values, memo entry) of the views last taken
    take = _taker(tuple(r for _, r in chains))
    single = len(chains) == 1

    def view_chain(x, *values):
        q = last[0]
        if q is not None and q[0](x) and q[1] == x.storage_offset() and q[2] == values and not x.requires_grad:
            return take(x, q[3][0], q[1])
        offset = x.storage_offset()
        key = (x.shape, x.stride(), offset, values)
        try:
            got = memo.get(key)
        except TypeError:   # an argument value that cannot be a key (never remembered)
            got = key = None
        if got is not None and not x.requires_grad:
            if got[1] is None:   # the entry's tensor check, made at its first reuse
                got[1] = tensor_check((x,)) or False
            last[0] = (got[1], offset, values, got) if got[1] else None
            return take(x, got[0], offset)
        outs = []
        for steps, _ in chains:
            y = x
            for fn, args in steps:   # (each _Slot(i) is values[i])
                y = fn(y, *_remap(args, lambda a: values[a] if isinstance(a, _Slot) else a))
            outs.append(y)
        base = x.untyped_storage().data_ptr()
        if key is not None and all(y.untyped_storage().data_ptr() == base for y in outs):
            if len(memo) >= _MEMO_MAX:
                memo.clear()
            memo[key] = [tuple(zip(*((tuple(y.shape), y.stride(), y.storage_offset() - offset) for y in outs))), None]
        return outs[0] if single else tuple(outs)
    # (fx_reinplace: every element of the views has a location of its own)
    view_chain.injective = not any(fn is torch.Tensor.expand for steps, _ in chains for fn, _ in steps)
    return view_chain


def _pure_readers_only(n: fx.Node) -> bool:
    """Every reader of n reads it into fresh results only (PURE_READERS, or a segment's run that
    updates no input); a graph output is not."""
    if not (REINTERPRET and n.users):
        return False
    for u in n.users:
        if u.op != "call_function":
            return False
        runner = getattr(u.target, "__self__", None)   # a segment's bound run
        if not (u.target in PURE_READERS or isinstance(runner, SegmentRunner) and not runner.writes):
            return False
    return True


def _is_view(n) -> bool:
    return isinstance(n, fx.Node) and n.op == "call_function" and n.target in VIEW_CALLS and not n.kwargs \
        and bool(n.args) and isinstance(n.args[0], fx.Node)


def _split_args(n: fx.Node) -> tuple | None:
    """(piece function, the split's arguments after its tensor) of a split call, else None."""
    if n.op != "call_function" or n.kwargs or n.target not in _SPLITS or not n.args or \
            not isinstance(n.args[0], fx.Node):
        return None
    piece, defaults = _SPLITS[n.target]
    given = tuple(n.args[1:])
    if len(given) > len(defaults) or any(d is None for d in defaults[len(given):]):
        return None
    return piece, given + defaults[len(given):]


def _heads_chain(n: fx.Node) -> bool:
    """n's one reader is a view call of n."""
    reader = next(iter(n.users))
    return _is_view(reader) and reader.args[0] is n


def _pieces_of_splits(g: fx.Graph) -> int:
    """Replace each split whose every reader is a getitem of a constant index >= 0 read only by a view
    call (the head of a chain), or whose one reader is such a getitem (a narrow costs less than a
    split; the piece may also end a chain of views before it), by one piece call per getitem.
    Returns the calls removed."""
    removed = 0
    for n in list(g.nodes):
        got = _split_args(n)
        if got is None or not n.users:
            continue
        readers = list(n.users)
        if not all(u.op == "call_function" and u.target is operator.getitem and len(u.args) == 2 and
                   isinstance(u.args[1], int) and u.args[1] >= 0 for u in readers):
            continue
        if len(readers) > 1 and not all(len(u.users) == 1 and _heads_chain(u) for u in readers):
            continue
        piece, args = got
        for u in readers:
            with g.inserting_before(u):
                call = g.call_function(piece, (n.args[0], *args, u.args[1]))
            u.replace_all_uses_with(call)
            g.erase_node(u)
        g.erase_node(n)
        removed += 1
    return removed


def merge_views(g: fx.Graph) -> None:
    """view(view(x, a), b) as view(x, b) where the inner view has no other reader: both are plain
    views (Tensor.view) only of row-major tensors, and any view of row-major x is x's memory in
    the same order."""
    for n in list(g.nodes):
        inner = n.args[0] if n.target is torch.Tensor.view else None
        if isinstance(inner, fx.Node) and inner.target is torch.Tensor.view and len(inner.users) == 1:
            n.args = (inner.args[0],) + n.args[1:]
            g.erase_node(inner)
            counters.bump("torch_views_merged")


def fold(g: fx.Graph) -> tuple[int, int]:
    """Replace each chain of two or more view calls (each one's value read only by the next) by
    one view_chain call, a split's pieces taken as steps of chains (_pieces_of_splits). Returns
    (chains, calls removed)."""
    if not ENABLED:
        return 0, 0
    chains, removed, gone = 0, _pieces_of_splits(g), set()
    made: dict = {}   # each chain call -> its chain: (steps, reinterpret)
    for n in reversed(list(g.nodes)):
        if n in gone or not _is_view(n):
            continue
        if len(n.users) == 1 and _is_view(next(iter(n.users))):
            continue   # not a chain's last call
        chain = [n]
        while _is_view(chain[0].args[0]) and len(chain[0].args[0].users) == 1:
            chain.insert(0, chain[0].args[0])
        if len(chain) < 2:
            continue
        values: list = []

        def slot(a):
            values.append(a)
            return _Slot(len(values) - 1)
        steps = [(m.target, fx.map_arg(tuple(m.args[1:]), slot)) for m in chain]
        made_chain = (steps, _pure_readers_only(n))
        with g.inserting_before(n):
            call = g.call_function(_chain_call([made_chain]), (chain[0].args[0], *values))
        made[call] = made_chain
        n.replace_all_uses_with(call)
        for m in reversed(chain):
            g.erase_node(m)
        gone.update(chain)
        chains, removed = chains + 1, removed + len(chain) - 1
    removed += _merge_siblings(g, made) if SIBLINGS else 0
    if removed:
        counters.bump("torch_view_chain_calls_removed", removed)
    return chains, removed


def _merge_siblings(g: fx.Graph, made: dict) -> int:
    """The chain calls of one input (attention's q, k and v of one product) as one call returning
    their views, which getitems take apart: one check of the input and one memo for all. Only
    calls whose values are all computed before the first of them. made: fold's chain calls, each
    to its chain. Returns the calls removed."""
    order = {n: i for i, n in enumerate(g.nodes)}
    groups: dict = {}
    for n in g.nodes:
        if n in made:
            groups.setdefault(n.args[0], []).append(n)
    removed = 0
    for calls in groups.values():
        first = calls[0]
        if len(calls) < 2 or not all(order.get(a, -1) < order[first] for c in calls for a in c.args[1:]
                                     if isinstance(a, fx.Node)):
            continue
        chains, values = [], []
        for c in calls:   # each chain's values as slots of the shared values (a node once)
            slots = [_shared_slot(values, a) for a in c.args[1:]]
            renumber = lambda a, slots=slots: _Slot(slots[a]) if isinstance(a, _Slot) else a   # noqa: E731
            steps, reinterpret = made[c]
            chains.append(([(fn, _remap(args, renumber)) for fn, args in steps], reinterpret))
        with g.inserting_before(first):
            call = g.call_function(_chain_call(chains), (first.args[0], *values))
            for i, c in enumerate(calls):
                c.replace_all_uses_with(g.call_function(operator.getitem, (call, i)))
        for c in calls:
            g.erase_node(c)
        removed += len(calls) - 1
    return removed


def _shared_slot(values: list, a) -> int:
    """The index of value a in values, appended where it is not a node there already."""
    if isinstance(a, fx.Node) and a in values:
        return values.index(a)
    values.append(a)
    return len(values) - 1
