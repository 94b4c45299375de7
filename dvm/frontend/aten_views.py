"""ATen lowerings that move data without computing: slices and selects (DVM 'slice' views), cat
(of equal pieces: a where over a new axis, then a reshape; else a concat node) and indexing with
aranges (views).
Part of the one table in aten_table (LOWERINGS); the same handler conventions apply."""
from __future__ import annotations

from ..graph import build
from ..graph.dtypes import DType
from ..graph.node import Node
from ..graph.symbolic import SymExpr, mod, prod, sym_max
from .aten_common import Unsupported, dvm_dtype


INT64_MAX = 2 ** 63 - 1


def _slice_start(size, start, length, end, step: int) -> object:
    """PyTorch's clamped start of x[start:end] along an axis of `size` whose result has `length`
    elements: exact for a start >= 0 (int or size expression) and for slices that run to the end."""
    if start is None:
        start = 0
    if isinstance(start, int) and start < 0:
        if step == 1 and (end is None or (isinstance(end, int) and end >= INT64_MAX // 2)):
            return size - length        # x[-k:]: the last `length` elements
        if not isinstance(size, int):
            raise Unsupported("negative slice start on a symbolic size")
        return max(start + size, 0)
    if isinstance(start, SymExpr) and build.bounds(start)[0] < 0:
        raise Unsupported(f"slice start {start} may be negative")
    return start


def slice_(lw, x, dim=0, start=None, end=None, step=1):
    if not isinstance(step, int) or step < 1:
        raise Unsupported(f"slice step {step}")
    dim %= max(x.ndim, 1)
    length = lw.out_shape[dim]
    return build.slice_view(lw.ctx, x, dim, _slice_start(x.shape[dim], start, length, end, step),
                            length, step)


def select(lw, x, dim, index):
    dim %= max(x.ndim, 1)
    if isinstance(index, int) and index < 0:
        index = x.shape[dim] + index
    elif isinstance(index, SymExpr) and build.bounds(index)[0] < 0:
        raise Unsupported(f"select index {index} may be negative")
    return build.slice_view(lw.ctx, x, dim, index, 1, keep=False)


def flip(lw, x, dims):
    """x reversed along dims: a slice of step -1 along each (a view; its reader copies it)"""
    if x.ndim == 0:
        raise Unsupported("flip of a 0-d tensor")
    for d in sorted({d % x.ndim for d in dims}):
        n = x.shape[d]
        if not build.is_one(n) and build.decide_eq(n, 0) is not True:
            x = build.slice_view(lw.ctx, x, d, n - 1, n, -1)
    return x


def roll(lw, x, shifts, dims=()):
    """x rolled by shifts along dims (the flattened x without dims): per axis of size n, the last
    shift % n elements, then the others (a concat; shift % n a size expression where n is one)"""
    if not dims:
        flat = build.reshape(lw.ctx, x, (prod(x.shape),))
        return build.reshape(lw.ctx, roll(lw, flat, shifts, (0,)), x.shape)
    if len(shifts) != len(dims):
        raise Unsupported("roll: shifts and dims of different lengths")
    for shift, d in zip(shifts, dims):
        d %= x.ndim
        n = x.shape[d]
        if not isinstance(shift, int):
            raise Unsupported("roll by a symbolic shift")
        if isinstance(n, int):
            k = shift % n if n else 0
        else:
            k = mod(shift, n)
        if build.decide_eq(k, 0) is not True:
            tail, head = build.slice_view(lw.ctx, x, d, n - k, k), build.slice_view(lw.ctx, x, d, 0, n - k)
            x = build.concat(lw.ctx, [tail, head], d)
    return x


def slice_backward(lw, g, input_sizes, dim, start, end, step):
    """The gradient of x[start:end] along dim (step 1): g between zeros, a concat of g and the
    zero pieces before and after it (the gradient itself where the slice took the whole axis)."""
    dim %= len(input_sizes)
    if step != 1:
        raise Unsupported(f"slice_backward of step {step}")
    length = g.shape[dim]
    first = _slice_start(input_sizes[dim], start, length, end, step)
    after = input_sizes[dim] - first - length
    return _between(lw.ctx, g, dim, first, after, build.cast(build.const(0), g.dtype))


def _between(ctx, x: Node, dim: int, before, after, fill: Node) -> Node:
    """x along dim between `before` and `after` elements of the scalar fill (lengths >= 0, a
    symbolic one maybe 0 at run time: that piece stores nothing)"""
    def piece(n):
        if build.decide_eq(n, 0) is True:
            return None
        if build.bounds(n)[0] < 0:
            raise Unsupported(f"a piece of length {n} that may be negative")
        return build.broadcast_to(ctx, fill, _with_size(x.shape, dim, n))
    return _joined(ctx, [piece(before), x, piece(after)], dim)


def _joined(ctx, pieces: list, dim: int) -> Node:
    """the pieces that are not None joined along dim (a concat of two or more)"""
    pieces = [p for p in pieces if p is not None]
    return build.concat(ctx, pieces, dim) if len(pieces) > 1 else pieces[0]


def _with_size(shape: tuple, dim: int, n) -> tuple:
    return shape[:dim] + (n,) + shape[dim + 1:]


def _axis_pads(ndim: int, pad) -> list:
    """(axis, before, after) of each padded axis: PyTorch's pairs run from the last axis back"""
    return [(ndim - 1 - i, pad[2 * i], pad[2 * i + 1]) for i in range(len(pad) // 2)]


def constant_pad_nd(lw, x, pad, value=0):
    """F.pad's constant mode: per padded axis, a negative pad slices, a positive one joins pieces
    of the value (concats)"""
    if len(pad) % 2 or len(pad) // 2 > x.ndim:
        raise Unsupported(f"pad {list(pad)} for rank {x.ndim}")
    fill = build.cast(build.const(value), x.dtype)
    for dim, lo, hi in _axis_pads(x.ndim, pad):
        crop_lo, crop_hi = (_part(-p) for p in (lo, hi))
        if build.decide_eq(crop_lo, 0) is not True or build.decide_eq(crop_hi, 0) is not True:
            x = build.slice_view(lw.ctx, x, dim, crop_lo, x.shape[dim] - crop_lo - crop_hi)
        x = _between(lw.ctx, x, dim, _part(lo), _part(hi), fill)
    return x


def edge_pad(reflect: bool):
    """reflection / replication padding, joined to x by a concat per padded axis: the mirrored
    elements x[lo:0:-1] and x[n-2:n-2-hi:-1] (reflect), or the first and the last element repeated"""
    def fn(lw, x, padding):
        if len(padding) % 2 or not all(isinstance(p, int) and p >= 0 for p in padding):
            raise Unsupported(f"padding {list(padding)}")
        for dim, lo, hi in _axis_pads(x.ndim, padding):
            x = _joined(lw.ctx, [_edge(lw.ctx, x, dim, lo, True, reflect) if lo else None, x,
                                 _edge(lw.ctx, x, dim, hi, False, reflect) if hi else None], dim)
        return x
    return fn


def _edge(ctx, x: Node, dim: int, k: int, before: bool, reflect: bool) -> Node:
    """the k elements padded before (or after) x along dim"""
    n = x.shape[dim]
    if reflect:
        return build.slice_view(ctx, x, dim, k if before else n - 2, k, -1)
    end = build.slice_view(ctx, x, dim, 0 if before else n - 1, 1)
    return build.broadcast_to(ctx, end, _with_size(x.shape, dim, k))


def _part(p):
    """max(p, 0): a pad's growth, or (of -p) its crop; a size expression where p's sign is not known"""
    return max(p, 0) if isinstance(p, int) else sym_max(p, 0)


def cat(lw, tensors, dim=0):
    """cat along `dim`: a concat node (each piece computed once and stored into its slice of one
    buffer), or, for one piece repeated (HF's rotary `cat((freqs, freqs), -1)`), that piece
    broadcast along a new axis in front of dim and the two axes merged (no store). (Equal pieces
    selected by where on a new axis' index took 2.5-4x the concat's time: docs/DECISIONS.md.)"""
    dt = dvm_dtype(lw.out.dtype)
    pieces = [build.cast(t, dt) for t in tensors if not (t.ndim == 1 and build.decide_eq(t.shape[0], 0) is True)]
    if not pieces:
        raise Unsupported("cat of empty tensors")
    if len(pieces) == 1:
        return pieces[0]
    dim %= pieces[0].ndim
    if any(p.ndim != pieces[0].ndim for p in pieces):
        raise Unsupported("cat of pieces of different ranks")
    if all(p is pieces[0] for p in pieces):
        return _repeated(lw.ctx, pieces[0], len(pieces), dim, lw.out_shape)
    return build.reshape(lw.ctx, build.concat(lw.ctx, pieces, dim), lw.out_shape)


def stack(lw, tensors, dim=0):
    """stack: cat of the pieces, each with a new axis of 1 at dim (a view)"""
    dim %= tensors[0].ndim + 1
    pieces = [build.reshape(lw.ctx, t, t.shape[:dim] + (1,) + t.shape[dim:]) for t in tensors]
    return cat(lw, pieces, dim)


def _repeated(ctx, piece: Node, k: int, dim: int, out_shape) -> Node:
    """cat([piece] * k, dim): piece broadcast along a new axis of k in front of dim, then the two
    axes merged."""
    stacked = build.reshape(ctx, piece, piece.shape[:dim] + (1,) + piece.shape[dim:])
    return build.reshape(ctx, build.broadcast_to(ctx, stacked, _with_size(stacked.shape, dim, k)), out_shape)


def _iota_axis(n: Node):
    """(axis, length) when the int64 / int32 node n holds its index along `axis` (0 .. length-1)
    and is constant along every other axis: an arange reshaped / broadcast / permuted, maybe
    plus 0 or cast between integer dtypes. None when that is not evident from the graph."""
    if n.dtype not in (DType.INT64, DType.INT32):
        return None
    if n.op == "iota":
        a = n.attr("axis")
        return a, n.shape[a]
    if n.op == "cast" and n.inputs[0].dtype in (DType.INT64, DType.INT32):
        return _iota_axis(n.inputs[0])
    if n.op in ("add", "sub") and n.inputs[1].op == "const" and n.inputs[1].attr("value") == 0:
        r = _iota_axis(n.inputs[0])
        return r if r is not None and n.shape[r[0]] == r[1] else None
    if n.op == "add" and n.inputs[0].op == "const" and n.inputs[0].attr("value") == 0:
        r = _iota_axis(n.inputs[1])
        return r if r is not None and n.shape[r[0]] == r[1] else None
    if n.op == "permute":
        r = _iota_axis(n.inputs[0])
        return None if r is None else (n.attr("dims").index(r[0]), r[1])
    if n.op == "broadcast_to":
        r = _iota_axis(n.inputs[0])
        return None if r is None else (r[0] + n.ndim - n.inputs[0].ndim, r[1])
    if n.op == "reshape":
        r = _iota_axis(n.inputs[0])
        if r is None:
            return None
        src = n.inputs[0].shape
        if build.is_one(r[1]):
            return None if src[r[0]] != 1 else (_first_unit(n.shape), 1)
        big_in = [i for i, d in enumerate(src) if not build.is_one(d)]
        big_out = [i for i, d in enumerate(n.shape) if not build.is_one(d)]
        if [src[i] for i in big_in] != [n.shape[i] for i in big_out]:
            return None          # the reshape merges or splits dims: not a plain unsqueeze
        return big_out[big_in.index(r[0])], r[1]
    return None


def _first_unit(shape) -> int:
    return next((i for i, d in enumerate(shape) if build.is_one(d)), 0)


def index(lw, x, indices):
    """x[i_0, ..., i_{k-1}] with each i_j an arange over x's axis j, varying along its own axis of
    the broadcast index shape: a view of x (reshape, permute, broadcast). An arange of n over an
    axis not known to have n entries reads x[:n] there: a slice, whose bounds are checked at run
    time where they cannot be decided (a batch size passed as its own argument, beside a mask's
    batch axis). Other indexing (gathers) runs through PyTorch."""
    if any(i is None or not isinstance(i, Node) for i in indices) or len(indices) > x.ndim:
        raise Unsupported("index with None / non-tensor / too many indices")
    k, out_shape = len(indices), lw.out_shape
    m = len(out_shape) - (x.ndim - k)
    place: dict = {}
    iotas = [_iota_axis(i) for i in indices]
    if any(r is None for r in iotas):
        raise Unsupported("index tensors that are not aranges over the indexed axis")
    for j, r in enumerate(iotas):
        if build.decide_eq(r[1], x.shape[j]) is not True:
            x = build.slice_view(lw.ctx, x, j, 0, r[1])
    for j, i in enumerate(indices):
        r = iotas[j]
        if build.is_one(r[1]):
            continue             # index 0 of a size-1 axis: the axis drops out
        a = r[0] + m - i.ndim
        if a in place.values() or not 0 <= a < m:
            raise Unsupported("two index tensors along one axis (a diagonal)")
        place[j] = a
    kept = [j for j in range(k) if j in place]
    rest = x.shape[k:]
    y = build.reshape(lw.ctx, x, tuple(x.shape[j] for j in kept) + (1,) * (m - len(kept)) + rest)
    units = iter(range(len(kept), m))
    src_of = {place[j]: n for n, j in enumerate(kept)}
    dims = [src_of[p] if p in src_of else next(units) for p in range(m)] + list(range(m, m + len(rest)))
    return build.broadcast_to(lw.ctx, build.permute(lw.ctx, y, dims), out_shape)
