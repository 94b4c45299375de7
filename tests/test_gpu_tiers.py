"""Tiered execution of the GPU VM (vm/gpu/tiered.py, specialize.py) in Triton's interpreter mode:
specialised kernels compute the reference's results on every kind of stream, a structure is keyed
by its stream and never by its sizes, background specialisation switches in only after a bitwise
check, and a kernel whose bits differ is rejected (its structure keeps the interpreter)."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from gpu_helpers import GPU, compare, interpreted   # (first: sets TRITON_INTERPRET)

import dvm
from dvm import config as dvm_config
from dvm.runtime import counters
from dvm.vm.gpu import specialize, tiered

from test_gpu_vm import _reduce_kernel, layer_norm, softmax

pytestmark = [pytest.mark.filterwarnings("ignore::RuntimeWarning"),
              pytest.mark.skipif(not interpreted(), reason="GPU VM kernels defined for a real GPU: see "
                                 "tests/test_gpu_device.py")]
RNG = np.random.default_rng(7)


@pytest.fixture(autouse=True)
def vm(monkeypatch, tmp_path):
    """Specialise after two launches; generated sources in a fresh directory; fresh tiers."""
    monkeypatch.setenv("DVM_GPU_SPECIALIZE", "2")
    monkeypatch.setenv("DVM_GPU_CACHE", str(tmp_path))
    monkeypatch.setattr(tiered, "MANAGER", tiered.TierManager())   # no state from other tests
    dvm_config.reload()
    yield None
    monkeypatch.undo()
    dvm_config.reload()


def _tiers(kfn, *arrays):
    layout = dvm.verify(kfn.program(*arrays, vm="gpu"))
    return layout, [tiered.MANAGER.tier(specialize.structure_key(kl)) for kl in layout.kernels]


@dvm.kernel
def mixed(k, x, m):
    """Casts, an int chain with iota, a bool select, argmax and a row-level store."""
    x, m = k.load(x), k.load(m)
    i = k.add(k.mul(k.iota(x.shape, 1), 3), k.cast(k.gt(x, 0), "int32"))
    y = k.where(m, k.exp(x), k.cast(k.cast(x, "bfloat16"), "float32"))
    return k.store(i), k.store(y), k.store(k.argmax(x, axis=-1)), k.store(k.sum(y, axis=-1, keepdims=True))


@dvm.kernel
def scaled_sum(k, x, y):
    return k.store(k.add(k.mul(k.load(x), 1.5), k.load(y)))


def _rows(shape, dtype="float32"):
    return RNG.standard_normal(shape).astype(np.float32).astype(ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype)


# DVM_GPU_VECTOR's fast path: tiles of one row inside the columns (a shorter last tile), bf16, an
# unaligned view (the general form), a broadcast row, a multi-sweep softmax, LayerNorm
VECTOR_CASES = [
    (scaled_sum, lambda: (_rows((3, 2100)), _rows((3, 2100)))),
    (scaled_sum, lambda: (_rows((3, 2100), "bfloat16"), _rows((3, 2100), "bfloat16"))),
    (scaled_sum, lambda: (_rows((3, 2101))[:, 1:], _rows((3, 2100)))),
    (scaled_sum, lambda: (_rows((3, 2048)), _rows((2048,)))),
    (dvm.kernel(softmax), lambda: (_rows((3, 2100)),)),
    (dvm.kernel(layer_norm), lambda: (_rows((2, 3000)), np.ones(3000, np.float32), np.zeros(3000, np.float32))),
]

CASES = [
    (dvm.kernel(softmax), lambda: (RNG.standard_normal((3, 1300)).astype(np.float32),)),
    (dvm.kernel(layer_norm), lambda: (RNG.standard_normal((4, 40)).astype(np.float32),
                                      np.ones(40, np.float32), np.zeros(40, np.float32))),
    (mixed, lambda: (RNG.standard_normal((5, 21)).astype(np.float32), RNG.random((5, 21)) < 0.5)),
    (_reduce_kernel("prod", 0), lambda: (RNG.uniform(0.9, 1.1, (30, 7)),)),
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_specialised_kernels_compute_the_reference(case):
    _specialised_compute_the_reference(*CASES[case])


@pytest.mark.parametrize("case", range(len(VECTOR_CASES)))
def test_the_vector_fast_path_computes_the_reference(case, monkeypatch):
    monkeypatch.setenv("DVM_GPU_VECTOR", "1")
    dvm_config.reload()
    _specialised_compute_the_reference(*VECTOR_CASES[case])


def _specialised_compute_the_reference(kfn, make):
    args = make()
    layout, tiers = _tiers(kfn, *args)
    assert GPU.specialise_now(layout) == ["ready"] * len(tiers)
    compare(kfn, *args)                                   # the check: interpreter vs specialised
    assert [t.state for t in tiers] == ["trusted"] * len(tiers), [t.error for t in tiers]
    launches = counters.snapshot().get("gpu_specialised_launches", 0)
    compare(kfn, *args)                                   # the specialised kernels alone
    assert counters.snapshot()["gpu_specialised_launches"] - launches == len(tiers)


def test_contiguous_tiles_have_a_fast_path_in_the_source_under_dvm_gpu_vector(monkeypatch):
    kl = dvm.verify(scaled_sum.program(_rows((3, 2100)), _rows((3, 2100)), vm="gpu")).kernels[0]
    off = specialize.structure_key(kl)
    assert "if vec" not in specialize.source(kl)
    monkeypatch.setenv("DVM_GPU_VECTOR", "1")
    dvm_config.reload()
    assert specialize.structure_key(kl) != off   # another structure: its own tier
    src = specialize.source(kl)
    aligned = [line.strip().split("(")[0].split("= ")[-1] for line in src.splitlines() if "vmask, True)" in line]
    assert "if vec & ((ct + 1) * bn <= cols):" in src and aligned == ["t.load_f32", "t.load_f32", "t.store_f32"]
    # a reduction's rows: its loads too (a softmax sweeps the row three times)
    assert ", vmask, True)" in specialize.source(
        dvm.verify(dvm.kernel(softmax).program(_rows((3, 2100)), vm="gpu")).kernels[0])


def test_structure_is_the_stream_never_the_size():
    kfn = dvm.kernel(softmax)
    keys = {specialize.structure_key(dvm.verify(kfn.program(RNG.standard_normal(s).astype(np.float32),
                                                            vm="gpu")).kernels[0])
            for s in ((2, 1100), (9, 3000), (4, 1500))}   # the multi-sweep stream at three sizes
    assert len(keys) == 1
    # (one row is folded away: a stream over one folded dim fewer is another structure)
    assert specialize.structure_key(dvm.verify(kfn.program(np.ones((1, 1500), np.float32), vm="gpu")).kernels[0]) \
        not in keys
    other = _reduce_kernel("sum", -1).program(np.ones((2, 2000), np.float32), vm="gpu")
    assert specialize.structure_key(dvm.verify(other).kernels[0]) not in keys


def test_background_specialisation_switches_in_after_the_check():
    kfn = _reduce_kernel("max", -1)
    x = RNG.standard_normal((4, 1100)).astype(np.float32)
    _, (tier,) = _tiers(kfn, x)
    assert tier.state == "new"
    for _ in range(2):                  # two interpreted launches: queued for the background
        compare(kfn, x)
    assert tiered.MANAGER.drain(60) and tier.state == "ready", tier.error
    compare(kfn, RNG.standard_normal((2, 1500)).astype(np.float32))   # another size: same structure
    assert tier.state == "trusted"
    with open(tier.path) as f:
        assert "def specialised(" in f.read()


def test_a_kernel_whose_bits_differ_is_rejected():
    kfn = _reduce_kernel("sum", -1)
    x = RNG.standard_normal((3, 50)).astype(np.float32)
    layout, (tier,) = _tiers(kfn, x)
    src = specialize.source(layout.kernels[0]).replace("t.tree(", "t.tree(1.0 + ")   # wrong sums
    tiered.MANAGER.build_now(tier, src, tiered.compile_args())
    assert tier.state == "ready"
    rejected = counters.snapshot().get("gpu_tier_rejected", 0)
    compare(kfn, x)                     # the interpreter's results stand
    assert tier.state == "rejected" and counters.snapshot()["gpu_tier_rejected"] == rejected + 1
    compare(kfn, x)                     # and it stays on the interpreter
    assert tier.state == "rejected"
