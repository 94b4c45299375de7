"""`dvm bench lazy`, in-process on one small case and one model: the report's structure, finite
times, lazy results equal to eager's (no failures), the files it writes; CLI argument errors."""
import json
import math
import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("torch")
pytest.importorskip("transformers")

from dvm.tools import bench_lazy  # noqa: E402
from dvm.tools.cli import main  # noqa: E402

pytestmark = [pytest.mark.cpu_vm, pytest.mark.vm_once]   # runs once, on the default (CPU) VM


def _positive(x) -> bool:
    return isinstance(x, float) and math.isfinite(x) and x > 0


def test_report(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(bench_lazy, "WARMUP_CALLS", 2)
    monkeypatch.setattr(bench_lazy, "WARMUP_MAX", 4)
    paths = {k: str(tmp_path / f"lazy.{k}") for k in ("json", "md", "png")}
    rc = main(["bench", "lazy", "--sizes", "small", "--cases", "rmsnorm,adam", "--models", "llama", "--tokens", "2",
               "--rounds", "1", "--threads", "1", "--json", paths["json"], "--md", paths["md"], "--png", paths["png"]])
    assert rc == 0, capsys.readouterr().out
    report = json.load(open(paths["json"]))
    assert report["benchmark"] == "lazy" and report["failures"] == []
    assert [r["case"] for r in report["chains"]] == ["rmsnorm", "adam"]
    for row in report["chains"]:
        assert all(_positive(row[k]) for k in ("eager_s", "lazy_s", "forced_s", "lazy_speedup", "forced_speedup"))
        assert row["forced_per_call"]["flushes"] >= 1 and "mismatch" not in row
    (gen,) = report["generate"]
    assert gen["lazy_equal"] and gen["forced_equal"] and _positive(gen["eager_tokens_per_s"])
    assert gen["forced_per_token"]["flushes"] > 0
    text = open(paths["md"]).read()
    assert "| rmsnorm | small 32x128 |" in text and "| llama | 2 |" in text
    assert os.path.getsize(paths["png"]) > 0


@pytest.mark.parametrize("argv", [["--sizes", "huge"], ["--cases", "nope"], ["--models", "gpt"],
                                  ["--rounds", "0"], ["--tokens", "0"], ["--threads", "0"]])
def test_bad_arguments(argv, capsys):
    assert main(["bench", "lazy", *argv]) == 2
    assert "dvm: error:" in capsys.readouterr().err
