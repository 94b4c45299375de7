"""The VMs DVM knows, by DVM_VM name: adding a VM is one line here and its module, which defines
`VM_INSTANCE` (a vm.contract.VM). Modules are imported on first use."""
from __future__ import annotations

import importlib
from functools import lru_cache

VM_MODULES = {
    "cpu": "dvm.vm.cpu",              # numba, compiled once per machine (the default)
    "reference": "dvm.vm.reference",  # NumPy, the executable specification
    "gpu": "dvm.vm.gpu",              # Triton, device "cuda" (Triton's interpreter mode: the CPU)
}
VM_NAMES = tuple(VM_MODULES)


@lru_cache(maxsize=None)
def get(name: str):
    """The VM registered as `name` (a vm.contract.VM)."""
    try:
        module = VM_MODULES[name]
    except KeyError:
        raise ValueError(f"unknown VM {name!r}: available VMs are {', '.join(VM_NAMES)}") from None
    return importlib.import_module(module).VM_INSTANCE


def host_vms() -> tuple[str, ...]:
    """The VMs that run on host (NumPy) buffers and import here (a device VM's module may need
    packages this machine lacks)."""
    names = []
    for name in VM_NAMES:
        try:
            vm = get(name)
        except ImportError:
            continue
        if vm.host_buffers:
            names.append(name)
    return tuple(names)
