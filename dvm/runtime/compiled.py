"""A compiled graph: fusion plan and kernel templates (built once), Programs per instance
(bounded, thread-safe LRU), and the launch path from NumPy arrays to results."""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Mapping, Sequence

import numpy as np

from ..codegen import encoder
from ..codegen.encoder import ArgSpec, NeedsCopy, encode_program
from ..codegen.lower import lower
from ..codegen.program import ARG_IN, ARG_OUT, ARG_WS, Program
from ..config import config
from ..fusion.partition import partition
from ..graph.node import Node
from ..graph.symbolic import evaluate
from ..graph.views import Layout, contiguous_strides
from . import counters, debug
from .launch import execute


def as_buffer(a: np.ndarray) -> tuple[np.ndarray, Layout]:
    """A 1-D view over the memory `a` spans, and a's (shape, strides, offset) in elements."""
    item = a.itemsize
    if a.flags.c_contiguous:
        return a.reshape(-1), (a.shape, tuple(s // item for s in a.strides) if a.size > 1
                               else contiguous_strides(a.shape), 0)
    if any(s % item for s in a.strides):
        a = np.ascontiguousarray(a)
        counters.bump("input_copies")
    if a.size == 0:
        return np.empty(0, a.dtype), (a.shape, (0,) * a.ndim, 0)
    flips = tuple(slice(None, None, -1) if s < 0 else slice(None) for s in a.strides)
    pos = a[flips] if any(s < 0 for s in a.strides) else a
    strides = tuple(s // item for s in a.strides)
    offset = sum((n - 1) * -s for n, s in zip(a.shape, strides) if s < 0)
    extent = 1 + sum((n - 1) * abs(s) for n, s in zip(a.shape, strides))
    buf = np.lib.stride_tricks.as_strided(pos, shape=(extent,), strides=(item,), writeable=False)
    return buf, (a.shape, strides, offset)


class CompiledGraph:
    """inputs: 'input' nodes (attr index = slot); outputs: result nodes."""

    def __init__(self, inputs: Sequence[Node], outputs: Sequence[Node]):
        self.inputs, self.outputs = list(inputs), list(outputs)
        self.plan = partition(len(inputs), self.outputs)
        slot_dtypes = [n.dtype for n in self.inputs] + [o.dtype for o in self.outputs] + \
            [w.dtype for w in self.plan.workspaces]
        self.templates = [lower(self.plan, g, slot_dtypes) for g in self.plan.groups]
        self.args = [ArgSpec(ARG_IN, n.dtype, None) for n in self.inputs] + \
            [ArgSpec(ARG_OUT, o.dtype, tuple(o.shape)) for o in self.outputs] + \
            [ArgSpec(ARG_WS, w.dtype, tuple(w.shape)) for w in self.plan.workspaces]
        self._out_specs = [(tuple(o.shape), o.dtype.np_dtype) for o in self.outputs]
        self._programs: OrderedDict = OrderedDict()
        self._lock = threading.Lock()
        counters.bump("graphs_compiled")
        counters.bump("kernels_vector", len(self.templates))
        debug.on_compile(self)

    def program(self, env: Mapping[str, int], layouts: Sequence[Layout]) -> Program:
        # env order is fixed per graph; the single-tile threshold decides the stream, so it is part of the key
        key = (tuple(env.values()), tuple([(l[1], l[2]) for l in layouts]), encoder.SINGLE_TILE_COLS)
        with self._lock:
            prog = self._programs.get(key)
            if prog is not None:
                self._programs.move_to_end(key)
                counters.bump("cache_hits")
                return prog
        t0 = time.perf_counter_ns()
        prog = encode_program(self.templates, self.args, env, layouts)
        ns = time.perf_counter_ns() - t0
        counters.record_encode(ns)
        debug.on_encode(prog, ns / 1e3)
        with self._lock:
            prog = self._programs.setdefault(key, prog)
            self._programs.move_to_end(key)
            while len(self._programs) > config().cache_size:
                self._programs.popitem(last=False)
        return prog

    def run(self, env: Mapping[str, int], arrays: Sequence[np.ndarray], vm: str | None = None) -> list[np.ndarray]:
        arrays = list(arrays)
        for _ in range(len(arrays) + 1):
            bufs, layouts = zip(*[as_buffer(a) for a in arrays]) if arrays else ((), ())
            try:
                prog = self.program(env, layouts)
                break
            except NeedsCopy as e:  # a view chain the input's strides cannot express
                arrays[e.slot] = np.ascontiguousarray(arrays[e.slot])
                counters.bump("input_copies")
        outs = [np.empty(tuple([evaluate(d, env) for d in shape]), dt) for shape, dt in self._out_specs]
        buffers = list(bufs)
        buffers += [o.reshape(-1) for o in outs]
        if self.plan.workspaces:
            buffers += [np.empty(_numel(w.shape, env), w.dtype.np_dtype) for w in self.plan.workspaces]
        execute(prog, buffers, vm=vm, fresh_outputs=True)
        return outs


def _numel(shape, env) -> int:
    n = 1
    for d in shape:
        n *= evaluate(d, env)
    return n

