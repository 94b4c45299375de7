"""Equal segments share one CompiledGraph (runtime.compiled.shared_graph): a model's equal layers
encode, verify and bind a new size once, not once a layer; graphs that differ in an op, a
constant, a dtype, an input's slot or the env's key order never share; results stay eager's."""
import numpy as np
import pytest

from dvm.graph.build import ShapeContext, const, elementwise
from dvm.graph.dtypes import DType
from dvm.graph.node import Node
from dvm.graph.symbolic import sym
from dvm.runtime import counters
from dvm.runtime.compiled import CompiledGraph, shared_graph

torch = pytest.importorskip("torch")
from dvm.frontend.torch_runtime import COMPILED  # noqa: E402

pytestmark = pytest.mark.vm_once   # graph identity, not arithmetic: the default VM
N = sym("n")


def _graph(label: str = "x", c: float = 0.5, dtype: DType = DType.FLOAT32, slot: int = 0, op: str = "mul"):
    """(inputs, outputs) of tanh(x op c) + y over two labelled inputs."""
    ctx = ShapeContext()
    x = Node.make("input", dtype, (N,), index=slot, name=label)
    y = Node.make("input", dtype, (N,), index=1 - slot, name=label + "_y")
    out = elementwise(ctx, "add", elementwise(ctx, "tanh", elementwise(ctx, op, x, const(c))), y)
    return (x, y) if slot == 0 else (y, x), (out,)


def test_graphs_that_differ_only_in_their_inputs_labels_are_one():
    a = shared_graph(*_graph("first"), ["n"])
    before = counters.snapshot().get("graphs_shared", 0)
    assert shared_graph(*_graph("second"), ["n"]) is a
    assert counters.snapshot().get("graphs_shared", 0) == before + 1
    x = np.linspace(-2, 2, 7, dtype=np.float32)
    y = np.arange(7, dtype=np.float32)
    got = a.run({"n": 7}, [x, y])[0]
    np.testing.assert_array_equal(got, CompiledGraph(*_graph("second")).run({"n": 7}, [x, y])[0])
    np.testing.assert_allclose(got, np.tanh(x * np.float32(0.5)) + y, rtol=1e-6)


@pytest.mark.parametrize("other", [dict(c=0.25), dict(c=-0.0 + 0.5000001), dict(op="add"),
                                   dict(dtype=DType.FLOAT64), dict(slot=1)])
def test_graphs_that_compute_differently_never_share(other):
    assert shared_graph(*_graph(), ["n"]) is not shared_graph(*_graph(**other), ["n"])


def test_an_env_of_other_keys_or_order_gets_its_own_graph():
    """The caches key on env's values in its key order: (8, 3) under ("n", "m") is not (8, 3)
    under ("m", "n")."""
    g = shared_graph(*_graph(), ["n", "m"])
    assert shared_graph(*_graph(), ["m", "n"]) is not g
    assert shared_graph(*_graph(), ["n"]) is not g
    assert shared_graph(*_graph(), ["n", "m"]) is g


class _Layer(torch.nn.Module):
    def __init__(self, h: int, act):
        super().__init__()
        self.lin, self.w, self.act = torch.nn.Linear(h, h), torch.nn.Parameter(torch.rand(h) + 0.5), act

    def forward(self, x):
        h = x + self.act(self.lin(x))
        return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * self.w


class _Stack(torch.nn.Module):
    """Three equal layers (their own weights), then one with another activation."""

    def __init__(self, h: int = 32):
        super().__init__()
        torch.manual_seed(0)
        acts = [torch.nn.functional.silu] * 3 + [torch.tanh]
        self.layers = torch.nn.ModuleList(_Layer(h, a) for a in acts)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def test_equal_layers_share_their_graph_and_encode_a_new_size_once():
    torch._dynamo.reset()
    model = _Stack()
    compiled = torch.compile(model, backend="dvm", dynamic=True)
    with torch.no_grad():
        for n in (5, 9):
            x = torch.randn(2, n, 32)
            torch.testing.assert_close(compiled(x), model(x))
        graph = COMPILED[-1]
        runners = graph.segments
        distinct = {id(r.graph) for r in runners}
        assert len(runners) == 4 and len(distinct) == 2, graph.describe()   # the equal layers: one
        by_graph = {}
        for r in runners:
            assert by_graph.setdefault(id(r.graph), r.launch) is r.launch   # and one launcher
        assert graph.describe().count("the graph of segment 0 (equal)") == 2   # dvm.explain says so
        before = counters.snapshot().get("encodes", 0)
        x = torch.randn(2, 13, 32)                                        # a new size
        torch.testing.assert_close(compiled(x), model(x))
        assert counters.snapshot().get("encodes", 0) - before == len(distinct)
