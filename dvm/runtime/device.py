"""A CompiledGraph on device arrays: the launch path of a VM that runs on device memory
(vm.contract.VM.host_buffers False), through the VM's bound launch on addresses.

A frontend describes each input as a DeviceArray (data address, DType, shape and strides in
elements; strides are non-negative, so the input's buffer starts at its address) and allocates
outputs and workspaces with its own allocator. A DeviceLaunch is made once per call signature
(symbol values, each input's dtype, shape and strides): encode for the VM's Target, verify, check
every input's dtype and that the program stays inside its span, bind the VM. Inputs whose layout
a view chain cannot express (encoder.NeedsCopy) are listed in `copy_slots`: the frontend passes a
row-major copy of them.
"""
from __future__ import annotations

from typing import Callable, Mapping, NamedTuple, Sequence

from ..codegen.encoder import NeedsCopy
from ..codegen.verifier import verify
from ..errors import VerifyError
from ..graph.dtypes import DType
from ..graph.symbolic import evaluate
from ..graph.views import contiguous_strides
from ..vm import registry
from . import counters

# (shape, dtype) -> (the array, its data address)
Allocate = Callable[[tuple, DType], tuple[object, int]]


class DeviceArray(NamedTuple):
    address: int
    dtype: DType
    shape: tuple
    strides: tuple      # in elements, non-negative


def span(a: DeviceArray) -> int:
    """Elements from a's address to its last element, inclusive (0 when empty)."""
    if 0 in a.shape:
        return 0
    return 1 + sum((n - 1) * s for n, s in zip(a.shape, a.strides))


class DeviceLaunch:
    """graph's Program for one call signature, bound to a device VM."""
    __slots__ = ("run", "copy_slots", "outs", "ws", "layout")

    def __init__(self, graph, env: Mapping[str, int], arrays: Sequence[DeviceArray], vm_name: str):
        vm = registry.get(vm_name)
        layouts = [(a.shape, a.strides, 0) for a in arrays]
        copies: list[int] = []
        for _ in range(len(arrays) + 1):
            try:
                prog = graph.program(env, layouts, vm.target)
                break
            except NeedsCopy as e:   # the frontend copies that input row-major
                copies.append(e.slot)
                shape = arrays[e.slot].shape
                layouts[e.slot] = (shape, contiguous_strides(shape), 0)
        self.copy_slots = tuple(copies)
        self.layout = layout = verify(prog)
        for i, (a, (shape, strides, _)) in enumerate(zip(arrays, layouts)):
            ext = layout.extents[i]
            have = span(DeviceArray(0, a.dtype, shape, strides))
            if int(layout.args[i].dtype) != int(a.dtype):
                raise VerifyError("buffers", f"input {i} is {a.dtype.short}, the program expects "
                                             f"{DType(layout.args[i].dtype).short}")
            if ext is not None and (ext[0] < 0 or ext[1] >= have):
                raise VerifyError("bounds", f"input {i} spans {have} elements, the program touches {ext}")
        self.outs = tuple((tuple(int(evaluate(d, env)) for d in o.shape), o.dtype) for o in graph.outputs)
        self.ws = tuple((_numel(w.shape, env), w.dtype) for w in graph.plan.workspaces)
        numels = [span(DeviceArray(0, a.dtype, s, st)) for a, (s, st, _) in zip(arrays, layouts)] + \
            [_count(shape) for shape, _ in self.outs] + [n for n, _ in self.ws]
        self.run = vm.bind(layout, numels)

    def __call__(self, addresses: Sequence[int], allocate: Allocate, cached: bool = True) -> list:
        """Run on inputs at `addresses` (of this signature; copies made for copy_slots); returns
        the outputs the allocator made. Workspaces are freed after the call (the allocator's
        memory must stay valid for work queued before the free, as CUDA caching allocators do)."""
        outs = [allocate(shape, dt) for shape, dt in self.outs]
        ws = [allocate((n,), dt) for n, dt in self.ws]
        counters.bump_launch(cached)
        self.run([*addresses, *[a for _, a in outs], *[a for _, a in ws]])
        return [o for o, _ in outs]


def _count(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _numel(shape, env) -> int:
    return _count(int(evaluate(d, env)) for d in shape)
