"""QA and NER windows: how a model's windows are fitted to a graph that accepts at most `capacity` tokens, how a
served bundle's windows follow from its manifest's `task_settings`, and how a token sequence is cut into them.

One rule, used by export's accuracy guard (`export/task_guard.py`, which also writes the fitted settings into
the bundle manifest), by the service (`service/engine/pipelines.py`, which reads them back with `qa_windows` /
`ner_windows`) and by the load tests' Triton peer, so that all of them window a text the same way. A stored window
that fits is kept as it is: it is the one the model was fine-tuned and evaluated with. A longer one, or none at all,
becomes a window of `capacity` tokens whose question and stride are shrunk so that every window keeps room for
context and consecutive windows share only part of it. `token_windows` and `window_count` are how a token sequence
is cut into those windows (consecutive windows sharing `stride` tokens, the last one ending at the sequence's end,
as the `tokenizers` library's overflow windows are cut), so that a server can count the windows of a request from
its token counts before building any. The special tokens of a window are the tokenizer's template's
(`BertTokenizer.template.pair_specials` / `single_specials`: BERT's 3 and 2 by default, RoBERTa's
`<s> q </s></s> c </s>` has 4).
Torch-free.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import bert_model.tasks.defaults as defaults

QA_SPECIAL_TOKENS = 3
"""[CLS] question [SEP] context [SEP] (BERT's pair template; RoBERTa's has 4)."""
NER_SPECIAL_TOKENS = 2
"""[CLS] text [SEP] (every family's single-text template)."""


class QAWindow(NamedTuple):
    max_seq_length: int
    """Tokens per window, specials included."""
    max_query_length: int
    """Question tokens kept."""
    doc_stride: int
    """Context tokens shared by consecutive windows."""


class NERWindow(NamedTuple):
    max_seq_length: int
    """Tokens per window, specials included."""
    stride: int
    """Tokens shared by consecutive windows."""


def fit_qa_window(
    capacity: int,
    max_query_length: int,
    doc_stride: int,
    max_seq_length: int | None = None,
    special_tokens: int = QA_SPECIAL_TOKENS,
) -> QAWindow:
    """The QA window for a graph of `capacity` tokens: the stored `max_seq_length` and its question and stride
    when it fits; otherwise (longer, or None) `capacity` tokens, the question at most half of what the
    `special_tokens` leave and the stride at most half of the context room."""
    if max_seq_length is not None and max_seq_length <= capacity:
        return QAWindow(max_seq_length, max_query_length, doc_stride)
    query = min(max_query_length, (capacity - special_tokens) // 2)
    stride = min(doc_stride, (capacity - query - special_tokens) // 2)
    return QAWindow(capacity, query, stride)


def fit_ner_window(
    capacity: int, stride: int, max_seq_length: int | None = None, special_tokens: int = NER_SPECIAL_TOKENS
) -> NERWindow:
    """The NER window for a graph of `capacity` tokens: the stored `max_seq_length` and stride when it fits;
    otherwise (longer, or None) `capacity` tokens and a stride of at most a quarter of the text room."""
    if max_seq_length is not None and max_seq_length <= capacity:
        return NERWindow(max_seq_length, stride)
    return NERWindow(capacity, min(stride, (capacity - special_tokens) // 4))


def token_windows(count: int, room: int, stride: int) -> list[tuple[int, int]]:
    """Token spans [first, stop) of at most `room` tokens covering [0, count), consecutive ones sharing `stride`
    tokens; one (possibly empty) span for a short sequence."""
    _check_room(room, stride)
    windows = [(0, min(room, count))]
    while windows[-1][1] < count:
        first = windows[-1][1] - stride
        windows.append((first, min(first + room, count)))
    return windows


def window_count(count: int, room: int, stride: int) -> int:
    """len(token_windows(count, room, stride)), computed without building them."""
    _check_room(room, stride)
    if count <= room:
        return 1
    return 1 + -(-(count - room) // (room - stride))


def _check_room(room: int, stride: int) -> None:
    if room < 1 or not 0 <= stride < room:
        raise ValueError(f"windows need room >= 1 token and 0 <= stride < room, got room {room}, stride {stride}")


# ---- a served bundle's windows ---------------------------------------------------------------------------
@dataclass(frozen=True)
class QAWindows:
    """How a QA pipeline windows and decodes: the model's settings fitted to the graph, or the defaults."""

    max_seq_length: int
    doc_stride: int
    max_query_length: int
    max_answer_length: int
    null_threshold: float
    """Threshold of the empty answer when a request sets handle_impossible_answer (a SQuAD 2.0 model's own)."""
    special_tokens: int = QA_SPECIAL_TOKENS
    """Special tokens of a window (the tokenizer's pair template)."""

    @property
    def context_room(self) -> int:
        """Context tokens per window: what the question and the special tokens leave."""
        return self.max_seq_length - self.max_query_length - self.special_tokens


def qa_windows(settings: Mapping[str, Any], capacity: int, special_tokens: int = QA_SPECIAL_TOKENS) -> QAWindows:
    """QA windows from a manifest's `task_settings`, at most `capacity` tokens (the graph's max_seq_length), for a
    tokenizer whose pair template has `special_tokens`.

    Stored settings that fit the graph are used as they are (what `bertserve evaluate` uses); without them, or
    with a longer stored window, the window is the graph's length, fitted as export's guard fits it.
    """
    length, query, stride = fit_qa_window(
        capacity,
        _setting(settings, "max_query_length", defaults.QA_MAX_QUERY_LENGTH),
        _setting(settings, "doc_stride", defaults.QA_DOC_STRIDE, minimum=0),
        _stored_length(settings),
        special_tokens,
    )
    room = length - query - special_tokens
    if stride >= room:
        raise ValueError(
            f"manifest task_settings: doc_stride {stride} must be smaller than the context tokens of a window "
            f"({length} - {query} - {special_tokens} = {room})"
        )
    threshold = settings.get("null_threshold")
    return QAWindows(
        max_seq_length=length,
        doc_stride=stride,
        max_query_length=query,
        max_answer_length=_setting(settings, "max_answer_length", defaults.QA_MAX_ANSWER_LENGTH),
        null_threshold=float(threshold) if isinstance(threshold, int | float) else 0.0,
        special_tokens=special_tokens,
    )


def ner_windows(
    settings: Mapping[str, Any], capacity: int, special_tokens: int = NER_SPECIAL_TOKENS
) -> tuple[int, int]:
    """NER (window length, stride) from a manifest's `task_settings`, at most `capacity` tokens (fitted as
    `qa_windows` fits)."""
    length, stride = fit_ner_window(
        capacity,
        _setting(settings, "stride", defaults.NER_STRIDE, minimum=0),
        _stored_length(settings),
        special_tokens,
    )
    if stride >= length - special_tokens:
        raise ValueError(
            f"manifest task_settings: stride {stride} must be smaller than max_seq_length - {special_tokens} "
            f"({length - special_tokens})"
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
