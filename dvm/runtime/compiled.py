"""A compiled graph: fusion plan and kernel templates (built once), Programs per instance
(bounded, thread-safe LRU), and the launch path from NumPy arrays to results.

Caches: every graph's Programs and Launches live in BoundedDicts (codegen.lru) bounded by
DVM_CACHE_SIZE entries each and, per family (all programs, all launches), by DVM_CACHE_MB
bytes in all; dvm.counters() reports their entries and bytes."""
from __future__ import annotations

import threading
import time
import weakref
from typing import Callable, Mapping, Sequence

import numpy as np

from ..codegen import encoder, lru
from ..codegen.encoder import ArgSpec, NeedsCopy, encode_program
from ..codegen.lower import lower
from ..codegen.program import ARG_IN, ARG_OUT, ARG_WS, MAX_ARGS, MAX_KERNELS, Program
from ..codegen.target import GENERIC, Target
from ..config import config
from ..errors import ProgramLimitError
from ..fusion.partition import partition
from ..graph.node import Node, topo_order
from ..graph.symbolic import evaluate
from ..graph.views import Layout, contiguous_strides
from . import buffer_pool, counters, debug
from .in_place import may_overwrite
from ..codegen.verifier import check_buffers, verify
from ..vm import registry
from ..vm.buffers import data_ptr
from .launch import host_only, vm_runner

# Estimated bytes a cached Program or Launch keeps alive besides its words (measured with
# tracemalloc on small kernels, rounded up: the Program and its verified layout, ~1.5 KB a
# kernel; a Launch's allocators, tuples and the CPU VM's bound runner and descriptors, ~3 KB)
PROGRAM_OVERHEAD_BYTES = 4096
KERNEL_LAYOUT_BYTES = 2048
LAUNCH_OVERHEAD_BYTES = 4096
PROGRAMS = lru.family("programs", lambda: config().cache_mb << 20)
LAUNCHES = lru.family("launches", lambda: config().cache_mb << 20)


def _cache_entries() -> int:
    return config().cache_size


def program_cache() -> lru.BoundedDict:
    return lru.BoundedDict(PROGRAMS, _cache_entries)


def launch_cache() -> lru.BoundedDict:
    """A cache of launches (a graph's, a kernel function's, a torch launcher's)."""
    return lru.BoundedDict(LAUNCHES, _cache_entries)


def program_bytes(prog: Program) -> int:
    """What a cached Program keeps alive: its words, the layout the verifier adds (its objects
    and views, a few KB whatever the words; the instruction arrays are the stream's, shared)."""
    return prog.words.nbytes + PROGRAM_OVERHEAD_BYTES


def launch_bytes(launch: "Launch") -> int:
    """What a cached Launch keeps alive: its layout (and the Program words it views), the VM's
    descriptors of it (about the size of the words again), its own objects."""
    words = launch.layout.words
    n = 0 if words is None else 2 * words.nbytes
    return n + LAUNCH_OVERHEAD_BYTES + KERNEL_LAYOUT_BYTES * len(launch.layout.kernels)


