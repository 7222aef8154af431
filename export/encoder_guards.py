"""The accuracy guards of the encoder's own tasks, embed and fill-mask: examples, and outputs -> predictions.

- embed: each text's unit sentence vector as the service answers it by default: the graph's normalized vector
  (the bundle's pooling, then L2 normalization, both in the graph), so that the cosine is a dot product;
  held-out texts (SST-2 sentences, or a calibration file), plus, when the data folder has SQuAD, question ->
  paragraph retrieval: each question's nearest paragraph by cosine among the paragraphs of the sample (its gold
  paragraph and its neighbours from the same article). PyTorch fp32's retrieval accuracy against the gold
  paragraphs is recorded.
- fill-mask: held-out sentences with MASKED_SHARE of their word pieces (at least one) replaced by [MASK], chosen
  with a fixed seed; the prediction at each masked position is its top-5 token ids. The graph's (B, M, V) rows
  past a row's own masks are filler and are dropped (`trim`), leaving one row per masked position. PyTorch fp32's
  accuracy at recovering the original tokens (top-1, top-5) is recorded.
Both are judged by agreement with PyTorch fp32 (export/parity.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from bert_model.tasks.classification import build_classification_features
from bert_model.tasks.features import Feature
from bert_model.tokenization import BertTokenizer
from export.guard_data import read_texts, retrieval_sample
from export.parity import AGREEMENT, Scored
from export.task_guard import GuardOptions, Rows, TaskGuard, batches

RETRIEVAL_PARAGRAPHS = 64
"""Paragraphs searched per question (the first of SQuAD dev-half-a: a few articles, so most are near misses)."""
RETRIEVAL_QUESTIONS = 256
MASKED_SHARE = 0.15
FILL_MASK_SEED = 0
TOP_K = 5


def embedding_guard(
    tokenizer: BertTokenizer, max_len: int, pooling: str, options: GuardOptions, data_dir: Path | None
) -> TaskGuard:
    """Sentence vectors of held-out texts, and question -> paragraph retrieval when SQuAD is in `data_dir`."""
    rows, source = read_texts("embed", data_dir, options.calibration, options.limit)
    texts = [row[0] for row in rows]
    sample = None if options.calibration else retrieval_sample(data_dir, RETRIEVAL_PARAGRAPHS, RETRIEVAL_QUESTIONS)
    questions = sample.questions if sample else []
    paragraphs = sample.paragraphs if sample else []
    features = build_classification_features(tokenizer, texts + questions + paragraphs, max_seq_length=max_len)
    first_question, first_paragraph = len(texts), len(texts) + len(questions)

    def decode(outputs: Rows) -> Scored:
        vectors = np.stack(outputs["normalized_embedding"])  # (texts, H), unit rows
        scored = Scored(dict(enumerate(vectors)))
        if sample:
            nearest = np.argmax(vectors[first_question:first_paragraph] @ vectors[first_paragraph:].T, axis=1)
            scored.metrics["retrieved"] = nearest.tolist()
            scored.metrics["retrieval_top1_accuracy"] = float(np.mean(nearest == np.asarray(sample.gold)))
        return scored

    order, feeds = batches(features, tokenizer.pad_id, options.batch_size)
    settings = {"max_seq_length": max_len, "pooling": pooling}
    if sample:
        source += f" + retrieval: {len(questions)} questions over {len(paragraphs)} paragraphs of {sample.source}"
        settings.update(retrieval_questions=len(questions), retrieval_paragraphs=len(paragraphs))
    return TaskGuard("embed", AGREEMENT, source, list(features), order, feeds, decode, len(features), settings)


def fill_mask_guard(tokenizer: BertTokenizer, max_len: int, options: GuardOptions, data_dir: Path | None) -> TaskGuard:
    """Held-out sentences with seeded [MASK]s; predictions: the top-5 token ids at each masked position."""
    rows, source = read_texts("fill-mask", data_dir, options.calibration, options.limit)
    encoded = build_classification_features(tokenizer, [row[0] for row in rows], max_seq_length=min(max_len, 128))
    features, originals = mask_features(encoded, tokenizer.mask_id, np.random.default_rng(FILL_MASK_SEED))
    order, feeds = batches(features, tokenizer.pad_id, options.batch_size)
    masks = [(feed["input_ids"] == tokenizer.mask_id).sum(axis=1) for feed in feeds]  # (B,) per batch
    gold = np.concatenate([np.concatenate([originals[i] for i in batch]) for batch in order])

    def trim(output: dict[str, np.ndarray], batch: int) -> dict[str, np.ndarray]:
        logits = output["mask_logits"]  # (B, M, V): each row's masks first, in position order
        return {"mask_logits": np.concatenate([row[:count] for row, count in zip(logits, masks[batch], strict=True)])}

    def decode(outputs: Rows) -> Scored:
        logits = np.stack(outputs["mask_logits"])  # (all masked positions, V), batch after batch, row-major
        best = np.argsort(-logits, axis=1, kind="stable")[:, :TOP_K]
        metrics = {
            "masked_top1_accuracy": float(np.mean(best[:, 0] == gold)),
            "masked_top5_accuracy": float(np.mean((best == gold[:, None]).any(axis=1))),
        }
        return Scored({index: tuple(row.tolist()) for index, row in enumerate(best)}, metrics)

    settings = {"max_seq_length": min(max_len, 128), "masked_share": MASKED_SHARE, "seed": FILL_MASK_SEED}
    guard = TaskGuard("fill-mask", AGREEMENT, source, features, order, feeds, decode, len(features), settings)
    guard.trim = trim
    return guard


def mask_features(
    features: Sequence[Feature], mask_id: int, rng: np.random.Generator
) -> tuple[list[Feature], list[np.ndarray]]:
    """Each feature with MASKED_SHARE of its word pieces (at least one; never [CLS] / [SEP]) replaced by
    `mask_id`, and the original ids at every [MASK] of the result, in position order (a [MASK] the text already
    had is its own original)."""
    masked: list[Feature] = []
    originals: list[np.ndarray] = []
    for feature in features:
        original = np.asarray(feature.input_ids, dtype=np.int64)
        inner = np.arange(1, len(original) - 1)
        if inner.size == 0:
            continue
        ids = original.copy()
        ids[rng.choice(inner, size=max(1, round(MASKED_SHARE * inner.size)), replace=False)] = mask_id
        originals.append(original[ids == mask_id])
        masked.append(Feature(len(masked), ids.tolist(), list(feature.token_type_ids)))
    return masked, originals
