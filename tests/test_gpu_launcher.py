"""vm/gpu/launcher.py without a GPU: Triton's driver and a JIT function replaced by fakes that
record what the launcher calls. The first launch goes through the JIT function; later ones call
the binary's launcher directly, with Triton's launch hooks and metadata only where a hook is
registered; a direct launch that raises turns the path off for good (counted)."""
from __future__ import annotations

import pytest

triton = pytest.importorskip("triton", reason="the GPU VM needs Triton (pip install '.[gpu]')")

from dvm.runtime import counters  # noqa: E402
from dvm.vm.gpu import launcher as launcher_module  # noqa: E402

pytestmark = pytest.mark.vm_once


class _Driver:
    def get_current_device(self):
        return 0

    def get_current_stream(self, device):
        return 1234


class _Binary:
    function, packed_metadata = "function", "packed"

    def __init__(self, calls, fail=False):
        self.calls, self.fail = calls, fail

    def run(self, *a):
        if self.fail:
            raise TypeError("another launcher signature")
        self.calls.append(("direct", a))

    def launch_metadata(self, grid, stream, *args):
        return ("metadata", grid, stream)


class JITFunction:   # (the launcher takes the direct path only for Triton's JITFunction, by name)
    def __init__(self, fail=False):
        self.calls = []
        self.binary = _Binary(self.calls, fail)

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.calls.append(("jit", grid, args, kwargs))
            return self.binary
        return launch


@pytest.fixture
def driver(monkeypatch):
    monkeypatch.setattr(triton.runtime.driver, "_active", _Driver())   # (DriverConfig.active reads it)


def test_the_first_launch_compiles_through_the_jit_function_and_later_ones_go_direct(driver):
    fn = JITFunction()
    launch = launcher_module.Launcher(fn, {"TILE": 1024, "HOT_D": 2}, {"num_warps": 8})
    launch(7, [1, 2, 3])
    launch(9, [4, 5, 6])
    assert fn.calls[0] == ("jit", (7,), (1, 2, 3), {"TILE": 1024, "HOT_D": 2, "num_warps": 8})
    # no hook registered: neither hooks nor launch metadata (the launcher calls nothing)
    assert fn.calls[1] == ("direct", (9, 1, 1, 1234, "function", "packed", None, None, None, 4, 5, 6, 1024, 2))


def test_registered_launch_hooks_get_the_launch_metadata(driver):
    fn = JITFunction()
    launch = launcher_module.Launcher(fn, {"TILE": 1024}, {})
    launch(3, [1])

    def hook(metadata):
        pass
    hooks = triton.knobs.runtime.launch_enter_hook
    hooks.add(hook)
    try:
        launch(3, [1])
    finally:
        hooks.remove(hook)
    kind, args = fn.calls[1]
    assert kind == "direct" and args[6] == ("metadata", (3, 1, 1), 1234) and args[7] is hooks


def test_a_direct_launch_that_raises_falls_back_to_the_jit_function_for_good(driver):
    fn = JITFunction(fail=True)
    launch = launcher_module.Launcher(fn, {"TILE": 1024}, {})
    before = counters.snapshot().get("gpu_direct_launch_failed", 0)
    for grid in (1, 2, 3):
        launch(grid, [5])
    assert [c[0] for c in fn.calls] == ["jit", "jit", "jit"]
    assert counters.snapshot()["gpu_direct_launch_failed"] - before == 1


def test_launchers_are_kept_per_function_constexprs_and_options():
    fn = JITFunction()
    one = launcher_module.launcher(fn, {"TILE": 1024}, {"num_warps": 8})
    assert launcher_module.launcher(fn, {"TILE": 1024}, {"num_warps": 8}) is one
    assert launcher_module.launcher(fn, {"TILE": 512}, {"num_warps": 8}) is not one
