"""The model zoo of `dvm bench models --zoo` (small configs, random weights, no downloads) under
torch.compile(backend="dvm", dynamic=True): outputs equal to eager's at a few shapes (batch > 1,
so that an encoder's padding mask has padded rows; one Dynamo graph for both shapes), no graph
falling back to PyTorch; and the zoo report's arithmetic (speed-ups, fixed cost, misses)."""
import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import dvm.frontend.torch_backend  # noqa: E402,F401
from dvm.runtime import counters  # noqa: E402
from dvm.tools import bench_zoo, bench_zoo_report  # noqa: E402
from dvm.tools.bench_zoo_models import ZOO, first_output, inputs  # noqa: E402

pytestmark = [pytest.mark.cpu_vm, pytest.mark.vm_once]   # runs once, on the default (CPU) VM
SHAPES = [(2, 9), (3, 31)]
# llama and qwen2_moe are tested over many lengths in tests/test_hf_models.py; the realistic-width
# configs are their architectures at hidden 1024
SMALL = [name for name in ZOO if name not in ("llama", "qwen2_moe") and not name.endswith("_wide")]
TOL = dict(rtol=1e-4, atol=1e-4)   # as tests/test_hf_models.py: f32 sums in another order


@pytest.mark.parametrize("name", SMALL)
def test_zoo_model_matches_eager(name):
    zm = ZOO[name]
    model = zm.build()
    torch._dynamo.reset()
    before = counters.snapshot()
    cm = torch.compile(model, backend="dvm", dynamic=True)
    with torch.no_grad():
        for b, L in SHAPES:
            kw = inputs(zm, b, L)
            torch.testing.assert_close(first_output(cm(**kw)), first_output(model(**kw)), **TOL,
                                       msg=lambda m: f"{name} batch {b} length {L}: {m}")
    after = counters.snapshot()
    assert not [k for k in after if k.startswith("fallback:graph:") and after[k] != before.get(k, 0)]
    assert after.get("torch_segments", 0) > before.get("torch_segments", 0)   # DVM ran kernels


@pytest.mark.parametrize("name, dtype", [("gpt2", "float16"), ("llama", "float16"), ("bert", "bfloat16"),
                                         ("mixtral", "bfloat16")])
def test_zoo_model_in_16_bits_within_the_bench_tolerance(name, dtype):
    """`dvm bench models --zoo --zoo-dtype`: the model converted, DVM's logits within the dtype's
    TOLERANCE of eager's or as close to the float32 model's (the benchmark's own pass and check)."""
    zm = ZOO[name]
    model = zm.build().to(getattr(torch, dtype))
    torch._dynamo.reset()
    cells = [(2, 9), (1, 20)]
    zoo = bench_zoo._Zoo(1, True, dtype)
    refs = zoo.references(zm, model, cells, dtype)
    result = zoo.one_pass(name, torch.compile(model, backend="dvm", dynamic=True), zm, cells, refs)
    assert result["mismatches"] == [] and result["max_abs_err"] is not None, result


def test_16_bit_logits_off_eager_pass_when_as_close_to_float32():
    """A token routed to another expert moves DVM's 16-bit logits off eager's: they pass when their
    distance from the float32 model's is within FP32_FACTOR x eager's (+ atol), else say why."""
    zoo = bench_zoo._Zoo(1, True, "bfloat16")
    logits32 = torch.zeros(1, 4, 8)
    zoo.fp32 = {(1, 4): (logits32, 0.3)}   # eager 0.3 from float32
    assert zoo._against_fp32(logits32 + 0.5, 1, 4, "off") == ""          # 0.5 <= 2 * 0.3 + atol
    assert "0.9 from float32" in zoo._against_fp32(logits32 + 0.9, 1, 4, "off")


def test_zoo_inputs():
    bert, t5 = ZOO["bert"], ZOO["t5"]
    kw = inputs(bert, 4, 16)
    assert kw["input_ids"].shape == (4, 16) and (kw["input_ids"] != 1).all()
    assert kw["attention_mask"][0].all() and kw["attention_mask"].sum(1).tolist() == [16, 14, 12, 10]
    kw = inputs(t5, 2, 9)
    assert kw["decoder_input_ids"].shape == (2, 4) and "attention_mask" in kw
    assert set(inputs(ZOO["gpt2"], 1, 8)) == {"input_ids"}


