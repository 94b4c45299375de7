"""An exact GELU that PyTorch would run alone, chosen by its size at run time (frontend/gelu_size):
the VM's GELU up to vm_limit() float32 elements on the CPU VM (eager's values within
assert_close, counted), PyTorch's kernel above it and for other dtypes, layouts and VMs (eager's
bit for bit); in compiled graphs, for the GELU of a linear (fx_product_activation) and a lone
GELU (fx_lone_gelu)."""
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import dvm  # noqa: E402
from dvm import config as dvm_config  # noqa: E402
from dvm.frontend import gelu_size  # noqa: E402
from dvm.frontend.torch_calls import linear_activation  # noqa: E402

pytestmark = [pytest.mark.cpu_vm, pytest.mark.vm_once]   # runs once, on the default (CPU) VM

SPECIAL = [math.nan, math.inf, -math.inf, 0.0, -0.0, 1e-45, -1e-45, 3.4e38, -3.4e38, -5.0, -13.9, 14.0, 0.5]


def _vm_calls() -> int:
    return dvm.counters().get("torch_gelu_vm_small", 0)


def _limit(monkeypatch, n: int) -> None:
    """vm_limit() == n with PyTorch's thread count now."""
    monkeypatch.setattr(gelu_size, "VM_GELU_MAX_ELEMENTS", n * torch.get_num_threads())
    assert gelu_size.vm_limit() == n


def test_the_limit_is_per_thread(monkeypatch):
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert gelu_size.vm_limit() == gelu_size.VM_GELU_MAX_ELEMENTS
        torch.set_num_threads(2)
        assert gelu_size.vm_limit() == gelu_size.VM_GELU_MAX_ELEMENTS // 2
    finally:
        torch.set_num_threads(threads)


def _compiled(f):
    torch._dynamo.reset()
    return torch.compile(f, backend="dvm", dynamic=True)


def test_small_float32_takes_the_vms_gelu_large_takes_pytorchs(monkeypatch):
    _limit(monkeypatch, 64)
    small, large = torch.randn(4, 16), torch.randn(5, 13)
    before = _vm_calls()
    torch.testing.assert_close(gelu_size.gelu(small), F.gelu(small))
    assert _vm_calls() == before + 1
    assert torch.equal(gelu_size.gelu(large), F.gelu(large)) and _vm_calls() == before + 1


@pytest.mark.parametrize("why,make", [
    ("float64", lambda: torch.randn(4, 8, dtype=torch.float64)),
    ("bfloat16", lambda: torch.randn(4, 8, dtype=torch.bfloat16)),
    ("not contiguous", lambda: torch.randn(8, 4).t()),
    ("empty", lambda: torch.randn(0, 8)),
])
def test_other_tensors_take_pytorchs_gelu_bitwise(why, make):
    x, before = make(), _vm_calls()
    got = gelu_size.gelu(x)
    assert torch.equal(got, F.gelu(x)) and got.stride() == F.gelu(x).stride(), why
    assert _vm_calls() == before, why


def test_the_tanh_form_and_the_reference_vm_take_pytorchs(monkeypatch):
    x, before = torch.randn(4, 8), _vm_calls()
    assert torch.equal(gelu_size.gelu(x, approximate="tanh"), F.gelu(x, approximate="tanh"))
    monkeypatch.setenv("DVM_VM", "reference")
    dvm_config.reload()
    try:
        assert torch.equal(gelu_size.gelu(x), F.gelu(x))
    finally:
        monkeypatch.undo()
        dvm_config.reload()
    assert _vm_calls() == before


def test_special_values_as_eager_in_float64():
    """NaN, +-inf, +-0, subnormals, the extremes: float64 eager's values rounded. (PyTorch's float32
    kernel gives NaN at +inf, inf at 3.4e38 and -1.19e-6 at -5, where GELU is -1.43e-6.)"""
    x = torch.tensor(SPECIAL, dtype=torch.float32)
    want = F.gelu(x.double()).float()
    got = gelu_size.gelu(x)
    torch.testing.assert_close(got, want, equal_nan=True)
    assert torch.equal(torch.signbit(got[3:7]), torch.signbit(want[3:7]))   # (+-0, +-tiny)


@settings(max_examples=60, deadline=None)
@given(shape=st.lists(st.integers(0, 9), min_size=0, max_size=4),
       scale=st.sampled_from([0.1, 1.0, 4.0, 30.0]), seed=st.integers(0, 2**16))
