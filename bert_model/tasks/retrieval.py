"""Question -> paragraph retrieval: the SQuAD retrieval set and recall@k over a cosine ranking.

Scored as dense passage retrieval is (Karpukhin et al. 2020, DPR, section 5.1: top-k retrieval accuracy): a
question counts at k when its gold paragraph is among the k paragraphs most similar to it. Every SQuAD question
was asked about exactly one paragraph, so this top-k accuracy is recall@k. Similarity is cosine: both sides are
L2-normalized before the dot product. A paragraph that scores exactly as high as the gold one is ranked above it,
so ties never flatter a model (constant vectors score 0 at every k below the number of paragraphs).

Torch-free: numpy only. Scores are percentages (0-100), like the other metrics of `bert_model.tasks`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import ArrayLike

from bert_model.tasks.embeddings import l2_normalize
from bert_model.tasks.readers import SquadExample

RANKING_CHUNK = 1024
"""Questions scored per matrix product, so memory stays (chunk x paragraphs) however many questions."""


@dataclass
class RetrievalSet:
    """Questions, the paragraphs they are searched against, and each question's gold paragraph index."""

    questions: list[str] = field(default_factory=list)
    paragraphs: list[str] = field(default_factory=list)
    gold: list[int] = field(default_factory=list)


def squad_retrieval_set(examples: Sequence[SquadExample], max_paragraphs: int | None = None) -> RetrievalSet:
    """Every question of `examples` against every distinct paragraph (context) among them, in file order.

    `max_paragraphs` keeps the first N paragraphs and only the questions asked about them (a smaller set of the
    same kind: neighbouring paragraphs of one article stay the hard negatives)."""
    if max_paragraphs is not None and max_paragraphs < 1:
        raise ValueError(f"max_paragraphs must be at least 1, got {max_paragraphs}")
    retrieval = RetrievalSet()
    index: dict[str, int] = {}
    for example in examples:
        if example.context not in index:
            if max_paragraphs is not None and len(index) == max_paragraphs:
                break
            index[example.context] = len(retrieval.paragraphs)
            retrieval.paragraphs.append(example.context)
        retrieval.questions.append(example.question)
        retrieval.gold.append(index[example.context])
    if not retrieval.questions:
        raise ValueError("no questions to retrieve paragraphs for")
    return retrieval


def gold_ranks(question_vectors: ArrayLike, paragraph_vectors: ArrayLike, gold: Sequence[int]) -> np.ndarray:
    """(Q, H) questions, (P, H) paragraphs, Q gold indices -> (Q,) 1-based rank of each gold paragraph by cosine."""
    questions = l2_normalize(question_vectors)
    paragraphs = l2_normalize(paragraph_vectors)
    targets = np.asarray(gold, dtype=np.int64)
    if questions.ndim != 2 or paragraphs.ndim != 2 or questions.shape[1] != paragraphs.shape[1]:
        shapes = f"{questions.shape} and {paragraphs.shape}"
        raise ValueError(f"expected (questions, H) and (paragraphs, H) vectors, got {shapes}")
    if targets.shape != (len(questions),):
        raise ValueError(f"{len(targets)} gold indices for {len(questions)} questions")
    if len(targets) and not (targets.min() >= 0 and targets.max() < len(paragraphs)):
        raise ValueError(f"gold indices must lie in [0, {len(paragraphs)}), got {targets.min()}..{targets.max()}")
    ranks = np.empty(len(questions), dtype=np.int64)
    for start in range(0, len(questions), RANKING_CHUNK):
        stop = start + RANKING_CHUNK
        scores = questions[start:stop] @ paragraphs.T  # (chunk, P) cosine similarities
        own = scores[np.arange(len(scores)), targets[start:stop]][:, None]  # (chunk, 1)
        ranks[start:stop] = (scores >= own).sum(axis=1)  # the gold itself counts once: rank 1 = nothing above it
    return ranks


def recall_at_k(
    question_vectors: ArrayLike, paragraph_vectors: ArrayLike, gold: Sequence[int], ks: Sequence[int] = (1, 5)
) -> dict[str, float]:
    """`recall@k` for each k (percent of questions whose gold paragraph ranks k or better), the mean reciprocal
    rank (`mrr`, percent) and the counts."""
    if not ks or any(k < 1 for k in ks):
        raise ValueError(f"every k must be at least 1, got {list(ks)}")
    ranks = gold_ranks(question_vectors, paragraph_vectors, gold)
    if not len(ranks):
        raise ValueError("cannot score an empty set of questions")
    metrics = {f"recall@{k}": 100.0 * float(np.mean(ranks <= k)) for k in ks}
    metrics["mrr"] = 100.0 * float(np.mean(1.0 / ranks))
    metrics["questions"] = float(len(ranks))
    metrics["paragraphs"] = float(len(np.asarray(paragraph_vectors)))
    return metrics


def top_candidates(question_vectors: ArrayLike, paragraph_vectors: ArrayLike, k: int) -> np.ndarray:
    """(Q, k) indices of each question's k most similar paragraphs by cosine, best first: the first stage of
    retrieve-then-rerank."""
    questions, paragraphs = l2_normalize(question_vectors), l2_normalize(paragraph_vectors)
    k = min(k, len(paragraphs))
    rows = []
    for start in range(0, len(questions), RANKING_CHUNK):
        scores = questions[start : start + RANKING_CHUNK] @ paragraphs.T
        top = np.argpartition(-scores, k - 1, axis=1)[:, :k]
        order = np.argsort(-np.take_along_axis(scores, top, axis=1), axis=1, kind="stable")
        rows.append(np.take_along_axis(top, order, axis=1))
    return np.concatenate(rows) if rows else np.zeros((0, k), dtype=np.int64)


def candidate_ranking(scores: ArrayLike, gold: int | None = None) -> list[int]:
    """A candidate list's indices by score, best first: ties go to the earlier candidate, except that the `gold`
    one comes after every candidate scoring as high as it (ties never flatter a model, as in `gold_ranks`)."""
    values = np.asarray(scores, dtype=np.float64).reshape(-1)
    return sorted(range(len(values)), key=lambda i: (-values[i], i == gold, i))


def ranking_metrics(
    rankings: Sequence[Sequence[int]], gold: Sequence[int], ks: Sequence[int] = (1, 5)
) -> dict[str, float]:
    """recall@k (percent), MRR@10 (percent: 1/rank when the gold paragraph is among the first 10, else 0) of
    per-question paragraph rankings (best first; a gold paragraph missing from its ranking counts as not found)."""
    if len(rankings) != len(gold) or not len(gold):
        raise ValueError(f"{len(rankings)} rankings for {len(gold)} questions")
    ranks = np.array(
        [list(ranking).index(g) + 1 if g in ranking else 10**9 for ranking, g in zip(rankings, gold, strict=True)]
    )
    metrics = {f"recall@{k}": 100.0 * float(np.mean(ranks <= k)) for k in ks}
    metrics["mrr@10"] = 100.0 * float(np.mean(np.where(ranks <= 10, 1.0 / ranks, 0.0)))
    metrics["questions"] = float(len(ranks))
    return metrics
