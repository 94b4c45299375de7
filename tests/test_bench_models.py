"""`dvm bench models --quick` and `dvm demo --no-inductor`, in-process: the report's structure,
finite numbers, DVM's logits within tolerance of eager, no DVM recompiles beyond Dynamo's own
size-1 specializations."""
import json
import math
import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("torch")
pytest.importorskip("transformers")

from dvm.tools import bench_models, bench_models_run  # noqa: E402
from dvm.tools.cli import main  # noqa: E402

pytestmark = [pytest.mark.cpu_vm, pytest.mark.vm_once]   # runs once, on the default (CPU) VM


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0


def test_stream_lengths():
    lengths = bench_models.stream_lengths(32, seed=0)
    assert len(lengths) == len(set(lengths)) == 32
    assert 1 in lengths and all(1 <= x <= 1024 for x in lengths)
    for lo, hi in bench_models.BUCKETS:
        assert any(lo <= x <= hi for x in lengths)
    assert bench_models.stream_lengths(32, seed=0) == lengths
    stream = bench_models.make_stream(lengths, [1, 3], seed=0)
    assert sorted(stream) == sorted((b, L) for L in lengths for b in (1, 3))


def test_compare_logits():
    """The stream's check against eager: within rtol = atol = 1e-4, a value outside it, a shape."""
    import torch
    want = torch.tensor([[1.0, -2.0], [1e3, 0.0]])
    err, why = bench_models_run.compare(want + 5e-5, want)
    assert 0 < err < 1e-4 and why == ""
    err, why = bench_models_run.compare(want + torch.tensor([[0.0, 0.0], [0.0, 1e-3]]), want)
    assert err == pytest.approx(1e-3) and why.startswith("max abs err")
    err, why = bench_models_run.compare(want[:1], want)
    assert err == math.inf and why == "shape (1, 2) vs (2, 2)"


def test_bench_models_quick(tmp_path, capsys):
    paths = {k: str(tmp_path / f"models.{k}") for k in ("json", "md", "png")}
    assert main(["bench", "models", "--quick", "--layers", "3", "--json", paths["json"], "--md", paths["md"],
                 "--png", paths["png"]]) == 0
    captured = capsys.readouterr()
    assert "[dvm bench models]" in captured.err and "llama dvm: [1/6]" in captured.err   # progress on stderr
    assert "| system | first call" in captured.out
    assert os.path.getsize(paths["png"]) > 0 and os.path.getsize(paths["md"]) > 0
    report = json.loads(open(paths["json"]).read())
    assert report["benchmark"] == "models" and report["failures"] == []
    assert report["systems"] == ["eager", "dvm"] and report["batches"] == [1]
    assert report["layers"] == 3 and "3 layers" in report["models"]["llama"]["what"]
    assert len(report["lengths"]) == 6 and 1 in report["lengths"]
    assert _finite(report["loadavg_1min"]["start"]) and report["machine"]["cores"] >= 1
    per = report["models"]["llama"]["systems"]
    assert set(per) == {"eager", "dvm"}
    for name, s in per.items():
        for key in ("first_call_s", "tracing_first_s", "backend_compile_first_s", "backend_compile_total_s",
                    "stream_total_s"):
            assert _finite(s[key]), (name, key, s[key])
        assert s["stream_total_s"] >= s["first_call_s"]
        assert len(s["calls"]) == 6 and all(_finite(c["s"]) for c in s["calls"])
        assert {(x["batch"], x["length"]) for x in s["steady"]} == {(1, L) for L in report["lengths"]}
        assert all(_finite(x["median_s"]) for x in s["steady"])
        for bk in report["buckets"]:
            v = s["buckets"]["1"][bk]
            assert v is None or _finite(v)
        assert not s["recompile_limit_hit"]
    # the compiled system's steady-state calls alternate with eager calls: ratios per bucket
    assert per["eager"]["speedup_vs_eager"] is None
    assert all(_finite(x["eager_median_s"]) for x in per["dvm"]["steady"])
    assert all(v is None or (_finite(v) and v > 0) for v in per["dvm"]["speedup_vs_eager"]["1"].values())
    assert "Speed-up over eager timed side by side" in open(paths["md"]).read()
    d = per["dvm"]
    assert d["within_tolerance"] and _finite(d["max_abs_err"]) and d["max_abs_err"] <= 1e-3
    assert d["backend_compile_first_s"] > 0 and d["backend_compiles"] >= 1
    # no recompiles beyond Dynamo's one-time specializations of sizes equal to 1
    info = d["dvm"]
    assert info["size1_patterns"] == len({L == 1 for L in report["lengths"]}) == 2
    assert 1 <= d["graphs"] <= info["size1_patterns"]
    assert info["recompiles_beyond_size1"] == 0 and d["graphs_after_stream"] == 0
    assert info["graph_fallbacks"] == {}
    g = info["main_graph"]
    assert g["vector_kernels"] > 0 and g["segments"] > 0 and g["cube_ops"] > 0
    assert g["fallback_ops"] == sum(g["fallbacks"].values())


def test_bench_models_rejects_bad_arguments(capsys):
    assert main(["bench", "models", "--models", "gpt9", "--json", "-"]) == 2
    assert main(["bench", "models", "--batches", "0", "--json", "-"]) == 2
    assert main(["bench", "models", "--lengths", "2000", "--json", "-"]) == 2
    assert main(["bench", "models", "--layers", "0", "--json", "-"]) == 2
    assert main(["bench", "models", "--zoo", "--layers", "4", "--json", "-"]) == 2
    err = capsys.readouterr().err
    assert "gpt9" in err and "--batches" in err and "--lengths" in err and "Traceback" not in err
    assert "--layers must be in 1 .. 64" in err and "not to --zoo" in err


def test_demo_without_inductor(capsys):
    assert main(["demo", "--no-inductor"]) == 0
    out = capsys.readouterr().out
    assert "DVM (dynamic=True)" in out and "eager" in out and "Inductor dynamic=True" not in out
    assert "match eager" in out and "FAILED" not in out
    assert "DVM (dynamic=True): speed-up over eager" in out
