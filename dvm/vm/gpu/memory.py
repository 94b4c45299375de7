"""Device memory for the GPU VM's own data (device images, argument tables, scratch), without a
framework import: the VM asks a provider. Whoever hands the VM device buffers installs one (the
torch frontend: frontend/gpu_arrays.py); in Triton's interpreter mode "device" memory is host
memory and NumPy is always the provider.

A provider: empty(nbytes) -> an object that owns nbytes of device memory, address(obj) -> its
address, upload(np.ndarray) -> an owning object holding a copy of the array, download(obj) -> the
int64 contents of an owned object as a NumPy array (a synchronizing copy).
"""
from __future__ import annotations

import threading
from typing import Protocol

import numpy as np

from ...errors import DeviceError


class MemoryProvider(Protocol):
    def empty(self, nbytes: int) -> object: ...
    def upload(self, host: np.ndarray) -> object: ...
    def address(self, obj: object) -> int: ...
    def download(self, obj: object) -> np.ndarray: ...


class HostMemory:
    """NumPy arrays as device memory: what the Triton interpreter reads and writes."""

    def empty(self, nbytes: int) -> np.ndarray:
        return np.zeros(max(nbytes, 8) // 8 + 1, np.int64)

    def upload(self, host: np.ndarray) -> np.ndarray:
        return np.array(host, copy=True)

    def address(self, obj: np.ndarray) -> int:
        return obj.__array_interface__["data"][0]

    def download(self, obj: np.ndarray) -> np.ndarray:
        return np.array(obj, copy=True).view(np.int64)


_LOCK = threading.Lock()
_PROVIDER: MemoryProvider | None = None


def set_provider(provider: MemoryProvider | None) -> None:
    """Install the device memory provider (None: none). A frontend calls it once."""
    global _PROVIDER
    with _LOCK:
        _PROVIDER = provider


def provider(interpreted: bool) -> MemoryProvider:
    """The provider in use: host memory for an interpreted VM, else the installed one."""
    if interpreted:
        return HOST
    got = _PROVIDER
    if got is not None:
        return got
    raise DeviceError("the GPU VM has no device memory provider: run it through a frontend that "
                      "hands it device buffers (torch CUDA tensors: the builder API or torch.compile), "
                      "or call dvm.vm.gpu.memory.set_provider(...)")


HOST = HostMemory()
