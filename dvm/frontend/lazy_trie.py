"""The structure of pending graphs: a trie of recorded ops, each node holding the DVM graph of
its prefix, built once on symbolic sizes (lazy_lower) by the table's handlers.

A pending graph is a path from ROOT: each recorded op is one edge, keyed by its signature (the
op and its encoded arguments: pending values by index, new inputs by dtype and size pattern,
sizes by symbol, scalars by kind or value; see lazy_record). The node at the end of an edge holds
the DVM values of every pending value so far, the graph's inputs (tensors and runtime scalars, in
slot order), the shape checks, and how to allocate the new values at concrete sizes. A program
that repeats the same ops on new sizes walks the same path: the handlers run once per edge, and
each recording is a dictionary lookup plus the evaluation of the new values' shapes.

The trie is shared by all threads (insertions under a lock; lookups are plain dict reads) and
bounded: past TRIE_MAX_NODES it is dropped and regrown (counted); pending graphs keep their nodes.
"""
from __future__ import annotations

import threading

import torch

from ..graph import build
from ..graph.build import ShapeContext
from ..graph.node import Node
from ..runtime import counters
from .aten_common import TORCH_TO_DVM, Unsupported, dvm_dtype
from .lazy_lower import AtTheseSizes, LazyLower, check_result, dim_of, scalar_dtype, shape_code, symbol
from .lazy_ops import Arg
from .torch_segment import _stride_order

TRIE_MAX_NODES = 20_000
TORCH_OF = {d: t for t, d in TORCH_TO_DVM.items()}
_LOCK = threading.Lock()
_COUNT = [0]


class Prefix:
    """A trie node: the pending graph after the ops on the path to it."""
    __slots__ = ("children", "nodes", "inputs", "scalars", "checks", "new_checks", "outs", "n_ops", "op",
                 "failed", "transient", "__weakref__")

    def __init__(self, nodes=(), inputs=(), scalars=(), checks=(), new_checks=(), outs=(), n_ops=0, op=None,
                 failed=None, transient=False):
        self.children: dict = {}
        self.nodes = nodes            # DVM Node per pending value (None: a view DVM cannot take)
        self.inputs = inputs          # 'input' Node per slot (tensors and runtime scalars)
        self.scalars = scalars        # ((slot, DType), ...): the runtime scalar slots
        self.checks = checks          # every shape check so far
        self.new_checks = new_checks  # the checks the last op added (evaluated at each recording)
        self.outs = outs              # per new value: (size codes or None, DVM shape, torch dtype,
                                      # eager's dense dim order when not row-major, else None)
        self.n_ops = n_ops            # recorded ops (views not counted)
        self.op = op                  # the OpInfo of the edge into this node
        self.failed = failed          # why the op cannot be recorded (a cached structural failure)
        self.transient = transient    # failed at these sizes only (AtTheseSizes): not cached


ROOT = [Prefix()]


def root() -> Prefix:
    return ROOT[0]


def child(prefix: Prefix, sig: tuple, make) -> Prefix:
    """prefix's child for sig, made by make() (a Prefix, failed or not) on a miss."""
    got = prefix.children.get(sig)
    if got is not None:
        return got
    made = make()
    if made.failed is not None and made.transient:
        return made                          # not remembered: other sizes may record
    with _LOCK:
        got = prefix.children.setdefault(sig, made)
        if got is made:
            _COUNT[0] += 1
            if _COUNT[0] > TRIE_MAX_NODES:   # dropped for new graphs; pending ones keep their path
                ROOT[0], _COUNT[0] = Prefix(), 0
                counters.bump("lazy_trie_resets")
    counters.bump("lazy_structures_built")
    return got


