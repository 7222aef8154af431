"""`make bench-gpu` on a machine without CUDA: it stops at once, says why, exits non-zero, writes nothing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


def test_without_cuda_it_stops_with_a_clear_message(tmp_path: Path) -> None:
    import onnxruntime as ort

    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this machine has CUDA: the benchmark would run")
    out = tmp_path / "bench"
    result = subprocess.run(
        [sys.executable, "-m", "bertserve.benchmarks.gpu", "--out", str(out), "--bundles-dir", str(tmp_path / "b")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr
    assert "bench-gpu needs CUDA and stops here, nothing measured" in result.stderr
    assert "CUDAExecutionProvider" in result.stderr and "onnxruntime-gpu" in result.stderr
    assert not out.exists() and not (tmp_path / "b").exists()
