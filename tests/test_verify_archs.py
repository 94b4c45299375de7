"""dvm verify archs: a transformers architecture built tiny, compiled with DVM, against eager (one
end to end, in its own process); a DVM failure stays a failure unless aot_eager fails alike; the
report counts statuses; bad arguments are usage errors."""
import json
import os

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from dvm.tools import cli, tiny_archs, verify_archs  # noqa: E402

pytestmark = [pytest.mark.cpu_vm, pytest.mark.vm_once]


def test_an_architecture_matches_eager_end_to_end(tmp_path, capsys):
    paths = {k: str(tmp_path / f"archs.{k}") for k in ("json", "md")}
    rc = verify_archs.main(match="^OPTForCausalLM$", mode="forward", json_path=paths["json"], md_path=paths["md"])
    (row,) = json.loads(open(paths["json"]).read())
    assert rc == 0, row
    assert row["name"] == "OPTForCausalLM" and row["status"] == "match" and row["max_err"] <= verify_archs.TOL
    assert "[1/1] OPTForCausalLM forward: match" in capsys.readouterr().err
    assert "1 architectures: 1 match" in open(paths["md"]).read()


def test_an_encoder_matches_eager_through_the_command(tmp_path, capsys):
    """`--head masked-lm` runs the *ForMaskedLM classes (the encoders)."""
    paths = [str(tmp_path / f"archs.{k}") for k in ("json", "md")]
    rc = cli.main(["verify", "archs", "--head", "masked-lm", "--match", "^DistilBertForMaskedLM$",
                   "--json", paths[0], "--md", paths[1]])
    (row,) = json.loads(open(paths[0]).read())
    assert rc == 0 and row["name"] == "DistilBertForMaskedLM" and row["status"] == "match", row
    assert "# dvm verify archs (forward, masked-lm)" in open(paths[1]).read()


@pytest.mark.parametrize("head, ending", [("causal-lm", "ForCausalLM"), ("masked-lm", "ForMaskedLM")])
def test_the_head_picks_the_classes(head, ending):
    names = verify_archs.architectures(head=head)
    assert len(names) > 20 and all(n.endswith(ending) for n in names)
    assert not any(n.startswith(("Auto", "TF")) for n in names)   # (factories, TensorFlow)


@pytest.mark.parametrize("types, keep", [(None, [0, 1]), (["full"] * 4, [0, 1]),
                                         (["sliding"] * 5 + ["full"], [0, 5]), (["linear", "full", "linear"], [0, 1])])
def test_a_tiny_model_keeps_the_first_layer_and_one_of_another_kind(types, keep):
    assert tiny_archs.kept_layers(types, 6 if types is None else len(types)) == keep


def test_per_layer_fields_are_cut_to_the_kept_layers():
    """Gemma 4 sets head_dim per layer (reading the config's own head_dim raises) in a
    per_layer_config keyed by the layer's index."""
    got = tiny_archs._per_layer({"05": {"head_dim": 512}, "11": {"head_dim": 512, "other": 1}}, [0, 5])
    assert got == {"01": {"head_dim": tiny_archs.TINY["head_dim"]}}
    model = tiny_archs.tiny_model("Gemma4ForCausalLM")
    assert model.config.layer_types == ["sliding_attention", "full_attention"]


def test_an_encoder_decoder_gets_its_tokens_as_decoder_inputs_too(tmp_path):
    """(T5's forward refuses to run without decoder inputs: it would be skipped, eager failing.)"""
    names = verify_archs.architectures(head="seq2seq-lm")
    assert {"BartForConditionalGeneration", "T5ForConditionalGeneration", "MarianMTModel"} <= set(names)
    path = str(tmp_path / "archs.json")
    rc = verify_archs.main(match="^T5ForConditionalGeneration$", head="seq2seq-lm", json_path=path, md_path=None)
    (row,) = json.loads(open(path).read())
    assert rc == 0 and row["status"] == "match", row


@pytest.mark.parametrize("aot_eager, want", [({"status": "match", "max_err": 0.0}, "MISMATCH"),
                                             ({"status": "MISMATCH", "detail": "off"}, "skipped")])
def test_a_dvm_failure_is_dvms_unless_aot_eager_fails_alike(monkeypatch, aot_eager, want):
    def check(name, mode, backend="dvm"):
        return {"status": "MISMATCH", "detail": "logits off"} if backend == "dvm" else aot_eager
    monkeypatch.setattr(verify_archs, "check", check)
    got = verify_archs.child("AnyForCausalLM", "train")
    assert got["status"] == want and got["mode"] == "train"
    if want == "skipped":
        assert got["detail"].startswith("aot_eager fails alike") and got["dvm"] == "logits off"


