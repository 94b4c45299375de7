"""The cached launch path: a call signature seen before (dtypes, shapes, strides, VM) reuses its
verified Launch, and still gives exactly the results of a first call for every layout."""
import gc
import threading

import numpy as np
import pytest

import dvm
from dvm.errors import DTypeError, ShapeError
from dvm.graph import build
from dvm.graph.dtypes import DType
from dvm.graph.node import Node
from dvm.graph.symbolic import sym
from dvm.runtime.compiled import CompiledGraph
from dvm.vm.buffers import _interface_ptr, data_ptr
from dvm.vm.cpu.host.desc import PARALLEL_MIN_ELEMS


@dvm.kernel
def axpy(k, x, y):
    return k.store(k.add(k.mul(k.load(x), 2.0), k.load(y)))


@dvm.kernel
def row_softmax_and_sum(k, x):
    x = k.load(x)
    e = k.exp(k.sub(x, k.max(x, axis=-1, keepdims=True)))
    return k.store(k.div(e, k.sum(e, axis=-1, keepdims=True))), k.store(k.sum(x, axis=0))


def _expect_axpy(x, y):
    return (x.astype(np.float32) * np.float32(2.0) + y).astype(np.float32)


def _layouts(rng):
    """(x, y) pairs of one shape in different memory layouts."""
    base = rng.standard_normal((7, 10)).astype(np.float32)
    big = rng.standard_normal((14, 20)).astype(np.float32)
    return {
        "contiguous": base.copy(),
        "transposed": np.asfortranarray(base),
        "strided": big[::2, ::2],
        "reversed": big[:7, ::-2],
        "broadcast row": np.broadcast_to(base[0], (7, 10)),
    }


