"""Fine-tuning recipe for a cross-encoder reranker: one relevance score per (query, passage) pair.

The model is the sequence classifier of classify.py with one output (`num_labels=1`), read as a relevance score;
its inputs are `bert_model.tasks.rerank`'s `[CLS] query [SEP] passage [SEP]` pairs, cut longest-first as the
service cuts them (Nogueira & Cho 2019, "Passage Re-ranking with BERT").

Loss: listwise softmax cross-entropy over each query's group, its positive passage and `negatives` hard negatives
(Gao et al. 2021, "Rethink Training of BERT Rerankers in Multi-Stage Retrieval Pipeline": the localized contrastive
estimation loss). A reranker is judged by the order it puts a query's candidates in, and this loss trains exactly
that comparison: every step pushes the positive above the negatives its first stage ranks highest, where pointwise
binary cross-entropy scores each pair alone and spends much of its gradient on negatives that are already far
below. The cost is calibration: a score is meaningful against the other candidates of its query, not as an
absolute probability; its sigmoid (what the service returns by default, as sentence-transformers' CrossEncoder
does) keeps the order.

Data: SQuAD JSON (each answerable question, its paragraph as the positive, hard negatives mined from its article:
bert_model/finetuning/negatives.py), or a pairs file of JSON lines `{"query": ..., "positive": ...,
"negatives": [...]}` (hardest first; `.jsonl` or `.jsonl.gz`). Evaluation: each query's candidate list, its gold
passage and the hardest negatives (`eval_candidates` in all); recall@1, recall@5 and MRR@10 of the model's order
(`bert_model.tasks.retrieval`, ties counted against the model).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bert_model.finetuning.batching import model_inputs
from bert_model.finetuning.negatives import NegativeMiner, squad_articles
from bert_model.finetuning.options import RerankOptions
from bert_model.finetuning.recipe import EvalOutcome, EvalSet, TaskRecipe, TrainSet
from bert_model.tasks.features import Feature
from bert_model.tasks.readers import RankingList, read_ranking_lists, read_squad
from bert_model.tasks.rerank import build_rerank_features
from bert_model.tasks.retrieval import candidate_ranking, ranking_metrics
from bert_model.tokenization import BertTokenizer

RELEVANCE_LABEL = "LABEL_0"
"""The one output's name in config.json (what transformers and sentence-transformers name a single label)."""
PAIRS_SUFFIXES = (".jsonl", ".jsonl.gz")


