"""Shared fixtures for the task tests: the real MiniLM WordPiece tokenizer and the shared data folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from bert_model.tokenization import BertTokenizer

SHARED_DATA = Path(__file__).resolve().parents[3].parent / "shared" / "data"


@pytest.fixture(scope="session")
def tokenizer() -> BertTokenizer:
    try:
        return BertTokenizer.from_pretrained("minilm")
    except FileNotFoundError as error:
        pytest.skip(f"the embedded minilm tokenizer is not installed: {error}")


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real data sets not available at {SHARED_DATA} (a user's clone has none)")
    return SHARED_DATA
