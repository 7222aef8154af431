"""Load-test fixtures: one tiny classifier (checkpoint + bundle) per session."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(Hugging Face checkpoint folder, serving bundle) of the same random tiny sentiment classifier."""
    pytest.importorskip("torch", reason="building the tiny test model needs torch (the load tests do not)")
    from tests.loadtests.tiny_models import build_tiny_classifier

    return build_tiny_classifier(tmp_path_factory.mktemp("tiny"))
