"""Sequence classification: encode texts or text pairs, and turn logits into ranked `{label, score}` lists.

Reference: Devlin et al. (2019), section 4.1 (GLUE): the [CLS] representation feeds a linear layer and a
softmax over the labels. One feature per input, framed as the tokenizer's template frames it (`[CLS] A [SEP] B
[SEP]`, RoBERTa's `<s> A </s></s> B </s>`), with segment ids 0 throughout for a model without token types; texts
longer than `max_seq_length` are truncated (`longest_first`), or refused with `InputTooLongError` when
`truncation="none"`. Torch-free.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, TypedDict

import numpy as np
from tokenizers import Encoding

from bert_model.config import PROBLEM_TYPES
from bert_model.tasks.features import Feature, OutputRows, check_aligned
from bert_model.tasks.numeric import sigmoid, softmax
from bert_model.tokenization import BertTokenizer, Truncation

ScoreFunction = Literal["softmax", "sigmoid", "none"]
SCORE_FUNCTIONS: tuple[str, ...] = ("softmax", "sigmoid", "none")


class LabelScore(TypedDict):
    """One ranked class: its name and its probability (or raw score with `function="none"`)."""

    label: str
    score: float


@dataclass(eq=False)
class ClassificationFeature(Feature):
    """One encoded text (or text pair); classification has exactly one feature per input."""


def build_classification_features(
    tokenizer: BertTokenizer,
    texts: Sequence[str],
    pairs: Sequence[str] | None = None,
    *,
    max_seq_length: int = 128,
    truncation: Truncation = "longest_first",
) -> list[ClassificationFeature]:
    """Encode `texts` (and `pairs`, as second segments) into one feature per input, in order."""
    encodings = tokenizer.encode_batch(texts, pairs, max_length=max_seq_length, truncation=truncation, overflow=False)
    return [
        ClassificationFeature(request_index=index, input_ids=list(e.ids), token_type_ids=segment_ids(tokenizer, e))
        for index, e in enumerate(encodings)
    ]


def segment_ids(tokenizer: BertTokenizer, encoding: Encoding) -> list[int]:
    """The segment ids of an encoding as the model takes them: the template's, or 0 throughout for a model without
    token types (RoBERTa, DistilBERT)."""
    return list(encoding.type_ids) if tokenizer.uses_token_types else [0] * len(encoding.ids)


def default_score_function(problem_type: str | None, num_labels: int) -> ScoreFunction:
    """How a model's logits become scores when a request does not say: the rule of Hugging Face's
    text-classification pipeline (`function_to_apply` unset). A regression head's outputs are the predictions
    (none); a multi-label head, and any head with a single output, gets independent sigmoids; a single-label head
    with two or more labels a softmax. `problem_type` is the model config's (None: not stated)."""
    if problem_type is not None and problem_type not in PROBLEM_TYPES:
        raise ValueError(f"problem_type must be one of {PROBLEM_TYPES} or None, got {problem_type!r}")
    if num_labels < 1:
        raise ValueError(f"a classification head has at least one output, got num_labels={num_labels}")
    if problem_type == "regression":
        return "none"
    if problem_type == "multi_label_classification" or num_labels == 1:
        return "sigmoid"
    return "softmax"


def classification_scores(logits: np.ndarray, function: ScoreFunction = "softmax") -> np.ndarray:
    """(B, C) logits -> (B, C) scores: softmax probabilities, independent sigmoids, or the raw logits."""
    values = np.asarray(logits, dtype=np.float32)
    if values.ndim != 2:
        raise ValueError(f"classification logits must have shape (batch, num_labels), got {values.shape}")
    if function == "softmax":
        return softmax(values, axis=-1)
    if function == "sigmoid":
        return sigmoid(values)
    if function == "none":
        return values
    raise ValueError(f"function must be one of {SCORE_FUNCTIONS}, got {function!r}")


def classification_postprocess(
    features: Sequence[Feature],
    logits: OutputRows,
    labels: Sequence[str],
    *,
    top_k: int | None = 1,
    function: ScoreFunction = "softmax",
) -> dict[int, list[LabelScore]]:
    """Per request index: the `top_k` labels (None = all), best first, as `[{label, score}]`.

    `logits` has one (num_labels,) row per feature, in the order of `features`. For a one-output regression
    head use `function="none"`: the single score is the predicted value.
    """
    check_aligned(features, logits, "logits")
    if not features:
        return {}
    rows = np.stack([feature_row_1d(row, len(labels)) for row in logits])
    ranked = label_scores(rows, labels, top_k=top_k, function=function)
    return {feature.request_index: row for feature, row in zip(features, ranked, strict=True)}


def label_scores(
    logits: np.ndarray, labels: Sequence[str], *, top_k: int | None = 1, function: ScoreFunction = "softmax"
) -> list[list[LabelScore]]:
    """Per row of (B, num_labels) `logits`: the `top_k` labels (None = all), best first, as `[{label, score}]`.

    One score function and one stable sort over all rows (ties keep label order); each row's answer is the one it
    would get alone, so that rows of many requests can be ranked in one call.
    """
    if top_k is not None and (not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1):
        raise ValueError(f"k must be a positive integer or None, got {top_k!r}")
    scores = classification_scores(logits, function)
    order = np.argsort(-scores, axis=-1, kind="stable")
    if top_k is not None:
        order = order[:, :top_k]
    values = np.take_along_axis(scores, order, axis=-1)
    return [
        [{"label": labels[index], "score": value} for index, value in zip(indices, row, strict=True)]
        for indices, row in zip(order.tolist(), values.tolist(), strict=True)
    ]


def predicted_label_ids(logits: np.ndarray) -> np.ndarray:
    """(B, C) logits -> (B,) index of the best class (argmax, first on ties)."""
    values = np.asarray(logits)
    if values.ndim != 2:
        raise ValueError(f"classification logits must have shape (batch, num_labels), got {values.shape}")
    return np.argmax(values, axis=-1)


def feature_row_1d(row: np.ndarray | Sequence[float], num_labels: int) -> np.ndarray:
    """Check one logits row has exactly `num_labels` entries."""
    values = np.asarray(row, dtype=np.float32)
    if values.shape != (num_labels,):
        raise ValueError(f"a logits row has shape {values.shape}, expected ({num_labels},) for {num_labels} labels")
    return values


__all__ = [
    "ClassificationFeature",
    "LabelScore",
    "build_classification_features",
    "classification_postprocess",
    "classification_scores",
    "default_score_function",
    "label_scores",
    "predicted_label_ids",
    "segment_ids",
]
