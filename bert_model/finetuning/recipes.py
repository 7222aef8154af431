"""The recipe of each task by name, and the task settings a fine-tuned model carries in its config.json.

`finetune` and `evaluate` (run.py) build their recipes here, and so does export's accuracy guard
(`export/task_guard.py`), so that all three read a model's settings and decode its outputs the same way.
A fine-tuned model stores its task settings under `bertserve.task` of config.json (`TaskRecipe.settings`):
the task's name and its window sizes (SQuAD 2.0 models also `version_2` and the tuned `null_threshold`; a reranker
its pair length and how its candidate lists are built).
"""

from __future__ import annotations

from typing import Any

from bert_model.config import META_KEY, BertConfig
from bert_model.finetuning.classify import ClassifyRecipe
from bert_model.finetuning.ner import NERRecipe
from bert_model.finetuning.options import ClassifyOptions, NEROptions, QAOptions, RerankOptions
from bert_model.finetuning.qa import QARecipe
from bert_model.finetuning.recipe import TaskRecipe
from bert_model.finetuning.rerank import RerankRecipe
from bert_model.tokenization import BertTokenizer

_NOT_OPTIONS = ("name", "version_2", "null_threshold")
"""Stored settings that are facts about the trained model, not options of its task."""


def make_recipe(task: str, tokenizer: BertTokenizer, options: Any, config: BertConfig | None = None) -> TaskRecipe:
    """The recipe of `task`; with a trained model's `config`, its labels and stored task settings."""
    labels = [config.id2label[i] for i in sorted(config.id2label)] if config and config.id2label else None
    if task == "classify":
        return ClassifyRecipe(tokenizer, options if isinstance(options, ClassifyOptions) else None, labels)
    if task == "ner":
        return NERRecipe(tokenizer, options if isinstance(options, NEROptions) else None, labels)
    if task == "qa":
        threshold = stored_settings(config).get("null_threshold") if config else None
        return QARecipe(tokenizer, options if isinstance(options, QAOptions) else None, threshold)
    if task == "rerank":
        return RerankRecipe(tokenizer, options if isinstance(options, RerankOptions) else None)
    raise ValueError(f"unknown task {task!r}: choose classify, qa, ner or rerank")


def stored_settings(config: BertConfig | None) -> dict[str, Any]:
    """The `bertserve.task` settings a fine-tuned model was saved with ({} for other models)."""
    meta = config.extra.get(META_KEY) if config else None
    task = meta.get("task") if isinstance(meta, dict) else None
    return task if isinstance(task, dict) else {}


def default_options(task: str, settings: dict[str, Any]) -> Any:
    """Task options from a model's stored settings (window sizes the model was trained with)."""
    keep = {k: v for k, v in settings.items() if k not in _NOT_OPTIONS}
    factory = {"classify": ClassifyOptions, "qa": QAOptions, "ner": NEROptions, "rerank": RerankOptions}[task]
    return factory(**keep)
