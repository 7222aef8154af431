"""Starting the triton peer's Triton: a Triton that exits before it is ready is started again, a bounded number
of times (pytriton's handshake between two model instances can lose a race on a loaded machine)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from loadtests.peers.triton_peer import START_ATTEMPTS, TritonProcess


def _failing_python(tmp_path: Path, status: int) -> tuple[Path, Path]:
    """A stand-in for the Triton venv's python that records each start and exits with `status` at once."""
    starts = tmp_path / "starts.txt"
    script = tmp_path / "python"
    script.write_text(f"#!/bin/sh\necho started >> {starts}\nexit {status}\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script, starts


def test_a_triton_that_exits_before_ready_is_started_again_then_given_up(tmp_path: Path) -> None:
    python, starts = _failing_python(tmp_path, status=3)
    triton = TritonProcess(python, {"classify": str(tmp_path)}, max_batch_size=8, delay_us=0)
    with pytest.raises(RuntimeError, match=r"exited with status 3 before it was ready \(start 3 of 3\)"):
        triton.start(timeout_s=30)
    assert START_ATTEMPTS == 3
    assert starts.read_text().splitlines() == ["started"] * 3


def test_one_attempt_means_no_second_start(tmp_path: Path) -> None:
    python, starts = _failing_python(tmp_path, status=1)
    triton = TritonProcess(python, {"classify": str(tmp_path)}, max_batch_size=8, delay_us=0)
    with pytest.raises(RuntimeError, match=r"\(start 1 of 1\)"):
        triton.start(timeout_s=30, attempts=1)
    assert starts.read_text().splitlines() == ["started"]
