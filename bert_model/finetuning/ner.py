"""Fine-tuning recipe for named-entity recognition on CoNLL column files (IOB1 or IOB2).

Devlin et al. (2019), section 5.3: a linear layer over every token; the label of a word sits on its first
word piece (-100 on the others, ignored by the loss); predictions are read at the first piece. Scored at
the entity level with seqeval.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from bert_model.finetuning.batching import model_inputs, pad_token_labels
from bert_model.finetuning.options import NEROptions
from bert_model.finetuning.recipe import EvalOutcome, EvalSet, TaskRecipe, TrainSet
from bert_model.tasks.features import Feature
from bert_model.tasks.metrics import ner_metrics
from bert_model.tasks.ner import NERFeature, align_labels, bio_labels, build_ner_word_features, ner_word_predictions
from bert_model.tasks.readers import ConllSentence, read_conll
from bert_model.tokenization import BertTokenizer


class NERRecipe(TaskRecipe):
    task: ClassVar[str] = "ner"
    primary_metric: ClassVar[str] = "f1"
    output_names: ClassVar[tuple[str, ...]] = ("logits",)

    def __init__(
        self, tokenizer: BertTokenizer, options: NEROptions | None = None, labels: list[str] | None = None
    ) -> None:
        self.options = options or NEROptions()
        super().__init__(tokenizer, labels or self.options.labels)

    @staticmethod
    def model_class() -> type[nn.Module]:
        from bert_model.heads import BertForTokenClassification

        return BertForTokenClassification

    def _read(self, path: str | Path) -> list[ConllSentence]:
        return read_conll(path, tag_column=self.options.tag_column, scheme=self.options.scheme)  # type: ignore[arg-type]

    def _features(self, sentences: list[ConllSentence]) -> list[NERFeature]:
        return build_ner_word_features(
            self.tokenizer,
            [s.words for s in sentences],
            max_seq_length=self.options.max_seq_length,
            stride=self.options.stride,
        )

    def load_train(self, path: str | Path, limit: int | None = None) -> TrainSet:
        sentences = self._read(path)[:limit]
        if self.labels is None:
            types = sorted({tag[2:] for s in sentences for tag in s.tags if tag != "O"})
            self.labels = bio_labels(types)
        check_known_tags(sentences, self.labels, path)
        index = {label: i for i, label in enumerate(self.labels)}
        features = self._features(sentences)
        targets = [align_labels(f, [index[t] for t in sentences[f.request_index].tags]) for f in features]
        return TrainSet(list(features), targets, len(sentences))

    def load_eval(self, path: str | Path) -> EvalSet:
        sentences = self._read(path)
        if self.labels is not None:
            check_known_tags(sentences, self.labels, path)
        return EvalSet(Path(path), sentences, list(self._features(sentences)))

    def batch(self, train: TrainSet, indices: list[int]) -> dict[str, torch.Tensor]:
        features = [train.features[i] for i in indices]
        inputs = model_inputs(features, self.tokenizer.pad_id)
        inputs["labels"] = pad_token_labels([train.targets[i] for i in indices], inputs["input_ids"].shape[1])
        return inputs

    def score(
        self, eval_set: EvalSet, indices: list[int], rows: dict[str, list[np.ndarray]], features: list[Feature]
    ) -> EvalOutcome:
        assert self.labels is not None
        ner_features = [f for f in features if isinstance(f, NERFeature)]
        predicted = ner_word_predictions(ner_features, rows["logits"], self.labels)
        gold = [eval_set.examples[i].tags for i in indices]
        metrics = ner_metrics(gold, [predicted[i] for i in indices])
        return EvalOutcome(metrics, {i: predicted[i] for i in indices})

    def settings(self) -> dict[str, Any]:
        return {"name": self.task, "max_seq_length": self.options.max_seq_length, "stride": self.options.stride}


def check_known_tags(sentences: list[ConllSentence], labels: list[str], path: str | Path) -> None:
    """Raise ValueError naming the lines whose tag the model does not know."""
    known = set(labels)
    unknown = [(s.line + k, tag) for s in sentences for k, tag in enumerate(s.tags) if tag not in known]
    if unknown:
        shown = ", ".join(f"line {line}: {tag!r}" for line, tag in unknown[:5])
        raise ValueError(f"{path}: {len(unknown)} tag(s) the model does not know ({shown}); its labels are {labels}")


def write_conll_predictions(path: Path, eval_set: EvalSet, outcome: EvalOutcome) -> None:
    """conlleval's layout: `word gold predicted` per line, a blank line after each sentence."""
    with path.open("w") as handle:
        for index, tags in sorted(outcome.predictions.items()):
            sentence = eval_set.examples[index]
            for word, gold, predicted in zip(sentence.words, sentence.tags, tags, strict=True):
                handle.write(f"{word} {gold} {predicted}\n")
            handle.write("\n")
