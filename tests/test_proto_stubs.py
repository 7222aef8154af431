"""The generated gRPC modules are regenerated when missing or older than the .proto (a pull changed it)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from proto.stubs import GENERATED, PROTO_FILE, REPO, ensure_generated, generate, stale


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A repository root holding only the .proto, as a fresh clone has it."""
    (tmp_path / PROTO_FILE).parent.mkdir(parents=True)
    shutil.copy(REPO / PROTO_FILE, tmp_path / PROTO_FILE)
    return tmp_path


def test_missing_then_fresh_then_stale_after_the_proto_changes(checkout: Path) -> None:
    assert stale(checkout)  # nothing generated yet
    generate(checkout)
    assert all((checkout / name).is_file() for name in GENERATED)
    assert not stale(checkout)
    earlier = (checkout / PROTO_FILE).stat().st_mtime - 60
    for name in GENERATED:  # generated before a pull wrote a newer contract
        os.utime(checkout / name, (earlier, earlier))
    assert stale(checkout)
    ensure_generated(checkout)  # what the server's and the load tests' imports run first
    assert not stale(checkout)
    (checkout / GENERATED[1]).unlink()
    assert stale(checkout)
    ensure_generated(checkout)
    assert not stale(checkout)


def test_the_generated_modules_follow_the_proto(checkout: Path) -> None:
    proto = checkout / PROTO_FILE
    proto.write_text(
        proto.read_text().replace("SCORE_FUNCTION_NONE = 3;", "SCORE_FUNCTION_NONE = 3;\n  SCORE_FUNCTION_X = 4;")
    )
    generate(checkout)
    assert "SCORE_FUNCTION_X" in (checkout / "proto/gen/bert/v1/bert_pb2.pyi").read_text()
