"""A build process's compile of a piece without the work whose result nobody uses.

numba compiles every function a piece calls as a program of its own: Python and C wrappers, then
machine code for it and for every function it links in, once per callee. Only the piece's machine
code is run and cached: it is made from the callees' IR, linked into the piece's module; a build
process (host/build) never calls a callee from Python. Under `callees_as_ir` a callee is compiled
to optimized IR only: no wrappers, no machine code of its own (the core's compile: 25 % less CPU,
30 % less memory).

The piece's code is not numba's, byte for byte: numba hands a callee's module to its JIT, whose
code generation rewrites that module in place (it lowers it for the target), and a caller then
links the rewritten IR; here a caller links the IR as the optimizer left it. Same semantics (no
reassociation either way); the pieces came out 0-18 % smaller and as fast (BENCHMARKS.md).

Not for a process that may call the callees from Python (host/startup's in-process fallback, tests):
their dispatchers would hold overloads with no Python entry point.
"""
from __future__ import annotations

import contextlib

from numba import _dynfunc
from numba.core.codegen import JITCodeLibrary
from numba.core.cpu import CPUContext
from numba.core.dispatcher import _FunctionCompiler

# The numba internals replaced here (numba is pinned): each must exist, or the compile is left as is.
_HOOKS = ((_FunctionCompiler, "_customize_flags"), (JITCodeLibrary, "_finalize_final_module"),
          (CPUContext, "get_executable"))
_LIBRARY_STEPS = ("_finalize_dynamic_globals", "_verify_declare_only_symbols")


SCHEME = 1   # in the pieces' cache stamp (host/pieces.source_hash), with whether it is available


def stamp() -> str:
    return f"callees as IR {SCHEME}" if available() else "callees compiled"


def available() -> bool:
    return (all(callable(getattr(owner, name, None)) for owner, name in _HOOKS)
            and all(callable(getattr(JITCodeLibrary, name, None)) for name in _LIBRARY_STEPS)
            and callable(getattr(_dynfunc, "make_function", None)))


@contextlib.contextmanager
def callees_as_ir(top: str, entry: _FunctionCompiler | None = None):
    """While compiling the function named `top` (its numba library's name: the function's
    qualified name), compile the functions it calls to IR only. `entry`: the compiler of a `top`
    that Python calls (a dispatcher's), which keeps its Python wrapper."""
    if not available():
        yield
        return
    plain = [getattr(owner, name) for owner, name in _HOOKS]
    plain_flags, plain_finalize, plain_executable = plain

    def customize_flags(compiler, flags):
        flags = plain_flags(compiler, flags)
        if compiler is not entry:
            flags.no_cpython_wrapper = flags.no_cfunc_wrapper = True
        return flags

    def finalize_final_module(library):
        if library.name == top:
            return plain_finalize(library)
        for step in _LIBRARY_STEPS:   # numba's checks of the module, without handing it to the JIT
            getattr(library, step)()
        library._finalized = True

    def get_executable(context, library, fndesc, env):
        if library.name == top:
            return plain_executable(context, library, fndesc, env)
        return _dynfunc.make_function(fndesc.lookup_module(), fndesc.qualname.split(".")[-1], "", 0, env,
                                      (library,))

    for (owner, name), hook in zip(_HOOKS, (customize_flags, finalize_final_module, get_executable)):
        setattr(owner, name, hook)
    try:
        yield
    finally:
        for (owner, name), original in zip(_HOOKS, plain):
            setattr(owner, name, original)
