"""Every test that runs a program runs on both VMs: the numba CPU VM and the reference VM."""
import pytest

from dvm import config as dvm_config

VMS = ("cpu", "reference")


@pytest.fixture(params=VMS, autouse=True)
def vm(request, monkeypatch):
    """The VM this test runs on (DVM_VM); the CPU VM is checked against the reference by
    running the same assertions on both."""
    monkeypatch.setenv("DVM_VM", request.param)
    dvm_config.reload()
    yield request.param
    monkeypatch.undo()
    dvm_config.reload()
