"""An output written into the memory of an input (runtime/in_place): which graphs allow it, and
every VM computing the same values when the output buffer is the input buffer itself."""
import numpy as np
import pytest

from dvm.codegen.verifier import verify
from dvm.config import config
from dvm.graph import build
from dvm.graph.dtypes import DType
from dvm.graph.node import Node
from dvm.graph.symbolic import sym
from dvm.runtime.compiled import CompiledGraph, as_buffer
from dvm.vm import registry

S, C = sym("s"), 37


def _input(shape, index, dtype=DType.FLOAT32):
    return Node.make("input", dtype, shape, index=index)


def _ew(ctx, name, *args):
    return build.elementwise(ctx, name, *args)


def _adam_like(ctx, p, g, m):
    """m' = 0.9 m + 0.1 g; p' = p - 0.01 m' / (|m'| + 1): two outputs over their inputs."""
    m2 = _ew(ctx, "add", _ew(ctx, "mul", m, build.const(0.9)), _ew(ctx, "mul", g, build.const(0.1)))
    den = _ew(ctx, "add", _ew(ctx, "abs", m2), build.const(1.0))
    return _ew(ctx, "sub", p, _ew(ctx, "div", _ew(ctx, "mul", m2, build.const(0.01)), den)), m2


def _sgd_like(ctx, p, g, b):
    """b' = 0.9 b + g; p' = p + (-0.01) b': each a product by a constant and a sum (FK_UNBIN runs
    with a constant), b' computed over b's tile and p' over p's when written over them."""
    b2 = _ew(ctx, "add", _ew(ctx, "mul", b, build.const(0.9)), g)
    return _ew(ctx, "add", p, _ew(ctx, "mul", b2, build.const(-0.01))), b2


def _graphs():
    """name -> (inputs, outputs, {(out, slot): may it be written over})."""
    ctx = build.ShapeContext()
    p, g, m = _input((S, C), 0), _input((S, C), 1), _input((S, C), 2)
    p2, m2 = _adam_like(ctx, p, g, m)
    p3, b3 = _sgd_like(ctx, p, g, m)
    row = _input((C,), 1)
    t = _input((C, C), 0)
    x = _input((S, C), 0)
    mean = build.reduce(ctx, "mean", x, 1, True)
    y = _ew(ctx, "mul", x, build.const(2.0))
    return {
        # p, g and m read once each, unviewed, by the kernel storing p' and m' (from all three)
        "adam": ([p, g, m], [p2, m2], {(0, 0): True, (1, 2): True, (0, 1): True}),
        "sgd": ([p, g, m], [p3, b3], {(0, 0): True, (1, 2): True}),
        # the broadcast row is read at other points than those storing it; shapes differ anyway
        "broadcast": ([p, row], [_ew(ctx, "add", p, row)], {(0, 0): True, (0, 1): False}),
        # t read transposed too: another element than the one stored over
        "transposed": ([t], [_ew(ctx, "add", t, build.permute(ctx, t, (1, 0)))], {(0, 0): False}),
        # a reduction reads the row before the kernel stores it (another sweep, or a kernel before)
        "reduction": ([x], [_ew(ctx, "sub", x, mean)], {(0, 0): False}),
        # the new value does not depend on the input: the store may come before the load
        "independent": ([x, _input((S, C), 1)], [_ew(ctx, "exp", _input((S, C), 1)), y],
                        {(0, 0): False, (1, 0): True}),
        # a second kernel reads x after the first has stored over it
        "two_readers": ([x], [y, build.reduce(ctx, "sum", _ew(ctx, "exp", x), 1, False)],
                        {(0, 0): False}),
    }


@pytest.mark.parametrize("name", sorted(_graphs()))
def test_which_outputs_may_overwrite_an_input(name):
    inputs, outputs, cases = _graphs()[name]
    graph = CompiledGraph(inputs, outputs)
    for (out, slot), want in cases.items():
        assert graph.overwrites(out, slot) is want, (out, slot)


@pytest.mark.parametrize("rows", [1, 5, 300])
def test_vm_writes_over_its_input(rows):
    """The CPU VM and the reference VM on the Adam-like graph with p' in p's buffer and m' in
    m's: the values of a run into fresh outputs."""
    inputs, outputs, _ = _graphs()["adam"]
    graph = CompiledGraph(inputs, outputs)
    rng = np.random.default_rng(rows)
    arrays = [rng.standard_normal((rows, C)).astype(np.float32) for _ in inputs]
    want = graph.run({"s": rows}, [a.copy() for a in arrays])
    p, g, m = (a.copy() for a in arrays)
    layouts = [as_buffer(a)[1] for a in (p, g, m)]
    vm = registry.get(config().vm)
    layout = verify(graph.program({"s": rows}, layouts, vm.target))
    vm.run(layout, [p.reshape(-1), g.reshape(-1), m.reshape(-1), p.reshape(-1), m.reshape(-1)])
    np.testing.assert_array_equal(p, want[0])
    np.testing.assert_array_equal(m, want[1])
    np.testing.assert_array_equal(g, arrays[1])


