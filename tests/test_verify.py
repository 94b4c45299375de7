"""The accuracy verification mode (dvm.verify, DVM_VERIFY=1) and its reproducers (dvm repro):
every kernel of a compiled function or model is checked against eager and float64; a wrong kernel
is caught, named, and leaves a reproducer that `dvm repro` replays on every VM; a reproducer whose
Program is malformed is rejected by the verifier, never run."""
import json
import os
import subprocess
import sys
import weakref

import numpy as np
import pytest

torch = pytest.importorskip("torch")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import dvm  # noqa: E402
import dvm.runtime.compiled as compiled_mod  # noqa: E402
from dvm.codegen.program import Program, float_bits  # noqa: E402
from dvm.frontend import torch_segment  # noqa: E402
from dvm.tools.verify import session  # noqa: E402
from dvm.tools.cli import main as cli  # noqa: E402

pytestmark = [pytest.mark.cpu_vm, pytest.mark.vm_once]
CONSTANT = 0.7   # chain's literal: a constant of its Program (a global would become a float64 input)


def chain(x, y):
    return torch.tanh(x * 0.7 + y) * torch.sigmoid(y), (x - y).sum(-1)


def _inputs(dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    return torch.randn(13, 70, generator=g).to(dtype), torch.randn(70, generator=g).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_verify_passes_a_correct_function(dtype, tmp_path):
    torch._dynamo.reset()
    report = dvm.verify(chain, *_inputs(dtype), repro_dir=str(tmp_path))
    assert report.rows and report.passed, report.markdown()
    row = report.rows[0]
    assert {"mul.Tensor", "add.Tensor", "tanh", "sigmoid", "sum.dim_IntList"} <= set(row["ops"])
    assert row["calls"] == 1 and row["vector_kernels"] >= 1
    assert not list(tmp_path.iterdir())            # no reproducer for a passing kernel
    text = report.markdown()
    assert "same() pass 1/1" in text and "NPU ratios pass 1/1" in text and row["kernel"] in text
    json.dumps(report.as_json(), allow_nan=False)  # the JSON report is plain JSON
    out, _ = report.output   # the call's result (bf16 / f16: DVM rounds fewer intermediates than eager)
    assert out.dtype == dtype and out.shape == (13, 70)


def test_verify_keeps_dvm_verify_a_program_verifier():
    prog = dvm.kernel(lambda k, x: k.store(k.exp(k.load(x)))).program(np.ones(3, np.float32))
    assert len(dvm.verify(prog).kernels) == 1


def _perturbed(encode):
    """encode_program, with the float constant CONSTANT of every Program nudged by 1e-3."""
    bits, wrong = float_bits(CONSTANT), float_bits(CONSTANT * 1.001)

    def encode_wrong(*args, **kwargs):
        prog = encode(*args, **kwargs)
        words = prog.words.copy()
        assert (words == bits).sum() == 1, "the constant is in the Program's constant pool"
        words[words == bits] = wrong
        return Program(words)
    return encode_wrong


def test_a_wrong_kernel_is_caught_named_and_reproduced(tmp_path, monkeypatch, capsys):
    torch._dynamo.reset()
    # (graphs of their own, as in a fresh process: equal graphs share their Programs)
    monkeypatch.setattr(compiled_mod, "_SHARED", weakref.WeakValueDictionary())
    monkeypatch.setattr(compiled_mod, "encode_program", _perturbed(compiled_mod.encode_program))
    report = dvm.verify(chain, *_inputs(), repro_dir=str(tmp_path), label="injected")
    assert not report.passed
    bad = report.failures()
    assert len(bad) == 1, report.markdown()
    row = bad[0]
    assert row["same_failures"] == 1 and row["npu_failures"] == 1
    assert "mul.Tensor" in row["ops"] and row["kernel"] in report.markdown()
    assert "FAIL" in report.markdown()
    path = row["repro"]
    assert path and os.path.exists(path) and path.startswith(str(tmp_path))

    capsys.readouterr()
    assert cli(["repro", path]) == 1                 # replays, on every VM, and fails again
    out = capsys.readouterr().out
    assert row["kernel"] in out and "the failure reproduces" in out, out
    for vm in ("cpu", "reference"):
        assert f"  {vm}" in out
    assert "bitwise the captured result" in out and "DIFFERS" not in out

    with np.load(path, allow_pickle=False) as z:       # the same reproducer with a broken Program
        arrays = {k: z[k] for k in z.files}
    arrays["program"] = arrays["program"].copy()
    arrays["program"][2] += 1                        # the header's length word
    broken = tmp_path / "broken.npz"
    np.savez(broken, **arrays)
    assert cli(["repro", str(broken)]) == 2
    assert "rejected by the verifier" in capsys.readouterr().err


def test_repro_rejects_a_file_that_is_not_one(tmp_path, capsys):
    path = tmp_path / "x.npz"
    np.savez(path, a=np.zeros(3))
    assert cli(["repro", str(path)]) == 2
    assert "not a DVM reproducer" in capsys.readouterr().err


def test_the_hook_is_off_outside_a_session():
    assert torch_segment.VERIFY is None
    torch._dynamo.reset()
    with session(repro_dir=None) as s:
        assert torch_segment.VERIFY is s
        torch.compile(chain, backend="dvm", dynamic=True)(*_inputs())
    assert torch_segment.VERIFY is None
    assert s.report().summary()["launches"] == 1


def test_dvm_verify_environment_variable(tmp_path):
    script = ("import torch\n"
              "def f(x):\n    return torch.exp(x * 0.5).sum(-1)\n"
              "torch.compile(f, backend='dvm', dynamic=True)(torch.randn(5, 9))\n")
    env = dict(os.environ, DVM_VERIFY="1", DVM_DUMP_DIR=str(tmp_path))
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "same() pass 1/1" in proc.stderr
    report = json.loads((tmp_path / "verify.json").read_text())
    assert report["summary"]["kernels"] == 1 and report["summary"]["passed"]


def test_dvm_verify_model_command(tmp_path, capsys):
    """`dvm verify --model`: a bf16 forward of the tiny Llama (the training tests verify every
    kernel of forward and backward in f32 and bf16 autocast)."""
    out = tmp_path / "v.json"
    rc = cli(["verify", "--model", "llama", "--dtypes", "bfloat16", "--lengths", "9", "--batch", "1",
              "--no-backward", "--json", str(out), "--md", "-", "--repro-dir", str(tmp_path / "r")])
    report = json.loads(out.read_text())
    assert rc == 0, report["failures"]
    (run,) = report["runs"]
    assert run["model"] == "llama" and run["dtype"] == "bfloat16" and run["summary"]["passed"]
    assert run["summary"]["kernels"] >= 5
    text = capsys.readouterr().out
    assert "| llama | bfloat16 |" in text and "### llama, bfloat16" in text
