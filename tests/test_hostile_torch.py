"""Issue 50, hole 5: tensors with a negative or conjugate bit at the torch boundary. They raised
PyTorch's "Can't call numpy() on Tensor that has negative bit set" from inside the launch code;
they are now resolved (counted), on the first call and on the cached fast path."""
import pytest

torch = pytest.importorskip("torch")

from dvm.runtime import counters  # noqa: E402


def _resolved_count() -> int:
    return counters.snapshot().get("torch_neg_conj_resolved", 0)


def _f(x, y):
    return torch.relu(x) * 2 + y


@pytest.mark.parametrize("make", [
    lambda x: torch._neg_view(x),
    lambda x: torch.complex(x, -x).conj().imag,     # the .imag of a conjugated complex tensor
    lambda x: torch._neg_view(x.t()).t(),           # a strided neg view
], ids=["neg_view", "conj_imag", "strided_neg_view"])
def test_neg_and_conj_inputs_are_resolved(make):
    torch._dynamo.reset()
    compiled = torch.compile(_f, backend="dvm", dynamic=True)
    x, y = torch.randn(4, 6), torch.randn(4, 6)
    flagged = make(x)
    assert flagged.is_neg()
    before = _resolved_count()
    for _ in range(3):   # the first call, then the remembered launch
        torch.testing.assert_close(compiled(flagged, y), _f(flagged.resolve_neg(), y))
    assert _resolved_count() >= before + 3
    torch.testing.assert_close(compiled(x, y), _f(x, y))   # the plain tensor is not confused with it


def test_neg_view_inside_the_graph():
    torch._dynamo.reset()

    def g(x, y):
        return torch.relu(torch._neg_view(x)) * 2 + y
    compiled = torch.compile(g, backend="dvm", dynamic=True)
    x, y = torch.randn(3, 5), torch.randn(3, 5)
    for _ in range(2):
        torch.testing.assert_close(compiled(x, y), g(x, y))


def test_integer_to_negative_scalar_power_raises_like_eager():
    """Under torch.compile the lowered pow returned 0s where eager raises."""
    torch._dynamo.reset()
    compiled = torch.compile(lambda x: x ** -1 + 1, backend="dvm", dynamic=True)
    with pytest.raises(RuntimeError, match="Integers to negative integer powers are not allowed"):
        compiled(torch.tensor([2, 3, 1]))
