"""The `dvm` command line, called in-process (main([...])) with output captured."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

import dvm
import dvm.config
from dvm.codegen import isa
from dvm.codegen.program import VERSION
from dvm.config import config
from dvm.tools.bench_encode import KERNELS, softmax
from dvm.tools.cli import main


@pytest.fixture(autouse=True)
def _fresh_config():
    config.cache_clear()
    yield
    config.cache_clear()


def test_version(capsys):
    assert main(["version"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"dvm {dvm.__version__}\n")
    assert f"VM {dvm.config.config().vm}" in out


def test_python_dash_m_dvm():
    r = subprocess.run([sys.executable, "-m", "dvm", "version"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"dvm {dvm.__version__}")


def test_no_command_prints_usage(capsys):
    assert main([]) == 2
    assert "usage: dvm" in capsys.readouterr().err


def test_unknown_command_is_a_usage_error(capsys):
    assert main(["frobnicate"]) == 2
    err = capsys.readouterr().err
    assert "invalid choice" in err and "Traceback" not in err


def test_bad_environment_is_reported_without_traceback(capsys, monkeypatch):
    monkeypatch.setenv("DVM_DEBUG", "loud")
    assert main(["version"]) == 2
    err = capsys.readouterr().err
    assert "DVM_DEBUG" in err and "Traceback" not in err


def _saved_program(tmp_path) -> tuple[dvm.Program, str]:
    prog = softmax.program(np.empty((3, 5), np.float32))
    path = tmp_path / "softmax.npy"
    prog.save(path)
    return prog, str(path)


def test_disasm_saved_program(tmp_path, capsys):
    prog, path = _saved_program(tmp_path)
    assert main(["disasm", path]) == 0
    out = capsys.readouterr().out
    assert out.strip() == dvm.disasm(prog)
    assert out.startswith(f"program v{VERSION}: 1 kernel(s)")
    assert "store.f32" in out


def test_disasm_rejects_bad_opcode(tmp_path, capsys):
    prog, path = _saved_program(tmp_path)
    words = prog.words.copy()
    words[-isa.WORDS] = 9999          # opcode of the last instruction
    np.save(path, words)
    assert main(["disasm", path]) == 2
    captured = capsys.readouterr()
    assert "[opcode]" in captured.err and "9999" in captured.err
    assert "Traceback" not in captured.err and captured.out == ""


def test_disasm_rejects_bad_magic(tmp_path, capsys):
    prog, path = _saved_program(tmp_path)
    words = prog.words.copy()
    words[0] = 12345
    np.save(path, words)
    assert main(["disasm", path]) == 2
    assert "[header]" in capsys.readouterr().err


def test_disasm_rejects_truncated_program(tmp_path, capsys):
    prog, path = _saved_program(tmp_path)
    np.save(path, prog.words[:-3].copy())
    assert main(["disasm", path]) == 2
    assert "[length]" in capsys.readouterr().err


def test_disasm_rejects_files_that_are_not_programs(tmp_path, capsys):
    text = tmp_path / "text.npy"
    text.write_text("not a program\n")
    assert main(["disasm", str(text)]) == 2
    floats = tmp_path / "floats.npy"
    np.save(floats, np.zeros(8, np.float32))
    assert main(["disasm", str(floats)]) == 2
    assert main(["disasm", str(tmp_path / "missing.npy")]) == 1
    err = capsys.readouterr().err
    assert "not a saved DVM program" in err and "cannot read" in err and "Traceback" not in err


def test_bench_encode_quick_writes_json(tmp_path, capsys):
    path = tmp_path / "encode.json"
    assert main(["bench", "encode", "--quick", "--json", str(path)]) == 0
    captured = capsys.readouterr()
    assert "| kernel | encode p50" in captured.out
    assert "[dvm bench encode]" in captured.err          # progress goes to stderr
    report = json.loads(path.read_text())
    assert set(report["kernels"]) == {bk.name for bk in KERNELS}
    assert report["budget_us"] == {"p50": 20.0, "p99": 100.0}
    for r in report["kernels"].values():
        assert r["instances"] == 60
        for col in ("encode_us", "first_call_us"):
            assert {"p50", "p99", "max"} <= set(r[col])
            assert 0 < r[col]["p50"] <= r[col]["p99"] <= r[col]["max"]
        assert isinstance(r["encode_within_budget"], bool)


def test_bench_encode_rejects_zero_shapes(capsys):
    assert main(["bench", "encode", "--shapes", "0", "--json", "-"]) == 2
    assert "--shapes" in capsys.readouterr().err


def test_builder_demo_runs_and_checks_results(capsys):
    assert main(["demo", "--builder"]) == 0
    out = capsys.readouterr().out
    for bk in KERNELS:
        assert bk.name in out
    assert "new shape" in out and "cache hit" in out and "FAIL" not in out
    summary = next(line for line in out.splitlines() if line.startswith("summary:"))
    assert "10 traces" in summary and "60 encodes" in summary and "20 cache hits" in summary
