"""The accuracy guards of score heads, judged by rank agreement with PyTorch fp32 (parity.RANKING).

- rerank: candidate lists (export/guard_data.py `ranking_lists`: SQuAD questions with their paragraph and the
  paragraphs that follow it in the article, by default), one `[CLS] query [SEP] passage [SEP]` row per candidate
  built and cut as the service builds them (`bert_model.tasks.rerank`); a list's prediction is its candidates'
  logits. PyTorch fp32's recall@1 and MRR@10 against the known relevant passages are recorded.
- a classifier with one output (a regression or single-score head): its arg-max label is always the same, so the
  guard texts (as the classify guard reads them) are ranked instead, in consecutive lists of LIST_SIZE texts, as a
  reranker's candidates are; a list's prediction is its texts' scores.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from bert_model.tasks.classification import build_classification_features
from bert_model.tasks.features import Feature
from bert_model.tasks.readers import RankingList
from bert_model.tasks.rerank import build_rerank_features
from bert_model.tasks.retrieval import candidate_ranking, ranking_metrics
from bert_model.tokenization import BertTokenizer
from export.guard_data import ranking_lists, read_texts
from export.parity import RANKING, Scored
from export.task_guard import GuardOptions, Rows, TaskGuard, batches

RERANK_QUERIES = 200
"""Queries the rerank guard ranks candidates for (fewer when the guard's example limit is lower): each is
RERANK_CANDIDATES model rows, so the default limit of 1000 examples would cost ten thousand rows per variant."""
RERANK_CANDIDATES = 10
LIST_SIZE = 10
"""Texts per list of a one-output classifier's guard."""


def rerank_guard(tokenizer: BertTokenizer, max_len: int, options: GuardOptions) -> TaskGuard:
    """Candidate lists of queries; predictions: each list's logits, in candidate order."""
    limit = min(options.limit, RERANK_QUERIES)
    lists, source = ranking_lists(options.data_dir, options.eval_data, options.calibration, limit, RERANK_CANDIDATES)
    features: list[Feature] = []
    for index, ranking in enumerate(lists):
        pairs = build_rerank_features(tokenizer, ranking.query, ranking.passages, max_seq_length=max_len)
        features += [dataclasses.replace(pair, request_index=index) for pair in pairs]

    def decode(rows: Rows) -> Scored:
        scores = list_scores(features, rows["logits"], len(lists))
        return Scored(dict(enumerate(scores)), rerank_metrics(lists, scores))

    order, feeds = batches(features, tokenizer.pad_id, options.batch_size)
    settings = {"max_seq_length": max_len, "queries": len(lists), "candidates": RERANK_CANDIDATES}
    return TaskGuard("rerank", RANKING, source, features, order, feeds, decode, len(lists), settings)


def score_guard(tokenizer: BertTokenizer, max_len: int, options: GuardOptions) -> TaskGuard:
    """A one-output classifier's guard texts in lists of LIST_SIZE; predictions: each list's scores."""
    rows, source = read_texts("classify", options.data_dir, options.calibration, options.limit)
    pairs = [row[1] for row in rows] if rows and all(len(row) > 1 for row in rows) else None
    built = build_classification_features(tokenizer, [row[0] for row in rows], pairs, max_seq_length=max_len)
    features: list[Feature] = [
        dataclasses.replace(f, request_index=index // LIST_SIZE) for index, f in enumerate(built)
    ]
    count = -(-len(features) // LIST_SIZE)

    def decode(outputs: Rows) -> Scored:
        return Scored(dict(enumerate(list_scores(features, outputs["logits"], count))))

    order, feeds = batches(features, tokenizer.pad_id, options.batch_size)
    settings = {"max_seq_length": max_len, "list_size": LIST_SIZE}
    return TaskGuard("classify", RANKING, source, features, order, feeds, decode, len(rows), settings)


def list_scores(features: list[Feature], logits: list[np.ndarray], count: int) -> list[np.ndarray]:
    """Per list (a feature's `request_index`), its features' one-output logits in feature order."""
    scores: list[list[float]] = [[] for _ in range(count)]
    for feature, row in zip(features, logits, strict=True):
        scores[feature.request_index].append(float(np.asarray(row).reshape(-1)[0]))
    return [np.asarray(values, dtype=np.float32) for values in scores]


def rerank_metrics(lists: list[RankingList], scores: list[np.ndarray]) -> dict[str, float]:
    """recall@1 and MRR@10 (percent) over the lists whose relevant passage is known; {} when none is."""
    known = [(ranking.gold, values) for ranking, values in zip(lists, scores, strict=True) if ranking.gold is not None]
    if not known:
        return {}
    gold = [g for g, _ in known]
    metrics = ranking_metrics([candidate_ranking(values, g) for g, values in known], gold, ks=(1,))
    return {"recall@1": metrics["recall@1"], "mrr@10": metrics["mrr@10"]}
