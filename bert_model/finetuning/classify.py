"""Fine-tuning recipe for text classification (single texts or pairs, any label set).

Devlin et al. (2019), section 4.1: [CLS] -> pooler -> linear -> softmax, cross-entropy (BERT, ALBERT); RoBERTa,
XLM-R, ELECTRA and DistilBERT classify from the first token through their own two-layer head instead
(`heads.BertForSequenceClassification`). Label names are kept in the saved config as `id2label` / `label2id`
(Hugging Face compatible).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from bert_model.finetuning.batching import model_inputs
from bert_model.finetuning.options import ClassifyOptions
from bert_model.finetuning.recipe import EvalOutcome, EvalSet, TaskRecipe, TrainSet
from bert_model.tasks.classification import build_classification_features, classification_postprocess
from bert_model.tasks.features import Feature
from bert_model.tasks.metrics import classification_metrics
from bert_model.tasks.readers import TextExample, check_known_labels, label_set, read_text_dataset
from bert_model.tokenization import BertTokenizer


class ClassifyRecipe(TaskRecipe):
    task: ClassVar[str] = "classify"
    primary_metric: ClassVar[str] = "accuracy"
    output_names: ClassVar[tuple[str, ...]] = ("logits",)
    lora_extra_modules: ClassVar[tuple[str, ...]] = ("bert.pooler",)
    """With LoRA, the pooler trains in full where the family classifies from it (BERT, ALBERT). The first-token
    head of the other families (`classifier.dense`, `classifier.out_proj`) lies under `classifier`, which LoRA always
    trains in full (`adapters.HEAD_MODULES`); those models have no pooler, so this name trains nothing there."""

    def __init__(
        self, tokenizer: BertTokenizer, options: ClassifyOptions | None = None, labels: list[str] | None = None
    ) -> None:
        self.options = options or ClassifyOptions()
        super().__init__(tokenizer, labels or self.options.labels)

    @staticmethod
    def model_class() -> type[nn.Module]:
        from bert_model.heads import BertForSequenceClassification

        return BertForSequenceClassification

    def _read(self, path: str | Path) -> list[TextExample]:
        return read_text_dataset(
            path,
            text_column=self.options.text_column,
            pair_column=self.options.pair_column,
            label_column=self.options.label_column,
            label_map=self.options.label_map,
        )

    def _features(self, examples: list[TextExample]) -> list[Feature]:
        pairs = [e.pair or "" for e in examples] if any(e.pair is not None for e in examples) else None
        return list(
            build_classification_features(
                self.tokenizer, [e.text for e in examples], pairs, max_seq_length=self.options.max_seq_length
            )
        )

    def load_train(self, path: str | Path, limit: int | None = None) -> TrainSet:
        examples = self._read(path)[:limit]
        if self.labels is None:
            self.labels = label_set(examples)
        check_known_labels(examples, self.labels, path)
        if len(self.labels) < 2:
            raise ValueError(f"{path}: classification needs at least two labels, found {self.labels}")
        index = {label: i for i, label in enumerate(self.labels)}
        return TrainSet(self._features(examples), [index[e.label or ""] for e in examples], len(examples))

    def load_eval(self, path: str | Path) -> EvalSet:
        examples = self._read(path)
        if self.labels is not None:
            check_known_labels(examples, self.labels, path)
        return EvalSet(Path(path), examples, self._features(examples))

    def batch(self, train: TrainSet, indices: list[int]) -> dict[str, torch.Tensor]:
        inputs = model_inputs([train.features[i] for i in indices], self.tokenizer.pad_id)
        inputs["labels"] = torch.tensor([train.targets[i] for i in indices], dtype=torch.long)
        return inputs

    def score(
        self, eval_set: EvalSet, indices: list[int], rows: dict[str, list[np.ndarray]], features: list[Feature]
    ) -> EvalOutcome:
        assert self.labels is not None
        results = classification_postprocess(features, rows["logits"], self.labels, top_k=1)
        predicted = [results[i][0]["label"] for i in indices]
        references = [eval_set.examples[i].label for i in indices]
        metrics = classification_metrics(predicted, references, self.labels)
        return EvalOutcome(metrics, {i: results[i][0] for i in indices})

    def settings(self) -> dict[str, Any]:
        return {"name": self.task, "max_seq_length": self.options.max_seq_length, "label_map": self.options.label_map}


def write_classify_predictions(path: Path, eval_set: EvalSet, outcome: EvalOutcome) -> None:
    """One JSON line per example: line, text, predicted label and score, reference label."""
    with path.open("w") as handle:
        for index, prediction in sorted(outcome.predictions.items()):
            example = eval_set.examples[index]
            record = {"line": example.line, "text": example.text, **prediction, "reference": example.label}
            if example.pair is not None:
                record["pair"] = example.pair
            handle.write(json.dumps(record) + "\n")
