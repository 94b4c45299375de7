"""DVM: a real-time operator compiler. Fused kernels are encoded to bytecode per instance in
microseconds and run by virtual machines compiled once."""
from .codegen.disasm import disasm
from .codegen.program import Program
from .codegen.verifier import verify as _verify_program
from .errors import ArgumentError, DTypeError, DvmError, ProgramLimitError, ShapeError, TraceError, VerifyError
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


def verify(target, *inputs, **kwargs):
    """`dvm.verify(program)`: the bytecode verifier (returns the ProgramLayout, VerifyError if
    malformed). `dvm.verify(model_or_fn, *inputs, repro_dir=..., label=..., **kwargs)`: accuracy
    verification (tools/verify): runs model_or_fn(*inputs, **kwargs) compiled with the DVM
    backend, every kernel launch checked against eager PyTorch and float64; returns the
    VerifyReport. Imports torch lazily."""
    if isinstance(target, Program):
        return _verify_program(target)
    from .tools.verify import verify as verify_accuracy
    return verify_accuracy(target, *inputs, **kwargs)


def __getattr__(name: str):
    """`dvm.lazy` and `dvm.sync` (eager lazy mode, frontend/lazy.py) import torch on first use."""
    if name in ("lazy", "sync"):
        from .frontend import lazy as lazy_module
        value = getattr(lazy_module, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'dvm' has no attribute {name!r}")


__all__ = ["kernel", "KernelFunction", "explain", "compile", "lazy", "sync", "Program", "disasm", "verify", "execute",
           "counters", "reset_counters", "DvmError", "DTypeError", "ShapeError", "TraceError", "VerifyError",
           "ArgumentError", "ProgramLimitError"]
