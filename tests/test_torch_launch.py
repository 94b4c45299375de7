"""The steady-state launch path of the torch.compile frontend (frontend/torch_launch): a segment
called again with the same signature runs on its tensors' data pointers, without NumPy
conversions or a launch-cache lookup, and gives what eager gives; the generated run graph is
boxed for the backward too."""
import os
import sys
import warnings

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

from dvm import config as dvm_config  # noqa: E402
from dvm.runtime import counters  # noqa: E402
from dvm.runtime.compiled import CompiledGraph  # noqa: E402

pytestmark = pytest.mark.cpu_vm   # runs once, on the default (CPU) VM


@pytest.fixture(autouse=True)
def vm(monkeypatch):
    """The fast path exists on the CPU VM only: these run there, with its fast pieces loaded (a
    launch bound before they are is not the direct one the quick-path test looks for)."""
    from dvm.vm import cpu
    monkeypatch.setenv("DVM_VM", "cpu")
    dvm_config.reload()
    cpu.warm_up(wait_fast=True)
    yield "cpu"
    monkeypatch.undo()
    dvm_config.reload()


@pytest.fixture
def slow_path_calls(monkeypatch):
    """How many times CompiledGraph.launcher (the NumPy path) ran."""
    calls = []
    orig = CompiledGraph.launcher

    def counting(self, *args, **kwargs):
        calls.append(1)
        return orig(self, *args, **kwargs)
    monkeypatch.setattr(CompiledGraph, "launcher", counting)
    return calls


