"""Verify-then-run: the only path from a Program to a VM."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..codegen.program import Program
from ..codegen.verifier import check_buffers, verify
from ..config import config
from ..errors import DeviceError
from ..vm import registry
from . import counters


def host_only(vm: str) -> None:
    """NumPy arrays are host memory: refuse a VM that runs on device memory only."""
    if not registry.get(vm).host_buffers:
        raise DeviceError(f"the {vm!r} VM runs on {registry.get(vm).device} memory: pass device arrays "
                          "(e.g. CUDA tensors), not NumPy arrays")


def vm_runner(name: str | None = None):
    """The `run` of VM `name` (default: DVM_VM)."""
    return registry.get(name or config().vm).run


def execute(program: Program, buffers: Sequence[np.ndarray], vm: str | None = None,
            fresh_outputs: bool = False) -> None:
    """Verify `program` (structure cached per Program), check the buffers, run it.
    `fresh_outputs`: the caller allocated the output/workspace buffers itself just now, so they
    cannot overlap anything (skips only the overlap test, never the bounds test)."""
    layout = verify(program)
    if all(isinstance(b, np.ndarray) for b in buffers):
        host_only(vm or config().vm)
    check_buffers(layout, buffers, check_overlap=not fresh_outputs)
    counters.bump_launch(False)
    vm_runner(vm)(layout, list(buffers))
