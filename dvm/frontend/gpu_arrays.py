"""Device arrays for the GPU VM: CUDA tensors, and anything exposing `__cuda_array_interface__`
or a CUDA `__dlpack__` (CuPy, JAX, Numba), viewed as torch tensors without a copy; outputs and
workspaces allocated by torch on the inputs' device; launches through runtime.device.

Who goes here: the builder API with device arrays, and the torch backend's segments whose
tensors are on a CUDA device. A CPU tensor goes here only when the selected VM (DVM_VM) is a
device VM that runs on host memory (the GPU VM in Triton's interpreter mode, for tests).
Installs the GPU VM's device memory provider (torch allocations) on first use.
"""
from __future__ import annotations

import importlib.util
import threading
from typing import Sequence

import numpy as np
import torch

from ..config import config
from ..errors import DeviceError, DTypeError
from ..graph.dtypes import DType
from ..runtime import counters
from ..runtime.device import DeviceArray, DeviceLaunch
from ..vm import registry

TORCH_DTYPE = {DType.BOOL: torch.bool, DType.INT32: torch.int32, DType.INT64: torch.int64,
               DType.FLOAT16: torch.float16, DType.BFLOAT16: torch.bfloat16, DType.FLOAT32: torch.float32,
               DType.FLOAT64: torch.float64}
DVM_DTYPE = {v: k for k, v in TORCH_DTYPE.items()}
GPU_VM = "gpu"
_KDL_CUDA = 2


def is_device_array(x) -> bool:
    """A CUDA tensor, or a non-NumPy object exposing CUDA memory."""
    if isinstance(x, torch.Tensor):
        return x.is_cuda
    if isinstance(x, np.ndarray):
        return False
    if hasattr(x, "__cuda_array_interface__"):
        return True
    dev = getattr(x, "__dlpack_device__", None)
    return dev is not None and dev()[0] == _KDL_CUDA


def as_tensor(x) -> torch.Tensor:
    """x as a torch tensor over the same memory (no copy)."""
    if isinstance(x, torch.Tensor):
        t = x.detach()
    elif hasattr(x, "__cuda_array_interface__"):
        t = torch.as_tensor(x, device="cuda")
    else:
        t = torch.from_dlpack(x)
    return t.resolve_neg().resolve_conj() if t.is_neg() or t.is_conj() else t


def device_supported(device: torch.device) -> str | None:
    """Why DVM cannot run kernels on `device` (None: it can)."""
    if device.type == "cpu":
        return None
    if device.type == "cuda" and importlib.util.find_spec("triton") is not None:
        return None
    if device.type == "cuda":
        return "device cuda needs Triton (pip install 'dvm[gpu]')"
    return f"device {device}"


def vm_for(tensors: Sequence[torch.Tensor]) -> str | None:
    """The device VM that runs on these tensors, or None (they go the host path)."""
    if any(t.is_cuda for t in tensors):
        return GPU_VM
    vm = config().vm
    return vm if registry.get(vm).device != "cpu" else None


def dvm_dtype(t: torch.Tensor) -> DType:
    try:
        return DVM_DTYPE[t.dtype]
    except KeyError:
        raise DTypeError(f"unsupported dtype {t.dtype}") from None


class TorchMemory:
    """The GPU VM's memory provider (vm/gpu/memory.py) through torch's caching allocator."""

    def __init__(self, device: torch.device):
        self.device = device

    def empty(self, nbytes: int) -> torch.Tensor:
        return torch.empty(max(nbytes, 8), dtype=torch.uint8, device=self.device)

    def upload(self, host: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(host).view(np.uint8).copy()).to(self.device)

    def address(self, obj: torch.Tensor) -> int:
        return obj.data_ptr()

    def download(self, obj: torch.Tensor) -> np.ndarray:
        return obj.cpu().numpy().view(np.int64)


_INSTALLED: set = set()
_LOCK = threading.Lock()


def _install_memory(device: torch.device) -> None:
    if device.type != "cuda" or device in _INSTALLED:
        return
    from ..vm.gpu import memory
    with _LOCK:
        memory.set_provider(TorchMemory(device))
        _INSTALLED.add(device)


