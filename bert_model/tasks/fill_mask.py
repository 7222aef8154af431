"""Fill-mask: the masked-LM head's best tokens at each mask position, shaped like Hugging Face's pipeline.

Follows transformers' `FillMaskPipeline` (pipelines/fill_mask.py): at each mask position, the softmax over
the vocabulary (over `targets` only when given), its `top_k` best as `{score, token, token_str, sequence}`,
where `sequence` is the input with that one mask filled, decoded without padding; special tokens are left
out of it when the input has one mask and kept when it has several (so the other masks stay visible).
Unlike the pipeline, a target that is not one vocabulary entry is refused (the pipeline silently replaces it
by its first word piece). The mask token is the tokenizer's own ([MASK], RoBERTa's <mask>) unless a caller
names one. A bundle's graph scores the mask tokens only (export/wrapper.py): a feature's output row
is (M, V), the logits of its mask tokens in position order, then filler rows up to its batch's most masks.
Torch-free: numpy + tokenizers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypedDict

import numpy as np

import bert_model.tasks.defaults as defaults
from bert_model.tasks.classification import segment_ids
from bert_model.tasks.features import Feature
from bert_model.tasks.numeric import softmax
from bert_model.tokenization import BertTokenizer, Truncation

DEFAULT_MASK_TOKEN = "[MASK]"
"""BERT's mask token (a bundle manifest without a `mask_token` means it)."""


class FillMaskResult(TypedDict):
    score: float
    token: int
    token_str: str
    sequence: str


def mask_token_id(tokenizer: BertTokenizer, mask_token: str | None = None) -> int:
    """The id of `mask_token` (None: the tokenizer's own); ValueError when the vocabulary has no such token."""
    if mask_token is None:
        return tokenizer.mask_id
    token_id = tokenizer.token_to_id(mask_token)
    if token_id is None:
        raise ValueError(f"the tokenizer has no mask token {mask_token!r}")
    return token_id


def target_ids(tokenizer: BertTokenizer, targets: Sequence[str]) -> list[int]:
    """Vocabulary ids of `targets`, in order, without repeats. A target is a vocabulary entry (`paris`,
    `##ing`) or a word the tokenizer turns into exactly one (`Paris` for an uncased model); anything else
    raises ValueError naming it."""
    if not targets:
        raise ValueError("targets is empty: give at least one token, or leave targets out")
    ids: list[int] = []
    for index, target in enumerate(targets):
        if not isinstance(target, str) or not target.strip():
            raise ValueError(f"targets[{index}] must be a non-blank string, got {target!r}")
        token_id = tokenizer.token_to_id(target)
        if token_id is None:
            pieces = tokenizer.backend.encode(target, add_special_tokens=False).ids
            if len(pieces) != 1:
                shown = tokenizer.convert_ids_to_tokens(pieces)
                raise ValueError(
                    f"targets[{index}] {target!r} is not one token of the vocabulary (it is {len(pieces)}: "
                    f"{' '.join(shown)}); give single tokens"
                )
            token_id = pieces[0]
        if token_id not in ids:
            ids.append(token_id)
    return ids


def build_fill_mask_features(
    tokenizer: BertTokenizer,
    texts: Sequence[str],
    *,
    max_seq_length: int = 512,
    truncation: Truncation = "longest_first",
    mask_token: str | None = None,
) -> list[Feature]:
    """One feature per text; each must hold `mask_token` (None: the tokenizer's own; ValueError naming the text
    otherwise, also when truncation cut every mask off)."""
    mask_token = tokenizer.mask_token if mask_token is None else mask_token
    mask_id = mask_token_id(tokenizer, mask_token)
    features = []
    encodings = tokenizer.encode_batch(texts, max_length=max_seq_length, truncation=truncation, overflow=False)
    for index, encoding in enumerate(encodings):
        if mask_id not in encoding.ids:
            if mask_token in texts[index]:
                raise ValueError(
                    f"input {index}: every {mask_token} falls after the first {max_seq_length} tokens, which "
                    "are all the model reads; move it earlier or shorten the text"
                )
            raise ValueError(f"input {index} has no mask token: put {mask_token} where a word should be predicted")
        features.append(
            Feature(request_index=index, input_ids=list(encoding.ids), token_type_ids=segment_ids(tokenizer, encoding))
        )
    return features


def fill_mask_postprocess(
    tokenizer: BertTokenizer,
    features: Sequence[Feature],
    mask_logits: Sequence[np.ndarray],
    *,
    top_k: int = defaults.FILL_MASK_TOP_K,
    targets: Sequence[int] | None = None,
    mask_token: str | None = None,
) -> dict[int, list[list[FillMaskResult]]]:
    """Per request index: for each mask position in order, the `top_k` best fills (at most len(targets)).
    `mask_logits` holds one (M, V) row per feature: the logits of its mask tokens in position order first."""
    if top_k < 1:
        raise ValueError(f"top_k must be at least 1, got {top_k}")
    if len(features) != len(mask_logits):
        raise ValueError(f"{len(mask_logits)} output rows for {len(features)} features")
    mask_id = mask_token_id(tokenizer, mask_token)
    candidates = None if targets is None else np.asarray(list(targets), dtype=np.int64)
    results: dict[int, list[list[FillMaskResult]]] = {}
    for feature, output in zip(features, mask_logits, strict=True):
        ids = np.asarray(feature.input_ids, dtype=np.int64)
        positions = np.flatnonzero(ids == mask_id)
        rows = np.asarray(output)
        if rows.ndim != 2 or rows.shape[0] < len(positions):
            raise ValueError(f"mask_logits row of shape {rows.shape} for an input with {len(positions)} mask tokens")
        single = len(positions) == 1
        results[feature.request_index] = [
            _fill(tokenizer, ids, int(position), rows[order], top_k, candidates, single)
            for order, position in enumerate(positions)
        ]
    return results


def top_indices(scores: np.ndarray, k: int) -> np.ndarray:
    """The indices of the `k` highest `scores`, best first, ties in index order: the first k of a stable argsort of
    -scores, found by partitioning (a full sort of a vocabulary-wide row costs ~4 ms, most of a fill's time)."""
    count = scores.shape[0]
    if k >= count:
        return np.argsort(-scores, kind="stable")
    kth = np.partition(scores, count - k)[count - k]  # the k-th highest score
    candidates = np.flatnonzero(scores >= kth)  # every score tied with it too, in index order
    return candidates[np.argsort(-scores[candidates], kind="stable")[:k]]


def _fill(
    tokenizer: BertTokenizer,
    ids: np.ndarray,
    position: int,
    logits: np.ndarray,
    top_k: int,
    candidates: np.ndarray | None,
    single: bool,
) -> list[FillMaskResult]:
    probabilities = softmax(logits)  # over the whole vocabulary, as the pipeline does
    if candidates is not None:
        probabilities = probabilities[candidates]
    best = top_indices(probabilities, top_k)
    fills: list[FillMaskResult] = []
    for choice in best:
        token = int(choice if candidates is None else candidates[choice])
        filled = ids.copy()
        filled[position] = token
        filled = filled[filled != tokenizer.pad_id]
        fills.append(
            {
                "score": float(probabilities[choice]),
                "token": token,
                "token_str": tokenizer.decode([token], skip_special_tokens=False),
                "sequence": tokenizer.decode(filled.tolist(), skip_special_tokens=single),
            }
        )
    return fills
