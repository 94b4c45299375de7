"""`dvm bench floor`: the hand-fused C loops compute what the DVM kernels compute (checked against
the cases' NumPy references), the run writes its JSON and markdown, and bad arguments are usage
errors. The C parts are skipped on a machine without a C compiler with OpenMP. No timing
assertions."""
from __future__ import annotations

import contextlib
import io
import json
import shutil

import numpy as np
import pytest

from dvm.config import config
from dvm.tools import bench_floor
from dvm.tools.bench_ops_baselines import check
from dvm.tools.cli import main

needs_cc = pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None,
                              reason="no C compiler on PATH")


@pytest.fixture(scope="module")
def libs(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("floor"))
    return {name: bench_floor.build(name, d) for name in bench_floor.BUILDS}


@needs_cc
@pytest.mark.parametrize("build", sorted(bench_floor.BUILDS))
@pytest.mark.parametrize("chain", bench_floor.CHAINS)
def test_c_loops_compute_the_cases(libs, build, chain, vm):
    lib = libs[build]
    if lib.lib is None:
        pytest.skip(lib.error)   # e.g. a C library without libmvec
    if vm != "reference" or not lib.has(chain):   # the C loops do not depend on the VM: run them once
        pytest.skip("C loop runs once" if lib.has(chain) else f"no {build} form of {chain}")
    case = bench_floor._case(chain)
    shape = (37, 129)   # rows of an odd width: every loop has a remainder after its vector part
    inputs = case.inputs(np.random.default_rng(1), shape)
    want = (case.exact(*inputs) if case.exact else case.numpy(*inputs)).astype(np.float32)
    lib.lib.dvm_floor_threads(2)
    run = lib.runner(chain, inputs)
    check(run(), want, *case.tolerance(shape, want), f"C {build} {chain}")
    out = run()                      # the same preallocated output, written again
    check(out, want, *case.tolerance(shape, want), f"C {build} {chain} (second call)")


@needs_cc
def test_loading_the_fast_math_build_keeps_subnormals(libs):
    """The libmvec build is compiled with -ffast-math; loading it must not set flush-to-zero /
    denormals-are-zero for the process (GCC's crtfastmath.o does that when it is linked in),
    or every later NumPy and VM result with subnormals changes."""
    assert all(lib.lib is not None or lib.error for lib in libs.values())
    tiny = np.array([1e-40, -3e-39], np.float32)
    assert np.all(tiny * np.float32(1.0) == tiny) and bench_floor._subnormals_kept()


def test_missing_compiler_is_reported_not_raised(tmp_path, monkeypatch):
    monkeypatch.setattr(bench_floor.shutil, "which", lambda name: None)
    lib = bench_floor.build("ours", str(tmp_path))
    assert lib.lib is None and "no C compiler" in lib.error
    assert not lib.has("chain8")


def test_run_writes_json_and_markdown(tmp_path, vm):
    config.cache_clear()
    paths = {k: str(tmp_path / f"floor.{k}") for k in ("json", "md")}
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["bench", "floor", "--shape", "16x256", "--cases", "silu_mul,chain8", "--repeat", "1",
                   "--json", paths["json"], "--md", paths["md"]])
    assert rc == 0, out.getvalue() + err.getvalue()
    assert "[dvm bench floor]" in err.getvalue() and "| case |" in out.getvalue()
    with open(paths["json"]) as f:
        report = json.load(f)
    assert report["benchmark"] == "floor" and report["failures"] == []
    assert [r["case"] for r in report["rows"]] == ["silu_mul", "chain8"]
    for r in report["rows"]:
        assert r["shape"] == [16, 256] and r["dvm_s"] > 0 and r["copy_s"] > 0
        for name in bench_floor.BUILDS:   # a time, or None with the build listed as unavailable
            assert (r[name] is not None and r[name] > 0) or name in report["unavailable"]
    with open(paths["md"]) as f:
        assert "VM / C floor" in f.read()


@pytest.mark.parametrize("argv, msg", [
    (["--shape", "12"], "ROWSxCOLS"),
    (["--shape", "0x5"], "at least 1"),
    (["--cases", "softmax"], "unknown softmax"),
    (["--threads", "0"], "--threads"),
    (["--repeat", "0"], "--repeat"),
])
def test_bad_arguments_are_usage_errors(argv, msg, capsys):
    assert main(["bench", "floor", *argv, "--json", "-", "--md", "-"]) == 2
    assert msg in capsys.readouterr().err
