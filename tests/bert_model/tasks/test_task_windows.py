"""Fitting QA and NER windows to a graph's length: the one rule of export's guard and the service."""

from __future__ import annotations

import itertools

import pytest

from bert_model.tasks.qa import QASettings
from bert_model.tasks.windows import NERWindow, QAWindow, fit_ner_window, fit_qa_window


@pytest.mark.parametrize("stored", [256, 512])
def test_a_stored_qa_window_that_fits_is_kept_as_it_is(stored: int) -> None:
    assert fit_qa_window(512, 200, 240, stored) == QAWindow(stored, 200, 240)


def test_a_longer_stored_qa_window_becomes_the_graph_length_with_question_and_stride_shrunk() -> None:
    assert fit_qa_window(256, 64, 128, max_seq_length=384) == QAWindow(256, 64, 94)  # (256 - 64 - 3) // 2
    assert fit_qa_window(64, 64, 128, max_seq_length=384) == QAWindow(64, 30, 15)  # (64 - 3) // 2, (64 - 33) // 2
    assert fit_qa_window(512, 10, 20, max_seq_length=1024) == QAWindow(512, 10, 20)  # small enough already


def test_without_a_stored_qa_window_the_defaults_are_fitted_to_the_graph() -> None:
    assert fit_qa_window(128, 64, 128) == QAWindow(128, 62, 31)
    assert fit_qa_window(512, 64, 128) == QAWindow(512, 64, 128)


def test_ner_windows_fit_as_qa_windows_do() -> None:
    assert fit_ner_window(512, 32, 128) == NERWindow(128, 32)
    assert fit_ner_window(64, 32, 128) == NERWindow(64, 15)  # (64 - 2) // 4
    assert fit_ner_window(64, 32) == NERWindow(64, 15)
    assert fit_ner_window(512, 32) == NERWindow(512, 32)


def test_a_fitted_window_always_has_room_for_context() -> None:
    for capacity, query, stride in itertools.product([8, 9, 33, 64, 128, 512], [1, 30, 64, 300], [0, 16, 128, 500]):
        window = fit_qa_window(capacity, query, stride, max_seq_length=1024)
        QASettings(window.max_seq_length, window.doc_stride, window.max_query_length)  # validates the window
        length, ner_stride = fit_ner_window(capacity, stride, max_seq_length=1024)
        assert 0 <= ner_stride < length - 2
