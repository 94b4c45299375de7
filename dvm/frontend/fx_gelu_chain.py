"""A GELU written out as arithmetic, recognized as the VM's one GELU op (a pattern of fx_patterns'
kind, found once per ATen graph).

GPT-2's, Phi's and CodeGen's `0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x ** 3)))`,
BLOOM's `x * 0.5 * (1 + tanh(0.79788456 * x * (1 + 0.044715 * x * x)))` and erf's
`x * 0.5 * (1 + erf(x / sqrt(2)))` reach the ATen graph as eight or so elementwise ops, which the
VM's tile form runs as as many passes over a tile. As `gelu_tanh` / `gelu` they are one
instruction (docs/DECISIONS.md, "A GELU written out").

A match is found from each tanh (erf) node: its root is that node or one of the next MAX_AFTER
arithmetic nodes below it, x a node above it, and every node between (the cone: what the root
computes from x) an ARITH op, the trigger, or x itself, with Python numbers for its other
operands, of x's floating dtype and shape. Which formula the cone is, is decided by its values:
evaluated in float64 on _PROBES it must equal the GELU's within PROBE_RTOL (any spelling, any
order of the operands). The largest root that matches is kept.

Values: the op computes the GELU within a few ULP of the exact function; eager's chain rounds each
step (up to ~2e-3 relative where 1 + tanh cancels, at |gelu(x)| < 1e-4), so the two agree within
assert_close's defaults, as the fused chain did. Nodes of the cone read outside the match (a
training graph saves them) stay nodes of their own (fx_patterns.close). Counted as a pattern of
its segment: "gelu_tanh (written out)" in dvm.explain.
"""
from __future__ import annotations

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch._subclasses.fake_tensor import unset_fake_temporarily

from ..graph import build
from .fx_patterns import Match, _val, close

aten = torch.ops.aten
ENABLED = True   # off: the chain is lowered op by op (tests compare the two)

ARITH = frozenset({aten.mul.Tensor, aten.add.Tensor, aten.sub.Tensor, aten.div.Tensor, aten.pow.Tensor_Scalar,
                   aten.neg.default, aten.rsub.Scalar})
MAX_AFTER = 3     # nodes below the trigger a root may be (1 + t, then * x, then * 0.5)
MAX_ABOVE = 6     # nodes above the trigger x may be (x ** 3, * c, + x, * c2: four)
MAX_DEPTH = 16    # the longest path in a cone (a GELU's: 6)
PROBE_RTOL, PROBE_ATOL = 1e-7, 1e-12
_PROBES = torch.cat([torch.linspace(-12.0, 12.0, 241, dtype=torch.float64),
                     torch.tensor([-30.0, -1e-3, 1e-3, 30.0], dtype=torch.float64)])
# trigger op -> (the VM op, its values on _PROBES)
_KINDS = {aten.tanh.default: ("gelu_tanh", F.gelu(_PROBES, approximate="tanh")),
          aten.erf.default: ("gelu", F.gelu(_PROBES))}


def _cone(root: fx.Node, x: fx.Node, trigger) -> list | None:
    """The nodes root computes from x (x excluded; graph order), or None unless every node from root
    up to x is an ARITH op or the trigger of x's dtype and shape, at most MAX_DEPTH deep, with
    Python numbers for its other operands."""
    xv = _val(x)
    of_x: dict = {x: True}

    def reads_x_only(n, depth: int) -> bool:
        if n not in of_x:
            v = _val(n)
            of_x[n] = False   # (decided below; no cycle in a graph)
            args = (*n.args, *n.kwargs.values())
            if depth < MAX_DEPTH and n.op == "call_function" and (n.target in ARITH or n.target is trigger) and \
                    isinstance(v, torch.Tensor) and v.dtype == xv.dtype and v.shape == xv.shape and \
                    any(isinstance(a, fx.Node) for a in args):
                of_x[n] = all(reads_x_only(a, depth + 1) if isinstance(a, fx.Node) else _number(a) for a in args)
        return of_x[n]

    if not reads_x_only(root, 0):
        return None
    order = {n: i for i, n in enumerate(root.graph.nodes)}
    return sorted((n for n, ok in of_x.items() if ok and n is not x), key=order.__getitem__)


def _number(a) -> bool:
    return isinstance(a, (int, float)) and not isinstance(a, bool)


def _is_gelu(cone: list, x: fx.Node, want: torch.Tensor) -> bool:
    """The cone's last node, evaluated in float64 on _PROBES for x, equals want."""
    env = {x: _PROBES}
    with unset_fake_temporarily():   # (the backend plans under Dynamo's fake mode)
        try:
            for n in cone:
                env[n] = n.target(*[env[a] if isinstance(a, fx.Node) else a for a in n.args], **n.kwargs)
        except Exception:  # noqa: BLE001 - an op that does not take the probes: not a GELU
            return False
        got = env[cone[-1]]
        return bool(torch.all((got - want).abs() <= PROBE_RTOL * want.abs() + PROBE_ATOL))


def _above(t: fx.Node) -> list:
    """Nodes up to MAX_ABOVE steps above the trigger t, nearest first (x's candidates)."""
    out, frontier = [], [t]
    for _ in range(MAX_ABOVE):
        frontier = [a for n in frontier for a in n.args if isinstance(a, fx.Node) and a not in out]
        out += list(dict.fromkeys(frontier))
    return out


def _below(t: fx.Node) -> list:
    """t, then each single user below it that is an ARITH op, up to MAX_AFTER of them."""
    out = [t]
    while len(out) <= MAX_AFTER and len(out[-1].users) == 1:
        (u,) = out[-1].users
        if u.op != "call_function" or u.target not in ARITH:
            break
        out.append(u)
    return out


def _match(t: fx.Node) -> Match | None:
    op, want = _KINDS[t.target]
    xs = [a for a in _above(t) if isinstance(_val(a), torch.Tensor) and _val(a).dtype.is_floating_point]
    for root in reversed(_below(t)):
        for x in xs:
            cone = _cone(root, x, t.target)
            if cone is not None and _is_gelu(cone, x, want):
                return Match(f"{op} (written out)", root, (x,), _lower(op), absorbed=cone[:-1])
    return None


def _lower(op: str):
    def lower(lw, x):
        return build.elementwise(lw.ctx, op, x)
    return lower


def find(gm: fx.GraphModule) -> dict:
    """root FX node -> Match for each GELU written out (absorbed nodes used only inside it)."""
    out: dict = {}
    if not ENABLED:
        return out
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.target in _KINDS and not any(n in m.absorbed for m in out.values()):
            m = _match(n)
            if m is not None:
                close(m)
                out[m.root] = m
    return out
