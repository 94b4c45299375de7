"""dvm.lazy(): one test per flush reason. Each computes something inside a lazy region that must
flush for that reason, checks the values against eager, that the flush was counted under that
reason, and that dvm.explain() names the reason and the op that caused it."""
import pytest

torch = pytest.importorskip("torch")

import dvm  # noqa: E402
from dvm.runtime import counters  # noqa: E402
from test_lazy import no_dvm_failures  # noqa: E402,F401 (autouse: a DVM failure fails the test)

X = torch.linspace(-2.0, 3.0, 96).reshape(8, 12)
W = torch.linspace(0.5, 1.5, 12)


def _lazy(**kw):
    kw.setdefault("adaptive", False)
    return dvm.lazy(**kw)


def _flushes() -> dict:
    return {k[len("lazy_flush:"):]: v for k, v in counters.snapshot().items() if k.startswith("lazy_flush:")}


def _delta(before: dict) -> dict:
    after = _flushes()
    return {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}


def _pending_chain():
    return torch.exp(X * 0.25) * W + 1.0


WANT = torch.exp(X * 0.25) * W + 1.0


def _check(reason: str, before: dict, cause: str | None = None, n: int = 1):
    got = _delta(before)
    assert got.get(reason) == n, f"expected {n} flush(es) for {reason!r}, counted {got}"
    text = dvm.explain()
    assert reason in text
    if cause is not None:
        assert cause in text, text


def test_item():
    big = torch.linspace(-1.0, 1.0, 8192).reshape(64, 128)   # past lazy_flush.PEEK_MAX_NUMEL
    before = _flushes()
    with _lazy():
        v = (torch.exp(big * 0.25) + 1.0).sum().item()
    assert v == pytest.approx((torch.exp(big * 0.25) + 1.0).sum().item(), rel=1e-5)
    _check("item", before, "_local_scalar_dense")


def test_item_of_a_small_value_is_computed_alone():
    """.item() of a value computed from a few small inputs (an optimizer's step count, updated in
    place) leaves the rest pending: one flush, at the region's end, for everything."""
    step, p = torch.zeros(()), X.clone()
    want_p, want_step = X.clone(), torch.zeros(())
    for _ in range(2):
        want_step += 1
        want_p.mul_(0.5).add_(W * (1 - 0.9 ** want_step.item()))
    before, alone = _flushes(), counters.snapshot().get("lazy_item_computed_alone", 0)
    with _lazy():
        for _ in range(2):
            step += 1
            p.mul_(0.5).add_(W * (1 - 0.9 ** step.item()))
    torch.testing.assert_close(p, want_p)
    torch.testing.assert_close(step, want_step)
    assert counters.snapshot().get("lazy_item_computed_alone", 0) - alone == 2
    assert _delta(before) == {"exit": 1}


def test_bool_control_flow():
    before = _flushes()
    with _lazy():
        y = _pending_chain()
        taken = bool((y > 2.0).sum() > 0)
        if y.max() > 100:            # Python control flow on a tensor: a second bool flush
            y = y * 0
    assert taken == bool((WANT > 2.0).sum() > 0)
    torch.testing.assert_close(y, WANT)
    _check("bool", before, "Tensor.__bool__", n=2)


def test_tolist():
    before = _flushes()
    with _lazy():
        got = _pending_chain().tolist()
    torch.testing.assert_close(torch.tensor(got), WANT)
    _check("tolist", before, "Tensor.tolist")


def test_numpy():
    before = _flushes()
    with _lazy():
        a = _pending_chain().numpy()
    torch.testing.assert_close(torch.from_numpy(a.copy()), WANT)
    _check("numpy", before, "Tensor.numpy")


def test_numpy_write_to_an_input():
    """numpy() of a tensor the pending graph reads may write it: the graph runs first."""
    x = X.clone()
    before = _flushes()
    with _lazy():
        y = x * 2
        x.numpy()[:] = 0
        z = x + 1
    torch.testing.assert_close(y, X * 2)
    torch.testing.assert_close(z, torch.ones_like(X))
    _check("numpy", before, "Tensor.numpy")


def test_print(capsys):
    before = _flushes()
    with _lazy():
        print(_pending_chain())
    assert capsys.readouterr().out.strip() == str(WANT).strip()
    _check("print", before, "Tensor.__str__")


def test_storage_read():
    before = _flushes()
    with _lazy():
        y = _pending_chain()
        ptr = y.data_ptr()
        raw = torch.frombuffer(bytearray(y.untyped_storage()), dtype=torch.float32)
    assert ptr != 0
    torch.testing.assert_close(raw.reshape(8, 12), WANT)
    _check("storage", before, "Tensor.data_ptr")


def test_unsupported_op():
    before = _flushes()
    with _lazy():
        c = torch.cumsum(_pending_chain(), 0)
    torch.testing.assert_close(c, torch.cumsum(WANT, 0))
    _check("unsupported", before, "cumsum")


def test_write_through_view_of_pending():
    before = _flushes()
    with _lazy():
        y = _pending_chain()
        row = y[0]
        row.mul_(10)                  # a write through a view: y must see it
        z = y + 0
    want = WANT.clone()
    want[0] *= 10
    torch.testing.assert_close(z, want)
    _check("inplace", before, "mul_.Tensor")


def test_out_argument():
    before = _flushes()
    with _lazy():
        y = _pending_chain()
        out = torch.empty_like(X)
        torch.mul(y, 2.0, out=out)
    torch.testing.assert_close(out, WANT * 2)
    _check("inplace", before, "mul.out")


def test_set_():
    before = _flushes()
    with _lazy():
        y = _pending_chain()
        z = y * 2
        y.set_(torch.zeros(5))        # replaces y's storage: the pending graph runs first
    torch.testing.assert_close(z, WANT * 2)
    torch.testing.assert_close(y, torch.zeros(5))
    _check("inplace", before, "set_")


def test_write_to_an_input_by_unrecorded_op():
    x = X.clone()
    before = _flushes()
    with _lazy():
        y = x * 2                     # reads x
        x.uniform_()                  # not recorded: it writes what the pending graph reads
    torch.testing.assert_close(y, X * 2)
    _check("inplace", before, "uniform_")


def test_matmul():
    before = _flushes()
    with _lazy():
        z = _pending_chain() @ W.reshape(12, 1)
    torch.testing.assert_close(z, WANT @ W.reshape(12, 1))
    _check("matmul", before, "mm")


def test_bound():
    before = _flushes()
    with _lazy(max_ops=3):
        y = X
        for _ in range(7):
            y = y * 1.5
    torch.testing.assert_close(y, X * 1.5 ** 7)
    _check("bound", before, n=2)


def test_exit():
    before = _flushes()
    with _lazy():
        y = _pending_chain()
    torch.testing.assert_close(y, WANT)
    _check("exit", before, "leaving dvm.lazy()")


def test_sync():
    before = _flushes()
    with _lazy():
        y = _pending_chain()
        dvm.sync()
        assert _delta(before).get("sync") == 1
    torch.testing.assert_close(y, WANT)
    _check("sync", before, "dvm.sync()")


def test_region_report_lists_recorded_ops_kernels_and_causes():
    with _lazy() as region:
        y = _pending_chain()
        z = y @ W.reshape(12, 1)
    text = region.report()
    assert "exp" in text and "mul.Tensor" in text
    assert "vector kernel" in text
    assert "matmul <- mm" in text
    torch.testing.assert_close(z, WANT @ W.reshape(12, 1))
