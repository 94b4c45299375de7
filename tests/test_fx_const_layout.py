"""Size-only values stored in their segments' read order (frontend/fx_const_layout): the order
found from the readers' views and the stored copy. (A model reading a permuted position table,
against eager and the change off: test_fx_cse.py.)"""

import pytest

torch = pytest.importorskip("torch")
from torch.fx.experimental.proxy_tensor import make_fx  # noqa: E402

from dvm.frontend.fx_const_layout import read_order, stored_in_order  # noqa: E402

pytestmark = [pytest.mark.cpu_vm, pytest.mark.vm_once]   # runs once, on the default (CPU) VM


def _placeholder(f, *shape):
    gm = make_fx(f, tracing_mode="fake")(torch.randn(*shape))
    return next(n for n in gm.graph.nodes if n.op == "placeholder")


def test_the_order_all_readers_take():
    x = _placeholder(lambda t: t.permute(2, 0, 1).unsqueeze(0) * 2 + t.transpose(0, 2).transpose(1, 2)[None], 3, 4, 5)
    assert read_order(x, lambda n: True) == (2, 0, 1)
    assert read_order(x, lambda n: n.op != "call_function" or "mul" not in n.name) is None   # a reader outside


def test_no_order_where_readers_disagree_or_take_it_as_it_is():
    assert read_order(_placeholder(lambda t: t.permute(1, 0) + t, 3, 3), lambda n: True) is None
    assert read_order(_placeholder(lambda t: t.unsqueeze(0) * 2, 3, 4), lambda n: True) is None
    assert read_order(_placeholder(lambda t: t.reshape(4, 3) * 2, 3, 4), lambda n: True) is None


def test_stored_copy_has_the_values_and_the_readers_order():
    x = torch.randn(3, 4, 5)
    y = stored_in_order(x, (2, 0, 1))
    assert torch.equal(x, y) and y.shape == x.shape
    assert y.permute(2, 0, 1).is_contiguous()
