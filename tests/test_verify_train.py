"""End-to-end verification (dvm verify train, dvm verify ddp) at a small size: the tiny Llama and
Qwen2-MoE train a few steps eagerly in float64, float32 and bf16 autocast and compiled with DVM
(every kernel launch of the DVM runs verified as well): the loss curves and final parameters pass
the accuracy rules; under DDP (2 processes, gloo) the compiled Llama's per-step losses match one
process within float32's tolerance and the ranks' parameters stay identical."""
import json
import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from dvm.tools import verify_ddp, verify_train  # noqa: E402

pytestmark = [pytest.mark.cpu_vm, pytest.mark.vm_once]
STEPS = 3


@pytest.mark.parametrize("name", verify_train.MODEL_NAMES)
def test_training_curves_pass_the_rules(name, tmp_path):
    paths = {k: str(tmp_path / f"train.{k}") for k in ("json", "md", "png")}
    rc = verify_train.main(models=[name], steps=STEPS, size="small", kinds=("eager", "dvm"), verify_kernels=True,
                           repro_dir=str(tmp_path / "repros"), json_path=paths["json"], md_path=paths["md"],
                           png_path=paths["png"], out=open(os.devnull, "w"))
    report = json.loads(open(paths["json"]).read())
    assert rc == 0, report["failures"]
    m = report["models"][name]
    assert set(m["losses"]) == {"eager_f64", "eager_f32", "dvm_f32", "eager_bf16", "dvm_bf16"}
    assert all(len(v) == STEPS for v in m["losses"].values())
    assert max(m["deviation"]["dvm_f32"]) < 1e-5          # float32 follows float64 closely
    for p in ("f32", "bf16"):
        assert m["rules"][p]["dvm"]["passed"]
        k = m["kernels"][f"dvm_{p}"]
        assert k["passed"] and k["kernels"] >= 10 and k["launches"] >= STEPS * k["kernels"] // 2
    assert os.path.getsize(paths["png"]) > 0 and "| step |" in open(paths["md"]).read()


def test_ddp_matches_one_process():
    r = verify_ddp.run("llama", steps=STEPS, size="small", precision="f32")
    assert r["ranks_identical"], r["ranks_identical_each_step"]
    assert r["losses_match"], (r["single_losses"], r["ddp_losses"])
    assert len(r["rank_losses"]) == verify_ddp.WORLD and r["rank_losses"][0] != r["rank_losses"][1]
    assert r["passed"]
