"""`bertserve loadtest --workers N`: locust's distributed mode (a master and N workers) reports as one process does.

The run's samples are the workers' own, merged into one file per target; locust's CSVs are the master's
aggregate of the same requests; every process's CPU time is reported.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from loadtests.runner import merge_progress
from loadtests.samples import read_samples
from tests.loadtests.test_smoke import REPO, _check_files, _run_dir


def test_merge_progress_adds_counts_and_keeps_the_worst_latency() -> None:
    one = {"t": 3.0, "users": 2, "counts": {"ok": 10, "rejected": 1}, "ok_rps": 5.0, "p50_ms": 4.0, "p99_ms": 9.0}
    two = {"t": 3.5, "users": 3, "counts": {"ok": 7, "error": 2}, "ok_rps": 2.5, "p50_ms": 6.0, "p99_ms": None}
    merged = merge_progress([one, two])
    assert merged == {
        "t": 3.5,
        "users": 5,
        "counts": {"ok": 17, "rejected": 1, "error": 2},
        "ok_rps": 7.5,
        "p50_ms": 6.0,
        "p99_ms": 9.0,
    }
    assert merge_progress([one]) is one


@pytest.mark.integration
def test_two_workers_share_the_load_and_report_as_one_process(tiny: tuple[Path, Path], tmp_path: Path) -> None:
    _, bundle = tiny
    results = tmp_path / "results"
    command = [
        sys.executable, "-m", "bertserve", "loadtest", "--profile", "smoke", "--duration", "4", "--users", "4",
        "--mix", "/classify=1,Classifier.Classify=1", "--models", f"classify={bundle}", "--workers", "2",
        "--results-dir", str(results),
    ]  # fmt: skip
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    run_dir = _run_dir(results, done)
    summary = _check_files(run_dir, ["ours-batching"])
    target = summary["targets"]["ours-batching"]
    loadgen = target["loadgen"]
    assert loadgen["workers"] == 2
    assert [p["role"] for p in loadgen["processes"]] == ["master", "worker 1", "worker 2"]
    assert all(p["cpu_s"] > 0 for p in loadgen["processes"]), loadgen
    assert loadgen["cpu_s"] >= sum(p["cpu_s"] for p in loadgen["processes"]) * 0.9
    assert "master" in (run_dir / "report.md").read_text()

    figures = target["summary"]["endpoints"]
    assert figures["all"]["failures"] == 0
    assert figures["/classify"]["ok"] > 0 and figures["Classifier.Classify"]["ok"] > 0
    samples = read_samples(run_dir / "ours-batching_samples.csv")
    assert [s.t_end for s in samples] == sorted(s.t_end for s in samples)
    assert not list(run_dir.glob("*.worker*"))  # merged, then removed
    with open(run_dir / "ours-batching_stats.csv", newline="") as handle:
        aggregated = next(row for row in csv.DictReader(handle) if row["Name"] == "Aggregated")
    assert int(aggregated["Request Count"]) == len(samples)  # the master counted exactly the workers' requests
    assert json.loads((run_dir / "ours-batching_config.json").read_text())["stages"][0][1] == 4
