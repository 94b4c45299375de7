"""The GPU VM through the frontends, in Triton's interpreter mode (tests/gpu_helpers.py): the
builder API on torch tensors (the device path: frontend/gpu_arrays, runtime/device), the
torch.compile backend with DVM_VM=gpu, and the errors a host-only setup gives. CPU tensors stand in
for CUDA tensors here (the interpreter's device memory is host memory); tests/test_gpu_device.py
runs the same paths on a GPU."""
from __future__ import annotations

import numpy as np
import pytest

from gpu_helpers import GPU, interpreted   # (first: sets TRITON_INTERPRET)

import torch

import dvm
from dvm import config as dvm_config
from dvm.errors import DeviceError
from dvm.frontend import gpu_arrays
from dvm.runtime import counters

pytestmark = [pytest.mark.filterwarnings("ignore::RuntimeWarning"),
              pytest.mark.skipif(not interpreted(), reason="GPU VM kernels defined for a real GPU: see "
                                 "tests/test_gpu_device.py")]


@pytest.fixture(autouse=True)
def vm(monkeypatch):
    """The GPU VM selected (DVM_VM=gpu), specialisation off: these tests are about the frontends."""
    monkeypatch.setenv("DVM_VM", "gpu")
    monkeypatch.setenv("DVM_GPU_SPECIALIZE", "0")
    dvm_config.reload()
    yield "gpu"
    monkeypatch.undo()
    dvm_config.reload()


@dvm.kernel
def swiglu_norm(k, x, g, w):
    x, g = k.load(x), k.load(g)
    h = k.mul(k.silu(g), x)
    ms = k.mean(k.mul(h, h), axis=-1, keepdims=True)
    return k.store(k.mul(k.mul(h, k.rsqrt(k.add(ms, 1e-6))), k.load(w)))


def _eager(x, g, w):
    h = torch.nn.functional.silu(g) * x
    return h * torch.rsqrt((h * h).mean(-1, keepdim=True) + 1e-6) * w


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_builder_on_tensors(dtype):
    torch.manual_seed(0)
    x, g = torch.randn(6, 40, dtype=dtype), torch.randn(6, 40, dtype=dtype)
    w = torch.rand(40, dtype=dtype) + 0.5
    before = counters.snapshot().get("launches", 0)
    y = swiglu_norm(x, g, w)
    assert isinstance(y, torch.Tensor) and y.dtype == dtype and y.device == x.device
    torch.testing.assert_close(y, _eager(x, g, w))
    y2 = swiglu_norm(x[:, :33], g[:, :33], w[:33])      # a new size: one encode, no new trace
    torch.testing.assert_close(y2, _eager(x[:, :33], g[:, :33], w[:33]))
    y3 = swiglu_norm(x.t().contiguous().t(), g, w)      # a transposed input: strided addresses
    torch.testing.assert_close(y3, _eager(x, g, w))
    assert counters.snapshot()["launches"] - before == 3


def test_a_repeated_call_reuses_its_launch_and_a_changed_one_does_not():
    @dvm.kernel
    def scaled_silu(k, x, w):   # (a kernel of its own: its launches and encodes start at zero)
        return k.store(k.mul(k.silu(k.load(x)), k.mul(k.load(w), 1.375)))

    torch.manual_seed(1)
    x, w = torch.randn(6, 40), torch.rand(40) + 0.5
    calls = [(x, w), (x, w), (x.t().contiguous().t(), w), (x, w), (x[:, :33], w[:33]),
             (x[:, :33].contiguous(), w[:33]), (x.bfloat16(), w.bfloat16()), (x, w)]
    before = counters.snapshot()
    for a, b in calls:   # (each call after the first checks its tensors against the last call's)
        torch.testing.assert_close(scaled_silu(a, b), torch.nn.functional.silu(a) * (b * 1.375))
    after = counters.snapshot()
    assert after["launches"] - before.get("launches", 0) == len(calls)
    # new signatures: the first call, the transposed input, the narrower view (row stride 40), its
    # copy (row stride 33), bf16; the other three repeat the call before them or an earlier one
    assert after["encodes"] - before.get("encodes", 0) == 5


def test_builder_copies_what_a_view_chain_cannot_express():
    @dvm.kernel
    def f(k, x):
        v = k.load(x)
        return k.store(k.exp(k.reshape(v, (v.shape[0] * v.shape[1],))))
    x = torch.randn(5, 8).t()   # reshape of a transposed view: the encoder asks for a copy
    torch.testing.assert_close(f(x), torch.exp(x.reshape(-1)))