class GraphLauncher:
    """A CompiledGraph on tensors through a device VM: one DeviceLaunch per call signature."""

    def __init__(self, graph):
        self.graph = graph
        self._launches: dict = {}
        self._lock = threading.Lock()
        # the last call: (env values, vm, device argument), a check that tensors have its tensors'
        # types, devices, dtypes, sizes and strides, its launch, the slots of host scalars, the
        # device: a call that passes the check needs no signature
        self._last: tuple | None = None

    def __call__(self, env: dict, tensors: Sequence[torch.Tensor], vm: str,
                 device: torch.device | None = None) -> list[torch.Tensor]:
        """device: the outputs' device where the caller knows it (a torch segment's, from tracing);
        else the tensors', or the VM's default without tensors."""
        last = self._last
        if last is not None and last[0] == (*env.values(), vm, device) and last[1](*tensors):
            _, _, launch, scalars, device = last
            if scalars:
                tensors = list(tensors)
                for i in scalars:
                    tensors[i] = _scalar_on(tensors[i], device)
            return self._run(launch, tensors, device, True)
        given = tuple(tensors)
        tensors = self._one_device(list(tensors), device)
        key_device = device
        if device is None:
            device = tensors[0].device if tensors else \
                torch.device("cuda" if vm == GPU_VM and not registry.get(vm).host_buffers else "cpu")
        key = (*env.values(), vm, device, *[(t.dtype, t.device, tuple(t.shape), t.stride()) for t in tensors])
        launch = self._launches.get(key)
        hit = launch is not None
        if not hit:
            if device.type == "cuda" and registry.get(vm).host_buffers:
                raise DeviceError(f"the {vm!r} VM's kernels were defined in Triton's interpreter mode "
                                  "(TRITON_INTERPRET=1 at their import): they cannot run on CUDA memory")
            _install_memory(device)
            arrays = [DeviceArray(t.data_ptr(), dvm_dtype(t), tuple(t.shape), tuple(t.stride())) for t in tensors]
            launch = DeviceLaunch(self.graph, env, arrays, vm)
            with self._lock:
                self._launches[key] = launch
                while len(self._launches) > config().cache_size:
                    self._launches.pop(next(iter(self._launches)))
        from .torch_launch import tensor_check   # (torch_launch imports this module)
        check = tensor_check(given)
        if check is not None:
            scalars = tuple(i for i, (a, b) in enumerate(zip(given, tensors)) if a is not b)
            self._last = ((*env.values(), vm, key_device), check, launch, scalars, device)
        return self._run(launch, tensors, device, hit)

    @staticmethod
    def _run(launch: DeviceLaunch, tensors: list, device: torch.device, hit: bool) -> list[torch.Tensor]:
        for s in launch.copy_slots:
            tensors[s] = tensors[s].contiguous()
            counters.bump("input_copies")

        def allocate(shape, dt):
            out = torch.empty(shape, dtype=TORCH_DTYPE[dt], device=device)
            return out, out.data_ptr()
        return launch([t.data_ptr() for t in tensors], allocate, hit)

    @staticmethod
    def _one_device(tensors: list[torch.Tensor], device: torch.device | None = None) -> list[torch.Tensor]:
        """0-d CPU tensors beside device tensors (as PyTorch allows) move to the device (`device`
        where given); any other mix of devices is an error."""
        devices = {t.device for t in tensors if t.dim() or not t.is_cpu}
        if device is not None:
            devices.add(device)
        if len(devices) > 1:
            raise DeviceError(f"a DVM kernel's tensors are on several devices: {sorted(map(str, devices))}")
        if devices:
            (device,) = devices
            for i, t in enumerate(tensors):
                if t.device != device:
                    tensors[i] = _scalar_on(t, device)
        return tensors


# device copies of 0-d host scalars that kernels read (a model's float constants: Dynamo passes
# them as 0-d float64 host tensors at every call): one copy per value, dtype and device. Invariant:
# read only (a launch never writes its inputs; a segment returns an input it passes through as a
# copy).
_SCALARS: dict = {}
MAX_SCALARS = 256


def _scalar_on(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    key = (t.dtype, repr(t.item()), device)   # (repr: -0.0 and 0.0 apart, NaN equal to itself)
    got = _SCALARS.get(key)
    if got is None:
        counters.bump("gpu_scalar_copies")
        got = t.to(device)
        with _LOCK:
            if len(_SCALARS) >= MAX_SCALARS:
                _SCALARS.clear()
            _SCALARS[key] = got
    return got


def graph_launcher(graph) -> GraphLauncher:
    got = graph.__dict__.get("_device_launcher")
    if got is None:
        got = graph.__dict__.setdefault("_device_launcher", GraphLauncher(graph))
    return got


def _traced(kfn, args: Sequence):
    """(tensors, traced graph, symbol values) of a @dvm.kernel call on device arrays."""
    tensors = [as_tensor(a) for a in args]
    if len(tensors) != len(kfn.arg_names):
        kfn._coerce(args)   # its error names the arguments
    sig = tuple((dvm_dtype(t), tuple(t.shape) if not kfn.dynamic else tuple(d if d < 2 else -1 for d in t.shape))
                for t in tensors)
    traced = kfn._trace(sig)
    return tensors, traced, kfn._bind(traced, tensors)


def kernel_program(kfn, args: Sequence, vm: str = GPU_VM):
    """The Program a @dvm.kernel call on these device arrays runs (encoded for `vm`)."""
    tensors, traced, env = _traced(kfn, args)
    layouts = [(tuple(t.shape), tuple(t.stride()), 0) for t in tensors]
    return traced.graph.program(env, layouts, registry.get(vm).target)


def call_kernel(kfn, args: Sequence, vm: str | None):
    """A @dvm.kernel function on device arrays: the builder's call, through a device VM."""
    tensors, traced, env = _traced(kfn, args)
    name = vm or vm_for(tensors) or GPU_VM
    if registry.get(name).device == "cpu":
        raise DeviceError(f"VM {name!r} runs on host memory; these arrays are on a CUDA device")
    outs = graph_launcher(traced.graph)(env, tensors, name)
    return outs[0] if traced.single else tuple(outs)
