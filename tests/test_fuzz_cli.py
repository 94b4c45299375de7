"""`dvm fuzz programs` end to end, short: worker processes run the mutants on both VMs (a crash is
counted, not fatal), and the report adds up. The long run's figures are in BENCHMARKS.md."""
from __future__ import annotations

import json

import pytest

from dvm.tools import fuzz_programs
from dvm.tools.cli import main

pytestmark = [pytest.mark.cpu_vm, pytest.mark.vm_once]   # runs the CPU VM in its workers, once


def test_short_fuzz_run_on_both_vms(tmp_path, capsys):
    path = tmp_path / "fuzz.json"
    assert main(["fuzz", "programs", "--mutants", "3000", "--seed", "7", "--vms", "reference,cpu",
                 "--json", str(path), "--md", "-"]) == 0
    report = json.loads(path.read_text())
    counts = report["counts"]
    assert sum(counts.values()) + len(report["crashed"]) + len(report["hung"]) == 3000
    assert report["crashed"] == [] and report["hung"] == [] and report["failures"] == []
    assert counts["canary"] == counts["mismatch"] == counts["error"] == 0
    assert counts["rejected"] > 1500 and counts["ran"] > 100   # not vacuous
    assert 0 < report["verify_max_small_us"] and report["retimed"]
    assert "ran correctly" in capsys.readouterr().out


def test_a_crashing_worker_is_counted_and_the_run_goes_on():
    report = fuzz_programs.run(300, seed=3, vms=("reference",), workers=1, crash_at=120, quiet=True)
    assert report.crashed == [120]
    assert sum(report.counts.values()) == 299   # every other mutant ran in a fresh worker
    assert not report.ok()


def test_replay_rebuilds_one_mutant(capsys):
    assert main(["fuzz", "programs", "--replay", "5", "--seed", "7", "--vms", "reference"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("mutant 5 of ") and "verify" in out


def test_fuzz_shapes_command(tmp_path, capsys):
    path = tmp_path / "shapes.json"
    assert main(["fuzz", "shapes", "--shapes", "60", "--programs", "60", "--json", str(path), "--md", "-"]) == 0
    report = json.loads(path.read_text())
    assert [p["count"] for p in report["phases"]] == [60, 60]
    assert "cache_traces_entries" in report["caches"]
    assert "growth after the caches filled" in capsys.readouterr().out
