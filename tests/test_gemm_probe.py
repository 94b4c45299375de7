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
        if r["blas"].startswith("MKL"):
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
