"""`dvm bench ops`, run in-process in its quick form (small shapes, no Inductor): the JSON, markdown
and PNG it writes, finite ratios, the correctness guard, and argument errors. No timing assertions."""
from __future__ import annotations

import json
import math
import sys

import numpy as np
import pytest

from dvm.config import config
from dvm.tools import bench_common, bench_ops, bench_ops_report
from dvm.tools.cli import main


@pytest.fixture(autouse=True)
def _fresh_config():
    config.cache_clear()
    yield
    config.cache_clear()


_QUICK_RUNS: dict = {}   # per VM: one quick run serves every test that reads it (it takes seconds)


@pytest.fixture
def quick_run(tmp_path_factory):
    """`dvm bench ops --quick --no-inductor` on the test's VM, run once per VM and module; tests
    read its results and must not change them."""
    vm = config().vm
    if vm not in _QUICK_RUNS:
        d = tmp_path_factory.mktemp(f"bench-ops-{vm}")
        paths = {k: str(d / f"ops.{k}") for k in ("json", "md", "png")}
        import contextlib
        import io
        out, err = io.StringIO(), io.StringIO()
        config.cache_clear()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main(["bench", "ops", "--quick", "--no-inductor", "--json", paths["json"],
                       "--md", paths["md"], "--png", paths["png"]])
        with open(paths["json"]) as f:
            report = json.load(f)
        _QUICK_RUNS[vm] = (rc, report, paths, out.getvalue(), err.getvalue())
    rc, report, paths, out, err = _QUICK_RUNS[vm]
    return rc, json.loads(json.dumps(report)), paths, out, err


def test_quick_run_succeeds_and_reports_progress(quick_run):
    rc, report, paths, out, err = quick_run
    assert rc == 0, out + err
    assert "[dvm bench ops]" in err                    # progress goes to stderr
    assert "| case |" in out and "wrote" in out          # tables and paths go to stdout
    assert report["failures"] == []


def test_json_structure(quick_run):
    _, report, _, _, _ = quick_run
    assert report["benchmark"] == "ops"
    assert report["vm"] == config().vm
    assert report["inductor"] is False and report["sizes"] == ["small"]
    assert report["shapes"] == [list(s) for s in bench_ops.SIZES["small"]]
    rows = report["results"]
    assert [r["case"] for r in rows] == list(bench_ops.CASE_NAMES)
    for r in rows:
        assert r["numel"] == int(np.prod(r["shape"])) and r["bytes"] > 0
        assert set(r["baselines"]) == set(bench_ops_report.BASELINES)
        assert r["dvm"]["status"] == "ok"
        for key in ("median_s", "gbps", "copy_fraction"):
            assert math.isfinite(r["dvm"][key]) and r["dvm"][key] > 0, (r["case"], key)
        for name, b in r["baselines"].items():
            assert b["status"] in ("ok", "n/a", "skipped"), (r["case"], name, b)
            if b["status"] == "ok":
                assert math.isfinite(b["ratio_to_dvm"]) and b["ratio_to_dvm"] > 0, (r["case"], name)
                assert math.isfinite(b["gbps"]) and b["gbps"] > 0
            else:
                assert b["ratio_to_dvm"] is None and b["note"]
        for name in ("numpy", "torch_eager", "copy", "reference_vm"):   # always run at small sizes
            want = "n/a" if name == "numpy" and r["case"].endswith("_bf16") else "ok"   # no bfloat16 NumPy
            assert r["baselines"][name]["status"] == want, (r["case"], name)
        assert r["baselines"]["inductor_static"]["status"] == "skipped"
    by_case = {r["case"]: r for r in rows}
    assert by_case["softmax"]["baselines"]["torch_native"]["status"] == "ok"
    assert by_case["rmsnorm"]["baselines"]["torch_native"]["status"] == "ok"
    assert by_case["tanh_exp"]["baselines"]["numexpr"]["status"] == "ok"
    assert by_case["bias_gelu"]["baselines"]["numexpr"]["status"] == "n/a"   # no erf in numexpr
    assert by_case["add_rmsnorm_bf16"]["baselines"]["torch_native"]["status"] == "ok"
    lo = report["launch_overhead"]
    for key in ("dvm_add", "dvm_chain8", "torch_add", "numpy_add"):
        assert math.isfinite(lo[key]["median_us"]) and lo[key]["median_us"] > 0
    assert math.isfinite(lo["dvm_vs_torch"])