class RerankRecipe(TaskRecipe):
    task: ClassVar[str] = "rerank"
    primary_metric: ClassVar[str] = "mrr@10"
    output_names: ClassVar[tuple[str, ...]] = ("logits",)
    lora_extra_modules: ClassVar[tuple[str, ...]] = ("bert.pooler",)
    """As classify's: the pooler trains in full where the family scores from it."""

    def __init__(self, tokenizer: BertTokenizer, options: RerankOptions | None = None, seed: int = 0) -> None:
        super().__init__(tokenizer, [RELEVANCE_LABEL])
        self.options = options or RerankOptions()
        self.seed = seed

    @staticmethod
    def model_class() -> type[nn.Module]:
        from bert_model.heads import BertForSequenceClassification

        return BertForSequenceClassification

    def load_train(self, path: str | Path, limit: int | None = None) -> TrainSet:
        groups = read_rerank_groups(path, self.options.negatives, self.options, self.seed)[:limit]
        features, units = self._features(groups)
        return TrainSet(features, [_gold(group) for group in groups], len(groups), units)

    def load_eval(self, path: str | Path) -> EvalSet:
        groups = read_rerank_groups(path, self.options.eval_candidates - 1, self.options, self.seed + 1)
        features, _ = self._features(groups)
        return EvalSet(Path(path), groups, features)

    def _features(self, groups: list[RankingList]) -> tuple[list[Feature], list[list[int]]]:
        """Every pair's feature (`request_index` = its group) in group order, and each group's feature indices."""
        features: list[Feature] = []
        units: list[list[int]] = []
        for index, group in enumerate(groups):
            pairs = build_rerank_features(
                self.tokenizer, group.query, group.passages, max_seq_length=self.options.max_seq_length
            )
            units.append(list(range(len(features), len(features) + len(pairs))))
            features += [dataclasses.replace(pair, request_index=index) for pair in pairs]
        return features, units

    def batch(self, train: TrainSet, indices: list[int]) -> dict[str, torch.Tensor]:
        """The pairs of the groups `indices`, and `group_index` (G, longest group): each group's rows in the batch,
        its positive first, -1 past its end."""
        assert train.groups is not None
        groups = [train.groups[i] for i in indices]
        width = max(len(group) for group in groups)
        rows: list[int] = []
        layout = torch.full((len(groups), width), -1, dtype=torch.long)
        for g, (group, index) in enumerate(zip(groups, indices, strict=True)):
            order = [group[train.targets[index]], *(f for n, f in enumerate(group) if n != train.targets[index])]
            layout[g, : len(order)] = torch.arange(len(rows), len(rows) + len(order))
            rows += order
        inputs = model_inputs([train.features[i] for i in rows], self.tokenizer.pad_id)
        inputs["group_index"] = layout
        return inputs

    def loss(self, model: nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """Softmax cross-entropy of each group's scores with its positive (column 0) as the target."""
        model_inputs_only = {name: value for name, value in inputs.items() if name != "group_index"}
        layout = inputs["group_index"]
        scores = model(**model_inputs_only).logits[:, 0].float()  # (rows,)
        grouped = scores[layout.clamp(min=0)].masked_fill(layout < 0, float("-inf"))  # (G, longest group)
        return F.cross_entropy(grouped, torch.zeros(len(layout), dtype=torch.long))

    def score(
        self, eval_set: EvalSet, indices: list[int], rows: dict[str, list[np.ndarray]], features: list[Feature]
    ) -> EvalOutcome:
        scores: dict[int, list[float]] = {}
        for feature, row in zip(features, rows["logits"], strict=True):
            scores.setdefault(feature.request_index, []).append(float(np.asarray(row).reshape(-1)[0]))
        groups = [eval_set.examples[i] for i in indices]
        gold = [_gold(group) for group in groups]
        rankings = [candidate_ranking(scores[i], g) for i, g in zip(indices, gold, strict=True)]
        metrics: dict[str, Any] = ranking_metrics(rankings, gold, ks=(1, 5))
        metrics["candidates"] = float(np.mean([len(group.passages) for group in groups]))
        return EvalOutcome(metrics, {i: ranking for i, ranking in zip(indices, rankings, strict=True)})

    def settings(self) -> dict[str, Any]:
        return {"name": self.task, **asdict(self.options)}

    def config_overrides(self) -> dict[str, Any]:
        return {"id2label": {0: RELEVANCE_LABEL}}


def read_rerank_groups(path: str | Path, negatives: int, options: RerankOptions, seed: int = 0) -> list[RankingList]:
    """Lists of a query, its positive passage (index 0) and up to `negatives` negatives, from a reranking JSON-lines
    file or SQuAD JSON (negatives mined from the question's article; unanswerable questions skipped)."""
    source = Path(path)
    if source.name.endswith(PAIRS_SUFFIXES):
        return read_ranking_lists(source, negatives)
    examples = [e for e in read_squad(source) if not e.is_impossible]
    if not examples:
        raise ValueError(f"{source}: no answerable question to rank passages for")
    articles = squad_articles(examples)
    mined = NegativeMiner(options.sources, options.embedding_model, seed).mine(articles, negatives)
    return [
        RankingList(question.text, [article.paragraphs[question.paragraph], *negative_texts])
        for article, per_question in zip(articles, mined, strict=True)
        for question, negative_texts in zip(article.questions, per_question, strict=True)
    ]


def _gold(group: RankingList) -> int:
    assert group.gold is not None, "training and evaluation lists know their relevant passage"
    return group.gold


def write_rerank_predictions(path: Path, eval_set: EvalSet, outcome: EvalOutcome) -> None:
    """One JSON line per query: the query, its candidates' order (indices into its list, best first), the gold
    index."""
    with path.open("w") as handle:
        for index, ranking in sorted(outcome.predictions.items()):
            group = eval_set.examples[index]
            handle.write(json.dumps({"query": group.query, "ranking": ranking, "gold": group.gold}) + "\n")