# -- decoding a signature into handler arguments -------------------------------------------------
class _Decoder:
    """Turns encoded arguments into handler values (Nodes, dims, scalars), adding the new input
    slots in the order the recorder numbered them."""

    def __init__(self, prefix: Prefix):
        self.prefix = prefix
        self.inputs = list(prefix.inputs)
        self.scalars = list(prefix.scalars)
        self.pending_scalars: list = []    # (slot, partner name, half reads f32)

    def tensor(self, e):
        if e is None:
            return None
        tag = e[0]
        if tag == "v":
            node = self.prefix.nodes[e[1]]
            if node is None:
                raise Unsupported("a view DVM cannot take")
            return node
        if tag == "i":
            return self.inputs[e[1]]
        if tag == "n":
            slot = len(self.inputs)
            node = Node.make("input", dvm_dtype(e[1]), tuple(dim_of(c) for c in e[2]), index=slot, name=f"in{slot}")
            self.inputs.append(node)
            return node
        return self.scalar(e)

    def scalar(self, e, name: str | None = None):
        if e is None:
            return None
        if e[0] == "f":
            slot = len(self.inputs)
            self.inputs.append(None)              # made once its partner is known
            self.pending_scalars.append((slot, e[1], e[2]))
            return ("slot", slot)
        if e[0] == "k":
            return float(e[2]) if e[1] == "f" else e[2]
        raise Unsupported(f"scalar encoding {e!r}")

    def value(self, kind: Arg, e):
        if kind is Arg.TENSOR:
            return self.tensor(e)
        if kind is Arg.TENSORS:
            return [self.tensor(x) for x in e] if e is not None else None
        if kind is Arg.SIZE:
            return _size(e)
        if kind is Arg.SCALAR:
            return self.scalar(e)
        return _literal(e)

    def finish(self, named: dict) -> None:
        """Make the runtime scalars' input nodes (their dtype follows their partner tensor)."""
        for slot, partner, half in self.pending_scalars:
            p = named.get(partner)
            if not isinstance(p, Node):
                raise Unsupported("runtime scalar without a tensor partner")
            dt = scalar_dtype(p, half)
            self.inputs[slot] = Node.make("input", dt, (), index=slot, name=f"scalar{slot}")
            self.scalars.append((slot, dt))
        for k, v in list(named.items()):
            if isinstance(v, tuple) and len(v) == 2 and v[0] == "slot":
                named[k] = self.inputs[v[1]]


def _size(e):
    if e is None or isinstance(e, int):
        return e
    if isinstance(e, tuple) and len(e) == 2 and e[0] == "z":
        return symbol(e[1])
    return tuple(_size(x) for x in e)


def _literal(e):
    if isinstance(e, tuple):
        if len(e) == 2 and e[0] == "F":
            return float(e[1])
        return tuple(_literal(x) for x in e)
    return e


def decode(prefix: Prefix, info, sig: tuple) -> tuple[_Decoder, list, dict]:
    """The handler's positional and keyword arguments for sig."""
    enc_args, enc_kwargs = sig[1], sig[2]
    dec = _Decoder(prefix)
    kinds = {name: kind for name, kind, _ in info.args}
    names = [name for name, _, _ in info.args]
    args = [dec.value(info.args[i][1], e) for i, e in enumerate(enc_args)]
    kwargs = {k: dec.value(kinds.get(k, Arg.LITERAL), e) for k, e in enc_kwargs}
    named = dict(zip(names, args))
    named.update(kwargs)
    dec.finish(named)
    args = [named[names[i]] for i in range(len(args))]
    kwargs = {k: named[k] for k in kwargs}
    return dec, args, kwargs


# -- building a child ------------------------------------------------------------------------------
def _meta(x):
    if isinstance(x, torch.Tensor):
        return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")
    if isinstance(x, (list, tuple)):
        return type(x)(_meta(v) for v in x)
    return x


def meta_run(func, args, kwargs):
    """func on meta copies of its arguments: PyTorch's result shapes and dtypes (its errors too)."""
    try:
        return func(*_meta(args), **{k: _meta(v) for k, v in kwargs.items()})
    except Exception as e:  # noqa: BLE001 - PyTorch rejects the call: it runs eagerly and raises there
        raise AtTheseSizes(f"PyTorch rejects it: {type(e).__name__}") from None


def _grow(prefix: Prefix, dec: _Decoder, ctx: ShapeContext, new_values: tuple, info, eager_outs=None,
          counts: bool = True) -> Prefix:
    """The child holding new_values; eager_outs: PyTorch's results (meta), whose layouts the
    placeholders take (None: no placeholders, the values live in existing tensors)."""
    new_checks = tuple(ctx.checks[len(prefix.checks):])
    outs = () if eager_outs is None else \
        tuple((shape_code(n.shape), n.shape, TORCH_OF[n.dtype], _stride_order(o)) for n, o in zip(new_values, eager_outs))
    return Prefix(nodes=prefix.nodes + new_values, inputs=tuple(dec.inputs), scalars=tuple(dec.scalars),
                  checks=tuple(ctx.checks), new_checks=new_checks, outs=outs,
                  n_ops=prefix.n_ops + (1 if counts else 0), op=info)


