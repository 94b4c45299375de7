"""The builder API: `@dvm.kernel` functions traced once per input signature, run on NumPy arrays.

A signature is (dtype, rank, which dims are 0 or 1) per argument; every other dim is a symbol, so
a new size costs one encode, never a re-trace (dynamic=False: one trace per concrete shape).
Tracing runs twice: the first pass learns which symbols broadcasting forces equal, the second
traces with those symbols unified, so fusion sees equal sizes as equal. Each call binds symbols
from the arguments' sizes and checks the recorded facts, naming the argument that violates one.
A kernel function's traces and launches are bounded caches (codegen.lru: DVM_CACHE_SIZE entries,
and DVM_CACHE_MB bytes per family in all), so any number of distinct shapes leaves memory flat.
"""
from __future__ import annotations

import functools
import inspect
import threading
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from ..codegen import encoder, lru
from ..codegen.limits import MAX_ELEMS, checked_span
from ..codegen.program import Program
from ..config import config
from ..errors import ArgumentError, DTypeError, ShapeError, TraceError
from ..graph import build
from ..graph.build import ShapeContext
from ..graph.dtypes import DType, dtype_of, result_type
from ..graph.node import Node
from ..graph.ops import BINARY, OP_TABLE, REDUCTIONS, TERNARY, UNARY
from ..graph.symbolic import Dim, SymExpr, evaluate, render, sym
from ..runtime import counters
from ..runtime.compiled import CompiledGraph, launch_bytes, launch_cache, remember
from ..vm import registry

Scalar = (bool, int, float, np.bool_, np.integer, np.floating)
# Estimated bytes a trace keeps alive (its graph, fusion plan, templates and their per-kernel
# encoder data; measured with tracemalloc on small kernels, ~12 KB, rounded up) besides the
# templates' instruction arrays, which are counted as they are
TRACE_OVERHEAD_BYTES = 16384
TEMPLATE_OVERHEAD_BYTES = 4096
TRACES = lru.family("traces", lambda: config().cache_mb << 20)
# ndarray subclasses whose meaning is not their data alone: a matrix's * is a matrix product and
# its reshape(-1) stays 2-D; a masked array's mask would be ignored
REFUSED_ARRAY_TYPES = (np.matrix, np.ma.MaskedArray)


class Value:
    """A traced tensor value inside a kernel function."""
    __slots__ = ("node", "k")

    def __init__(self, node: Node, k: "KernelBuilder"):
        self.node, self.k = node, k

    shape = property(lambda self: self.node.shape)
    dtype = property(lambda self: self.node.dtype.short)
    ndim = property(lambda self: self.node.ndim)

    def __repr__(self) -> str:
        return f"Value({self.node!r})"

    def __bool__(self) -> bool:
        raise TraceError("a traced Value has no truth value; use k.where for data-dependent choices")


def _binop(name: str, swap: bool = False):
    def method(self: Value, other):
        return getattr(self.k, name)(other, self) if swap else getattr(self.k, name)(self, other)
    return method


for _dunder, _op in (("add", "add"), ("sub", "sub"), ("mul", "mul"), ("truediv", "div"),
                     ("floordiv", "floor_divide"), ("mod", "remainder"), ("pow", "pow"),
                     ("and", "bitwise_and"), ("or", "bitwise_or"), ("xor", "bitwise_xor")):
    setattr(Value, f"__{_dunder}__", _binop(_op))
    setattr(Value, f"__r{_dunder}__", _binop(_op, swap=True))
for _dunder, _op in (("lt", "lt"), ("le", "le"), ("gt", "gt"), ("ge", "ge")):
    setattr(Value, f"__{_dunder}__", _binop(_op))
Value.__neg__ = lambda self: self.k.neg(self)
Value.__abs__ = lambda self: self.k.abs(self)
Value.__invert__ = lambda self: self.k.logical_not(self) if self.node.dtype is DType.BOOL \
    else self.k.bitwise_xor(self, -1)


@dataclass(frozen=True)
class InputRef:
    """What a kernel function receives for each argument; `k.load` turns it into a Value."""
    name: str
    node: Node


class OutputRef:
    __slots__ = ("value",)

    def __init__(self, value: Value):
        self.value = value