def test_any_shape_matches_eager(shape, scale, seed):
    """Shapes of any rank, sizes 0 and 1 among them, in any order of calls (each shape's launch
    is remembered apart)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * scale
    got = gelu_size.gelu(x)
    assert got.shape == x.shape and got.is_contiguous()
    torch.testing.assert_close(got, F.gelu(x))


def test_shapes_alternating_keep_their_own_launches():
    xs = [torch.randn(8, 256), torch.randn(8, 128), torch.randn(1, 8, 256), torch.randn(3)]
    for _ in range(3):
        for x in xs:
            torch.testing.assert_close(gelu_size.gelu(x), F.gelu(x))


@pytest.mark.parametrize("kxm", [False, True])
@pytest.mark.parametrize("no_bias", [False, True])
def test_the_activated_product_small_and_large(monkeypatch, kxm, no_bias):
    """linear_activation (fx_product_activation's call) and addmm_activation (an unfolded
    `_addmm_activation`): the product then the VM's GELU when small, PyTorch's kernel (bitwise)
    when large."""
    _limit(monkeypatch, 200)
    torch.manual_seed(0)
    w = torch.randn(24, 16)
    wk = w.t().contiguous() if kxm else w
    bias = torch.zeros(()) if no_bias else torch.randn(24)
    kwargs = {"use_gelu": True, **({"beta": 0} if no_bias else {})}
    for rows, vm in ((5, True), (9, False)):   # 5 x 24 = 120 elements, 9 x 24 = 216
        x = torch.randn(1, rows, 16)
        want = F.gelu(F.linear(x, w, None if no_bias else bias))
        before = _vm_calls()
        got = linear_activation(x, wk, bias, kxm=kxm, **kwargs)
        operand = wk if kxm else wk.t()   # (as linear_activation passes it)
        flat = gelu_size.addmm_activation(bias, x.view(rows, 16), operand, **kwargs)
        assert _vm_calls() == before + (2 if vm else 0)
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(flat, want.view(rows, 24))
        if not vm:
            eager = torch._addmm_activation(bias, x.view(rows, 16), operand, **kwargs)
            assert torch.equal(flat, eager) and torch.equal(got.view(rows, 24), eager)


def test_relu_products_are_untouched():
    torch.manual_seed(1)
    x, w, b = torch.randn(4, 16), torch.randn(16, 8), torch.randn(8)
    before = _vm_calls()
    assert torch.equal(gelu_size.addmm_activation(b, x, w), torch._addmm_activation(b, x, w))
    assert _vm_calls() == before


def _mlp():
    torch.manual_seed(0)
    w1, b1, w2, b2 = torch.randn(24, 16), torch.randn(24), torch.randn(16, 24), torch.randn(16)

    def product(x):
        return F.linear(F.gelu(F.linear(x, w1, b1)), w2, b2)

    def lone(x):
        return F.linear(F.gelu(x), w1.t(), b2)
    return product, lone


@pytest.mark.parametrize("which", ["product", "lone"])
def test_compiled_graphs_choose_per_call(monkeypatch, which):
    """One compiled graph, sizes on both sides of the limit: small calls take the VM's GELU, large
    ones PyTorch's, every result eager's (bitwise above the limit)."""
    _limit(monkeypatch, 24 * 10)
    f = dict(zip(("product", "lone"), _mlp()))[which]
    cf = _compiled(f)
    with torch.no_grad():
        for n in (3, 8, 33, 5, 130):
            x = torch.randn(2, n, 16 if which == "product" else 24)
            before = _vm_calls()
            got = cf(x)
            small = 2 * n * 24 <= gelu_size.vm_limit()   # (the GELU's elements)
            assert _vm_calls() == before + small, n
            if small:
                torch.testing.assert_close(got, f(x))
            else:
                assert torch.equal(got, f(x)), n


def test_switched_off_every_size_is_pytorchs(monkeypatch):
    monkeypatch.setattr(gelu_size, "ENABLED", False)
    product, _ = _mlp()
    cf = _compiled(product)
    before = _vm_calls()
    with torch.no_grad():
        for n in (1, 3, 8):
            x = torch.randn(2, n, 16)
            assert torch.equal(cf(x), product(x)), n
    assert _vm_calls() == before
