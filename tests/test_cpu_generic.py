"""The CPU VM on its generic paths alone (its FAST pieces out of the VM table: no fused runs, row
forms or register row trees), as a process runs on a cold machine while those compile in the
background: the same results as the reference VM, bitwise where the fast paths are."""
import numpy as np
import pytest

import test_cpu_fused
from dvm.frontend.library import layernorm, rmsnorm, softmax
from dvm.vm import cpu
from dvm.vm.cpu.host import pieces
from test_cpu_vm import run_on
import test_cpu_vm
from helpers import generic_paths

pytestmark = pytest.mark.cpu_vm   # compares the VMs itself


@pytest.fixture(autouse=True)
def vm():
    """Not parametrized over VMs: each test compares the CPU VM with the reference itself."""
    with generic_paths():
        yield "cpu"


@pytest.mark.parametrize("red", test_cpu_vm.REDS)
def test_reductions(red):
    test_cpu_vm.test_reductions(red)


@pytest.mark.parametrize("dtype", ["float32", "float64", "int64"])
@pytest.mark.parametrize("cols", [17, 250, 300, 1001, 3000])
def test_partial_row_reductions_keep_padding(dtype, cols):
    test_cpu_vm.test_partial_row_reductions_keep_padding(dtype, cols)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_max_min_signed_zero_and_nan_bitwise(dtype):
    test_cpu_vm.test_max_min_signed_zero_and_nan_bitwise(dtype)


@pytest.mark.parametrize("dt", test_cpu_vm.FLOATS)
@pytest.mark.parametrize("shape", [(4, 17), (3, 5000), (65, 1024)])
def test_norms(dt, shape):
    test_cpu_vm.test_norms(dt, shape)


def test_chain_and_iota():
    test_cpu_vm.test_chain_and_iota()


@pytest.mark.parametrize("shape", [(64, 1024), (9, 1001), (6, 600), (7, 2000), (5, 300), (13, 4096), (100, 17),
                                   (3, 70000)])
def test_fused_kernels_give_the_bits_of_their_generic_paths(shape):
    """Softmax, the norms and row reductions, which run fused with the fast pieces (row forms, fused
    runs, register trees), give bitwise what the generic paths give: a process switching to the
    fast pieces mid-run sees no change in its results."""
    x, w, b = test_cpu_fused._data(np.dtype(np.float32), shape)
    cases = [(layernorm, (x, w, b)), (rmsnorm, (x, w)), (softmax, (x,))]
    cases += [(kfn, (x,)) for kfn in test_cpu_fused.ROW_REDUCERS]
    for kfn, args in cases:
        generic = run_on(cpu.run, kfn, *args)
        pieces.install_all_loaded()
        fast = run_on(cpu.run, kfn, *args)
        pieces.uninstall_fast()
        for g, f in zip(generic, fast):
            assert test_cpu_fused._same(f, g), (kfn, shape)
