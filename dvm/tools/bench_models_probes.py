"""What `dvm bench models` records about each compiled system while it runs: Dynamo's
recompile-limit warnings, graph counts, the backend's own compile time (Inductor's compile_fx_inner,
DVM's CompiledFx) and, for DVM, the compiled graphs' kernels, fallbacks and counters."""
from __future__ import annotations

import logging
import time
from collections import Counter


class LimitWatcher(logging.Handler):
    """Catches Dynamo's "hit config.recompile_limit" warning (the frame then runs eagerly)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record):
        try:
            msg = record.getMessage()
        except Exception:  # pragma: no cover
            return
        if "recompile_limit" in msg or "cache_size_limit" in msg:
            self.messages.append(msg.splitlines()[0] + " " + " ".join(
                line.strip() for line in msg.splitlines()[1:3]))


class Stats:
    def __init__(self):
        self.graphs = 0
        self.backend_s = 0.0          # the backend's own compile
        self.backend_calls = 0
        self.wrapper_s = 0.0          # Inductor: all of compile_fx (AOT tracing included)
        self.compiled: list = []      # DVM: the CompiledFx objects


def inductor_backend(stats: Stats):
    """A Dynamo backend doing what backend="inductor" does (compile_fx), counting graphs and
    timing compile_fx_inner (Inductor's own compile of each AOT graph)."""
    from torch._inductor.compile_fx import compile_fx, compile_fx_inner

    def inner(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return compile_fx_inner(*args, **kwargs)
        finally:
            stats.backend_s += time.perf_counter() - t0
            stats.backend_calls += 1

    def backend(gm, example_inputs):
        t0 = time.perf_counter()
        try:
            out = compile_fx(gm, example_inputs, inner_compile=inner)
        finally:
            stats.wrapper_s += time.perf_counter() - t0
        stats.graphs += 1
        return out
    return backend


class TimeDvmCompiler:
    """Times DVM's compilers: wraps CompiledFx as dvm.frontend.torch_backend sees it."""

    def __init__(self, stats: Stats):
        self.stats = stats

    def __enter__(self):
        from dvm.frontend import torch_backend as tb
        self.tb, self.orig = tb, tb.CompiledFx
        stats, orig = self.stats, self.orig

        def timed(gm, example_inputs, kind):
            t0 = time.perf_counter()
            try:
                obj = orig(gm, example_inputs, kind)
            finally:
                stats.backend_s += time.perf_counter() - t0
                stats.backend_calls += 1
            stats.compiled.append(obj)
            return obj
        tb.CompiledFx = timed
        return self

    def __exit__(self, *exc):
        self.tb.CompiledFx = self.orig
        return False


def dvm_graph_info(cfx) -> dict:
    segs = cfx.segments
    fallbacks = Counter(f"{s.node.target}: {s.reason}" for s in cfx.torch_steps if s.kind == "fallback")
    cubes = Counter(str(s.node.target) for s in cfx.torch_steps if s.kind == "cube")
    chosen = Counter(f"{s.node.target}: {s.reason}" for s in cfx.torch_steps if s.kind == "torch")
    return {"kind": cfx.kind, "segments": len(segs), "vector_kernels": sum(s.n_kernels for s in segs),
            "cube_ops": sum(cubes.values()), "cube": dict(cubes),
            "fallback_ops": sum(fallbacks.values()), "fallbacks": dict(fallbacks), "pytorch_by_plan": dict(chosen),
            "patterns": dict(Counter(p for s in segs for p in s.seg.patterns)),
            # run once per tuple of sizes (fx_sizeonly): the first segments and PyTorch steps
            "size_only_segments": getattr(cfx, "n_const_segments", 0),
            "size_only_fallback_ops": sum(1 for s in cfx.torch_steps[:getattr(cfx, "n_const_torch_steps", 0)]
                                          if s.kind == "fallback"),
            "compile_s": cfx.compile_s}


def dvm_result(stats: Stats, before: dict, after: dict, stream, graphs_stream: int) -> dict:
    """DVM's part of a system record: the compiled graphs, the stream's counter deltas (fallbacks
    of whole graphs apart), and the recompiles beyond Dynamo's size-1 specializations."""
    delta = {k: v - before.get(k, 0) for k, v in after.items() if isinstance(v, int) and v != before.get(k, 0)}
    infos = [dvm_graph_info(c) for c in stats.compiled if hasattr(c, "segments")]
    main = max(infos, key=lambda x: x["vector_kernels"] + x["cube_ops"] + x["fallback_ops"], default=None)
    size1 = len({(b == 1, L == 1) for b, L in stream})
    return {"graphs": infos, "main_graph": main,
            "graph_fallbacks": {k: v for k, v in delta.items() if k.startswith("fallback:graph:")},
            "counters": {k: v for k, v in sorted(delta.items())
                         if not k.startswith(("view:", "python:", "fallback:", "cube:", "size:"))},
            "size1_patterns": size1, "recompiles_beyond_size1": max(0, graphs_stream - size1)}
