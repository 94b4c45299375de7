"""torch.compile(backend="dvm") on code that updates its inputs in place: optimizer steps
(torch.optim, foreach or not), the _foreach_ ops, lerp, addcmul_ / addcdiv_ (Dynamo's prims.fma),
and the input mutations a segment stores straight into the input or copies in after its launch.
Tolerances: torch.testing.assert_close defaults."""

import pytest

torch = pytest.importorskip("torch")

from dvm.runtime import counters  # noqa: E402

pytestmark = [pytest.mark.cpu_vm, pytest.mark.vm_once]


def _count(name: str) -> int:
    return counters.snapshot().get(name, 0)


def _no_fallbacks(before: dict) -> None:
    after = {k: v for k, v in counters.snapshot().items() if k.startswith("fallback")}
    assert after == before, f"fell back to PyTorch: { {k: v for k, v in after.items() if before.get(k) != v} }"


def _fallbacks() -> dict:
    return {k: v for k, v in counters.snapshot().items() if k.startswith("fallback")}


def _params(shapes, seed=0):
    g = torch.Generator().manual_seed(seed)
    ps = [torch.nn.Parameter(torch.randn(s, generator=g)) for s in shapes]
    for p in ps:
        p.grad = torch.randn(p.shape, generator=g) * 0.1
    return ps


OPTIMIZERS = {
    "adam": lambda ps, fe: torch.optim.Adam(ps, lr=1e-2, foreach=fe),
    "adamw": lambda ps, fe: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1, foreach=fe),
    "sgd_momentum": lambda ps, fe: torch.optim.SGD(ps, lr=1e-2, momentum=0.9, nesterov=True, foreach=fe),
    "rmsprop": lambda ps, fe: torch.optim.RMSprop(ps, lr=1e-2, foreach=fe),
}


@pytest.mark.parametrize("foreach", [False, True])
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_compiled_optimizer_step_matches_eager(name, foreach):
    """Parameters and optimizer state after three compiled steps are eager's; every op runs in
    DVM, and the updates of the parameters and the moments are stored into them by the launch."""
    torch._dynamo.reset()
    shapes = [(37, 19), (19,), (5, 3, 4)]
    eager_ps, dvm_ps = _params(shapes), _params(shapes)
    eager, opt = OPTIMIZERS[name](eager_ps, foreach), OPTIMIZERS[name](dvm_ps, foreach)
    step = torch.compile(opt.step, backend="dvm")
    before, copied = _fallbacks(), _count("torch_input_updates_copied")
    launches = _count("torch_segment_launches")
    for _ in range(3):
        eager.step()
        step()
    for a, b in zip(eager_ps, dvm_ps):
        torch.testing.assert_close(b, a)
    for p, q in zip(eager_ps, dvm_ps):
        for k, v in eager.state[p].items():
            torch.testing.assert_close(opt.state[q][k], v, msg=lambda m: f"state {k}: {m}")
    _no_fallbacks(before)
    assert _count("torch_segment_launches") > launches
    # only the 0-d step counters (read by several kernels) are copied in
    assert _count("torch_input_updates_copied") - copied <= 3 * len(shapes)


@pytest.mark.parametrize("name", ["sgd_momentum", "adam"])
def test_repeated_steps_take_the_quick_path_and_follow_new_storage(name):
    """From the third step on, a step whose every output is written into the tensor it updates runs
    the VM on the remembered addresses (the segment's quick path: no per-call binding; Adam's
    launch has workspaces, which the launch adds); the parameters stay eager's over many steps,
    and after a parameter's storage is replaced (`p.data = ...`: new addresses) the next step
    checks, takes the slow path and stays right."""
    torch._dynamo.reset()
    shapes = [(33, 17), (17,)]
    eager_ps, dvm_ps = _params(shapes), _params(shapes)
    eager, opt = OPTIMIZERS[name](eager_ps, True), OPTIMIZERS[name](dvm_ps, True)
    step = torch.compile(opt.step, backend="dvm")
    for _ in range(3):
        eager.step()
        step()
    from dvm.frontend.torch_runtime import COMPILED
    runners = [s for c in list(COMPILED)[-1:] for s in c.segments]
    assert runners and all(r._quick is not None for r in runners)
    stored = _count("torch_input_updates_stored")
    for k in range(8):
        if k == 4:
            for p, q in zip(eager_ps, dvm_ps):
                q.data = q.data.clone()   # new addresses, the same values
                assert q.data_ptr() != p.data_ptr()
        eager.step()
        step()
        for a, b in zip(eager_ps, dvm_ps):
            torch.testing.assert_close(b, a)
    assert _count("torch_input_updates_stored") > stored


