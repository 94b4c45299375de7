"""DVM: a real-time operator compiler. Fused kernels are encoded to bytecode per instance in
microseconds and run by virtual machines compiled once."""
from .codegen.disasm import disasm
from .codegen.program import Program
from .codegen.verifier import verify
from .errors import ArgumentError, DTypeError, DvmError, ShapeError, TraceError, VerifyError
from .frontend.builder import KernelFunction, kernel
from .frontend.explain import explain
from .runtime.counters import reset as reset_counters
from .runtime.counters import snapshot as counters
from .runtime.launch import execute

__version__ = "0.1.0"


def compile(model=None, **kwargs):  # noqa: A001 (the torch.compile shorthand)
    """`torch.compile(model, backend="dvm", dynamic=True, **kwargs)`; imports torch lazily."""
    from .frontend.torch_backend import compile as compile_
    return compile_(model, **kwargs)
__all__ = ["kernel", "KernelFunction", "explain", "compile", "Program", "disasm", "verify", "execute", "counters",
           "reset_counters", "DvmError", "DTypeError", "ShapeError", "TraceError", "VerifyError", "ArgumentError"]
