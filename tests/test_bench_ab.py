"""`dvm bench ab`: a one-round run with this checkout as both A and B (one small case: the table,
the JSON, B/A), usage errors (a folder without dvm/, bad numbers, a filter matching nothing), a
checkout whose process fails, and the comparison's pure parts on synthetic numbers. No timing
assertions."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from dvm.tools import bench_ab
from dvm.tools.bench_ops import SIZES
from dvm.tools.cli import main

CHECKOUT = str(Path(__file__).resolve().parents[1])
SMALL_CASE = "tanh_exp"   # two inputs, one cheap elementwise pass (a name no other case contains)


def test_one_round_on_this_checkout(tmp_path, capsys, vm):
    if vm != "cpu":
        pytest.skip("runs the CPU VM in its own processes: once is enough")
    paths = {k: str(tmp_path / f"ab.{k}") for k in ("json", "md")}
    rc = main(["bench", "ab", CHECKOUT, "--rounds", "1", "--cases", SMALL_CASE, "--sizes", "small",
               "--json", paths["json"], "--md", paths["md"]])
    out, err = capsys.readouterr()
    assert rc == 0, out + err
    assert "round 1/1: A ops" in err and "round 1/1: B ops" in err
    assert "| case | A µs | B µs | B/A | B/A of medians |" in out
    with open(paths["json"]) as f:
        report = json.load(f)
    assert report["benchmark"] == "ab" and report["suites"] == ["ops"] and report["failures"] == []
    assert report["a"]["path"] == report["b"]["path"] == CHECKOUT   # --other defaults to this checkout
    want = [f"{SMALL_CASE} {r}x{c}" for r, c in SIZES["small"]]
    assert [r["case"] for r in report["results"]] == want
    for r in report["results"]:
        assert r["suite"] == "ops" and r["a_s"] > 0 and r["b_s"] > 0
        assert math.isclose(r["ratio"], r["b_s"] / r["a_s"])
        assert math.isclose(r["median_ratio"], r["ratio"])   # one round: its median is its best
        assert r["flag"] == bench_ab.flag(r["ratio"], report["threshold"])
        assert r["a_rounds"] == [r["a_s"]] and r["b_rounds"] == [r["b_s"]]
    with open(paths["md"]) as f:
        md = f.read()
    assert all(f"| {case} |" in md for case in want)


def test_a_folder_without_dvm_is_a_usage_error(tmp_path, capsys):
    assert main(["bench", "ab", str(tmp_path), "--json", "-", "--md", "-"]) == 2
    err = capsys.readouterr().err
    assert "is not a checkout of this project" in err and "dvm/__init__.py" in err and "Traceback" not in err
    assert main(["bench", "ab", CHECKOUT, "--other", str(tmp_path / "missing"), "--json", "-", "--md", "-"]) == 2
    assert "--other" in capsys.readouterr().err


def test_a_failing_checkout_process_is_exit_1(tmp_path, capsys):
    (tmp_path / "dvm").mkdir()
    (tmp_path / "dvm" / "__init__.py").write_text("raise SystemExit(3)\n")   # the child stops at `import dvm`
    assert main(["bench", "ab", str(tmp_path), "--rounds", "1", "--cases", SMALL_CASE, "--sizes", "small",
                 "--json", "-", "--md", "-"]) == 1
    err = capsys.readouterr().err
    assert f"on {tmp_path} exited with 3" in err and "Traceback" not in err


@pytest.mark.parametrize("argv, msg", [
    (["--rounds", "0"], "--rounds"),
    (["--threshold", "1.5"], "--threshold"),
    (["--cases", "no_such_case"], "matches no case"),
    (["--sizes", "huge"], "unknown size class"),
    (["--suite", "zooo"], "invalid choice"),
    (["--suite", "zoo", "--zoo-dtype", "float8"], "invalid choice"),
])
def test_bad_arguments_are_usage_errors(argv, msg, capsys):
    assert main(["bench", "ab", CHECKOUT, *argv, "--json", "-", "--md", "-"]) == 2
    assert msg in capsys.readouterr().err


def test_suites_follow_the_case_filter():
    assert bench_ab.parse_suites("all", []) == ["ops", "models"]
    assert bench_ab.parse_suites("all", ["llama"]) == ["models"]
    assert bench_ab.parse_suites("all", ["softmax", "qwen"]) == ["ops", "models"]
    assert bench_ab.parse_suites("ops", ["max_"]) == ["ops"]
    assert bench_ab.parse_suites("zoo", ["opt", "bert"]) == ["zoo"]   # asked for by name only
    assert bench_ab.parse_suites("train", ["llama"]) == ["train"]
    with pytest.raises(ValueError, match="matches no case"):
        bench_ab.parse_suites("models", ["softmax"])


def test_the_zoo_dtype_reaches_only_the_zoo_process():
    """--zoo-dtype goes to the zoo's measuring process (whose models it converts), float32 by
    default, and never to the other suites' processes."""
    from dvm.tools.bench_ab_child import parse_args
    argv = bench_ab._child_argv("zoo", "out.json", ["gpt2"], [], "bfloat16")
    assert parse_args(argv[2:]).zoo_dtype == "bfloat16"
    assert parse_args(bench_ab._child_argv("zoo", "out.json", [], [])[2:]).zoo_dtype == "float32"
    assert "--zoo-dtype" not in bench_ab._child_argv("ops", "out.json", [], [], "bfloat16")
    from dvm.tools import bench_ab_child, bench_zoo   # the child (self-contained) lists the zoo's dtypes
    assert bench_ab_child.ZOO_DTYPES == bench_zoo.DTYPES


