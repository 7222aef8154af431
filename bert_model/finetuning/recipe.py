"""What a task family contributes to fine-tuning and evaluation: data loading, batches, scoring.

Each recipe turns files into `bert_model.tasks` features (one `request_index` per example), builds training
batches with targets, and scores model output rows with the tasks' post-processing and metrics.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from bert_model.finetuning.inference import predict_rows
from bert_model.finetuning.trainer import head_loss
from bert_model.tasks.features import Feature
from bert_model.tokenization import BertTokenizer


@dataclass
class TrainSet:
    """Training features and one target per training unit (class id, (start, end), or token labels)."""

    features: list[Feature]
    targets: list[Any]
    examples: int
    """How many examples (sentences, questions, texts) the features came from."""
    groups: list[list[int]] | None = None
    """Features trained together as one unit (rerank: a query's positive pair, then its negative pairs): the trainer
    draws units and `TaskRecipe.batch` receives unit indices. None: every feature is a unit."""

    def unit_lengths(self) -> list[int]:
        """Per training unit, the tokens that decide its padding: its feature's length, or its longest one's."""
        if self.groups is None:
            return [len(f) for f in self.features]
        return [max(len(self.features[i]) for i in group) for group in self.groups]


@dataclass
class EvalSet:
    """Evaluation examples and their features (`request_index` = example index)."""

    path: Path
    examples: list[Any]
    features: list[Feature]


@dataclass
class EvalOutcome:
    metrics: dict[str, Any]
    predictions: dict[int, Any] = field(default_factory=dict)
    """Per example index: the task's prediction (label, answer text, tag list)."""


class TaskRecipe(ABC):
    """One task family. Subclasses set the class attributes and implement the four abstract methods."""

    task: ClassVar[str]
    primary_metric: ClassVar[str]
    output_names: ClassVar[tuple[str, ...]]
    lora_extra_modules: ClassVar[tuple[str, ...]] = ()

    def __init__(self, tokenizer: BertTokenizer, labels: list[str] | None = None) -> None:
        self.tokenizer = tokenizer
        self.labels = labels

    @staticmethod
    @abstractmethod
    def model_class() -> type[nn.Module]:
        """The head class (imported lazily)."""

    @abstractmethod
    def load_train(self, path: str | Path, limit: int | None = None) -> TrainSet:
        """Read training data; sets `self.labels` when the task has labels and none were given."""

    @abstractmethod
    def load_eval(self, path: str | Path) -> EvalSet:
        """Read evaluation data; labels unknown to the model are an error."""

    @abstractmethod
    def batch(self, train: TrainSet, indices: list[int]) -> dict[str, torch.Tensor]:
        """Model inputs and targets for some training units (features, or groups of them)."""

    def loss(self, model: nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """The training loss of one batch: the head's own loss on its targets (a recipe may define another)."""
        return head_loss(model, inputs)

    @abstractmethod
    def score(
        self, eval_set: EvalSet, indices: list[int], rows: dict[str, list[np.ndarray]], features: list[Feature]
    ) -> EvalOutcome:
        """Metrics (and predictions) of the examples `indices` from their features' output rows."""

    def settings(self) -> dict[str, Any]:
        """Task settings stored in the saved config (`bertserve.task`), read back by `evaluate`."""
        return {"name": self.task}

    def config_overrides(self) -> dict[str, Any]:
        """BertConfig fields the head needs (e.g. `id2label`)."""
        return {"id2label": dict(enumerate(self.labels))} if self.labels else {}

    def evaluate(
        self, model: nn.Module, eval_set: EvalSet, limit: int | None = None, batch_size: int = 64, bf16: bool = False
    ) -> EvalOutcome:
        """Score `model` on all examples, or on `limit` evenly spaced ones."""
        indices = subset(len(eval_set.examples), limit)
        wanted = set(indices)
        features = [f for f in eval_set.features if f.request_index in wanted]
        rows = predict_rows(
            model,
            features,
            self.output_names,
            pad_id=self.tokenizer.pad_id,
            batch_size=batch_size,
            bf16=bf16,
            progress=limit is None,
        )
        return self.score(eval_set, indices, rows, features)


def subset(count: int, limit: int | None) -> list[int]:
    """All indices, or `limit` evenly spaced ones (deterministic)."""
    if limit is None or limit >= count:
        return list(range(count))
    return sorted({int(i) for i in np.linspace(0, count - 1, limit)})
