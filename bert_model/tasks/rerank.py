"""Reranking with a cross-encoder: each (query, passage) pair is one sequence `[CLS] query [SEP] passage [SEP]`, and
a one-output classification head scores its relevance. The passages are ranked by that score, best first.

Shared by fine-tuning's evaluation and the service (one feature per passage, so a request's pairs batch with other
requests' rows). A score is the head's raw logit, or its sigmoid (a probability-like value in (0, 1), what
sentence-transformers' CrossEncoder gives by default for one output). Torch-free.
Reference: Nogueira & Cho (2019), "Passage Re-ranking with BERT".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, TypedDict

import numpy as np

from bert_model.tasks.classification import ClassificationFeature, build_classification_features
from bert_model.tasks.features import OutputRows, check_aligned
from bert_model.tasks.numeric import sigmoid
from bert_model.tokenization import BertTokenizer

Activation = Literal["sigmoid", "none"]
ACTIVATIONS: tuple[str, ...] = ("sigmoid", "none")


class Rank(TypedDict):
    index: int
    """The passage's position in the request."""
    score: float


def build_rerank_features(
    tokenizer: BertTokenizer,
    query: str,
    passages: Sequence[str],
    *,
    max_seq_length: int = 256,
    truncate: bool = True,
) -> list[ClassificationFeature]:
    """One feature per passage, `request_index` = its position; a pair longer than `max_seq_length` is cut as
    sentence-transformers' CrossEncoder cuts it (longest first: the longer of query and passage loses a token at a
    time, so a long query is cut too), or refused with `truncate` False."""
    return build_classification_features(
        tokenizer,
        [query] * len(passages),
        list(passages),
        max_seq_length=max_seq_length,
        truncation="longest_first" if truncate else "none",
    )


def relevance_scores(logits: np.ndarray, activation: Activation = "sigmoid") -> np.ndarray:
    """(B, 1) or (B,) logits -> (B,) scores."""
    values = np.asarray(logits, dtype=np.float32).reshape(len(logits), -1)
    if values.shape[1] != 1:
        raise ValueError(f"a reranker has one output per pair, got {values.shape[1]}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    flat = values[:, 0]
    return sigmoid(flat) if activation == "sigmoid" else flat


def rerank_postprocess(
    features: Sequence[ClassificationFeature],
    logits: OutputRows,
    *,
    activation: Activation = "sigmoid",
    top_n: int | None = None,
) -> list[Rank]:
    """The passages by score, best first (ties: the earlier passage first), at most `top_n`."""
    check_aligned(features, logits, "logits")
    scores = relevance_scores(np.stack([np.asarray(row, dtype=np.float32).reshape(-1) for row in logits]), activation)
    by_passage = {feature.request_index: float(score) for feature, score in zip(features, scores, strict=True)}
    ranked = sorted(by_passage.items(), key=lambda item: (-item[1], item[0]))
    return [{"index": index, "score": score} for index, score in ranked[:top_n]]
