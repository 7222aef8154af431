"""Fine-tuning recipe for extractive question answering (SQuAD v1.1 and v2.0).

Devlin et al. (2019), sections 4.2-4.3: start/end logits per token, the loss is the mean of the start and end
cross-entropies; windows that do not contain the answer (and unanswerable questions) point at [CLS]. For
SQuAD 2.0 the no-answer threshold is tuned on the eval set and stored with the model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from bert_model.finetuning.batching import model_inputs
from bert_model.finetuning.options import QAOptions
from bert_model.finetuning.recipe import EvalOutcome, EvalSet, TaskRecipe, TrainSet
from bert_model.tasks.features import Feature
from bert_model.tasks.metrics import best_null_threshold, squad_metrics
from bert_model.tasks.qa import QAFeature, answer_token_positions, build_qa_features, qa_predictions
from bert_model.tasks.readers import SquadExample, read_squad
from bert_model.tokenization import BertTokenizer


class QARecipe(TaskRecipe):
    task: ClassVar[str] = "qa"
    primary_metric: ClassVar[str] = "f1"
    output_names: ClassVar[tuple[str, ...]] = ("start_logits", "end_logits")

    def __init__(
        self, tokenizer: BertTokenizer, options: QAOptions | None = None, null_threshold: float | None = None
    ) -> None:
        super().__init__(tokenizer, None)
        self.options = options or QAOptions()
        self.version_2 = null_threshold is not None
        self.null_threshold = null_threshold

    @staticmethod
    def model_class() -> type[nn.Module]:
        from bert_model.heads import BertForQuestionAnswering

        return BertForQuestionAnswering

    def _features(self, examples: list[SquadExample]) -> list[QAFeature]:
        return build_qa_features(
            self.tokenizer,
            [e.question for e in examples],
            [e.context for e in examples],
            max_seq_length=self.options.max_seq_length,
            doc_stride=self.options.doc_stride,
            max_query_length=self.options.max_query_length,
        )

    def load_train(self, path: str | Path, limit: int | None = None) -> TrainSet:
        examples = read_squad(path)[:limit]
        self.version_2 = self.version_2 or any(e.is_impossible for e in examples)
        features = self._features(examples)
        targets = []
        for feature in features:
            example = examples[feature.request_index]
            if example.answers and not example.is_impossible:
                answer = example.answers[0]
                targets.append(answer_token_positions(feature, answer.start, answer.start + len(answer.text)))
            else:
                targets.append((0, 0))
        return TrainSet(list(features), targets, len(examples))

    def load_eval(self, path: str | Path) -> EvalSet:
        examples = read_squad(path)
        return EvalSet(Path(path), examples, list(self._features(examples)))

    def batch(self, train: TrainSet, indices: list[int]) -> dict[str, torch.Tensor]:
        inputs = model_inputs([train.features[i] for i in indices], self.tokenizer.pad_id)
        inputs["start_positions"] = torch.tensor([train.targets[i][0] for i in indices], dtype=torch.long)
        inputs["end_positions"] = torch.tensor([train.targets[i][1] for i in indices], dtype=torch.long)
        return inputs

    def score(
        self, eval_set: EvalSet, indices: list[int], rows: dict[str, list[np.ndarray]], features: list[Feature]
    ) -> EvalOutcome:
        decoded = qa_predictions(
            [f for f in features if isinstance(f, QAFeature)],
            rows["start_logits"],
            rows["end_logits"],
            max_answer_length=self.options.max_answer_length,
        )
        examples = [eval_set.examples[i] for i in indices]
        spans = {eval_set.examples[i].id: _best_text(decoded.get(i)) for i in indices}
        metrics: dict[str, Any] = {}
        if self.version_2 or any(e.is_impossible for e in examples):
            diffs = {eval_set.examples[i].id: decoded[i].null_score_diff if i in decoded else np.inf for i in indices}
            best_threshold, best_f1 = best_null_threshold(examples, spans, diffs)
            threshold = self.null_threshold if self.null_threshold is not None else best_threshold
            spans = {qid: ("" if diffs[qid] > threshold else text) for qid, text in spans.items()}
            metrics.update({"null_threshold": threshold, "best_null_threshold": best_threshold, "best_f1": best_f1})
        metrics = {**squad_metrics(spans, examples), **metrics}
        return EvalOutcome(metrics, {i: spans[eval_set.examples[i].id] for i in indices})

    def settings(self) -> dict[str, Any]:
        return {
            "name": self.task,
            "max_seq_length": self.options.max_seq_length,
            "doc_stride": self.options.doc_stride,
            "max_query_length": self.options.max_query_length,
            "max_answer_length": self.options.max_answer_length,
            "version_2": self.version_2,
            "null_threshold": self.null_threshold,
        }


def _best_text(prediction: Any) -> str:
    if prediction is None or not prediction.candidates:
        return ""
    return str(prediction.candidates[0]["answer"])


def write_squad_predictions(path: Path, eval_set: EvalSet, outcome: EvalOutcome) -> None:
    """The official SQuAD predictions format: {question_id: answer_text}."""
    answers = {eval_set.examples[i].id: text for i, text in sorted(outcome.predictions.items())}
    path.write_text(json.dumps(answers, indent=1, ensure_ascii=False) + "\n")