class KernelBuilder:
    """The `k` of a kernel function. Every op of the op table is a method."""

    def __init__(self) -> None:
        self.ctx = ShapeContext()

    # -- arguments ------------------------------------------------------------------------------
    def _v(self, x, what: str = "argument") -> Node:
        if isinstance(x, Value):
            return x.node
        if isinstance(x, InputRef):
            return x.node
        if isinstance(x, Scalar):
            return build.const(x.item() if isinstance(x, np.generic) else x)
        raise TraceError(f"{what} must be a traced Value or a Python scalar, got {type(x).__name__}")

    def _wrap(self, node: Node) -> Value:
        return Value(node, self)

    def load(self, x: InputRef) -> Value:
        if not isinstance(x, InputRef):
            raise TraceError(f"k.load takes a kernel argument, got {type(x).__name__}")
        return self._wrap(x.node)

    def store(self, x: Value) -> OutputRef:
        return OutputRef(self._wrap(self._v(x, "k.store argument")))

    def scalar(self, value, dtype: Any = None) -> Value:
        """A constant. Without dtype it promotes like a Python scalar; with one, like a 0-d tensor."""
        return self._wrap(build.const(value, None if dtype is None else dtype_of(dtype)))

    def iota(self, shape: Sequence[Dim], axis: int, dtype: Any = "int64") -> Value:
        node = build.iota(tuple(shape), axis)
        return self._wrap(build.cast(node, dtype_of(dtype)))

    def cast(self, x, dtype: Any) -> Value:
        return self._wrap(build.cast(self._v(x), dtype_of(dtype)))

    # -- views ----------------------------------------------------------------------------------
    def reshape(self, x, shape: Sequence[Dim]) -> Value:
        return self._wrap(build.reshape(self.ctx, self._v(x), shape))

    def permute(self, x, dims: Sequence[int]) -> Value:
        return self._wrap(build.permute(self.ctx, self._v(x), dims))

    def broadcast_to(self, x, shape: Sequence[Dim]) -> Value:
        return self._wrap(build.broadcast_to(self.ctx, self._v(x), shape))

    def cat(self, xs: Sequence, axis: int = 0) -> Value:
        """torch.cat: the values (promoted to one dtype) joined along `axis`."""
        if not isinstance(xs, (list, tuple)) or not xs:
            raise TraceError(f"k.cat takes a non-empty list or tuple of values, got {type(xs).__name__}")
        nodes = [self._v(x, "k.cat argument") for x in xs]
        dt = result_type([n.dtype for n in nodes], [], [])
        return self._wrap(build.concat(self.ctx, [build.cast(n, dt) for n in nodes], axis))

    # -- composites with keyword forms ----------------------------------------------------------
    def clamp(self, x, min=None, max=None) -> Value:  # noqa: A002 (PyTorch's names)
        if min is None and max is None:
            raise TraceError("clamp needs min or max")
        if min is None:
            return self.minimum(x, max)
        if max is None:
            return self.maximum(x, min)
        return self._ew("clamp", x, min, max)

    def gelu(self, x, approximate: str = "none") -> Value:
        if approximate not in ("none", "tanh"):
            raise TraceError(f"gelu approximate must be 'none' or 'tanh', got {approximate!r}")
        return self._ew("gelu" if approximate == "none" else "gelu_tanh", x)

    def _ew(self, name: str, *args) -> Value:
        return self._wrap(build.elementwise(self.ctx, name, *[self._v(a) for a in args]))

    def _reduce(self, name: str, x, axis=None, keepdims: bool = False) -> Value:
        return self._wrap(build.reduce(self.ctx, name, self._v(x), axis, keepdims))


def _make_ew(name: str, arity: int):
    def method(self: KernelBuilder, *args):
        if len(args) != arity:
            raise TraceError(f"k.{name} takes {arity} argument(s), got {len(args)}")
        return self._ew(name, *args)
    method.__name__ = name
    method.__doc__ = OP_TABLE[name].doc or f"elementwise {name} (PyTorch semantics)"
    return method


def _make_reduce(name: str):
    def method(self: KernelBuilder, x, axis=None, keepdims: bool = False):
        return self._reduce(name, x, axis, keepdims)
    method.__name__ = name
    method.__doc__ = f"{name} over `axis` (None: all; int or tuple), keepdims like NumPy"
    return method


for _name in UNARY + BINARY + TERNARY:
    if not hasattr(KernelBuilder, _name):
        setattr(KernelBuilder, _name, _make_ew(_name, OP_TABLE[_name].arity))
for _name in REDUCTIONS:
    setattr(KernelBuilder, _name, _make_reduce(_name))


# ---------------------------------------------------------------------------------------------
@dataclass
class _Traced:
    graph: CompiledGraph
    arg_dims: list[tuple[Dim, ...]]
    checks: list
    origin: dict[str, tuple[str, int]]   # symbol name -> (argument name, dim) that first bound it
    single: bool


