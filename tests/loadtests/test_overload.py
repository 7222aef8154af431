"""The overload profile on a tiny model: the service rejects (429 / RESOURCE_EXHAUSTED) instead of timing out,
and accepted requests keep a p99 within the 2 s deadline the profile gives the server."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.loadtests.test_smoke import REPO, _run_dir

pytestmark = [pytest.mark.slow, pytest.mark.integration]


def test_overload_rejects_rather_than_times_out(tiny: tuple[Path, Path], tmp_path: Path) -> None:
    _, bundle = tiny
    command = [
        sys.executable, "-m", "bertserve", "loadtest", "--profile", "overload", "--duration", "15",
        "--mix", "/classify=1,Classifier.Classify=1", "--models", f"classify={bundle}",
        "--results-dir", str(tmp_path / "results"),
    ]  # fmt: skip
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads((_run_dir(tmp_path / "results", done) / "summary.json").read_text())
    figures = summary["targets"]["ours-batching"]["summary"]["endpoints"]
    for name in ("/classify", "Classifier.Classify"):
        assert figures[name]["rejected"] > 0, name
        assert figures[name]["timeouts"] == 0 and figures[name]["errors"] == 0, name
        assert figures[name]["latency_ms"]["p99"] < 2000, name
    assert [c["passed"] for c in summary["checks"]] == [True, True, True]
