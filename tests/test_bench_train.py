"""`dvm bench train`, in-process on one small model and cell without Inductor: the report's
structure, finite times, DVM's loss and gradients equal to eager's (no failures), the files it
writes; the gradient check catching a wrong, a missing and an unexpected gradient, and telling
eager's rounding (against the step in float64) from a system's error; the labels
(pads ignored); CLI argument errors."""
import json
import math
import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from dvm.tools import bench_train  # noqa: E402
from dvm.tools.bench_zoo_models import ZOO  # noqa: E402
from dvm.tools.cli import main  # noqa: E402

pytestmark = [pytest.mark.cpu_vm, pytest.mark.vm_once]   # runs once, on the default (CPU) VM


def test_report(tmp_path, capsys):
    paths = {k: str(tmp_path / f"train.{k}") for k in ("json", "md", "png")}
    rc = main(["bench", "train", "--models", "gpt2", "--cells", "2x8", "--no-inductor", "--rounds", "1",
               "--threads", "1", "--json", paths["json"], "--md", paths["md"], "--png", paths["png"]])
    assert rc == 0, capsys.readouterr().out
    report = json.load(open(paths["json"]))
    assert report["benchmark"] == "train" and report["failures"] == [] and report["inductor"] is False
    (cell,) = report["models"]["gpt2"]["cells"]
    assert (cell["batch"], cell["length"]) == (2, 8)
    assert set(cell["seconds"]) == {"eager", "dvm"}
    assert all(math.isfinite(t) and t > 0 for t in cell["seconds"].values())
    assert cell["dvm_x"] == pytest.approx(cell["seconds"]["eager"] / cell["seconds"]["dvm"])
    assert cell["grad_err"]["dvm"] < bench_train.RTOL and "mismatches" not in cell
    assert cell["dvm_launches_per_step"] >= 2           # a forward and a backward segment at least
    assert report["summary"]["cells"] == 1 and report["summary"]["inductor_geomean_x"] is None
    text = open(paths["md"]).read()
    assert "| gpt2 | 2x8 |" in text
    assert os.path.getsize(paths["png"]) > 0


def _grads(*shapes):
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(s, generator=gen) for s in shapes]


def test_mismatch_names_what_differs():
    loss, grads = torch.tensor(2.0), _grads((3, 4), (4,))
    assert bench_train.mismatch(loss, [g.clone() for g in grads], loss, grads) == (0.0, "")
    bent = [grads[0].clone(), grads[1] + torch.tensor([0, 0, 1e-2, 0])]
    worst, why = bench_train.mismatch(loss, bent, loss, grads)
    assert worst == pytest.approx(1e-2) and why.startswith("parameter 1 (4,): max abs err 0.01")
    assert "loss 2.1 vs 2" in bench_train.mismatch(torch.tensor(2.1), grads, loss, grads)[1]
    assert bench_train.mismatch(loss, [grads[0], None], loss, grads)[1] == "parameter 1: gradient missing"
    assert bench_train.mismatch(loss, grads, loss, [grads[0], None])[1] == "parameter 1: gradient unexpected"


def test_judge_tells_eagers_rounding_from_a_systems_error():
    """Outside eager's tolerance: eager's rounding where the system is within float64's and eager is
    not; the system's error otherwise (and float64's step is taken only then)."""
    loss, exact = torch.tensor(2.0), _grads((3, 4))
    ref = (loss.double(), [g.double() for g in exact])
    asked = []

    def reference():
        asked.append(1)
        return ref
    off = [exact[0] + 1e-2]
    assert bench_train.judge(loss, exact, loss, exact, reference) == (0.0, "", False) and not asked
    worst, why, eagers = bench_train.judge(loss, exact, loss, off, reference)     # eager is the one off
    assert eagers and why.startswith("parameter 0") and worst == pytest.approx(1e-2, rel=1e-4)
    assert bench_train.judge(loss, off, loss, exact, reference)[1:] == (why, False) and len(asked) == 2


def test_float64_step_is_the_step_in_double():
    model, kw = ZOO["gpt2"].build(), bench_train.step_inputs(ZOO["gpt2"], 1, 8, 0)
    loss, grads = bench_train.float64_step(model, kw)
    want = bench_train.make_step(model, model, kw)()
    assert all(g.dtype == torch.float64 for g in grads if g is not None)   # (HF takes the loss in float32)
    assert all(p.dtype == torch.float32 for p in model.parameters())   # the model itself untouched
    assert bench_train.mismatch(want, bench_train.gradients(model), loss, grads) == (pytest.approx(0, abs=1e-5), "")


def test_labels_ignore_an_encoders_pads():
    kw = bench_train.step_inputs(ZOO["bert"], 2, 8, 0)
    pads = kw["attention_mask"] == 0
    assert pads.any() and bool((kw["labels"][pads] == bench_train.IGNORE_INDEX).all())
    assert torch.equal(kw["labels"][~pads], kw["input_ids"][~pads])
    kw = bench_train.step_inputs(ZOO["t5"], 2, 8, 0)            # an encoder-decoder: the decoder's ids
    assert torch.equal(kw["labels"], kw["decoder_input_ids"])


def test_parse_cells():
    assert bench_train.parse_cells("1x64, 4x256") == [(1, 64), (4, 256)]
    for bad in ("", "4", "0x8", "4x", "ax8", "4x-8"):
        with pytest.raises(ValueError):
            bench_train.parse_cells(bad)


@pytest.mark.parametrize("argv", [["--models", "resnet"], ["--cells", "4"], ["--rounds", "0"], ["--threads", "0"]])
def test_bad_arguments(argv, capsys):
    assert main(["bench", "train", *argv]) == 2
    assert "dvm: error:" in capsys.readouterr().err
