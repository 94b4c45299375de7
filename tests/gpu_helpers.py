"""Helpers of the GPU VM's tests: run a kernel's GPU-encoded Program on the GPU VM and on the
reference VM from the same buffers, and compare (floats at assert_close's default tolerances for
their dtype, NaN positions equal; integers and bools exactly).

Importing this module puts Triton into interpreter mode (TRITON_INTERPRET=1) unless the GPU VM's
kernels were already defined for a real GPU in this process: the tests then run on the CPU.
"""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

if "dvm.vm.gpu.interp" not in sys.modules:
    os.environ.setdefault("TRITON_INTERPRET", "1")

triton = pytest.importorskip("triton", reason="the GPU VM needs Triton (pip install '.[gpu]')")

import torch  # noqa: E402

from dvm.codegen.encoder import NeedsCopy  # noqa: E402
from dvm.codegen.verifier import check_buffers, verify  # noqa: E402
from dvm.graph.dtypes import DType  # noqa: E402
from dvm.runtime.compiled import as_buffer  # noqa: E402
from dvm.vm import reference, registry  # noqa: E402

from helpers import to_torch  # noqa: E402

GPU = registry.get("gpu")


def interpreted() -> bool:
    return GPU.host_buffers


def run_on(vm_run, kfn, *arrays, poison: int = 0x7F):
    """Run kernel `kfn` (its Program encoded for the GPU VM) on `arrays` with `vm_run`."""
    arrays = [np.asarray(a) for a in arrays]
    try:
        prog = kfn.program(*arrays, vm="gpu")
    except NeedsCopy as e:
        arrays[e.slot] = np.ascontiguousarray(arrays[e.slot])
        return run_on(vm_run, kfn, *arrays, poison=poison)
    layout = verify(prog)
    ref = kfn(*arrays, vm="reference")   # output shapes and dtypes
    refs = ref if isinstance(ref, tuple) else (ref,)
    outs = [np.empty(r.shape, r.dtype) for r in refs]
    for o in outs:   # poison: an element the VM does not write must not pass for a result
        o.reshape(-1).view(np.uint8)[...] = poison
    bufs = [as_buffer(a)[0] for a in arrays] + [o.reshape(-1) for o in outs]
    for info in layout.args[len(bufs):]:   # workspaces
        bufs.append(np.empty(info.numel, DType(info.dtype).np_dtype))
    check_buffers(layout, bufs)
    vm_run(layout, bufs)
    return outs


def assert_match(got: np.ndarray, want: np.ndarray, what: str = "") -> None:
    assert got.dtype == want.dtype and got.shape == want.shape, what
    if want.dtype.kind in "biu":
        np.testing.assert_array_equal(got, want, err_msg=what)
    else:
        torch.testing.assert_close(to_torch(got), to_torch(want), equal_nan=True, msg=lambda m: f"{what}\n{m}")


def compare(kfn, *arrays, what: str = ""):
    """Run on the GPU VM and the reference VM; returns the GPU VM's outputs."""
    want = run_on(reference.run, kfn, *arrays)
    got = run_on(GPU.run, kfn, *arrays)
    for k, (g, w) in enumerate(zip(got, want)):
        assert_match(g, w, f"{what} output {k}")
    return got
