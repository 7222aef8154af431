"""How a model's QA and NER windows are fitted to a graph that accepts at most `capacity` tokens.

One rule, used by export's accuracy guard (`export/task_guard.py`, which also writes the fitted settings into
the bundle manifest) and by the service (`service/engine/pipelines.py`, which reads them back), so that both window a
text the same way. A stored window that fits is kept as it is: it is the one the model was fine-tuned and
evaluated with. A longer one, or none at all, becomes a window of `capacity` tokens whose question and stride
are shrunk so that every window keeps room for context and consecutive windows share only part of it.
`token_windows` and `window_count` are how a token sequence is cut into those windows (consecutive windows
sharing `stride` tokens, the last one ending at the sequence's end, as the `tokenizers` library's overflow windows
are cut), so that a server can count the windows of a request from its token counts before building any.
Torch-free.
"""

from __future__ import annotations

from typing import NamedTuple

QA_SPECIAL_TOKENS = 3
"""[CLS] question [SEP] context [SEP]."""
NER_SPECIAL_TOKENS = 2
"""[CLS] text [SEP]."""


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


def fit_qa_window(capacity: int, max_query_length: int, doc_stride: int, max_seq_length: int | None = None) -> QAWindow:
    """The QA window for a graph of `capacity` tokens: the stored `max_seq_length` and its question and stride
    when it fits; otherwise (longer, or None) `capacity` tokens, the question at most half of what the specials
    leave and the stride at most half of the context room."""
    if max_seq_length is not None and max_seq_length <= capacity:
        return QAWindow(max_seq_length, max_query_length, doc_stride)
    query = min(max_query_length, (capacity - QA_SPECIAL_TOKENS) // 2)
    stride = min(doc_stride, (capacity - query - QA_SPECIAL_TOKENS) // 2)
    return QAWindow(capacity, query, stride)


def fit_ner_window(capacity: int, stride: int, max_seq_length: int | None = None) -> NERWindow:
    """The NER window for a graph of `capacity` tokens: the stored `max_seq_length` and stride when it fits;
    otherwise (longer, or None) `capacity` tokens and a stride of at most a quarter of the text room."""
    if max_seq_length is not None and max_seq_length <= capacity:
        return NERWindow(max_seq_length, stride)
    return NERWindow(capacity, min(stride, (capacity - NER_SPECIAL_TOKENS) // 4))


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