class KernelFunction:
    """A traced-on-demand kernel. Call it with NumPy arrays; `program(...)` gives the encoded Program."""

    def __init__(self, fn: Callable, dynamic: bool = True):
        self.fn, self.dynamic = fn, dynamic
        params = list(inspect.signature(fn).parameters)
        if not params:
            raise TraceError("a kernel function takes the builder `k` as its first parameter")
        self.arg_names = params[1:]
        self._traces = lru.BoundedDict(TRACES, lambda: config().cache_size)
        self._launches = launch_cache()   # call signature -> Launch.cached_call(single output)
        self._lock = threading.Lock()
        functools.update_wrapper(self, fn)

    # -- arguments ------------------------------------------------------------------------------
    def _coerce(self, args) -> tuple[list[np.ndarray], tuple]:
        """The arguments as arrays, and their signature: (dtype, shape class) per argument,
        where a shape class keeps sizes 0 and 1 and marks the others -1 (dynamic=True)."""
        if len(args) != len(self.arg_names):
            raise TraceError(f"{self.fn.__name__} takes {len(self.arg_names)} array argument(s) "
                             f"({', '.join(self.arg_names)}), got {len(args)}")
        arrays, sig = [], []
        for name, a in zip(self.arg_names, args):
            if type(a) is not np.ndarray and isinstance(a, REFUSED_ARRAY_TYPES):
                raise ArgumentError(f"argument '{name}' is a {type(a).__module__}.{type(a).__name__}, whose "
                                    "operators and shapes differ from a plain array's: pass np.asarray(...) "
                                    "(a masked array: np.ma.filled(...))")
            arr = a if isinstance(a, np.ndarray) else np.asarray(a)
            try:
                dt = dtype_of(arr.dtype)
            except TypeError as e:
                raise DTypeError(f"argument '{name}': {e}") from None
            if not arr.flags.c_contiguous or arr.size > MAX_ELEMS:   # (else it spans size x itemsize bytes)
                checked_span(arr.shape, arr.strides, arr.itemsize, f"argument '{name}'")
            arrays.append(arr)
            sig.append((dt, arr.shape if not self.dynamic else tuple(d if d < 2 else -1 for d in arr.shape)))
        return arrays, tuple(sig)

    def instance(self, *args) -> tuple[_Traced, dict[str, int], list[np.ndarray]]:
        """(traced graph, symbol values, arrays) for these arguments: the steps of a call before
        encoding, for tools that time encoding alone."""
        arrays, sig = self._coerce(args)
        traced = self._trace(sig)
        return traced, self._bind(traced, arrays), arrays

    def trace(self, *args) -> _Traced:
        return self._trace(self._coerce(args)[1])

    def _trace(self, sig: tuple) -> _Traced:
        traced = self._traces.get(sig)
        if traced is not None:
            return traced
        with self._lock:  # one trace per signature, even under concurrent first calls
            traced = self._traces.get(sig)
            if traced is None:
                traced = self._trace_locked(sig)
        return traced

    def _trace_locked(self, sig: tuple) -> _Traced:
        dims = [tuple(d if d >= 0 else sym(f"{name}_{j}", lo=2) for j, d in enumerate(shape))
                for name, (_, shape) in zip(self.arg_names, sig)]
        first = self._run_fn(sig, dims)
        dims, origin = self._unify(dims, first[1].ctx.checks)
        outputs, k, single = self._run_fn(sig, dims)
        inputs = [Node.make("input", dt, d, index=i, name=n)
                  for i, ((dt, _), d, n) in enumerate(zip(sig, dims, self.arg_names))]
        traced = _Traced(CompiledGraph(inputs, outputs), dims, k.ctx.checks, origin, single)
        counters.bump("traces")
        return self._traces.put(sig, traced, _trace_bytes(traced))

    def _run_fn(self, sig, dims):
        k = KernelBuilder()
        refs = [InputRef(n, Node.make("input", dt, d, index=i, name=n))
                for i, ((dt, _), d, n) in enumerate(zip(sig, dims, self.arg_names))]
        result = self.fn(k, *refs)
        single = not isinstance(result, tuple)
        results = (result,) if single else result
        if not results or not all(isinstance(r, OutputRef) for r in results):
            raise TraceError(f"{self.fn.__name__} must return k.store(...) or a tuple of them")
        return [r.value.node for r in results], k, single

    def _unify(self, dims, checks) -> tuple[list, dict]:
        parent: dict[str, SymExpr] = {}

        def find(s: SymExpr) -> SymExpr:
            while (sym_ := s.as_symbol()) is not None and sym_.name in parent:
                s = parent[sym_.name]
            return s
        for c in checks:
            if isinstance(c.lhs, SymExpr) and isinstance(c.rhs, SymExpr):
                a, b = find(c.lhs), find(c.rhs)
                if a.as_symbol() and b.as_symbol() and a != b:
                    parent[b.as_symbol().name] = a
        origin: dict[str, tuple[str, int]] = {}
        out = []
        for name, shape in zip(self.arg_names, dims):
            new = tuple(find(d) if isinstance(d, SymExpr) else d for d in shape)
            for j, d in enumerate(new):
                if isinstance(d, SymExpr) and d.as_symbol():
                    origin.setdefault(d.as_symbol().name, (name, j))
            out.append(new)
        return out, origin

    # -- binding --------------------------------------------------------------------------------
    def _bind(self, traced: _Traced, arrays: list[np.ndarray]) -> dict[str, int]:
        env: dict[str, int] = {}
        for name, dims, a in zip(self.arg_names, traced.arg_dims, arrays):
            for j, (d, n) in enumerate(zip(dims, a.shape)):
                if isinstance(d, int):
                    continue
                s = d.as_symbol().name
                if s in env and env[s] != n:
                    src, sj = traced.origin[s]
                    raise ShapeError(f"argument '{name}' has size {n} at dim {j}, but the kernel needs it "
                                     f"equal to argument '{src}' dim {sj} (size {env[s]}), as they broadcast "
                                     f"together")
                env[s] = n
        for c in traced.checks:
            lhs = evaluate(c.lhs, env)
            if c.rhs is None:
                if lhs == 0:
                    raise ShapeError(c.why)
            elif lhs != evaluate(c.rhs, env):
                raise ShapeError(f"{c.why} (sizes {lhs} and {evaluate(c.rhs, env)} for arguments "
                                 f"{', '.join(f'{n}{tuple(a.shape)}' for n, a in zip(self.arg_names, arrays))})")
        return env

    def __call__(self, *args, vm: str | None = None):
        """Run on NumPy arrays, or on device arrays (CUDA tensors, or anything exposing
        __cuda_array_interface__ / a CUDA __dlpack__: then outputs are torch tensors on that device,
        run by the GPU VM); `vm` picks the VM for this call ("cpu", "reference", "gpu"; default:
        DVM_VM for host arrays)."""
        explicit, vm = vm, vm or config().vm
        try:   # the hot path: a call signature seen before needs no coercion, tracing or binding
            if len(args) == 1:   # (one argument: no list to build)
                a = args[0]
                sig = ((type(a), a.dtype, a.shape, a.strides),)
            else:
                sig = tuple([(type(a), a.dtype, a.shape, a.strides) for a in args])
            key = (sig, vm, encoder.SINGLE_TILE_COLS)
            known = self._launches.get(key)
        except (AttributeError, TypeError):   # not arrays (lists, scalars, ...): the general path
            key = known = None
        if known is not None:
            return known(args)
        if _device_call(args, vm):
            from .gpu_arrays import call_kernel   # (imports torch: only for device arrays)
            return call_kernel(self, args, explicit)
        arrays, sig = self._coerce(args)
        traced = self._traces.get(sig) or self._trace(sig)
        env = self._bind(traced, arrays)
        launch, hit = traced.graph.launcher(env, arrays, vm)
        if key is not None and all(type(a) is np.ndarray for a in args):
            remember(self._launches, key, launch.cached_call(traced.single), self._lock, launch_bytes(launch))
        outs = launch(list(arrays), hit)
        return outs[0] if traced.single else tuple(outs)

    def program(self, *args, vm: str | None = None) -> Program:
        """The encoded Program for these arguments (shapes, dtypes and layouts), as encoded for VM
        `vm` (default: DVM_VM; VMs may choose other tiles and streams)."""
        from ..runtime.compiled import as_buffer
        arrays, sig = self._coerce(args)
        traced = self._trace(sig)
        env = self._bind(traced, arrays)
        return traced.graph.program(env, [as_buffer(a)[1] for a in arrays], registry.get(vm or config().vm).target)

    def __repr__(self) -> str:
        return f"<dvm.kernel {self.fn.__name__}({', '.join(self.arg_names)}) dynamic={self.dynamic}>"


def _device_call(args, vm: str) -> bool:
    """Whether a call goes the device path (frontend/gpu_arrays): some argument is a device array
    (not NumPy: a CUDA tensor, __cuda_array_interface__, a CUDA __dlpack__), or a torch tensor
    for a VM that runs on device memory."""
    for a in args:
        if isinstance(a, np.ndarray):
            continue
        if hasattr(a, "__cuda_array_interface__") or (hasattr(a, "__dlpack_device__") and a.__dlpack_device__()[0] == 2):
            return True
        if type(a).__module__.startswith("torch") and registry.get(vm).device != "cpu":
            return True
    return False


def _trace_bytes(traced: _Traced) -> int:
    templates = traced.graph.templates
    return TRACE_OVERHEAD_BYTES + sum(TEMPLATE_OVERHEAD_BYTES + 2 * t.instrs.nbytes for t in templates)


def kernel(fn: Callable | None = None, *, dynamic: bool = True):
    """Decorator: `@dvm.kernel` or `@dvm.kernel(dynamic=False)` (one trace per concrete shape)."""
    if fn is None:
        return lambda f: KernelFunction(f, dynamic=dynamic)
    return KernelFunction(fn, dynamic=dynamic)


def describe_shape(shape) -> str:
    return render(shape)
