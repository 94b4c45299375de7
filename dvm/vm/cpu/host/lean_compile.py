"""A build process's compile of a piece without the work whose result nobody uses.

numba compiles every function a piece calls as a program of its own: Python and C wrappers, its
module optimized with everything it links, then machine code; once per callee, so a function deep
in the call tree is optimized once per level above it. Only the piece's machine code is run and
cached: it is made from the callees' IR, linked into the piece's module; a build process
(host/build) never calls a callee from Python. Under `callees_as_ir` a callee is compiled to IR
only (no wrappers, no module optimization, no machine code of its own) and the piece's module,
every callee linked in, is optimized once.

The piece's code is not numba's, byte for byte: numba's JIT also lowers a callee's module in place
for the target (CodeGenPrepare's address sinking, seen in the IR) before a caller links it, so
numba's pieces were made from target-lowered, twice-optimized callees. Same semantics (no
reassociation either way) and the same speed.

numba's inlining of `inline='always'` functions, which copies the function's IR into each call
site and types it again there, is also left to LLVM: the function is compiled once and marked
alwaysinline. A function whose callers' loops measured slower so keeps numba's copy
(`inline=jit.bits.NUMBA_INLINE`). Figures: docs/DECISIONS.md (Start-up) and BENCHMARKS.md.

Not for a process that may call the callees from Python (host/startup's in-process fallback, tests):
their dispatchers would hold overloads with no Python entry point.
"""
from __future__ import annotations

import contextlib

from numba import _dynfunc
from numba.core import cpu as numba_cpu
from numba.core.codegen import JITCodeLibrary
from numba.core.dispatcher import _FunctionCompiler
from numba.core.untyped_passes import InlineInlinables

# The numba internals replaced here (numba is pinned): each must exist, or the compile is numba's.
_HOOKS = ((_FunctionCompiler, "_customize_flags"), (JITCodeLibrary, "_optimize_final_module"),
          (JITCodeLibrary, "_finalize_final_module"), (numba_cpu.CPUContext, "get_executable"),
          (InlineInlinables, "run_pass"))
_LIBRARY_CHECKS = ("_finalize_dynamic_globals", "_verify_declare_only_symbols")
SCHEME = 4   # in the pieces' cache stamp (host/pieces.source_hash)


class _AlwaysToLLVM(numba_cpu.InlineOptions):
    """numba's inline option, 'always' read as 'never' (LLVM inlines it); a cost model still runs."""

    @property
    def is_never_inline(self):
        return self._inline == "always" or super().is_never_inline


def available() -> bool:
    return (all(callable(getattr(owner, name, None)) for owner, name in _HOOKS)
            and all(callable(getattr(JITCodeLibrary, name, None)) for name in _LIBRARY_CHECKS)
            and callable(getattr(_dynfunc, "make_function", None))
            and isinstance(getattr(numba_cpu.InlineOptions("always"), "_inline", None), str))


def stamp() -> str:
    return f"callees as IR {SCHEME}" if available() else "callees compiled"


@contextlib.contextmanager
def callees_as_ir(top: str, entry: _FunctionCompiler | None = None):
    """While compiling the function named `top` (its numba library's name: the function's
    qualified name), compile the functions it calls to IR only. `entry`: the compiler of a `top`
    that Python calls (a dispatcher's), which keeps its Python wrapper. A function marked
    `inline='always'` is not inlined into numba's IR of each caller (copied and typed again per
    call site) but compiled once and marked for LLVM to inline; one marked
    `inline=jit.bits.NUMBA_INLINE` still is."""
    if not available():
        yield
        return
    plain = [getattr(owner, name) for owner, name in _HOOKS]
    plain_flags, plain_optimize, plain_finalize, plain_executable, plain_inline = plain

    def customize_flags(compiler, flags):
        flags = plain_flags(compiler, flags)
        if compiler is not entry:
            flags.no_cpython_wrapper = flags.no_cfunc_wrapper = True
        # set on every function: numba would pass a caller's value on to its callees
        flags.forceinline = compiler.targetoptions.get("inline") == "always"
        return flags

    def inline_inlinables(pass_, state):
        plain_options = numba_cpu.InlineOptions   # the pass looks it up at each call site
        numba_cpu.InlineOptions = _AlwaysToLLVM
        try:
            return plain_inline(pass_, state)
        finally:
            numba_cpu.InlineOptions = plain_options

    def optimize_final_module(library):
        if library.name == top:
            plain_optimize(library)

    def finalize_final_module(library):
        if library.name == top:
            return plain_finalize(library)
        for check in _LIBRARY_CHECKS:   # numba's checks of the module, without handing it to the JIT
            getattr(library, check)()
        library._finalized = True

    def get_executable(context, library, fndesc, env):
        if library.name == top:
            return plain_executable(context, library, fndesc, env)
        return _dynfunc.make_function(fndesc.lookup_module(), fndesc.qualname.split(".")[-1], "", 0, env,
                                      (library,))

    hooks = (customize_flags, optimize_final_module, finalize_final_module, get_executable, inline_inlinables)
    for (owner, name), hook in zip(_HOOKS, hooks):
        setattr(owner, name, hook)
    try:
        yield
    finally:
        for (owner, name), original in zip(_HOOKS, plain):
            setattr(owner, name, original)
