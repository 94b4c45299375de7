"""Launching the VM's Triton kernels without JITFunction.run's per-call work.

JITFunction.run binds the arguments, computes the specialisation key and looks the binary up at
every call: host time per launch that grows with the parameter count (the VM kernel has 22). The
VM's kernels take the same types at every launch (int64 arguments under do_not_specialize, fixed
constexprs and options), so each resolves to one binary per device: after the first launch through
the JIT function, that binary is launched with the call run() itself ends with
(`CompiledKernel.run(grid, stream, function, metadata, launch metadata, hooks, *arguments)`,
Triton 3.6-3.9; the launch hooks, a profiler's, are passed as run() passes them, and left out
with their launch metadata where none is registered). The JIT
function launches instead in Triton's interpreter mode, and for good once a direct launch raised
(counted: gpu_direct_launch_failed).
"""
from __future__ import annotations

import threading

from ...runtime import counters

_LAUNCHERS: dict = {}
_LOCK = threading.Lock()


class Launcher:
    """fn[(grid,)](*args, **constexprs, **options), by the direct path once fn has a binary."""
    __slots__ = ("fn", "constexprs", "tail", "options", "binaries", "direct")

    def __init__(self, fn, constexprs: dict, options: dict):
        self.fn, self.constexprs, self.options = fn, constexprs, options
        self.tail = tuple(constexprs.values())   # (constexprs follow the arguments in fn's signature)
        self.binaries: dict = {}                 # device index -> (binary, run, function, packed metadata)
        self.direct = type(fn).__name__ == "JITFunction"

    def __call__(self, grid: int, args: list) -> None:
        if self.direct:
            import triton
            driver = triton.runtime.driver.active
            device = driver.get_current_device()
            binary = self.binaries.get(device)
            if binary is not None:
                compiled, run, function, metadata = binary
                hooks = triton.knobs.runtime
                enter, leave = hooks.launch_enter_hook, hooks.launch_exit_hook
                stream = driver.get_current_stream(device)
                try:
                    if _unhooked(enter) and _unhooked(leave):   # (the launcher calls neither)
                        run(grid, 1, 1, stream, function, metadata, None, None, None, *args, *self.tail)
                    else:
                        launch_metadata = compiled.launch_metadata((grid, 1, 1), stream, *args, *self.tail)
                        run(grid, 1, 1, stream, function, metadata, launch_metadata, enter, leave, *args, *self.tail)
                    return
                except Exception:
                    self.direct = False
                    counters.bump("gpu_direct_launch_failed")
            compiled = self.fn[(grid,)](*args, **self.constexprs, **self.options)
            if compiled is not None and self.direct:
                compiled = compiled.result() if hasattr(compiled, "result") else compiled
                self.binaries[device] = (compiled, compiled.run, compiled.function, compiled.packed_metadata)
            return
        self.fn[(grid,)](*args, **self.constexprs, **self.options)


def _unhooked(hook) -> bool:
    """No launch hook to call: None, or an empty HookChain (Triton 3.6-3.9's default)."""
    return hook is None or getattr(hook, "calls", None) == []


def launcher(fn, constexprs: dict, options: dict) -> Launcher:
    """The Launcher of fn with these constexprs and options (one per combination, kept)."""
    key = (fn, *constexprs.items(), *options.items())
    got = _LAUNCHERS.get(key)
    if got is None:
        with _LOCK:
            got = _LAUNCHERS.setdefault(key, Launcher(fn, constexprs, options))
    return got
