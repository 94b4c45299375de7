"""Input updates in a planned ATen graph: a `copy_(x, v)` of a graph input x (an input mutation
AOTAutograd keeps in the graph: an optimizer's update) whose value v the open segment computes
becomes part of that segment (`Segment.writes`): it stores v into x itself where that is safe at
run time (torch_segment.SegmentRunner), else copies it in after its launch."""
from __future__ import annotations

import torch
import torch.fx as fx

from ..graph.symbolic import decide_eq

COPY_ = torch.ops.aten.copy_.default


def absorb_write(planner, n: fx.Node) -> bool:
    """Make `n` (a copy_) a write of the planner's open segment, if nothing else reads v and every
    other reader of x comes before n (then it is a member of the segment or runs before its
    launch); False, and nothing changed, otherwise."""
    seg, (dst, src) = planner.open, (n.args + (None, None))[:2]
    if seg is None or n.kwargs or len(n.args) != 2 or n.users or not isinstance(src, fx.Node) \
            or planner.seg_of.get(src) is not seg or not isinstance(dst, fx.Node) or dst.op != "placeholder":
        return False
    fs, fd = src.meta.get("val"), dst.meta.get("val")
    if not (isinstance(fs, torch.Tensor) and isinstance(fd, torch.Tensor)) or fs.dtype != fd.dtype or \
            fs.dim() != fd.dim() or \
            not all(decide_eq(a, b) is True for a, b in zip(planner.syms.shape(fs), planner.syms.shape(fd))):
        return False
    if planner.position is None:
        planner.position = {m: i for i, m in enumerate(planner.gm.graph.nodes)}
    position = planner.position
    if any(u is not n and u.target is not COPY_ and position[u] > position[n] for u in dst.users) or \
            any(u not in seg.value and u.target is not COPY_ for u in src.users):
        return False
    if src not in seg.outputs:
        seg.outputs.append(src)
    seg.writes.append((n, src, dst))
    return True
