"""Every test that runs a program runs on both VMs: the numba CPU VM and the reference VM."""
import os
import subprocess
import sys

import pytest
from hypothesis import settings

from dvm import config as dvm_config

# CI runs a fixed set of Hypothesis examples (a landing must not depend on a random draw);
# local runs keep exploring new ones. Failures found locally get pinned as plain tests.
settings.register_profile("ci", derandomize=True)
if os.environ.get("CI"):
    settings.load_profile("ci")

VMS = ("cpu", "reference")


@pytest.fixture(autouse=True)
def vm(request, monkeypatch):
    """The VM this test runs on (DVM_VM): each test runs on both (pytest_generate_tests), so that
    the CPU VM is checked against the reference by the same assertions. In a module marked
    vm_once it is not parametrized: the VM DVM_VM selects (the CPU VM by default)."""
    name = getattr(request, "param", None)
    if name is None:
        yield os.environ.get("DVM_VM", "cpu")
        return
    monkeypatch.setenv("DVM_VM", name)
    dvm_config.reload()
    if name == "cpu":
        _whole_cpu_vm()
    yield name
    monkeypatch.undo()
    dvm_config.reload()


def pytest_generate_tests(metafunc):
    """`vm` over both VMs, except in modules marked vm_once (they run the VM DVM_VM selects, or
    compare the VMs themselves, or run no program) and in modules with a `vm` fixture of their
    own (the GPU VM's, the generic paths')."""
    if "vm" in metafunc.fixturenames and metafunc.definition.get_closest_marker("vm_once") is None \
            and not hasattr(metafunc.module, "vm"):
        metafunc.parametrize("vm", VMS, indirect=True)


@pytest.fixture(autouse=True)
def _whole_vm_for_cpu_vm_modules(request):
    """Tests marked cpu_vm (modules that run once, or compare the VMs themselves) run the whole
    CPU VM, in a reference-VM case too (on a cold cache: after its fast paths are built)."""
    if request.node.get_closest_marker("cpu_vm") is not None:
        _whole_cpu_vm()


def _whole_cpu_vm():
    """The CPU VM with its fast paths loaded (on a cold cache they compile in the background;
    tests of the generic paths take them out themselves: helpers.generic_paths)."""
    from dvm.vm import cpu
    cpu.warm_up(wait_fast=True)


# On a cold numba cache the CPU VM compiles first (its core ~30 s on 2 cores, its fast paths ~25 s
# more; longer while pip installs). Under pytest-xdist the controller starts it in a background
# process at once, and every test runs its reference-VM case before any CPU-VM case: the workers
# test on the reference VM while the VM compiles, and each worker's first CPU-VM test waits for
# that compile (the pieces' locks, dvm/vm/cpu/host/cache.py) instead of compiling the same code
# itself.
def pytest_configure(config):
    config.addinivalue_line("markers", "cpu_vm: runs the CPU VM whatever its `vm` parameter (a module that "
                            "compares the VMs itself, or runs once on the default VM); ordered with the "
                            "CPU-VM cases, after the compile")
    config.addinivalue_line("markers", "vm_once: not parametrized over the VMs (conftest's `vm`): runs the VM "
                            "DVM_VM selects, the CPU VM by default")
    if hasattr(config, "workerinput") or not config.getoption("numprocesses", None):
        return
    config._dvm_compile = subprocess.Popen([sys.executable, "-c", "from dvm.vm import cpu; cpu.warm_up(wait_fast=True)"])


def pytest_unconfigure(config):
    proc = getattr(config, "_dvm_compile", None)
    if proc is not None and proc.poll() is None:   # only reference-VM tests were selected
        proc.terminate()
        proc.wait()


def pytest_collection_modifyitems(items):
    def on_cpu(item) -> bool:
        spec = getattr(item, "callspec", None)
        return (spec is not None and spec.params.get("vm") == "cpu") or item.get_closest_marker("cpu_vm") is not None
    items.sort(key=on_cpu)   # stable: the reference-VM cases first, each group in its own order
