"""tools/gemm_probe: a product called from compiled code through the process's BLAS gives
PyTorch's product (MKL's sgemm_: bitwise) and its epilogue PyTorch's add and ReLU; arguments."""
import pytest

torch = pytest.importorskip("torch")

from dvm.tools import gemm_probe  # noqa: E402

pytestmark = [pytest.mark.cpu_vm, pytest.mark.vm_once]   # runs once, on the default (CPU) VM


def test_products_through_each_blas_found():
    found = gemm_probe.blas_libraries()
    if not found:
        pytest.skip("no BLAS sgemm exported by this process's libraries")
    rows = gemm_probe.probe(shapes=((3, 5, 7), (8, 33, 17)), samples=3)
    assert len(rows) == 2 * len(found)
    for r in rows:   # (the probe raises where the epilogue differs from PyTorch's)
        assert set(r["us"]) == set(gemm_probe.SYSTEMS) and min(r["us"].values()) > 0
        if r["blas"].startswith(gemm_probe.MKL):
            assert r["max_diff"] == 0, r
        else:
            assert r["max_diff"] < 1e-4, r
    text = gemm_probe.markdown(rows)
    assert "| 8x33x17 |" in text and "| F.linear | compiled product |" in text
    assert text.count("bitwise") >= sum(r["max_diff"] == 0 for r in rows)


@pytest.mark.parametrize("argv", [["--shapes", "8x8"], ["--shapes", "0x8x8"], ["--shapes", "axbxc"],
                                  ["--threads", "0"], ["--samples", "0"]])
def test_bad_arguments(argv, capsys):
    with pytest.raises(SystemExit) as e:
        gemm_probe.main(argv)
    assert e.value.code == 2 and "error" in capsys.readouterr().err


def _mkl():
    sgemm = gemm_probe.mkl_sgemm()
    if sgemm is None:
        pytest.skip("MKL's sgemm_ is not exported by this process's libraries")
    return sgemm


class _Block(torch.nn.Module):
    """A post-norm MLP block: an activated product (GELU), then a linear into a residual LayerNorm."""

    def __init__(self, d=16, inner=48):
        super().__init__()
        self.up, self.down, self.norm = torch.nn.Linear(d, inner), torch.nn.Linear(inner, d), torch.nn.LayerNorm(d)

    def forward(self, x):
        return self.norm(x + self.down(torch.nn.functional.gelu(self.up(x))))


def test_forward_rewrites_take_their_steps_and_keep_every_bit():
    """The probe's rewrites of a compiled block: the product feeding the residual LayerNorm
    (F.linear's bits) and the activated product (the VM's GELU's bits) each take their step, and
    the block's output is bit for bit the graph's own under each (check_bits raises otherwise)."""
    from dvm.tools import gemm_probe_forward as fwd
    torch._dynamo.reset()
    torch.manual_seed(0)
    compiled = torch.compile(_Block().eval(), backend="dvm", dynamic=True)
    xs = [torch.randn(b, L, 16) for b, L in ((2, 7), (3, 5))]
    rw, counts = fwd.rewrite_graphs_of(lambda: compiled(xs[0]), _mkl())
    assert counts == {fwd.SYSTEMS[2]: 1, fwd.SYSTEMS[3]: 1}
    for x in xs:
        fwd.check_bits(rw, lambda: compiled(x), f"block {tuple(x.shape)}")
    assert rw.calls == {fwd.SYSTEMS[2]: 4, fwd.SYSTEMS[3]: 4}   # (two calls a system and size)
    rows = [{"model": "block", "cell": (2, 7), "steps": counts, "us": dict.fromkeys(fwd.SYSTEMS, 10.0)}]
    assert "| block | 2x7 | 1 / 1 | 10 µs | 10 µs (1.000x) |" in fwd.markdown(rows)


@pytest.mark.parametrize("argv", [["--forward", "nosuchmodel"], ["--forward", "bert", "--cells", "8"],
                                  ["--forward", "bert", "--cells", "0x8"], ["--forward", "bert", "--rounds", "0"]])
def test_bad_forward_arguments(argv, capsys):
    with pytest.raises(SystemExit) as e:
        gemm_probe.main(argv)
    assert e.value.code == 2