def _cell(t, b, L, eager, ind, dvm):
    return {"threads": t, "batch": b, "length": L, "eager": eager, "inductor": ind, "dvm": dvm,
            "dvm_x": eager / dvm, "inductor_x": eager / ind, "rounds": 3,
            "dvm_x_min": eager / dvm, "inductor_x_min": eager / ind}


def test_zoo_report_arithmetic(tmp_path):
    # latency = fixed + per-token * L: eager 500 us + 10 us/token, Inductor 300 + 8, DVM 400 + 12
    cells = [_cell(1, 1, L, 500e-6 + 10e-6 * L, 300e-6 + 8e-6 * L, 400e-6 + 12e-6 * L) for L in (8, 64)]
    host = bench_zoo.host_cost(cells, 1)
    assert host["eager"] == pytest.approx(500e-6) and host["inductor"] == pytest.approx(300e-6)
    assert host["dvm"] == pytest.approx(400e-6)
    forward = {"segments": 3, "vector_kernels": 4, "cube_ops": 2, "fallback_ops": 1, "size_only_segments": 0,
               "size_only_fallback_ops": 0, "fallbacks": {"aten.cumsum.default: not in table": 1}, "graphs": 1}
    comp = {k: {"first_call_s": 1.0, "pass_s": 1.0, "max_abs_err": 1e-7, "mismatches": [], "graphs": 1,
                "backend_compile_s": 0.5, "graph_fallbacks": {}} for k in ("inductor_cold", "inductor_warm", "dvm")}
    models = {"m": {"what": "a model", "cells": cells,
                    "per_threads": {"1": {"compile": comp, "dvm_forward": forward, "host_s": host}}}}
    s = bench_zoo.summary(models)
    assert s["cells"] == 2 and s["dvm_min_x"] == pytest.approx(cells[1]["dvm_x"])
    assert s["dvm_geomean_x"] == pytest.approx((cells[0]["dvm_x"] * cells[1]["dvm_x"]) ** 0.5)
    assert [(c["length"], c["model"]) for c in s["misses"]] == [(64, "m")]   # 1168 us vs eager's 1140
    report = {"machine": {"cpu": "x", "cores": 2}, "loadavg_1min": {"start": 0.1, "end": 0.1}, "summary": s,
              "date": "d", "versions": {"torch": "t", "transformers": "t"}, "vm": "cpu", "seconds": 1.0,
              "lengths": [8, 64], "batches": [1], "threads": [1], "tolerance": {"rtol": 1e-4, "atol": 1e-4}, "models": models,
              "failures": []}
    md = bench_zoo_report.markdown(report)
    assert "| m | 1.07× (1.07×) | 0.98× (t1 b1 L64) | 1.50× (1.50×) |" in md and "m t1 b1 L64: 0.98× (fastest calls 0.98×" in md
    assert "aten.cumsum.default: not in table ×1" in md
    bench_zoo_report.plot(report, str(tmp_path / "z.png"))
    assert os.path.getsize(tmp_path / "z.png") > 0


def test_zoo_cli_rejects_bad_lists(capsys):
    from dvm.tools.cli import main
    assert main(["bench", "models", "--zoo", "--models", "nope"]) == 2
    assert main(["bench", "models", "--zoo", "--zoo-lengths", "0,8"]) == 2
    assert "dvm: error" in capsys.readouterr().err


def test_per_forward_sums_the_graphs_one_forward_runs():
    def info(segments, fallbacks):
        return {"segments": segments, "vector_kernels": 2 * segments, "cube_ops": 1, "fallback_ops": sum(fallbacks.values()),
                "size_only_segments": 1, "size_only_fallback_ops": 0, "fallbacks": fallbacks}
    out = bench_zoo.per_forward([info(3, {"a: x": 1}), info(2, {"a: x": 2, "b: y": 1})])
    assert (out["segments"], out["vector_kernels"], out["cube_ops"], out["fallback_ops"], out["graphs"]) == (5, 10, 2, 4, 2)
    assert out["fallbacks"] == {"a: x": 3, "b: y": 1} and list(out["fallbacks"]) == ["a: x", "b: y"]
    assert bench_zoo.per_forward([])["segments"] == 0