def build_record(prefix: Prefix, info, sig: tuple, args, kwargs, env: dict) -> Prefix:
    """The child for a recorded op (Kind.RECORD): its handler on the decoded arguments, checked
    against PyTorch's result on meta tensors."""
    try:
        out = meta_run(info.func, args, kwargs)
        dec, hargs, hkwargs = decode(prefix, info, sig)
        ctx = ShapeContext(list(prefix.checks))
        result = info.handler(LazyLower(ctx, out, info.func, hargs, hkwargs, env), *hargs, **hkwargs)
        outs = out if isinstance(out, (tuple, list)) else (out,)
        results = result if isinstance(result, tuple) else (result,)
        if len(results) != len(outs):
            raise Unsupported("output count")
        values = tuple(check_result(r, o, env) for r, o in zip(results, outs))
    except Unsupported as e:
        return Prefix(failed=str(e), transient=isinstance(e, AtTheseSizes))
    except Exception as e:  # noqa: BLE001 - DVM's DTypeError / ShapeError: PyTorch decides
        return Prefix(failed=f"{type(e).__name__}: {e}")
    return _grow(prefix, dec, ctx, values, info, eager_outs=outs)


def build_view(prefix: Prefix, info, sig: tuple, real_out, env: dict) -> Prefix:
    """The child for a view of a pending value: the table's handler for it (the real view,
    taken by PyTorch on the placeholder, is its reference), or an opaque value (None)."""
    node = None
    dec = _Decoder(prefix)
    ctx = ShapeContext(list(prefix.checks))
    outs = real_out if isinstance(real_out, (tuple, list)) else (real_out,)
    if info.handler is not None and len(outs) == 1:
        try:
            dec, hargs, hkwargs = decode(prefix, info, sig)
            ctx = ShapeContext(list(prefix.checks))
            r = info.handler(LazyLower(ctx, outs[0], info.func, hargs, hkwargs, env), *hargs, **hkwargs)
            node = check_result(r, outs[0], env)
        except Exception:  # noqa: BLE001 - an opaque view: reading it computes the pending graph
            node, dec, ctx = None, _Decoder(prefix), ShapeContext(list(prefix.checks))
    values = (node,) if node is not None else (None,) * len(outs)
    return _grow(prefix, dec, ctx, values, info, counts=False)


def build_inplace(prefix: Prefix, info, sig: tuple, args, kwargs, env: dict) -> Prefix:
    """The child for `self.op_(...)` / `self.copy_(src)`: the functional op's value cast to
    self's dtype (PyTorch's in-place rule), as self's new value."""
    try:
        meta_run(info.func, args, kwargs)   # PyTorch's checks (broadcast to self, castable)
        dec, hargs, hkwargs = decode(prefix, info, sig)
        ctx = ShapeContext(list(prefix.checks))
        target = hargs[0]
        if info.functional is None:       # copy_(self, src)
            value = _copy_value(ctx, target, hargs[1])
        else:
            fout = meta_run(info.functional, args, kwargs)
            value = info.handler(LazyLower(ctx, fout, info.functional, hargs, hkwargs, env), *hargs, **hkwargs)
            if not isinstance(value, Node):
                raise Unsupported("in-place op with several results")
            value = build.cast(value, target.dtype)
        value = check_result(value, args[0], env)
    except Unsupported as e:
        return Prefix(failed=str(e), transient=isinstance(e, AtTheseSizes))
    except Exception as e:  # noqa: BLE001
        return Prefix(failed=f"{type(e).__name__}: {e}")
    return _grow(prefix, dec, ctx, (value,), info)


def _copy_value(ctx, target: Node, src) -> Node:
    if not isinstance(src, Node):
        raise Unsupported("copy_ from a non-tensor")
    if src.ndim < target.ndim:
        src = build.reshape(ctx, src, (1,) * (target.ndim - src.ndim) + src.shape)
    return build.cast(build.broadcast_to(ctx, src, target.shape), target.dtype)


def concrete_shape(code, shape, sym_vals: list, env: dict) -> tuple:
    """The concrete shape of a new value (code: size codes; else its DVM shape)."""
    if code is not None:
        return tuple(c if c >= 0 else sym_vals[-1 - c] for c in code)
    from ..graph.symbolic import evaluate
    return tuple(evaluate(d, env) for d in shape)
