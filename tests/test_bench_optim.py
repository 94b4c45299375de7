"""`dvm bench optim`, in-process on the small shape: the report's structure, finite times, compiled
steps equal to eager's (no failures), DVM storing the updates into the parameters, the files it
writes; CLI argument errors."""
import json
import math
import os

import pytest

pytest.importorskip("torch")

from dvm.tools.cli import main  # noqa: E402

pytestmark = [pytest.mark.cpu_vm, pytest.mark.vm_once]   # runs once, on the default (CPU) VM


def test_report(tmp_path, capsys):
    paths = {k: str(tmp_path / f"optim.{k}") for k in ("json", "md", "png")}
    rc = main(["bench", "optim", "--sizes", "small", "--optimizers", "adam,sgd", "--rounds", "1", "--threads", "1",
               "--json", paths["json"], "--md", paths["md"], "--png", paths["png"]])
    assert rc == 0, capsys.readouterr().out
    report = json.load(open(paths["json"]))
    assert report["benchmark"] == "optim" and report["failures"] == []
    assert [(c["optimizer"], c["foreach"]) for c in report["cases"]] == \
        [("adam", False), ("adam", True), ("sgd", False), ("sgd", True)]
    for c in report["cases"]:
        assert all(math.isfinite(t) and t > 0 for t in c["seconds"].values())
        assert set(c["seconds"]) == {"eager", "dvm", "inductor"}
        assert c["per_step"]["torch_segment_launches"] >= 1
        # at most the step counters (0-d, read by several kernels) are copied in
        assert c["per_step"]["torch_input_updates_copied"] <= 4
    text = open(paths["md"]).read()
    assert "| adam | False | 32x128 |" in text and "| sgd | True | 32x128 |" in text
    assert os.path.getsize(paths["png"]) > 0


@pytest.mark.parametrize("argv", [["--sizes", "huge"], ["--optimizers", "lion"], ["--rounds", "0"],
                                  ["--threads", "0"]])
def test_bad_arguments(argv, capsys):
    assert main(["bench", "optim", *argv]) == 2
    assert "dvm: error:" in capsys.readouterr().err
