"""How a model's QA and NER windows are fitted to a graph that accepts at most `capacity` tokens.

One rule, used by export's accuracy guard (`export/task_guard.py`, which also writes the fitted settings into
the bundle manifest) and by the service (`service/pipelines.py`, which reads them back), so that both window a
text the same way. A stored window that fits is kept as it is: it is the one the model was fine-tuned and
evaluated with. A longer one, or none at all, becomes a window of `capacity` tokens whose question and stride
are shrunk so that every window keeps room for context and consecutive windows share only part of it.
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
