"""Shared fixture for the task tests: the real MiniLM WordPiece tokenizer (`data_dir` comes from tests/conftest.py)."""

from __future__ import annotations

import pytest

from bert_model.tokenization import BertTokenizer


@pytest.fixture(scope="session")
def tokenizer() -> BertTokenizer:
    try:
        return BertTokenizer.from_pretrained("minilm")
    except FileNotFoundError as error:
        pytest.skip(f"the embedded minilm tokenizer is not installed: {error}")