def as_buffer(a: np.ndarray) -> tuple[np.ndarray, Layout]:
    """A 1-D view over the memory `a` spans, and a's (shape, strides, offset) in elements."""
    item = a.itemsize
    if a.flags.c_contiguous:
        return a.reshape(-1), (a.shape, tuple(s // item for s in a.strides) if a.size > 1
                               else contiguous_strides(a.shape), 0)
    if _misaligned(a):
        a = np.ascontiguousarray(a)
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
        if self.plan.n_slots > MAX_ARGS or len(self.plan.groups) > MAX_KERNELS:
            raise ProgramLimitError(f"a graph of {self.plan.n_slots} buffers (inputs, outputs, workspaces) and "
                                    f"{len(self.plan.groups)} kernels: a Program holds at most {MAX_ARGS} "
                                    f"and {MAX_KERNELS}")
        slot_dtypes = [n.dtype for n in self.inputs] + [o.dtype for o in self.outputs] + \
            [w.dtype for w in self.plan.workspaces]
        self.templates = [lower(self.plan, g, slot_dtypes) for g in self.plan.groups]
        self.args = [ArgSpec(ARG_IN, n.dtype, None) for n in self.inputs] + \
            [ArgSpec(ARG_OUT, o.dtype, tuple(o.shape)) for o in self.outputs] + \
            [ArgSpec(ARG_WS, w.dtype, tuple(w.shape)) for w in self.plan.workspaces]
        self._out_specs = [(tuple(o.shape), o.dtype.np_dtype) for o in self.outputs]
        self._programs = program_cache()
        self._lock = threading.Lock()
        self._launches = launch_cache()
        self._overwrites: dict[tuple[int, int], bool] = {}
        counters.bump("graphs_compiled")
        counters.bump("kernels_vector", len(self.templates))
        debug.on_compile(self)

    def overwrites(self, out: int, slot: int) -> bool:
        """Whether output `out` may be written into the memory of input `slot` (runtime/in_place:
        the caller then passes that input's tensor as the output, row-major, overlapping no other
        input)."""
        ok = self._overwrites.get((out, slot))
        if ok is None:
            ok = self._overwrites[(out, slot)] = may_overwrite(
                self.templates, len(self.inputs), self.inputs, self.outputs, out, slot)
        return ok

    def program(self, env: Mapping[str, int], layouts: Sequence[Layout], target: Target = GENERIC) -> Program:
        """The Program for these sizes and input layouts, encoded for `target` (its VM's choices)."""
        # env order is fixed per graph; the single-tile threshold decides the stream, so it is part of the key
        key = (tuple(env.values()), tuple([(l[1], l[2]) for l in layouts]), encoder.SINGLE_TILE_COLS, target.name)
        prog = self._programs.get(key)
        if prog is not None:
            self._programs.touch(key)
            counters.bump_cache_hit()
            return prog
        t0 = time.perf_counter_ns()
        prog = encode_program(self.templates, self.args, env, layouts, target)
        ns = time.perf_counter_ns() - t0
        counters.record_encode(ns)
        debug.on_encode(prog, ns / 1e3)
        return self._programs.put(key, prog, program_bytes(prog))

    def run(self, env: Mapping[str, int], arrays: Sequence[np.ndarray], vm: str | None = None) -> list[np.ndarray]:
        launch, hit = self.launcher(env, arrays, vm)
        return launch(list(arrays), hit)

    def launcher(self, env: Mapping[str, int], arrays: Sequence[np.ndarray],
                 vm: str | None = None) -> tuple["Launch", bool]:
        """The Launch for these symbol values and these arrays' dtypes, shapes and strides, and
        whether it was cached already."""
        vm = vm or config().vm
        key = (tuple(env.values()), tuple([(type(a), a.dtype, a.shape, a.strides) for a in arrays]), vm,
               encoder.SINGLE_TILE_COLS)
        launch = self._launches.get(key)
        hit = launch is not None
        if not hit:
            launch = self._new_launch(env, list(arrays), vm)
            if all(isinstance(a, np.ndarray) for a in arrays):
                remember(self._launches, key, launch, self._lock, launch_bytes(launch))
        return launch, hit

    def _new_launch(self, env: Mapping[str, int], arrays: list[np.ndarray], vm: str) -> "Launch":
        """Slow path: encode (or find) the Program, verify it and check real buffers once."""
        host_only(vm)
        original = list(arrays)
        for _ in range(len(arrays) + 1):
            bufs, layouts = zip(*[as_buffer(a) for a in arrays]) if arrays else ((), ())
            try:
                prog = self.program(env, layouts, registry.get(vm).target)
                break
            except NeedsCopy as e:  # a view chain the input's strides cannot express
                arrays[e.slot] = np.ascontiguousarray(arrays[e.slot])
        copy_slots = tuple(i for i, (a, b) in enumerate(zip(original, arrays)) if a is not b or _misaligned(a))
        arrays = [np.ascontiguousarray(a) if _misaligned(a) else a for a in arrays]
        outs = [(tuple([evaluate(d, env) for d in shape]), dt) for shape, dt in self._out_specs]
        ws = [(_numel(w.shape, env), w.dtype.np_dtype) for w in self.plan.workspaces]
        buffers = list(bufs) + [buffer_pool.empty(shape, dt).reshape(-1) for shape, dt in outs] + \
            [buffer_pool.empty((n,), dt) for n, dt in ws]
        layout = verify(prog)
        check_buffers(layout, buffers, check_overlap=False)   # outputs and workspaces are fresh
        deltas = [_buffer_delta(a) for a in arrays] + [0] * (len(outs) + len(ws))
        numels = [b.shape[0] for b in buffers]
        return Launch(layout, copy_slots, outs, ws, vm, deltas, numels)


# (input nodes, output nodes, env names) -> the graph built for them, while some caller holds it
_SHARED: "weakref.WeakValueDictionary[tuple, CompiledGraph]" = weakref.WeakValueDictionary()
_SHARED_LOCK = threading.Lock()
_LABELS = ("name",)   # input attributes that only label an input (for dumps): not computed with


def shared_graph(inputs: Sequence[Node], outputs: Sequence[Node], env_names: Sequence[str]) -> CompiledGraph:
    """The CompiledGraph of these nodes without their inputs' labels, one per process for every
    caller whose env has the keys env_names in that order. Nodes are hash-consed (graph.node):
    equal graphs are the same unlabelled input and output nodes, hence the same templates, and the
    same env values mean the same sizes (the caches key on env's values in its key order). A
    model's equal layers then encode, verify and bind each new size once, not once a layer
    (counted: graphs_shared)."""
    inputs, outputs = _unlabelled(inputs, outputs)
    key = (inputs, outputs, tuple(env_names))
    with _SHARED_LOCK:
        graph = _SHARED.get(key)
    if graph is not None:
        counters.bump("graphs_shared")
        return graph
    graph = CompiledGraph(inputs, outputs)
    with _SHARED_LOCK:
        return _SHARED.setdefault(key, graph)


def _unlabelled(inputs: Sequence[Node], outputs: Sequence[Node]) -> tuple[tuple[Node, ...], tuple[Node, ...]]:
    """The graph of `outputs` over `inputs` rebuilt with input nodes that carry no _LABELS."""
    made: dict[Node, Node] = {}
    for node in [*inputs, *topo_order(outputs)]:
        if node in made:
            continue
        if node.op == "input":
            made[node] = Node.make("input", node.dtype, node.shape,
                                   **{k: v for k, v in node.attrs if k not in _LABELS})
        else:
            made[node] = Node.make(node.op, node.dtype, node.shape, [made[i] for i in node.inputs], **dict(node.attrs))
    return tuple(made[n] for n in inputs), tuple(made[n] for n in outputs)


def remember(cache: dict, key, value, lock: threading.Lock, nbytes: int | None = None) -> None:
    """Insert into a launch cache: a BoundedDict (launch_cache(): bounded by entries and bytes;
    `nbytes` defaults to launch_bytes of a Launch value) or a plain dict (the oldest entries
    beyond DVM_CACHE_SIZE dropped)."""
    if isinstance(cache, lru.BoundedDict):
        if nbytes is None:
            nbytes = launch_bytes(value) if isinstance(value, Launch) else LAUNCH_OVERHEAD_BYTES
        cache.put(key, value, nbytes)
        return
    with lock:
        cache[key] = value
        while len(cache) > config().cache_size:
            cache.pop(next(iter(cache)))


class Launch:
    """A verified Program bound to one call signature: symbol values and the dtypes, shapes and
    strides of the input arrays. Invariant: built from buffers that passed check_buffers; a later
    call with the same signature has inputs of the same dtypes and extents (as_buffer derives the
    buffers from shape and strides alone) and fresh outputs, so the check holds for it too. Calls
    skip binding, encoding, verification and buffer checks; a VM that binds launches (VM.bind)
    gets addresses directly."""
    __slots__ = ("layout", "copy_slots", "out_specs", "ws_specs", "vm", "deltas", "numels", "_bound",
                 "_shifted", "_plain", "_outs", "_ws_keep", "_ws_addrs", "_ws_lock")

    def __init__(self, layout, copy_slots, out_specs, ws_specs, vm, deltas, numels):
        self.layout = layout
        # tuples, not lists: a model keeps a Launch per segment and size, and the garbage collector
        # stops tracking a tuple of ints
        self.copy_slots, self.out_specs, self.ws_specs = tuple(copy_slots), tuple(out_specs), tuple(ws_specs)
        self.vm, self.deltas, self.numels = vm, tuple(deltas), tuple(numels)
        self._shifted = any(deltas)   # some buffer starts before its array's data pointer
        self._outs = tuple((buffer_pool.allocator(shape, dt), shape, dt) for shape, dt in out_specs)
        # small workspaces are allocated once and reused by one launch at a time (_ws_lock; a
        # concurrent launch of the same Launch takes fresh ones): ~1-2 us a workspace a call
        small = sum(n * np.dtype(dt).itemsize for n, dt in ws_specs) < buffer_pool.MIN_BYTES
        self._ws_keep = self._ws_addrs = None
        self._ws_lock = threading.Lock() if ws_specs and small else None
        # the VM bound to this program and these element counts (None: it runs on buffer objects)
        self._bound = registry.get(vm).bind(layout, list(numels))
        self._plain = self._bound is not None and not ws_specs and not self._shifted

    def cached_call(self, single: bool = False):
        """A function running this launch on arrays of its signature, for a caller's cache (made
        on request: the torch path never asks); it returns the output when `single` (one
        output), else a tuple of the outputs. A CPU launch without input copies, shifted buffers
        or large workspaces gets its layers flattened (direct_parts; vm/cpu/host/launch): ~0.5 us
        less a call, ~1.1 us with one output."""
        parts = self.direct_parts()
        if parts is not None and hasattr(parts[0], "caller"):   # the VM's one-function form (VM.bind)
            return parts[0].caller(self._outs, counters.bump_cached_launch, single=single, workspaces=parts[1])
        if not (self._plain and not self.copy_slots):
            if single:
                return lambda arrays: self(list(arrays))[0]
            return lambda arrays: tuple(self(list(arrays)))
        run, outs = self._bound, self._outs

        def call(arrays: Sequence[np.ndarray]):
            made = [alloc(shape, dt) for alloc, shape, dt in outs]
            counters.bump_cached_launch()
            run([data_ptr(a) for a in arrays] + [data_ptr(o) for o in made])
            return made[0] if single else tuple(made)
        return call

    def __call__(self, arrays: list[np.ndarray], cached: bool = True) -> list[np.ndarray]:
        """Run on `arrays` (same signature as the one this Launch was built for; the list may be
        modified); returns the outputs. `cached`: counted as a program cache hit."""
        for s in self.copy_slots:
            arrays[s] = np.ascontiguousarray(arrays[s])
            counters.bump("input_copies")
        outs = [alloc(shape, dt) for alloc, shape, dt in self._outs]
        if self._bound is not None:
            self.run_addresses([data_ptr(a) for a in arrays + outs], cached)
            return outs
        ws = self._workspaces()
        counters.bump_launch(cached)
        buffers = [as_buffer(a)[0] for a in arrays] + [o.reshape(-1) for o in outs] + ws
        vm_runner(self.vm)(self.layout, buffers)
        return outs

    @property
    def bound(self) -> bool:
        """Whether the VM runs this launch on addresses (run_addresses)."""
        return self._bound is not None

    def direct_parts(self) -> tuple | None:
        """(the bound VM, its workspaces' (element count, dtype)) where a caller may run this
        launch on the inputs' and outputs' addresses and small workspaces of its own (VM.bind's
        `caller`); None where not: input copies, shifted buffers, large workspaces, no bind."""
        if self._bound is None or self.copy_slots or self._shifted or (self.ws_specs and self._ws_lock is None):
            return None
        return self._bound, self.ws_specs

    def plain_runner(self) -> Callable[[list[int]], None] | None:
        """The VM bound to this launch when it needs no workspaces and no shifted buffers (a
        caller whose inputs need no copies may then call it on the inputs' and outputs' data
        pointers, counting the launch itself); else None (run_addresses)."""
        return self._bound if self._plain else None

    def run_addresses(self, addrs: list[int], cached: bool) -> None:
        """The bound VM on inputs and outputs given by data pointer (the caller keeps them alive);
        workspaces are added here."""
        if self._plain:   # no workspaces, no shifted buffers: the common case
            counters.bump_launch(cached)
            self._bound(addrs)
            return
        lock = self._ws_lock
        if lock is not None and lock.acquire(False):
            try:
                if self._ws_addrs is None:
                    self._ws_keep = self._workspaces()
                    self._ws_addrs = [data_ptr(w) for w in self._ws_keep]
                self._run_addrs(addrs + self._ws_addrs, cached)
            finally:
                lock.release()
            return
        ws = self._workspaces()
        self._run_addrs(addrs + [data_ptr(w) for w in ws] if ws else addrs, cached)

    def _run_addrs(self, addrs: list[int], cached: bool) -> None:
        if self._shifted:
            addrs = [a + d for a, d in zip(addrs, self.deltas)]
        counters.bump_launch(cached)
        self._bound(addrs)

    def _workspaces(self) -> list[np.ndarray]:
        return [buffer_pool.empty((n,), dt) for n, dt in self.ws_specs] if self.ws_specs else []


def _misaligned(a: np.ndarray) -> bool:
    """Strides that are not whole elements: as_buffer copies such an array."""
    return not a.flags.c_contiguous and any(s % a.itemsize for s in a.strides)


def _buffer_delta(a: np.ndarray) -> int:
    """Bytes from a's data pointer to the start of as_buffer(a)'s buffer (its lowest element)."""
    if a.size == 0 or a.flags.c_contiguous:
        return 0
    return sum((n - 1) * s for n, s in zip(a.shape, a.strides) if s < 0)


def _numel(shape, env) -> int:
    n = 1
    for d in shape:
        n *= evaluate(d, env)
    return n