def test_repeat_calls_hit_the_launch_cache(vm):
    x, y = np.ones((5, 33), np.float32), np.arange(5 * 33, dtype=np.float32).reshape(5, 33)
    axpy(x, y)
    dvm.reset_counters()
    for i in range(4):
        out = axpy(x + i, y)
        np.testing.assert_array_equal(out, _expect_axpy(x + i, y))
    c = dvm.counters()
    assert c.get("encodes", 0) == 0 and c.get("traces", 0) == 0
    assert c["launches"] == 4 and c["cache_hits"] == 4


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "strided", "reversed", "broadcast row"])
def test_every_layout_gives_first_call_results_on_repeat(vm, layout):
    rng = np.random.default_rng(0)
    x = _layouts(rng)[layout]
    y = rng.standard_normal((7, 10)).astype(np.float32)
    first = axpy(x, y)
    for _ in range(3):   # the same signature with new data: the cached Launch
        x2 = _layouts(rng)[layout]
        y2 = rng.standard_normal((7, 10)).astype(np.float32)
        np.testing.assert_allclose(axpy(x2, y2), _expect_axpy(x2, y2), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(first, _expect_axpy(x, y), rtol=1e-6, atol=1e-6)


def test_partial_element_strides_are_copied_and_counted_on_every_call(vm):
    raw = np.zeros(6 * 12, np.uint8)
    x = np.ndarray((12,), np.float32, raw.data, strides=(6,))   # a stride of 1.5 elements
    x[...] = np.arange(12, dtype=np.float32)
    y = np.ones(12, np.float32)
    dvm.reset_counters()
    for _ in range(3):
        np.testing.assert_array_equal(axpy(x, y), _expect_axpy(x, y))
    assert dvm.counters().get("input_copies", 0) >= 3


def test_multi_output_workspace_kernel_on_repeat(vm):
    rng = np.random.default_rng(1)
    for _ in range(3):
        x = rng.standard_normal((6, 40)).astype(np.float32)
        sm, s0 = row_softmax_and_sum(x)
        e = np.exp(x - x.max(axis=-1, keepdims=True))
        np.testing.assert_allclose(sm, e / e.sum(axis=-1, keepdims=True), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(s0, x.sum(axis=0), rtol=1e-5, atol=1e-5)


def test_reused_workspaces_under_concurrent_calls(vm):
    """A Launch keeps its small workspaces for the next call; calls of the same Launch from
    several threads at once must not share them (the one that finds them busy takes fresh ones)."""
    graph, rng = _workspace_graph(), np.random.default_rng(2)
    xs = [rng.standard_normal((6, 6)).astype(np.float32) for _ in range(4)]
    want = [-(a * a.sum(1, keepdims=True, dtype=np.float32))[1:] for a in xs]
    launch, _ = graph.launcher({"n": 6}, [xs[0]], vm)
    assert launch.ws_specs
    assert not _wrong_in_threads(lambda a: graph.run({"n": 6}, [a], vm=vm)[0], xs, want)


def _wrong_in_threads(call, xs: list, want: list) -> list:
    """call(xs[i]) 300 times in each of len(xs) threads at once: the i of each result not
    close to want[i]."""
    bad = []

    def work(i: int) -> None:
        for _ in range(300):
            if not np.allclose(call(xs[i]), want[i], rtol=1e-5, atol=1e-6):
                bad.append(i)
    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(xs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return bad


@dvm.kernel
def fma3(k, x, y, z):
    return k.store(k.add(k.mul(k.load(x), k.load(y)), k.load(z)))


@dvm.kernel
def negate(k, x):
    return k.store(k.neg(k.load(x)))


def test_cached_calls_of_one_to_three_inputs_and_several_outputs(vm):
    """The cached forms: one output with 1, 2 or 3 inputs (the CPU VM's flattened caller),
    several outputs (a tuple, as on a first call)."""
    rng = np.random.default_rng(3)
    for _ in range(3):
        x, y, z = (rng.standard_normal((3, 5)).astype(np.float32) for _ in range(3))
        np.testing.assert_array_equal(negate(x), -x)
        np.testing.assert_array_equal(axpy(x, y), _expect_axpy(x, y))
        np.testing.assert_array_equal(fma3(x, y, z), (x * y + z).astype(np.float32))
        both = row_softmax_and_sum(x)
        assert type(both) is tuple and len(both) == 2
        np.testing.assert_allclose(both[1], x.sum(axis=0), rtol=1e-5, atol=1e-5)


# element counts whose launch is one call of a chain of small kernels, and one whose kernel is big
# enough to be shared between threads (vm/cpu/host/launch: _ChainRunner, _ListRunner)
RUNNERS = {8: "_ChainRunner", PARALLEL_MIN_ELEMS + 8: "_ListRunner"}


@pytest.mark.cpu_vm   # the CPU VM's runner
@pytest.mark.parametrize("size", RUNNERS)
def test_a_busy_runner_takes_a_fresh_address_table(size):
    """A launch's address table is in use by another thread (its lock is held): the cached call
    packs the addresses into a table of its own, with the same results; so does the cached call
    of several outputs."""
    ctx, n = build.ShapeContext(), sym("n")
    x = Node.make("input", DType.FLOAT32, (n,), index=0)
    y = Node.make("input", DType.FLOAT32, (n,), index=1)
    graph = CompiledGraph([x, y], [build.elementwise(ctx, "sub", x, y)])
    pair = CompiledGraph([x, y], [build.elementwise(ctx, "sub", x, y), build.elementwise(ctx, "mul", x, y)])
    a, b = np.arange(size, dtype=np.float32), np.full(size, 0.5, np.float32)
    launch, _ = graph.launcher({"n": size}, [a, b], "cpu")
    call = launch.cached_call(single=True)
    np.testing.assert_array_equal(call((a, b)), a - b)
    pair_launch, _ = pair.launcher({"n": size}, [a, b], "cpu")
    pair_call = pair_launch.cached_call()
    runner, pair_runner = launch._bound, pair_launch._bound
    assert type(runner).__name__ == type(pair_runner).__name__ == RUNNERS[size]
    assert runner.lock.acquire(False) and pair_runner.lock.acquire(False)
    try:
        np.testing.assert_array_equal(call((b, a)), b - a)
        runner([a.ctypes.data, b.ctypes.data, (out := np.empty(size, np.float32)).ctypes.data])
        np.testing.assert_array_equal(out, a - b)
        diff, prod = pair_call((b, a))
        np.testing.assert_array_equal(diff, b - a)
        np.testing.assert_array_equal(prod, b * a)
    finally:
        runner.lock.release()
        pair_runner.lock.release()
    np.testing.assert_array_equal(call((a, a)), np.zeros(size, np.float32))
    diff, prod = pair_call((a, b))
    np.testing.assert_array_equal(diff, a - b)
    np.testing.assert_array_equal(prod, a * b)


def _workspace_graph():
    """-(x * x.sum(1))[1:] over (n, 6): x * x.sum(1) is a workspace between two kernels."""
    ctx, n = build.ShapeContext(), sym("n")
    x = Node.make("input", DType.FLOAT32, (n, 6), index=0)
    y = build.elementwise(ctx, "mul", x, build.reduce(ctx, "sum", x, 1, True))
    out = build.elementwise(ctx, "neg", build.slice_view(ctx, y, 0, 1, n - 1))
    return CompiledGraph([x], [out])


def _small_workspace_graph():
    """x[1:] * x.sum(1)[1:] over (n, 64): the row sums (n floats) are a workspace between two kernels."""
    ctx, n = build.ShapeContext(), sym("n")
    x = Node.make("input", DType.FLOAT32, (n, 64), index=0)
    sums = build.slice_view(ctx, build.reduce(ctx, "sum", x, 1, True), 0, 1, n - 1)
    return CompiledGraph([x], [build.elementwise(ctx, "mul", build.slice_view(ctx, x, 0, 1, n - 1), sums)])


# (graph, rows, its expected result, the runner): workspaces in a chain of small kernels, and in
# a launch whose second kernel is big enough to be shared between threads
WORKSPACE_CASES = {
    "chain": (_workspace_graph, 6, lambda a: -(a * a.sum(1, keepdims=True, dtype=np.float32))[1:], "_ChainRunner"),
    "list": (_small_workspace_graph, PARALLEL_MIN_ELEMS // 64 + 8,
             lambda a: a[1:] * a.sum(1, keepdims=True, dtype=np.float32)[1:], "_ListRunner"),
}


@pytest.mark.cpu_vm   # the CPU VM's runner
@pytest.mark.parametrize("case", WORKSPACE_CASES)
def test_cached_call_with_workspaces_owns_them(case):
    """The one-function cached call of a launch with small workspaces: its own, alive as long as
    the call is (memory freed and handed out again would be written by every launch), used by one
    launch at a time (with the runner busy it takes fresh ones), from several threads at once."""
    make, rows, expect, runner_type = WORKSPACE_CASES[case]
    graph, rng = make(), np.random.default_rng(5)
    # small integers: sums exact in any order
    xs = [rng.integers(-8, 8, (rows, graph.inputs[0].shape[1])).astype(np.float32) for _ in range(4)]
    want = [expect(a) for a in xs]
    launch, _ = graph.launcher({"n": rows}, [xs[0]], "cpu")
    assert launch.ws_specs and launch.direct_parts() is not None
    assert type(launch._bound).__name__ == runner_type
    call = launch.cached_call(single=True)
    gc.collect()
    sentinels = [np.full(n, 7.0, dt) for n, dt in launch.ws_specs for _ in range(64)]
    for a, w in zip(xs, want):
        np.testing.assert_allclose(call((a,)), w, rtol=1e-5, atol=1e-6)
    assert all((s == 7.0).all() for s in sentinels)
    runner = launch._bound
    assert runner.lock.acquire(False)
    try:
        np.testing.assert_allclose(call((xs[1],)), want[1], rtol=1e-5, atol=1e-6)
    finally:
        runner.lock.release()
    assert not _wrong_in_threads(lambda a: call((a,)), xs, want)


@pytest.mark.cpu_vm   # launches on both VMs
def test_vm_choice_is_part_of_the_signature(vm):
    x, y = np.full(9, 3.0, np.float32), np.ones(9, np.float32)
    for chosen in ("cpu", "reference", "cpu"):
        np.testing.assert_array_equal(axpy(x, y, vm=chosen), np.full(9, 7.0, np.float32))
    with pytest.raises(ValueError, match="unknown VM"):
        axpy(x, y, vm="nonsense")


def test_bad_inputs_after_cached_calls_still_raise(vm):
    x, y = np.ones((4, 8), np.float32), np.ones((4, 8), np.float32)
    axpy(x, y)
    axpy(x, y)
    with pytest.raises(DTypeError, match="argument 'x'"):
        axpy(np.ones((4, 8), np.complex64), y)
    with pytest.raises(ShapeError):
        axpy(np.ones((4, 8), np.float32), np.ones((4, 9), np.float32))
    np.testing.assert_array_equal(axpy(x, y), np.full((4, 8), 3.0, np.float32))


def test_lists_and_scalars_take_the_general_path(vm):
    np.testing.assert_array_equal(axpy([1.0, 2.0], [1.0, 1.0]), np.array([3.0, 5.0]))
    np.testing.assert_array_equal(axpy([1.0, 2.0], [1.0, 1.0]), np.array([3.0, 5.0]))


def test_data_ptr_matches_the_array_interface():
    base = np.arange(100, dtype=np.float64)
    for a in (base, base[3:], base[::-1], base.reshape(10, 10).T, base[5:6], np.empty(0, np.int8),
              np.asfortranarray(base.reshape(4, 25)), np.ones((), np.bool_)):
        assert data_ptr(a) == _interface_ptr(a)
