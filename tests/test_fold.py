"""Constant folding while the graph is built (graph/fold): an elementwise op of constants is the
constant the VMs would compute, a `where` of a constant condition is the operand it selects, and
a lerp with a Python weight (whose decomposition selects on a constant) compiles without a
per-element select and matches eager."""
import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dvm.codegen import isa
from dvm.graph import build
from dvm.graph.dtypes import Category, DType
from dvm.graph.node import Node
from dvm.graph.ops import BINARY, OP_TABLE, UNARY
from dvm.runtime.compiled import CompiledGraph

F32 = DType.FLOAT32
# ops correctly rounded on every VM (the CPU VM's transcendental functions are within a few ULP)
EXACT = ("neg", "abs", "sqrt", "floor", "ceil", "round", "trunc", "sign", "relu", "isnan", "isinf", "isfinite",
         "logical_not", "add", "sub", "mul", "div", "maximum", "minimum", "eq", "ne", "lt", "le", "gt", "ge",
         "logical_and", "logical_or", "logical_xor")
FLOAT_OPS = tuple(n for n in UNARY + BINARY if OP_TABLE[n].ref is not None and not n.startswith("bitwise"))
VALUES = st.one_of(st.floats(width=32), st.sampled_from([0.0, -0.0, 0.5, -1.5, 1e-40, math.inf, -math.inf, math.nan]))


def _input(index, dtype=F32):
    return Node.make("input", dtype, (), index=index)


def _run(name, values):
    """op `name` over 0-d float32 inputs holding `values`, run by the VM under test."""
    ctx = build.ShapeContext()
    xs = [_input(i) for i in range(len(values))]
    out = build.elementwise(ctx, name, *xs)
    (got,) = CompiledGraph(xs, [out]).run({}, [np.array(v, np.float32) for v in values])
    return got.item()


def _folded(name, values):
    node = build.elementwise(build.ShapeContext(), name, *[build.const(v, F32) for v in values])
    assert node.op == "const" and not node.attr("weak") and node.shape == ()
    return node.attr("value")


def _same(a, b):
    return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))


@pytest.mark.parametrize("name", FLOAT_OPS)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])   # (the VM: fixed per test)
@given(data=st.data())
def test_folded_constant_is_what_the_vm_computes(vm, name, data):
    """Exact ops on both VMs; the others against the reference VM (its float64 math, rounded)."""
    values = [data.draw(VALUES) for _ in range(OP_TABLE[name].arity)]
    folded = _folded(name, values)
    if vm == "reference" or name in EXACT:
        assert _same(float(folded), float(_run(name, values))), (name, values, folded)


def test_where_of_a_constant_condition_is_the_operand_it_selects():
    ctx = build.ShapeContext()
    x, y = Node.make("input", F32, (3, 4), index=0), Node.make("input", F32, (4,), index=1)
    assert build.elementwise(ctx, "where", build.const(True), x, y) is x
    picked = build.elementwise(ctx, "where", build.const(False), x, y)
    assert picked.op != "where" and picked.shape == (3, 4) and picked.inputs[0] is y
    # a weak scalar selected stands for a 0-d tensor: float16 data keeps promoting to float32
    scalar = build.elementwise(ctx, "where", build.cast(build.const(True), DType.BOOL), build.const(2.0),
                               Node.make("input", F32, (), index=2))
    half = Node.make("input", DType.FLOAT16, (5,), index=3)
    assert scalar.op == "const" and not scalar.attr("weak")
    assert build.elementwise(ctx, "mul", half, scalar).dtype is DType.FLOAT16   # a 0-d tensor does not promote


@pytest.mark.parametrize("dtype", [DType.FLOAT16, DType.BFLOAT16, DType.INT32, DType.INT64])
def test_other_compute_dtypes_are_not_folded(dtype):
    """float16 / bfloat16 values stay float32 between ops; integer division by zero raises at run time."""
    ctx = build.ShapeContext()
    name = "floor_divide" if dtype.category is Category.INT else "add"
    node = build.elementwise(ctx, name, build.const(3, dtype), build.const(0 if name == "floor_divide" else 1, dtype))
    assert node.op == name


@pytest.mark.parametrize("weight", [0.1, 0.7])
def test_lerp_with_a_python_weight_has_no_select(vm, weight):
    def f(a, b):
        return a.lerp(b, weight)
    a, b = torch.randn(64, 33), torch.randn(64, 33)
    g = torch.compile(f, backend="dvm", dynamic=False)
    torch.testing.assert_close(g(a, b), f(a, b))
    from dvm.frontend.torch_runtime import COMPILED
    ops = {isa.BY_CODE[row[0]].op for s in list(COMPILED)[-1].segments for t in s.graph.templates
           for row in t.instrs.reshape(-1, isa.WORDS).tolist()}
    assert "add" in ops and not ops & {"where", "abs", "ge"}


@pytest.mark.parametrize("dtype", [DType.FLOAT32, DType.FLOAT64])
def test_a_size_made_float_is_a_float_constant(vm, dtype):
    """x / n, n a symbolic size (a norm's count in its gradient): n cast to float is a float
    constant of the size, rounded where it is encoded as the cast rounds it (2**24 + 1 is
    2**24 in float32), not a cast per lane."""
    from dvm.codegen.disasm import disasm
    from dvm.graph.symbolic import sym
    n = sym("n", lo=1)
    count = build.cast(build.const(n), dtype)
    assert count.op == "const" and count.dtype is dtype and not count.attr("weak")
    x = Node.make("input", dtype, (), index=0)
    out = build.elementwise(build.ShapeContext(), "div", x, count)
    graph = CompiledGraph([x], [out])
    np_dtype = np.float32 if dtype is DType.FLOAT32 else np.float64
    for size in (768, 2 ** 24 + 1, 2 ** 53 - 1):
        (got,) = graph.run({"n": size}, [np.array(3.0, np_dtype)])
        assert got.item() == (np_dtype(3.0) / np_dtype(size)).item(), size
    layout = graph.program({"n": 768}, [((), (), 0)])
    assert "cast" not in disasm(layout)
