"""`dvm.explain`: what a kernel function fuses into, for given arguments, and the counters."""
from __future__ import annotations

from ..codegen.verifier import verify
from ..runtime import counters
from ..runtime.debug import graph_ir, report
from .builder import KernelFunction


def explain(fn=None, *args, ir: bool = False) -> str:
    """A readable report for a @dvm.kernel function (fusion groups, kernels of the Program for
    these arguments, counters) or for a torch model / function (segments, DVM kernels,
    fallbacks with reasons, counters); without arguments, what eager lazy mode (dvm.lazy())
    recorded, fused and flushed recently (flushes by reason, the op that caused each)."""
    if fn is None:
        from .lazy import report as lazy_report  # imports torch
        return lazy_report()
    if not isinstance(fn, KernelFunction):
        from .torch_backend import explain_model  # a torch model / function (imports torch)
        return explain_model(fn, *args)
    traced = fn.trace(*args)
    lines = [f"{fn!r}", report(traced.graph)]
    if traced.checks:
        lines.append("run-time shape checks:")
        lines += [f"  {c.lhs} {'!= 0' if c.rhs is None else '== ' + str(c.rhs)}  ({c.why})" for c in traced.checks]
    layout = verify(fn.program(*args))
    for i, kl in enumerate(layout.kernels):
        lines.append(f"kernel {i}: rows {list(kl.row_sizes)} x cols {list(kl.col_sizes)}, tile {kl.bm}x{kl.bn}, "
                     f"{len(kl.instrs)} instructions, {len(kl.sweeps)} sweep(s)")
    if ir:
        lines.append("graph IR:\n" + graph_ir(traced.graph.outputs))
    lines.append("counters: " + ", ".join(f"{k}={v}" for k, v in sorted(counters.snapshot().items())))
    return "\n".join(lines)