def test_rounds_alternate_the_order():
    assert [bench_ab.round_order(r) for r in range(3)] == [("A", "B"), ("B", "A"), ("A", "B")]


def test_best_of_rounds_keeps_each_cases_minimum():
    rounds = [{"x": 3.0, "y": 1.0}, {"x": 2.0, "y": 4.0, "z": 5.0}, {"x": 2.5}]
    assert bench_ab.best_of_rounds(rounds) == {"x": 2.0, "y": 1.0, "z": 5.0}


def test_median_of_rounds_per_case():
    rounds = [{"x": 3.0, "y": 1.0}, {"x": 2.0, "y": 4.0, "z": 5.0}, {"x": 2.5}]
    assert bench_ab.median_of_rounds(rounds) == {"x": 2.5, "y": 2.5, "z": 5.0}


def test_a_case_is_flagged_only_where_best_and_median_agree():
    # B's processes ran at one of two speeds: its best round is 20 % slower, its median is not
    a_rounds = [{"bimodal": t, "slow": t} for t in (1.0, 1.0, 1.3, 1.3, 1.0)]
    b_rounds = [{"bimodal": 1.2, "slow": 1.3}, {"bimodal": 1.05, "slow": 1.3}, {"bimodal": 1.05, "slow": 1.25},
                {"bimodal": 1.2, "slow": 1.3}, {"bimodal": 1.2, "slow": 1.3}]
    rows = {r["case"]: r for r in bench_ab.compare(
        bench_ab.best_of_rounds(a_rounds), bench_ab.best_of_rounds(b_rounds), 0.10,
        bench_ab.median_of_rounds(a_rounds), bench_ab.median_of_rounds(b_rounds))}
    assert rows["bimodal"]["ratio"] == pytest.approx(1.05) and rows["bimodal"]["median_ratio"] == pytest.approx(1.2)
    assert rows["bimodal"]["flag"] == ""   # the best says level, the median slower: not flagged
    assert rows["slow"]["ratio"] == pytest.approx(1.25) and rows["slow"]["median_ratio"] == pytest.approx(1.3)
    assert rows["slow"]["flag"] == "slower"
    (line,) = [x for x in bench_ab._table(list(rows.values())) if x.startswith("| bimodal |")]
    assert line.endswith("| 1.05 | 1.20 |  |")


def test_moved_cases_on_synthetic_numbers():
    a = {"slow": 1.0, "fast": 1.0, "same": 1.0, "much_faster": 2.0, "edge": 1.0, "only_a": 1.0}
    b = {"slow": 1.25, "fast": 0.8, "same": 1.05, "much_faster": 1.0, "edge": 1.1, "only_b": 3.0}
    rows = {r["case"]: r for r in bench_ab.compare(a, b, threshold=0.10)}
    assert list(rows) == [*a, "only_b"]
    assert rows["slow"]["ratio"] == pytest.approx(1.25)          # B / A, not A / B
    assert rows["much_faster"]["ratio"] == pytest.approx(0.5)
    assert {c: r["flag"] for c, r in rows.items()} == {
        "slow": "slower", "fast": "faster", "same": "", "much_faster": "faster", "edge": "",   # 1.1 is not > 1.1
        "only_a": "", "only_b": ""}
    assert rows["only_a"]["b_s"] is None and rows["only_a"]["ratio"] is None
    assert rows["only_b"]["a_s"] is None and rows["only_b"]["ratio"] is None
    mv = bench_ab.moved(list(rows.values()))
    assert mv["slower"] == [["slow", pytest.approx(1.25)]]
    assert mv["faster"] == [["much_faster", pytest.approx(0.5)], ["fast", pytest.approx(0.8)]]   # largest first
    assert bench_ab.moved(bench_ab.compare(a, a, 0.10)) == {"slower": [], "faster": []}
    assert [r["flag"] for r in bench_ab.compare({"x": 1.0}, {"x": 1.25}, threshold=0.30)] == [""]


@pytest.mark.vm_once   # a benchmark's process: the VM DVM_VM selects, once
@pytest.mark.cpu_vm
def test_the_train_suite_times_a_training_step(monkeypatch):
    """The train suite's process times each selected zoo model's training step (bench_train's
    step_inputs and make_step through torch.compile(backend="dvm")) at each cell: a tiny cell here."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from dvm.tools import bench_ab_child
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    threads = torch.get_num_threads()
    try:
        times = bench_ab_child.run_train(["gpt2"], cells=((1, 8),), min_total_s=0.0)
    finally:
        torch.set_num_threads(threads)
    assert list(times) == ["gpt2 b1 L8"] and times["gpt2 b1 L8"] > 0
