"""The exception types DVM raises. Every error a user can trigger derives from DvmError."""
from __future__ import annotations


class DvmError(Exception):
    """Base class of all DVM errors."""


class DTypeError(DvmError, TypeError):
    """An op was given a dtype it does not support, or an argument has an unsupported dtype."""


class ArgumentError(DvmError, TypeError):
    """An argument is of a kind DVM does not take (np.matrix, a masked array, ...)."""


class ShapeError(DvmError, ValueError):
    """Shapes do not broadcast, a reshape does not preserve size, or an argument's shape
    violates a constraint recorded when the kernel was traced."""


class VerifyError(DvmError, ValueError):
    """A Program failed verification. `rule` is a stable rule id (see codegen/verifier.py),
    `index` the instruction index (-1 when the rule is not about one instruction)."""

    def __init__(self, rule: str, message: str, index: int = -1, kernel: int = -1):
        self.rule, self.index, self.kernel = rule, index, kernel
        where = "" if index < 0 else f" at instruction {index}"
        where += "" if kernel < 0 else f" of kernel {kernel}"
        super().__init__(f"[{rule}]{where}: {message}")


class ProgramLimitError(DvmError, ValueError):
    """A graph needs more arguments (inputs, outputs, workspaces) or kernels than one Program
    holds (codegen/program.MAX_ARGS, MAX_KERNELS); the torch backend and lazy mode then run
    it through PyTorch, with this reason."""


class TraceError(DvmError):
    """A kernel function used the builder API incorrectly."""


class DeviceError(DvmError, RuntimeError):
    """A VM's device cannot run this request: the device (or the package it needs) is not present,
    buffers live on another device, or a Program exceeds what that VM was compiled for."""