def _check(fn, *args) -> tuple[int, int]:
    """fn compiled vs eager on clones of args: results and the arguments' in-place effects.
    Returns the input updates the call stored into the inputs and those it copied in after."""
    torch._dynamo.reset()
    a1 = [a.clone() for a in args]
    a2 = [a.clone() for a in args]
    cf = torch.compile(fn, backend="dvm", dynamic=True)
    stored, copied = _count("torch_input_updates_stored"), _count("torch_input_updates_copied")
    want, got = fn(*a1), cf(*a2)
    torch.testing.assert_close(got, want)
    for x1, x2 in zip(a1, a2):
        torch.testing.assert_close(x2, x1)
    return _count("torch_input_updates_stored") - stored, _count("torch_input_updates_copied") - copied


X = torch.randn(12, 10, generator=torch.Generator().manual_seed(1))
W = torch.randn(10, generator=torch.Generator().manual_seed(2))


def test_update_written_into_the_input():
    def f(x, w):
        x.mul_(0.9).add_(w, alpha=0.1)
        return x * 2
    assert _check(f, X, W) == (1, 0)


def test_update_read_after_by_a_reduction_is_copied_in():
    """the sum of the new value recomputes it from x in a kernel of its own"""
    def f(x, w):
        x.mul_(0.9).add_(w, alpha=0.1)
        return x.sum()
    assert _check(f, X, W) == (0, 1)


def test_update_read_by_a_reduction_is_copied_in():
    """x's old value is read by another kernel (the sum), after which x may not change."""
    def f(x, w):
        s = (x * x).sum(0)
        x.add_(w)
        return s
    assert _check(f, X, W) == (0, 1)


def test_update_read_transposed_is_copied_in():
    sq = torch.randn(9, 9)

    def f(x):
        y = x.t() * 2
        x.mul_(3)
        return y
    assert _check(f, sq) == (0, 1)


def test_update_of_a_non_contiguous_input():
    def f(x, w):
        x.addcmul_(w, w, value=0.5)
        return x * 2
    xt = torch.randn(10, 12).t()
    torch._dynamo.reset()
    cf = torch.compile(f, backend="dvm", dynamic=True)
    a, b = xt.clone().t().contiguous().t(), xt.clone().t().contiguous().t()
    torch.testing.assert_close(cf(a, W), f(b, W))
    torch.testing.assert_close(a, b)


def test_addcdiv_addcmul_lerp_and_fma():
    def f(x, a, b, w):
        x.addcmul_(a, b, value=0.3)
        y = x.clone().addcdiv_(a, b.abs() + 1, value=-0.2)
        return torch.lerp(a, b, 0.3), torch.lerp(a, b, 0.75), torch.lerp(a, b, w.sigmoid()), y
    before = _fallbacks()
    _check(f, X, X * 0.5, X.flip(0), X.abs())
    _no_fallbacks(before)


def test_foreach_ops():
    xs = [torch.randn(4, 5), torch.randn(7), torch.randn(2, 3, 2)]
    ys = [torch.randn_like(x) for x in xs]

    def f(xs, ys):
        a = torch._foreach_add(xs, ys, alpha=0.5)
        b = torch._foreach_mul(xs, 1.5)
        c = torch._foreach_lerp(xs, ys, 0.25)
        d = torch._foreach_pow(2.0, xs)
        e = torch._foreach_addcdiv(xs, ys, [y.abs() + 1 for y in ys], [0.1, 0.2, 0.3])
        m = torch._foreach_maximum(xs, 0.0)
        return a, b, c, d, e, torch._foreach_sqrt(m)
    torch._dynamo.reset()
    before = _fallbacks()
    got = torch.compile(f, backend="dvm")(xs, ys)
    torch.testing.assert_close(got, f(xs, ys))
    _no_fallbacks(before)


hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402

from test_lazy_programs import _interpret, programs  # noqa: E402


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs())
def test_random_programs_with_in_place_updates(prog):
    """Random programs of elementwise ops, reductions, views and in-place updates of the inputs
    (directly and through views), compiled: eager's results and eager's updated inputs."""
    shapes, dtype, seed, program = prog
    program = [step for step in program if step[0] != "sync"]
    gen = torch.Generator().manual_seed(seed)
    inputs = [torch.randn(*s, generator=gen, dtype=dtype) for s in shapes]

    def fn(*xs):
        return _interpret(program, list(xs), [])
    a1, a2 = [x.clone() for x in inputs], [x.clone() for x in inputs]
    want = fn(*a1)
    torch._dynamo.reset()
    got = torch.compile(fn, backend="dvm", dynamic=True)(*a2)
    assert len(got) == len(want)
    for x, y in zip(want, got):
        torch.testing.assert_close(y, x, equal_nan=True)
    for x, y in zip(a1, a2):
        torch.testing.assert_close(y, x, equal_nan=True)

