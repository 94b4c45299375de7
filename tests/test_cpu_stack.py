"""Parallel stacking (vm/cpu/host/stack): the kernels of a launch with a big kernel run as one
parallel job, independent ones beside each other. Results are bitwise those of the kernels run one
by one (DVM_STACK=0), on the OpenMP team and on the VM's own workers, and agree with the reference
VM; dependent kernels wait, in-place updates keep running beside each other, any other output
over an argument's memory orders every kernel, and a failing kernel raises."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import dvm
from dvm import config as dvm_config
from dvm.graph import build
from dvm.graph.dtypes import DType
from dvm.graph.node import Node
from dvm.graph.symbolic import sym
from dvm.runtime.compiled import CompiledGraph
from dvm.vm.cpu.host.desc import prog_desc
from dvm.vm.cpu.host.stack import PARALLEL_MIN_ELEMS, STACK_MIN_SIDE_WORK, arg_owners, kernel_waits, side_work

pytestmark = [pytest.mark.cpu_vm, pytest.mark.vm_once]   # compares the CPU VM with itself and the reference

WIDE, NARROW = 64, 48


def _graph():
    """Over x (n, WIDE) and y (m, NARROW): exp(x) - 1, y * y + 1 and the column sums of y
    (independent of it), and x[1:] * x.sum(1)[1:] (the row sums are a workspace, then a kernel
    that waits for it)."""
    ctx, n, m = build.ShapeContext(), sym("n"), sym("m")
    x = Node.make("input", DType.FLOAT32, (n, WIDE), index=0)
    y = Node.make("input", DType.FLOAT32, (m, NARROW), index=1)
    ew = build.elementwise
    one = build.const(1.0, DType.FLOAT32)
    sums = build.slice_view(ctx, build.reduce(ctx, "sum", x, 1, True), 0, 1, n - 1)
    outs = [ew(ctx, "sub", ew(ctx, "exp", x), one),
            ew(ctx, "add", ew(ctx, "mul", y, y), one),
            build.reduce(ctx, "sum", y, 0, False),
            ew(ctx, "mul", build.slice_view(ctx, x, 0, 1, n - 1), sums)]
    return CompiledGraph([x, y], outs)


GRAPH = _graph()


def _inputs(rows_x, rows_y, seed=0):
    rng = np.random.default_rng(seed)
    # small integers scaled by 1/8: the sums are exact in any order
    x = (rng.integers(-8, 8, (rows_x, WIDE)) / 8).astype(np.float32)
    y = (rng.integers(-8, 8, (rows_y, NARROW)) / 8).astype(np.float32)
    return x, y


@pytest.fixture(params=[1, 0], ids=["openmp", "workers"])
def threads_of(request, monkeypatch):
    """Parallel kernels on the OpenMP team (PyTorch's, loaded here) or on the VM's own workers."""
    pytest.importorskip("torch")   # brings the OpenMP runtime into the process
    monkeypatch.setenv("DVM_OPENMP", str(request.param))
    monkeypatch.setenv("DVM_NUM_THREADS", "2")
    dvm_config.reload()
    yield request.param
    monkeypatch.undo()
    dvm_config.reload()


def _run(graph, env, arrays, stack, vm="cpu", monkeypatch=None):
    monkeypatch.setenv("DVM_STACK", str(int(stack)))
    dvm_config.reload()
    return graph.run(env, arrays, vm)


def _stack_of(graph, env, arrays):
    launch, _ = graph.launcher(env, arrays, "cpu")
    return prog_desc(launch.layout)[4]


def test_kernel_waits_follow_loads_and_stores():
    """A kernel waits where it loads what the kernels since the last wait store, or stores what
    they load or store; the sets start again at each wait."""
    D = _Flags
    assert kernel_waits([D({2}, {0}), D({3}, {1}), D({4}, {0, 1})]) == [0, 0, 0]   # shared loads only
    assert kernel_waits([D({2}, {0}), D({3}, {2})]) == [0, 1]          # loads what kernel 0 stores
    assert kernel_waits([D({2}, {0}), D({0}, {1})]) == [0, 1]          # stores what kernel 0 loads
    assert kernel_waits([D({2}, {0}), D({2}, {1})]) == [0, 1]          # stores what kernel 0 stores
    assert kernel_waits([D({2}, {0}), D({3}, {2}), D({4}, {0})]) == [0, 1, 0]   # after a wait: kernel 1's sets
    assert kernel_waits([D({2}, {0}), D({3}, {2}), D({4}, {2})]) == [0, 1, 0]   # kernel 0 is done by then


class _Flags:
    """A descriptor's stored / loaded argument flags (what kernel_waits and arg_owners read)."""
    def __init__(self, stores, loads, n=5):
        self.argst, self.argld = np.zeros(n, np.int64), np.zeros(n, np.int64)
        self.argst[list(stores)], self.argld[list(loads)] = 1, 1


def test_arg_owners_name_the_one_kernel_or_none_or_several():
    owners = arg_owners([_Flags({2}, {0}), _Flags({3, 4}, {1, 2}), _Flags({4}, {1})])
    store, touch = owners[:5].tolist(), owners[5:].tolist()
    assert store == [-1, -1, 0, 1, -2]
    assert touch == [0, -2, -2, 1, -2]


def test_side_work_is_what_runs_beside_the_largest_kernel_of_each_run():
    class W:
        def __init__(self, work):
            self.work = work
    assert side_work([W(10), W(50), W(30)], [0, 0, 1]) == 10
    assert side_work([W(10), W(50), W(30)], [0, 0, 0]) == 40
    assert side_work([W(10), W(50), W(30)], [0, 1, 1]) == 0


def _ordered(owners, spans):
    """jit/entry._aliases_ordered on buffers at (address, element count) `spans` of float32."""
    from dvm.vm.cpu.jit.entry import _aliases_ordered
    n = len(spans)
    bufs = np.array([a for a, _ in spans] + [c for _, c in spans], np.int64)
    recs = np.concatenate([np.zeros(3, np.int64), np.asarray(owners, np.int64)])
    return _aliases_ordered(recs, 3, bufs, np.full(n, 4, np.int64))


def test_an_in_place_update_keeps_the_waits_and_any_other_overlap_orders_all():
    """Arguments: 0 in p, 1 in q, 2 out p' (kernel 0 stores it), 3 out q' (kernel 1). p' over p
    with only kernel 0 touching p: the waits by argument stay valid; p' over q (read by kernel 1),
    p' half over p, or p' stored by two kernels: not."""
    apart = [(1000, 8), (2000, 8), (3000, 8), (4000, 8)]
    in_place = [(1000, 8), (2000, 8), (1000, 8), (2000, 8)]
    owners = [-1, -1, 0, 1, 0, 1, 0, 1]   # stores, then touches
    assert _ordered(owners, apart) and _ordered(owners, in_place)
    assert not _ordered(owners, [(1000, 8), (2000, 8), (2000, 8), (4000, 8)])   # p' over q
    assert not _ordered(owners, [(1000, 8), (2000, 8), (1016, 8), (4000, 8)])   # half over p
    assert not _ordered([-1, -1, -2, 1, 0, 1, -2, 1], in_place)                  # p' stored twice
    assert not _ordered([-1, -1, 0, 1, 1, 1, 0, 1], in_place)                    # p read by kernel 1


def test_the_graph_stacks_with_independent_and_dependent_kernels():
    rows = PARALLEL_MIN_ELEMS // WIDE + 3
    x, y = _inputs(rows, 37)
    stack = _stack_of(GRAPH, {"n": rows, "m": 37}, [x, y])
    assert stack is not None and len(stack.waits) >= 3
    assert stack.waits[1] == 0 and 1 in stack.waits   # kernels beside each other, and one that waits
    assert _stack_of(GRAPH, {"n": 5, "m": 3}, list(_inputs(5, 3))) is None   # tiny: the chain only
    launch, _ = GRAPH.launcher({"n": SMALL_X, "m": SMALL_Y}, list(_inputs(SMALL_X, SMALL_Y)), "cpu")
    _, descs, _, chain, stack = prog_desc(launch.layout)
    assert max(d.work for d in descs) < PARALLEL_MIN_ELEMS and chain is not None and stack is not None
    assert side_work(descs, stack.waits) >= STACK_MIN_SIDE_WORK   # enough work beside the largest kernel


SMALL_X, SMALL_Y = PARALLEL_MIN_ELEMS * 7 // 8 // WIDE, PARALLEL_MIN_ELEMS * 3 // 4 // NARROW


@pytest.mark.parametrize("rows_x, rows_y", [(PARALLEL_MIN_ELEMS // WIDE + 3, 37),    # one big kernel
                                             (PARALLEL_MIN_ELEMS // WIDE * 3 + 1, 2 * PARALLEL_MIN_ELEMS // NARROW),
                                             (PARALLEL_MIN_ELEMS // WIDE, 1),
                                             (SMALL_X, SMALL_Y)])   # small kernels only
def test_stacked_equals_one_by_one(threads_of, rows_x, rows_y, monkeypatch):
    """Bitwise equal to the kernels run one by one, equal to the reference VM, counted (small
    kernels are stacked on the OpenMP team only: on the VM's workers they run as one chain)."""
    x, y = _inputs(rows_x, rows_y)
    env = {"n": rows_x, "m": rows_y}
    one_by_one = _run(GRAPH, env, [x, y], False, monkeypatch=monkeypatch)
    dvm.reset_counters()
    stacked = _run(GRAPH, env, [x, y], True, monkeypatch=monkeypatch)
    counted = dvm.counters()
    small = (rows_x, rows_y) == (SMALL_X, SMALL_Y)
    assert counted.get("cpu_stacked_openmp" if threads_of else "cpu_stacked_workers", 0) == \
        (0 if small and not threads_of else 1)
    for a, b in zip(stacked, one_by_one):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(stacked, _run(GRAPH, env, [x, y], True, vm="reference", monkeypatch=monkeypatch)):
        np.testing.assert_allclose(a, b, rtol=2e-6, atol=1e-6)


@settings(max_examples=15, deadline=None)
@given(rows_x=st.integers(1, 3 * PARALLEL_MIN_ELEMS // WIDE), rows_y=st.integers(1, 3000),
       seed=st.integers(0, 2 ** 16))
def test_stacked_equals_one_by_one_at_any_size(rows_x, rows_y, seed):
    """Hypothesis: sizes on both sides of the threading threshold, repeated launches (counters,
    late helpers): the stacked launch is bitwise the one-by-one run."""
    x, y = _inputs(rows_x, rows_y, seed)
    env = {"n": rows_x, "m": rows_y}
    with pytest.MonkeyPatch.context() as mp:   # (hypothesis runs examples inside one test call)
        want = _run(GRAPH, env, [x, y], False, monkeypatch=mp)
        for _ in range(3):
            for a, b in zip(_run(GRAPH, env, [x, y], True, monkeypatch=mp), want):
                np.testing.assert_array_equal(a, b)
    dvm_config.reload()


def _update_inputs(env, seed):
    """p and g over (n, WIDE), y over (m, NARROW)."""
    return _inputs(env["n"], 1, seed)[0], _inputs(env["n"], 1, seed + 1)[0], _inputs(1, env["m"], seed + 2)[1]


def _update_launches(env, arrays, square_first, monkeypatch):
    """The launch of p + g and y * y (two kernels; y * y the first output where square_first),
    bound with DVM_STACK=0, then with DVM_STACK=1."""
    ctx, n, m = build.ShapeContext(), sym("n"), sym("m")
    p = Node.make("input", DType.FLOAT32, (n, WIDE), index=0)
    g = Node.make("input", DType.FLOAT32, (n, WIDE), index=1)
    y = Node.make("input", DType.FLOAT32, (m, NARROW), index=2)
    outs = [build.elementwise(ctx, "add", p, g), build.elementwise(ctx, "mul", y, y)]
    graph = CompiledGraph([p, g, y], outs[::-1] if square_first else outs)
    for stack in (False, True):
        monkeypatch.setenv("DVM_STACK", str(int(stack)))
        dvm_config.reload()
        launch, _ = graph.launcher(env, arrays, "cpu")
        assert len(prog_desc(launch.layout)[1]) == 2
        yield launch


def test_a_stored_argument_over_another_keeps_the_order(threads_of, monkeypatch):
    """A launch whose output is another argument's memory (the VM's contract allows that only
    for an in-place update read by its own kernel; this one is read by another kernel): every
    kernel of the stack then waits for the ones before it, and the results are bitwise those of
    the kernels run one by one."""
    rows = 3 * PARALLEL_MIN_ELEMS // WIDE
    env = {"n": rows, "m": rows * WIDE // NARROW}
    pv, gv, yv = _update_inputs(env, seed=3)
    results = []
    for launch in _update_launches(env, [pv, gv, yv], square_first=True, monkeypatch=monkeypatch):
        ys, sq = yv.copy(), np.empty_like(yv)
        launch._bound([pv.ctypes.data, gv.ctypes.data, ys.ctypes.data, sq.ctypes.data, ys.ctypes.data])
        results.append((sq, ys))
    np.testing.assert_array_equal(results[0][0], results[1][0])
    np.testing.assert_array_equal(results[0][1], results[1][1])
    np.testing.assert_array_equal(results[1][1].reshape(-1), (pv + gv).reshape(-1))


def test_in_place_updates_in_a_stack(threads_of, monkeypatch):
    """p += g and y *= y written over their inputs (each input read by its own kernel only, as
    runtime/in_place allows): the kernels keep running beside each other, with the results of the
    kernels run one by one."""
    rows = 3 * PARALLEL_MIN_ELEMS // WIDE
    env = {"n": rows, "m": 2 * PARALLEL_MIN_ELEMS // NARROW}
    pv, gv, yv = _update_inputs(env, seed=6)
    for launch in _update_launches(env, [pv, gv, yv], square_first=False, monkeypatch=monkeypatch):
        ps, ys = pv.copy(), yv.copy()
        for _ in range(2):
            launch._bound([ps.ctypes.data, gv.ctypes.data, ys.ctypes.data, ps.ctypes.data, ys.ctypes.data])
        np.testing.assert_array_equal(ps, (pv + gv) + gv)
        np.testing.assert_array_equal(ys, (yv * yv) * (yv * yv))


def test_a_failing_kernel_in_a_stack_raises(threads_of, monkeypatch):
    """Integer division by zero in one kernel of a stacked launch raises ZeroDivisionError (no
    hang, no result), and the next launch runs."""
    ctx, n = build.ShapeContext(), sym("n")
    a = Node.make("input", DType.INT64, (n,), index=0)
    b = Node.make("input", DType.INT64, (n,), index=1)
    c = Node.make("input", DType.FLOAT32, (n,), index=2)
    graph = CompiledGraph([a, b, c], [build.elementwise(ctx, "floor_divide", a, b),
                                      build.reduce(ctx, "sum", c, 0, False)])
    size = 2 * PARALLEL_MIN_ELEMS
    av, cv = np.arange(size, dtype=np.int64), np.ones(size, np.float32)
    monkeypatch.setenv("DVM_STACK", "1")
    dvm_config.reload()
    bad = np.ones(size, np.int64)
    bad[size - 5] = 0
    for _ in range(3):
        with pytest.raises(ZeroDivisionError):
            graph.run({"n": size}, [av, bad, cv], "cpu")
    q, s = graph.run({"n": size}, [av, np.full(size, 3, np.int64), cv], "cpu")
    np.testing.assert_array_equal(q, av // 3)
    assert s == size
