"""No truncation setting a caller asks for grows the tokenizer: copies are bounded by concurrency, not by the
settings, and concurrent calls with different settings each get their own."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

import bert_model.tokenization as tokenization
from bert_model.tokenization import MAX_TRUNCATING_COPIES, BertTokenizer

QUESTION = "Which river runs through the old town?"
CONTEXT = " ".join(f"The river number {i} runs past the mill and the bridge of the old town." for i in range(30))


def count_copies(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """From now on, count every tokenizer copy built from a serialized tokenizer (what a new setting used to
    cost: a rebuild of about 6 MB)."""
    built: list[int] = []
    real = tokenization.Tokenizer

    class Counting:
        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

        @staticmethod
        def from_str(text: str) -> Any:
            built.append(1)
            return real.from_str(text)

    monkeypatch.setattr(tokenization, "Tokenizer", Counting())
    return built


def test_distinct_truncation_settings_build_a_bounded_number_of_copies(monkeypatch: pytest.MonkeyPatch) -> None:
    tokenizer = BertTokenizer.from_pretrained("minilm")
    counted_copies = count_copies(monkeypatch)
    for stride in range(60):  # 60 distinct (max_length, stride) settings, as 60 requests could send
        windows = tokenizer.encode(QUESTION, CONTEXT, max_length=128 + stride, truncation="only_second", stride=stride)
        assert len(windows.ids) == 128 + stride
    for length in range(16, 76):
        assert len(tokenizer.encode_batch([CONTEXT], max_length=length)[0].ids) == length
    assert len(counted_copies) <= MAX_TRUNCATING_COPIES, len(counted_copies)
    assert tokenizer.truncating_copies == len(counted_copies)


def test_concurrent_calls_with_different_settings_each_get_their_own() -> None:
    tokenizer = BertTokenizer.from_pretrained("minilm")
    settings = [(96 + 8 * (i % 7), 4 * (i % 5)) for i in range(64)]

    def windows(setting: tuple[int, int]) -> list[list[int]]:
        length, stride = setting
        encoding = tokenizer.encode(QUESTION, CONTEXT, max_length=length, truncation="only_second", stride=stride)
        return [window.ids for window in [encoding, *encoding.overflowing]]

    alone = [windows(setting) for setting in settings]
    with ThreadPoolExecutor(8) as pool:  # more threads than copies: callers wait for a copy, never share one
        together = list(pool.map(windows, settings))
    assert together == alone
    assert tokenizer.truncating_copies <= MAX_TRUNCATING_COPIES


def test_a_stride_that_cannot_window_is_a_value_error() -> None:
    tokenizer = BertTokenizer.from_pretrained("minilm")
    with pytest.raises(ValueError, match="stride 30 must be smaller than max_length 32 minus the 3 special tokens"):
        tokenizer.encode(QUESTION, CONTEXT, max_length=32, truncation="only_second", stride=30)
    with pytest.raises(ValueError, match="non-negative"):
        tokenizer.encode(CONTEXT, max_length=32, stride=-1)
    assert len(tokenizer.encode(CONTEXT, max_length=32, stride=29).overflowing) > 1  # 32 - 2 specials = 30 > 29