def test_markdown_and_png_written(quick_run):
    _, report, paths, _, _ = quick_run
    with open(paths["md"]) as f:
        md = f.read()
    assert md.startswith("# dvm bench ops")
    for case in bench_ops.CASE_NAMES:
        assert f"| {case} |" in md
    assert "Cached launch overhead" in md
    with open(paths["png"], "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_reference_vm_skips_large_shapes_explicitly(monkeypatch):
    """With the reference VM selected, DVM at a large shape is skipped with a note, not silently."""
    monkeypatch.setenv("DVM_VM", "reference")
    config.cache_clear()
    r = bench_ops._Run(repeat=1, min_total_s=0.0, inductor=False, quiet=True)
    case = next(c for c in bench_ops.CASES if c.name == "sum_last")
    row = r.bench_case(case, (bench_ops.REFERENCE_MAX_NUMEL // 64 + 1, 64), np.random.default_rng(0))
    assert row["dvm"]["status"] == "skipped" and row["dvm"]["note"] == "skipped: reference VM"
    assert row["baselines"]["reference_vm"]["status"] == "skipped"
    assert row["baselines"]["numpy"]["ratio_to_dvm"] is None
    assert "skipped: reference VM" in bench_ops.markdown(_fake_report(row))


def _fake_report(row: dict) -> dict:
    return {"machine": {"cpu": "test", "cores": 2}, "vm": "reference", "date": "now", "threads": 2,
            "repeat": 1, "loadavg_1min": {"start": 0.0, "end": 0.0}, "seconds": 0.0,
            "reference_vm_max_numel": bench_ops.REFERENCE_MAX_NUMEL, "results": [row], "inductor": False,
            "launch_overhead": {"budget_us": 10.0, "dvm_within_budget": False, "dvm_vs_torch": 1.0},
            "failures": []}


def test_mismatch_aborts_the_case_loudly(monkeypatch, capsys):
    """A DVM result that disagrees with NumPy aborts that case: reported, not timed, exit 1."""
    good = bench_ops.CASES[0]
    bad = bench_ops.Case(good.name, good.what, good.kernel, good.n_vectors, good.n_full,
                         lambda x: good.numpy(x) + np.float32(1e-2), good.kind)
    r = bench_ops._Run(repeat=1, min_total_s=0.0, inductor=False, quiet=True)
    row = r.bench_case(bad, (4, 8), np.random.default_rng(0))
    assert row["dvm"]["status"] == "mismatch" and "disagrees with NumPy" in row["dvm"]["note"]
    assert "median_s" not in row["dvm"] and row["baselines"] == {}
    assert r.failed and "MISMATCH" in capsys.readouterr().err


def test_call_on_vm_matches_the_kernel():
    from dvm.tools.bench_encode import _ref_softmax, softmax
    x = np.random.default_rng(1).standard_normal((5, 7), dtype=np.float32)
    forced = bench_ops.call_on_vm(softmax, [x], "reference")
    if config().vm == "reference":
        np.testing.assert_array_equal(forced, softmax(x))
    np.testing.assert_allclose(forced, _ref_softmax(x), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("argv, msg", [
    (["--sizes", "huge"], "unknown size class"),
    (["--cases", "conv"], "unknown case"),
    (["--repeat", "0"], "--repeat"),
    (["--inductor", "--no-inductor"], "not allowed"),
])
def test_bad_arguments_are_usage_errors(argv, msg, capsys):
    assert main(["bench", "ops", *argv, "--json", "-", "--md", "-", "--png", "-"]) == 2
    err = capsys.readouterr().err
    assert msg in err and "Traceback" not in err


def test_copy_roofline_buffers_do_not_alias_modulo_4096():
    """The roofline copies between 64-byte aligned buffers COPY_DELTA bytes apart modulo 4096
    (two plain allocations land 16 bytes apart, where a copy stalls on 4K aliasing)."""
    from dvm.tools.bench_ops import COPY_DELTA, copy_pair

    for n in (1, 1000, 4096, 65536, 300_001):
        src, dst = copy_pair(n)
        assert src.shape == dst.shape == (n,) and src.dtype == dst.dtype == np.float32
        assert (src == 1).all() and (dst == 0).all()
        assert src.ctypes.data % 4096 == 0
        assert (dst.ctypes.data - src.ctypes.data) % 4096 == COPY_DELTA
        np.copyto(dst, src)
        assert (dst == 1).all()


def test_a_second_run_lists_the_dvm_times_that_moved(quick_run):
    """The report compares DVM's times with the JSON an earlier run left (the regression that hid
    in the tables from 3fdd267 to 82ebec2: first-axis sums 4-13x slower)."""
    _, report, paths, _, _ = quick_run
    previous = json.loads(json.dumps(report))
    rows = {r["case"]: r for r in previous["results"]}
    rows["sum_first"]["dvm"]["median_s"] /= 10      # "it was 10x faster before"
    rows["softmax"]["dvm"]["median_s"] *= 1.2       # within the factor: not listed
    changes = bench_ops_report.compare(previous, report)
    assert [(m["case"], m["shape"]) for m in changes["moved"]] == [("sum_first", rows["sum_first"]["shape"])]
    assert changes["moved"][0]["after_s"] / changes["moved"][0]["before_s"] == pytest.approx(10)
    md = bench_ops_report.markdown({**report, "changes_vs_previous": changes})
    assert "## DVM against the previous run" in md and "| sum_first | 32x128 |" in md and "| 10.00 |" in md
    assert "No DVM time moved" in bench_ops_report.markdown(
        {**report, "changes_vs_previous": bench_ops_report.compare(report, report)})
    other = {**previous, "threads": report["threads"] + 1}
    assert "skipped" in bench_ops_report.compare(other, report)


def test_the_previous_json_is_read_and_a_bad_one_ignored(tmp_path, capsys):
    """bench ops compares with the JSON it is about to overwrite (bench_common.read_report); an
    unreadable one is named, not fatal."""
    path = tmp_path / "ops.json"
    path.write_text("{not json")
    assert bench_common.read_report(str(path), "ops", sys.stdout) is None
    assert "not comparing with" in capsys.readouterr().out
    path.write_text(json.dumps({"benchmark": "models"}))
    assert bench_common.read_report(str(path), "ops", sys.stdout) is None
    path.write_text(json.dumps({"benchmark": "ops", "results": []}))
    assert bench_common.read_report(str(path), "ops", sys.stdout) == {"benchmark": "ops", "results": []}
    assert bench_common.read_report(str(tmp_path / "absent.json"), "ops", sys.stdout) is None


def test_bfloat16_results_are_checked_in_their_dtype():
    """A bfloat16 case's results (NumPy's ml_dtypes arrays, torch tensors) are compared with the
    float32 reference in value, and a result of another dtype is a mismatch, not a pass."""
    import ml_dtypes
    import torch
    from dvm.tools.bench_ops_baselines import Mismatch, as_tensor, check
    want = np.linspace(-3, 3, 12, dtype=np.float32).reshape(3, 4)
    got = want.astype(ml_dtypes.bfloat16)
    check(got, want, 1.6e-2, 1e-5, "DVM", dtype="bfloat16")
    check(as_tensor(got), want, 1.6e-2, 1e-5, "eager", dtype="bfloat16")
    assert torch.equal(as_tensor(got[:, 1:3]).float(), torch.from_numpy(got[:, 1:3].astype(np.float32)))
    with pytest.raises(Mismatch, match="got float32"):
        check(want, want, 1.6e-2, 1e-5, "DVM", dtype="bfloat16")
    with pytest.raises(Mismatch, match="disagrees"):
        check((want + 0.5).astype(ml_dtypes.bfloat16), want, 1.6e-2, 1e-5, "DVM", dtype="bfloat16")
