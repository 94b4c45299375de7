"""The contract every VM implements. runtime/ picks and drives a VM through it only (vm.registry);
codegen/ never imports a VM: what a VM wants of its Programs reaches the encoder as its `target`.

A VM runs Programs that passed the verifier (codegen.verifier.verify) on buffers that passed
codegen.verifier.check_buffers, with the reference VM's semantics (vm/reference.py), bit for bit
where the reference VM is exact. A VM never re-checks what the verifier guaranteed and never
writes outside the extents check_buffers accepted. An output buffer may be exactly an input's
memory where runtime/in_place allows it: a VM runs each tile's stream in order, so each element
is loaded before the instruction computing its stored value and never read after.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Callable, Sequence

from ..codegen.isa import InstrSpec
from ..codegen.program import ProgramLayout
from ..codegen.target import GENERIC, Target

AddressRunner = Callable[[Sequence[int]], None]


class VM(ABC):
    """One VM. Subclasses set `name` (its DVM_VM value) and `device` ("cpu": buffers are NumPy
    arrays or host addresses; "cuda": device memory)."""
    name: str = ""
    device: str = "cpu"

    @property
    def target(self) -> Target:
        """The encoder's choices for this VM (tiles, streams)."""
        return GENERIC

    def warm_up(self) -> None:
        """Compile or load the VM's code, once per process (idempotent). May block on a cold
        machine; says on stderr what it waits for."""

    @property
    def host_buffers(self) -> bool:
        """Whether `run` and `bind` take host memory (NumPy arrays, their addresses). A device VM
        takes device memory (runtime/device.py launches it on device arrays); it may run on the
        host too where its device is emulated there (the GPU VM in Triton's interpreter mode)."""
        return self.device == "cpu"

    def handles(self, spec: InstrSpec) -> bool:
        """Whether the VM implements instruction `spec` of the ISA table."""
        return True

    @abstractmethod
    def run(self, layout: ProgramLayout, buffers: list, threads: int | None = None) -> None:
        """Run a verified program on buffers that passed check_buffers (outputs written in place).
        `threads`: a cap on the VM's parallelism for this call (None: its default); results do not
        depend on it."""

    def bind(self, layout: ProgramLayout, numels: Sequence[int]) -> AddressRunner | None:
        """A launcher for `layout` on buffers given by address, their element counts fixed to
        `numels` (the cached launch path: the caller guarantees buffers of the dtypes and extents
        that passed check_buffers and keeps them alive during the call); None when the VM runs on
        buffer objects only. The launcher may also offer `caller(outs, on_launch, ptr, single,
        workspaces)`: one function that allocates the outputs and runs on the inputs' and outputs'
        addresses, with workspaces of its own (vm/cpu/host/launch._Runner.caller); callers
        check for it with hasattr."""
        return None
