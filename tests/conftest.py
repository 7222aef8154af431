"""Shared fixtures: the real data folder (../shared/data) and a tiny config for shape/behaviour tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DATA_DIR = Path(os.environ.get("BERTSERVE_DATA_DIR", REPO.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """../shared/data (or $BERTSERVE_DATA_DIR); tests needing real data skip when it is absent."""
    if not DATA_DIR.is_dir():
        pytest.skip(f"real data folder {DATA_DIR} is absent (set BERTSERVE_DATA_DIR)")
    return DATA_DIR
