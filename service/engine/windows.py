"""How a served QA or NER model cuts long inputs into windows: the model's own settings from the manifest's
`task_settings` (the ones it was fine-tuned and `bertserve evaluate`d with, e.g. 256-token QA windows, doc_stride
128), capped by the graph's `max_seq_length` and fitted by `bert_model.tasks.windows` as the export's guard fits
them; a setting the manifest does not give takes this module's default. Per-request fields (`doc_stride`,
`max_answer_len`) still override.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from bert_model.tasks.windows import fit_ner_window, fit_qa_window

QA_MAX_QUESTION_TOKENS = 64
QA_DEFAULT_STRIDE = 128
QA_DEFAULT_MAX_ANSWER_LEN = 15
NER_DEFAULT_STRIDE = 32


@dataclass(frozen=True)
class QAWindows:
    """How a QA pipeline windows and decodes: the model's settings fitted to the graph, or the defaults."""

    max_seq_length: int
    doc_stride: int
    max_query_length: int
    max_answer_length: int
    null_threshold: float
    """Threshold of the empty answer when a request sets handle_impossible_answer (a SQuAD 2.0 model's own)."""

    @property
    def context_room(self) -> int:
        """Context tokens per window: what the question and the three special tokens leave."""
        return self.max_seq_length - self.max_query_length - 3


def qa_windows(settings: Mapping[str, Any], capacity: int) -> QAWindows:
    """QA windows from a manifest's `task_settings`, at most `capacity` tokens (the graph's max_seq_length).

    Stored settings that fit the graph are used as they are (what `bertserve evaluate` uses); without them, or
    with a longer stored window, the window is the graph's length, fitted by `bert_model.tasks.windows` as
    export's guard fits it.
    """
    length, query, stride = fit_qa_window(
        capacity,
        _setting(settings, "max_query_length", QA_MAX_QUESTION_TOKENS),
        _setting(settings, "doc_stride", QA_DEFAULT_STRIDE, minimum=0),
        _stored_length(settings),
    )
    if stride >= length - query - 3:
        raise ValueError(
            f"manifest task_settings: doc_stride {stride} must be smaller than the context tokens of a window "
            f"({length} - {query} - 3 = {length - query - 3})"
        )
    threshold = settings.get("null_threshold")
    return QAWindows(
        max_seq_length=length,
        doc_stride=stride,
        max_query_length=query,
        max_answer_length=_setting(settings, "max_answer_length", QA_DEFAULT_MAX_ANSWER_LEN),
        null_threshold=float(threshold) if isinstance(threshold, int | float) else 0.0,
    )


def ner_windows(settings: Mapping[str, Any], capacity: int) -> tuple[int, int]:
    """NER (window length, stride) from a manifest's `task_settings`, at most `capacity` tokens (fitted as
    `qa_windows` fits, by `bert_model.tasks.windows`)."""
    length, stride = fit_ner_window(
        capacity, _setting(settings, "stride", NER_DEFAULT_STRIDE, minimum=0), _stored_length(settings)
    )
    if stride >= length - 2:
        raise ValueError(
            f"manifest task_settings: stride {stride} must be smaller than max_seq_length - 2 ({length - 2})"
        )
    return length, stride


def _stored_length(settings: Mapping[str, Any]) -> int | None:
    """The model's own window length, None for a bundle without one."""
    return _setting(settings, "max_seq_length", 0, minimum=8) if "max_seq_length" in settings else None


def _setting(settings: Mapping[str, Any], name: str, default: int, minimum: int = 1) -> int:
    value = settings.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"manifest task_settings {name} must be an integer >= {minimum}, got {value!r}")
    return value