@pytest.mark.parametrize("stdout, outcome, want", [
    ("", -9, "skipped"),                                   # killed building the model (Blt: > 24 GiB)
    (verify_archs.COMPILING + "\n", -9, "DVM ERROR"),      # killed after DVM began
    (None, "timeout", "skipped"),
    (verify_archs.COMPILING.encode() + b"\n", "timeout", "timeout"),
])
def test_a_dead_child_is_dvms_only_after_its_first_compiled_call(monkeypatch, stdout, outcome, want):
    import subprocess

    def run(cmd, **kw):
        if outcome == "timeout":
            raise subprocess.TimeoutExpired(cmd, 1.0, output=stdout)
        return subprocess.CompletedProcess(cmd, outcome, stdout, "Killed\n")
    monkeypatch.setattr(verify_archs.subprocess, "run", run)
    got = verify_archs._run_one("XForCausalLM", "forward", 1.0)
    assert got["status"] == want, got
    if want == "skipped":
        assert "before its first compiled call" in got["detail"], got


def test_dvm_failing_to_import_is_dvms_error(monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "dvm.frontend.torch_backend", None)   # its import raises
    monkeypatch.setattr(verify_archs, "check", lambda *a, **k: pytest.fail("checked without DVM"))
    got = verify_archs.child("XForCausalLM", "forward")
    assert got["status"] == "DVM ERROR" and got["detail"].startswith("import: "), got


def test_failures_set_the_exit_status_and_lead_the_report(monkeypatch, tmp_path):
    rows = {"AForCausalLM": {"status": "match", "max_err": 1e-7}, "BForCausalLM": {"status": "DVM ERROR",
                                                                                   "detail": "KeyError: x\ny"}}
    monkeypatch.setattr(verify_archs, "architectures", lambda match=None, head="causal-lm": list(rows))
    monkeypatch.setattr(verify_archs, "_run_one", lambda name, mode, t: {"name": name, "mode": mode, **rows[name]})
    md = tmp_path / "r.md"
    assert verify_archs.main(jobs=2, json_path=None, md_path=str(md)) == 1
    text = md.read_text()
    assert "2 architectures: 1 DVM ERROR, 1 match" in text
    assert text.index("BForCausalLM") < text.index("AForCausalLM") and "KeyError: x y" in text


@pytest.mark.parametrize("argv", [["--match", "("], ["--jobs", "0"], ["--timeout", "0"]])
def test_bad_arguments_are_usage_errors(argv, capsys):
    assert cli.main(["verify", "archs", *argv]) == 2
    assert "dvm" in capsys.readouterr().err


def test_no_matching_architecture_is_a_usage_error(capsys):
    assert verify_archs.main(match="^NoSuchModelForCausalLM$", json_path=None, md_path=None) == 2
    assert "no causal-lm class matches" in capsys.readouterr().err


def test_train_mode_passes_over_an_empty_parameter():
    """(MobileBert's tiny config has a weight with no elements: its gradient has no largest value.)"""
    import copy
    from types import SimpleNamespace

    import torch

    class Tiny(torch.nn.Module):
        config = SimpleNamespace()

        def __init__(self):
            super().__init__()
            self.emb, self.empty = torch.nn.Embedding(256, 8), torch.nn.Parameter(torch.zeros(0, 8))

        def forward(self, input_ids):
            return SimpleNamespace(logits=self.emb(input_ids) + self.empty.sum())
    model = Tiny()
    twin = copy.deepcopy(model)
    assert verify_archs._train(model, twin, twin, torch.randint(0, 256, (1, 5))) == 0.0


@pytest.mark.parametrize("mixed_detail, want", [("eager fails: shape", "match"), ("too big: 9 parameters", "skipped")])
def test_a_hybrid_skipped_with_a_layer_of_each_kind_is_checked_with_its_first_two(monkeypatch, mixed_detail, want):
    def check(name, mode, backend, mixed):
        return {"status": "skipped", "detail": mixed_detail} if mixed else {"status": "match", "max_err": 0.0}
    monkeypatch.setattr(verify_archs, "_check", check)
    monkeypatch.setattr(verify_archs, "mixes_layers", lambda name: True)
    got = verify_archs.check("HybridForCausalLM", "forward")
    assert got["status"] == want
    assert ("layers" in got) == (want == "match")


def test_an_encoder_decoder_with_configs_per_half_is_built_tiny():
    """T5Gemma's encoder and decoder have configs of their own (full size by default: 5.6 billion
    parameters before the halves were cut)."""
    model = tiny_archs.tiny_model("T5GemmaForConditionalGeneration")
    assert model.config.encoder.hidden_size == model.config.decoder.hidden_size == tiny_archs.TINY["hidden_size"]
    assert sum(p.numel() for p in model.parameters()) < tiny_archs.MAX_PARAMS


def test_a_model_over_the_limit_is_refused_before_it_is_built(monkeypatch):
    """Counted on the meta device: a model of many gigabytes is never allocated."""
    import torch
    monkeypatch.setattr(tiny_archs, "MAX_PARAMS", 1000)
    monkeypatch.setattr(torch, "manual_seed", lambda *a: pytest.fail("the model was built"))
    with pytest.raises(tiny_archs.Skip, match=f"^{tiny_archs.TOO_BIG}: "):
        tiny_archs.tiny_model("LlamaForCausalLM")
