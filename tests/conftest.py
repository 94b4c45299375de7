"""Every test that runs a program runs on both VMs: the numba CPU VM and the reference VM."""
import os

import pytest
from hypothesis import settings

from dvm import config as dvm_config

# CI runs a fixed set of Hypothesis examples (a landing must not depend on a random draw);
# local runs keep exploring new ones. Failures found locally get pinned as plain tests.
settings.register_profile("ci", derandomize=True)
if os.environ.get("CI"):
    settings.load_profile("ci")

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