def _compiled(fn):
    torch._dynamo.reset()
    return torch.compile(fn, backend="dvm", dynamic=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_second_call_skips_the_numpy_path(dtype, slow_path_calls):
    def f(x, y):
        return F.silu(x) * y + 1, (x * y).sum(-1)
    cf = _compiled(f)
    # f16/bf16 intermediates stay f32 inside the kernel (docs/DECISIONS.md, Graph and numerics):
    # the chain within eager's rounding of its steps, the sum against the f32 products' sum
    # rounded once
    tol = {} if dtype == torch.float32 else dict(rtol=1e-2, atol=1e-2)
    g = torch.Generator().manual_seed(0)
    for n in (3, 17, 3, 17):
        x, y = torch.randn(n, 9, dtype=dtype, generator=g), torch.randn(9, dtype=dtype, generator=g)
        for _ in range(2):
            out, total = cf(x, y)
            torch.testing.assert_close(out, f(x, y)[0], **tol)
            torch.testing.assert_close(total, (x.float() * y.float()).sum(-1).to(dtype))
    assert len(slow_path_calls) == 2, "one NumPy-path launch per signature, then data pointers only"


def test_empty_pieces_are_remembered_too(slow_path_calls):
    """A concatenation with an empty piece (an expert given no tokens) and an empty result: one
    NumPy-path launch per signature, then data pointers (an empty tensor's may be 0, never read)."""
    def f(a, b, c):
        return torch.cat([a * 2, b - 1, c + 1]).relu()
    cf = _compiled(f)
    for sizes in ((6, 0, 5), (3, 4, 0), (0, 0, 0)):
        for _ in range(3):
            xs = [torch.randn(n, 8) for n in sizes]
            torch.testing.assert_close(cf(*xs), f(*xs))
    assert len(slow_path_calls) == 3, "one NumPy-path launch per signature, empty pieces or not"


def test_input_copied_on_every_call():
    """A view the input's strides cannot express (a transposed graph input, flattened): the
    Program was encoded for a row-major copy, and each fast-path call makes that copy again
    (counted)."""
    def f(x):
        return torch.exp(x.reshape(-1)) * 2
    cf = _compiled(f)
    counters.reset()
    for _ in range(3):
        x = torch.randn(5, 4).t()
        torch.testing.assert_close(cf(x), f(x))
    assert counters.snapshot().get("input_copies") == 3


def test_views_of_torch_values_replayed_in_the_segment():
    """Views PyTorch would take of a value only for a DVM segment (here a transposed, unsqueezed
    and expanded matmul result) are replayed inside the segment: the run graph makes no PyTorch
    call for them, and the segment reads the matmul's result through strides."""
    def f(x, w):
        y = (x @ w).t().unsqueeze(0).expand(2, -1, -1)
        return torch.tanh(y) + 1
    cf = _compiled(f)
    counters.reset()
    for n in (4, 7, 9):
        x, w = torch.randn(n, 6), torch.randn(6, 5)
        torch.testing.assert_close(cf(x, w), f(x, w))
    snap = counters.snapshot()
    assert snap.get("torch_unused_view_steps", 0) >= 3 and not snap.get("input_copies"), snap


def test_tensor_that_requires_grad_in_inference(slow_path_calls):
    w = torch.randn(6, requires_grad=True)
    cf = _compiled(lambda x: torch.tanh(x * w) + w)
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(4, 6)
            torch.testing.assert_close(cf(x), torch.tanh(x * w) + w)
    assert len(slow_path_calls) == 1


def test_changing_the_vm_is_honoured(monkeypatch):
    """The signature includes the selected VM: a cached CPU launch is not reused on the reference VM."""
    import dvm.vm.reference as ref
    cf = _compiled(lambda x: torch.exp(x) + 1)
    x = torch.randn(5, 3)
    cf(x)
    cf(x)
    ran = []
    orig = ref.run
    monkeypatch.setattr(ref, "run", lambda *a, **k: (ran.append(1), orig(*a, **k))[1])
    monkeypatch.setenv("DVM_VM", "reference")
    dvm_config.reload()
    torch.testing.assert_close(cf(x), torch.exp(x) + 1)
    assert ran, "the reference VM ran"


def test_backward_called_boxed():
    """AOTAutograd calls the backward boxed (its wrapper keeps CompiledFx's instance attribute),
    so the generated code frees saved tensors as it goes; no 'boxed arguments' warning."""
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 3))
    cm = _compiled(model)
    x = torch.randn(5, 8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cm(x).square().sum().backward()
    assert not [w for w in caught if "boxed arguments" in str(w.message)]
    got = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model(x).square().sum().backward()
    for g, p in zip(got, model.parameters()):
        torch.testing.assert_close(g, p.grad)


def test_run_graph_is_generated_code():
    """The plan runs as FX-generated straight-line Python: one call per segment, views that
    may meet a DVM (row-major) output go through view_or_reshape."""
    from dvm.frontend.torch_runtime import COMPILED
    cf = _compiled(lambda x, y: (torch.exp(x).t().contiguous().view(-1) @ y.view(-1)).sin())
    x, y = torch.randn(3, 4), torch.randn(4, 3)
    torch.testing.assert_close(cf(x, y), (torch.exp(x).t().contiguous().view(-1) @ y.view(-1)).sin())
    code = COMPILED[-1].runner.code
    assert "args_list.clear()" in code
    assert code.count("= dvm_frontend_torch_segment_run") == len(COMPILED[-1].segments) >= 1
    assert os.environ["DVM_VM"] == "cpu"


def test_remembered_signatures_are_plain_tuples():
    """The fast-path cache keeps keys the garbage collector stops tracking (a model keeps one per
    segment and size): torch.Size is replaced by an equal plain tuple with the same hash."""
    import gc
    from dvm.frontend.torch_launch import _untracked_key, guarded_signature
    key = guarded_signature({"s0": 3}, [torch.randn(3, 4), torch.randn(4)])
    plain = _untracked_key(key)
    assert plain == key and hash(plain) == hash(key)
    assert not any(isinstance(x, torch.Size) for k in plain if isinstance(k, tuple) for x in k)
    for _ in range(3):   # a collection untracks a tuple whose items are untracked already: inner first
        gc.collect()
    assert not gc.is_tracked(plain)


def test_tensor_check_sees_what_the_signature_keys_on():
    """The last-call shortcut's check rejects a tensor whose signature differs: dtype, device,
    sizes, strides, neg bit, type; it accepts other tensors of the same properties."""
    from dvm.frontend.torch_launch import tensor_check
    a, b = torch.randn(4, 6), torch.randn(6)
    same = tensor_check([a, b])
    assert same(torch.randn(4, 6), torch.randn(6))
    for other in (a.double(), a.to("meta"), torch.randn(4, 7), a.t().contiguous().t(), torch._neg_view(a),
                  a.as_subclass(type("Sub", (torch.Tensor,), {}))):
        assert not same(other, b)
    assert not same(a, 3.0)


def test_last_call_shortcut_never_runs_another_signature(slow_path_calls):
    """Calls alternating between layouts of one shape with the same sizes: each runs the Launch
    of its own signature (the shortcut only skips the lookup)."""
    from dvm.frontend.torch_launch import TensorLauncher
    from dvm.graph import build
    from dvm.graph.dtypes import DType
    from dvm.graph.node import Node
    from dvm.graph.symbolic import sym
    ctx, n = build.ShapeContext(), sym("n")
    x = Node.make("input", DType.FLOAT32, (n, 5), index=0)
    y = Node.make("input", DType.FLOAT32, (5,), index=1)
    launcher = TensorLauncher(CompiledGraph([x, y], [build.elementwise(ctx, "sub", x, y)]))
    base, w = torch.randn(5, 5), torch.randn(5)
    layouts = [base, base.t(), base, torch.randn(5, 10)[:, ::2], base.t(), base]
    for t in layouts * 2:
        (got,) = launcher({"n": 5}, [t, w])
        torch.testing.assert_close(got, t - w, rtol=0, atol=0)
    assert len(slow_path_calls) == 3, "one NumPy-path launch per signature"


def _scaled(x, w, k: int):
    return torch.relu(x * k - w)


def test_segment_quick_path_runs_only_its_own_launch(monkeypatch):
    """A segment called again with the sizes and tensor layouts of its last two calls runs that
    launch directly (SegmentRunner.run's quick path, without the launcher): every result matches
    eager across layouts of one shape, other sizes and other scalars, every launch and segment
    run is still counted, and a runner called again with one call's sizes and tensors skips the
    launcher from its third call on."""
    from dvm.frontend.torch_launch import TensorLauncher
    from dvm.frontend.torch_segment import SegmentRunner
    through, seen = [], []
    orig, run = TensorLauncher.__call__, SegmentRunner.run
    monkeypatch.setattr(TensorLauncher, "__call__", lambda self, *a, **k: through.append(1) or orig(self, *a, **k))
    monkeypatch.setattr(SegmentRunner, "run", lambda self, env, *ts: seen.append((self, env, ts)) or run(self, env, *ts))
    fn = _compiled(_scaled)
    base, w = torch.randn(6, 6), torch.randn(6)
    calls = [(base, 2), (base, 2), (base, 2), (base.t(), 2), (base, 2), (base, 3), (base, 3), (base, 2),
             (torch.randn(9, 6), 2), (base, 2), (torch.randn(6, 12)[:, ::2], 2), (base, 2)]
    before = counters.snapshot()
    for t, k in calls:
        torch.testing.assert_close(fn(t, w, k), _scaled(t, w, k), rtol=0, atol=0)
    after = counters.snapshot()
    ran = after.get("torch_segment_launches", 0) - before.get("torch_segment_launches", 0)
    assert ran == len(calls)
    assert after.get("launches", 0) - before.get("launches", 0) >= len(calls)
    # the quick path on one runner (which of Dynamo's graphs, recompiled for layouts and scalars,
    # runs a call is Dynamo's routing, not the subject here)
    x = torch.randn(5, 6)
    expected = _scaled(x, w, 2)
    torch.testing.assert_close(fn(x, w, 2), expected, rtol=0, atol=0)
    runner, env, tensors = seen[-1]
    n = len(through)
    for _ in range(3):
        torch.testing.assert_close(run(runner, env, *tensors)[0], expected, rtol=0, atol=0)
    assert len(through) - n == 1, "the second call of these sizes makes the quick state; later ones use it"


# --- huge pages for large fresh outputs (runtime/hugepages) ------------------------------------------
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise(MADV_HUGEPAGE) is Linux's")
def test_hugepage_advice_covers_whole_huge_pages_only():
    from dvm.runtime import hugepages
    big = torch.empty(3 * hugepages.HUGE_PAGE, dtype=torch.uint8)   # holds at least two whole huge pages
    small = torch.empty(hugepages.HUGE_PAGE // 2, dtype=torch.uint8)   # holds none
    thp = "/sys/kernel/mm/transparent_hugepage/enabled"
    if os.path.exists(thp) and "[never]" not in open(thp).read():
        assert hugepages.advise(big.data_ptr(), big.nbytes)
    assert not hugepages.advise(small.data_ptr(), small.nbytes)
    big.fill_(7)   # the advice changes no byte
    assert bool((big == 7).all())


@pytest.fixture
def pool_off(monkeypatch):
    """DVM_POOL_MB=0 for one test (the configuration read again before and after)."""
    monkeypatch.setenv("DVM_POOL_MB", "0")
    dvm_config.reload()
    yield
    monkeypatch.undo()
    dvm_config.reload()


def test_large_torch_outputs_get_huge_page_advice(monkeypatch, pool_off):
    """With the buffer pool off, the torch launch advises outputs of HUGE_OUTPUT_BYTES or more,
    before the VM writes them, and only those; the results are eager's."""
    from dvm.frontend import torch_launch
    from dvm.runtime import hugepages
    advised = []
    monkeypatch.setattr(hugepages, "advise", lambda at, n: advised.append(n) or True)

    def f(x, y):
        return torch.softmax(x * 2.0, -1), y + 1.0
    g = torch.compile(f, backend="dvm", dynamic=True)
    x = torch.randn(4, 512, 1024)   # 8 MiB
    y = torch.randn(64, 64)
    for _ in range(2):
        got = g(x, y)
        torch.testing.assert_close(got[0], torch.softmax(x * 2.0, -1))
        torch.testing.assert_close(got[1], y + 1.0)
    assert advised and set(advised) == {x.nbytes}
    assert torch_launch.hugepages is hugepages


def test_large_torch_outputs_reuse_pooled_memory_only_once_dropped():
    """Outputs of hugepages.HUGE_OUTPUT_BYTES and more come from the buffer pool: once dropped, their
    blocks serve the next calls (no fresh pages); a kept output, or a view of one, is never handed
    out again while it lives and keeps its values. Eager's values in float32 and bfloat16, with a
    permuted output; smaller outputs are ordinary torch tensors."""
    from dvm.runtime import buffer_pool, hugepages

    def f(x, y):
        return torch.sigmoid(x) * 3.0, (y + 1.0).permute(1, 0, 2), y.sum(-1)
    g = torch.compile(f, backend="dvm", dynamic=True)
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(2048, 1024, dtype=dtype)   # 8 MiB (4 MiB in bfloat16): pooled
        y = torch.randn(128, 32, 512, dtype=dtype)
        for _ in range(3):   # (the third call takes the quick path)
            for a, b in zip(g(x, y), f(x, y)):
                torch.testing.assert_close(a, b)
        first = g(x, y)
        kept, kept_view = first[0], first[1][3:5]
        taken = {kept.data_ptr(), first[1].data_ptr()}
        assert buffer_pool.held_bytes() >= kept.nbytes + first[1].nbytes
        assert first[2].nbytes < hugepages.HUGE_OUTPUT_BYTES and first[2]._base is None   # torch's own memory
        del first
        reused = counters.snapshot().get("pool_reuses", 0)
        for _ in range(4):
            got = g(x, y)
            assert not taken & {got[0].data_ptr(), got[1].data_ptr()}
            del got
        assert counters.snapshot().get("pool_reuses", 0) >= reused + 6   # the dropped outputs' blocks
        torch.testing.assert_close(kept, torch.sigmoid(x) * 3.0)
        torch.testing.assert_close(kept_view, (y + 1.0).permute(1, 0, 2)[3:5])
