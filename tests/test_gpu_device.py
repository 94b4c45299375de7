"""The GPU VM on a real CUDA GPU: the differential checks on CUDA tensors, one compiled kernel
per variant for every shape, the torch backend on a CUDA model over many lengths. Skipped without
a CUDA device and Triton, and when this process defined the kernels in Triton's interpreter mode
(tests/gpu_helpers.py does so for the interpreter-mode tests, which `make test` collects too: run
this file in its own process, as scripts/gpu_session.sh does)."""
from __future__ import annotations

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton", reason="the GPU VM needs Triton (pip install '.[gpu]')")

if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)
if os.environ.get("TRITON_INTERPRET") == "1":
    pytest.skip("TRITON_INTERPRET=1: the GPU VM's kernels are interpreted in this process",
                allow_module_level=True)

import dvm  # noqa: E402
from dvm import config as dvm_config  # noqa: E402
from dvm.vm import registry  # noqa: E402

from helpers import random_values, to_torch  # noqa: E402
from gpu_kernels import KERNELS  # noqa: E402


GPU = registry.get("gpu")
RNG = np.random.default_rng(48)


@pytest.fixture(autouse=True)
def vm(monkeypatch):
    if GPU.host_buffers:   # another test module of this process set TRITON_INTERPRET first
        pytest.skip("the GPU VM's kernels were defined in Triton's interpreter mode in this process: "
                    "run this file alone (scripts/gpu_session.sh does)")
    monkeypatch.setenv("DVM_GPU_SPECIALIZE", "0")   # the interpreter: compile counts stay exact
    dvm_config.reload()
    yield None
    monkeypatch.undo()
    dvm_config.reload()


def _cuda(a: np.ndarray) -> torch.Tensor:
    return to_torch(a).cuda()


# float sums whose order on the device (warp shuffles) is not the reference VM's: kernel -> {output: reduced axis
# of its first input}
REORDERED_SUMS = {"reductions": {1: 0}}


def _assert_sum_within_bound(got: torch.Tensor, want: np.ndarray, x: np.ndarray, axis: int) -> None:
    """A float32 sum in another order than the reference's: within n·u·Σ|x| of the exact sum (the
    classical bound for any order), and non-finite where the reference is, with its value."""
    exact = x.astype(np.float64).sum(axis)
    bound = x.shape[axis] * np.finfo(np.float32).eps * np.abs(x.astype(np.float64)).sum(axis)
    g = got.cpu().double().numpy()
    finite = np.isfinite(want)
    np.testing.assert_array_equal(g[~finite], want[~finite].astype(np.float64))
    assert (np.abs(g - exact) <= bound)[finite].all()


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_kernels_on_cuda_match_the_reference(name):
    kfn, make = KERNELS[name]
    for args in make(RNG):
        want = kfn(*args, vm="reference")
        got = kfn(*[_cuda(a) for a in args])
        pairs = zip(want if isinstance(want, tuple) else (want,), got if isinstance(got, tuple) else (got,))
        for k, (w, g) in enumerate(pairs):
            assert g.is_cuda
            axis = REORDERED_SUMS.get(name, {}).get(k)
            if axis is not None:
                _assert_sum_within_bound(g, w, args[0], axis)
            else:
                torch.testing.assert_close(g.cpu(), to_torch(w), equal_nan=True)


def test_one_compiled_kernel_per_variant_for_every_shape():
    kfn, make = KERNELS["softmax"]
    for args in make(RNG):
        kfn(*[_cuda(a) for a in args])
    torch.cuda.synchronize()
    first = GPU.compiled_variants()
    for rows, cols in ((3, 17), (129, 4099), (1000, 1), (7, 1024), (2, 100000)):
        kfn(_cuda(random_values(RNG, "float32", (rows, cols))))
    torch.cuda.synchronize()
    assert GPU.compiled_variants() == first <= 2


def test_tiny_llama_on_cuda_over_lengths():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                                   max_position_embeddings=512, use_cache=False)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).cuda().eval()
    compiled = dvm.compile(model)
    with torch.no_grad():
        compiled(torch.randint(0, 256, (1, 5), device="cuda"))
        torch.cuda.synchronize()
        variants = GPU.compiled_variants()
        for L in (1, 2, 7, 16, 33, 100, 257):
            ids = torch.randint(0, 256, (1, L), device="cuda")
            torch.testing.assert_close(compiled(ids).logits, model(ids).logits, rtol=1e-4, atol=1e-4)
    assert GPU.compiled_variants() == variants   # no new length compiled anything