def _alias_code(graph, rows, outs_over):
    """jit/addr.alias_ok on the CPU VM's descriptor of `graph`'s kernel, with output k placed
    where outs_over[k] says: ("in", slot, shift) over that input's buffer shifted by `shift`
    elements, or None (a buffer of its own)."""
    from dvm.vm.cpu.host.decode import DECODE
    from dvm.vm.cpu.host.desc import prog_desc
    from dvm.vm.cpu.jit.addr import alias_ok
    arrays = [np.zeros((rows + 1) * C, np.float32) for _ in graph.inputs]   # (room for a shifted output)
    layouts = [as_buffer(a[:rows * C].reshape(rows, C))[1] for a in arrays]
    layout = verify(graph.program({"s": rows}, layouts, registry.get("cpu").target))
    argsz, descs, _, _, _ = prog_desc(layout)
    (d,) = descs
    own = [np.zeros(rows * C, np.float32) for _ in outs_over]   # (kept alive: distinct addresses)
    addrs = [a.ctypes.data for a in arrays]
    for k, over in enumerate(outs_over):
        addrs.append(own[k].ctypes.data if over is None else arrays[over[1]].ctypes.data + 4 * over[2])
    numels = np.full(len(addrs), rows * C, np.int64)   # each buffer's elements, as a launch passes them
    return alias_ok(np.array(addrs, np.int64), numels, argsz, d.argst, d.instrs, DECODE, d.rio, d.optab, d.meta,
                    d.dims)


@pytest.mark.vm_once
@pytest.mark.cpu_vm
@pytest.mark.parametrize("name, outs_over, want", [
    ("adam", (None, None), 1),                          # nothing overlaps
    ("adam", (("in", 0, 0), ("in", 2, 0)), 2),          # p' over p and m' over m: runtime/in_place's update
    ("adam", (("in", 1, 0), None), 2),                  # p' over g (g is read before p' is computed)
    ("adam", (None, ("in", 0, 0)), 0),                  # m' over p: p is read after m' is computed
    ("adam", (("in", 0, 1), None), 0),                  # p' over p shifted by an element: other elements
    ("transposed", (("in", 0, 0),), 0),                 # t read transposed too
    ("reduction", (("in", 0, 0),), 0),                  # the row is read again after a store
])
def test_in_place_tiles_where_the_kernel_allows_the_overlap(name, outs_over, want):
    """The CPU VM keeps its in-place tiles (registers pointing into buffers, results written into
    outputs) where an output is an input's memory exactly and the stream reads that input before
    computing the value stored over it (abi.ALIASED), and runs every tile through its registers
    wherever else arguments overlap (0)."""
    from dvm.vm.cpu.abi import ALIASED
    inputs, outputs, _ = _graphs()[name]
    got = _alias_code(CompiledGraph(inputs, outputs), 5, outs_over)
    assert got == {0: 0, 1: 1, 2: ALIASED}[want]


@pytest.mark.vm_once
@pytest.mark.cpu_vm
@pytest.mark.parametrize("rows", [1, 7, 2048])
@pytest.mark.parametrize("over", [(0, 2), (1, 2)])   # (p' over, m' over): the input slot each writes over
def test_vm_writes_over_its_input_with_in_place_tiles(rows, over):
    """The CPU VM on the Adam-like graph with p' written over p (or g) and m' over m, at sizes of
    one tile, a few and many (threads share them): the values of a run into fresh outputs, and
    the input no output is placed over unchanged."""
    inputs, outputs, _ = _graphs()["adam"]
    graph = CompiledGraph(inputs, outputs)
    rng = np.random.default_rng(rows)
    arrays = [rng.standard_normal((rows, C)).astype(np.float32) for _ in inputs]
    want = graph.run({"s": rows}, [a.copy() for a in arrays])
    bufs = [a.copy() for a in arrays]
    layouts = [as_buffer(a)[1] for a in bufs]
    vm = registry.get("cpu")
    layout = verify(graph.program({"s": rows}, layouts, vm.target))
    vm.run(layout, [b.reshape(-1) for b in bufs] + [bufs[over[0]].reshape(-1), bufs[over[1]].reshape(-1)])
    np.testing.assert_array_equal(bufs[over[0]], want[0])
    np.testing.assert_array_equal(bufs[over[1]], want[1])
    untouched = ({0, 1, 2} - set(over)).pop()
    np.testing.assert_array_equal(bufs[untouched], arrays[untouched])


@pytest.mark.vm_once
@pytest.mark.cpu_vm
@pytest.mark.parametrize("rows", [1, 7, 2048])
def test_scaled_sums_computed_over_the_tiles_they_update(rows):
    """The CPU VM on the SGD-like graph with p' over p and b' over b: its two products by a
    constant and sums are fused runs (jit/fused/unbin) computing over the input's tile (b' lands
    on b's, which x reads; p' on p's, which z reads); the values are float32's, op by op."""
    from dvm.vm.cpu.abi import FK_UNBIN, UNBIN_C_SHIFT
    from dvm.vm.cpu.host.desc import prog_desc
    inputs, outputs, _ = _graphs()["sgd"]
    graph = CompiledGraph(inputs, outputs)
    rng = np.random.default_rng(rows)
    arrays = [rng.standard_normal((rows, C)).astype(np.float32) for _ in inputs]
    arrays[2].reshape(-1)[::7] = np.inf
    p, g, b = (a.copy() for a in arrays)
    layout = verify(graph.program({"s": rows}, [as_buffer(a)[1] for a in (p, g, b)], registry.get("cpu").target))
    (d,) = prog_desc(layout)[1]
    assert sum(1 for row in d.fuse if row[0] == FK_UNBIN and row[7] >> UNBIN_C_SHIFT > 0) == 2
    registry.get("cpu").run(layout, [p.reshape(-1), g.reshape(-1), b.reshape(-1), p.reshape(-1), b.reshape(-1)])
    want_b = arrays[2] * np.float32(0.9) + arrays[1]
    np.testing.assert_array_equal(b, want_b)
    np.testing.assert_array_equal(p, arrays[0] + want_b * np.float32(-0.01))
    np.testing.assert_array_equal(g, arrays[1])