def test_numpy_arrays_are_refused_by_a_device_vm_on_a_gpu(monkeypatch):
    """On a GPU the VM refuses host memory; in interpreter mode host memory is its device memory."""
    x = np.ones((2, 3), np.float32)
    monkeypatch.setattr(type(GPU), "host_buffers", property(lambda self: False))
    with pytest.raises(DeviceError, match="device arrays"):
        swiglu_norm(x, x, x[0])


def test_device_array_detection():
    class Cai:
        __cuda_array_interface__ = {"shape": (1,), "typestr": "<f4", "data": (1, False), "version": 3}
    assert gpu_arrays.is_device_array(Cai())
    assert not gpu_arrays.is_device_array(np.ones(2))
    assert not gpu_arrays.is_device_array(torch.ones(2))
    assert gpu_arrays.device_supported(torch.device("cpu")) is None
    assert gpu_arrays.device_supported(torch.device("meta")) == "device meta"


class Block(torch.nn.Module):
    """RMSNorm, a SwiGLU MLP and a softmax: elementwise, norms and reductions between matmuls."""

    def __init__(self, d: int = 32):
        super().__init__()
        self.norm = torch.nn.RMSNorm(d, eps=1e-6)
        self.up = torch.nn.Linear(d, 2 * d, bias=False)
        self.down = torch.nn.Linear(d, d, bias=False)

    def forward(self, x):
        h = self.norm(x)
        a, b = self.up(h).chunk(2, dim=-1)
        y = x + self.down(torch.nn.functional.silu(a) * b)
        return torch.softmax(y, dim=-1), y.amax(-1)


def test_torch_compile_backend_on_the_gpu_vm(monkeypatch):
    runs = []
    original = gpu_arrays.DeviceLaunch.__call__
    monkeypatch.setattr(gpu_arrays.DeviceLaunch, "__call__", lambda self, *a: runs.append(1) or original(self, *a))
    torch.manual_seed(0)
    model = Block().eval()
    compiled = torch.compile(model, backend="dvm", dynamic=True)
    before = counters.snapshot().get("torch_segment_launches", 0)
    with torch.no_grad():
        for L in (5, 9):
            x = torch.randn(2, L, 32)
            for got, want in zip(compiled(x), model(x)):
                torch.testing.assert_close(got, want)
    assert counters.snapshot()["torch_segment_launches"] > before
    assert runs, "the segments did not run on the GPU VM"


def test_host_scalars_are_copied_to_a_device_once_per_value():
    meta = torch.device("meta")   # (a device without a GPU: the copies' identity is what is checked)
    one = gpu_arrays._scalar_on(torch.tensor(1e-6, dtype=torch.float64), meta)
    assert one.device == meta and one.dtype == torch.float64 and one.dim() == 0
    assert gpu_arrays._scalar_on(torch.tensor(1e-6, dtype=torch.float64), meta) is one
    assert gpu_arrays._scalar_on(torch.tensor(1e-6, dtype=torch.float32), meta) is not one
    zero, negative_zero = (gpu_arrays._scalar_on(torch.tensor(v), meta) for v in (0.0, -0.0))
    assert zero is not negative_zero
    nan = gpu_arrays._scalar_on(torch.tensor(float("nan")), meta)
    assert gpu_arrays._scalar_on(torch.tensor(float("nan")), meta) is nan


def test_a_segment_on_a_device_launches_there_whatever_its_inputs(monkeypatch):
    """A segment's device is its outputs' (from tracing): one with no input, or only 0-d host
    scalars, on a CUDA graph must not run on the host VM (FakeTensorMode makes CUDA values
    without a GPU; the device launch itself is replaced by a spy)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from dvm.frontend import torch_launch, torch_segment
    graph = torch.fx.Graph()
    nodes = [graph.placeholder(name) for name in ("on_cpu", "on_cuda")]
    with FakeTensorMode():
        nodes[0].meta["val"] = torch.empty(3)
        nodes[1].meta["val"] = torch.empty(3, device="cuda")
    assert torch_segment._device(nodes[:1]) is None
    assert torch_segment._device(nodes) == torch.device("cuda", 0)

    seen = []

    class Spy:
        def __call__(self, env, tensors, vm, device=None):
            seen.append((vm, device, len(tensors)))
            return ["ran on the device VM"]
    monkeypatch.setattr(torch_launch, "graph_launcher", lambda graph: Spy())
    launcher = torch_launch.TensorLauncher.__new__(torch_launch.TensorLauncher)
    launcher.graph = None
    assert launcher({}, [torch.tensor(1e-6, dtype=torch.float64)], None, torch.device("cuda", 0)) == \
        ["ran on the device VM"]
    assert seen == [("gpu", torch.device("cuda", 0), 1)]
