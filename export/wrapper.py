"""Loading a task model for export and wrapping it so that its forward takes and returns plain tensors.

`torch.onnx.export` traces `forward(input_ids, attention_mask, token_type_ids)`; the wrapper turns the output
dataclasses of bert_model.heads into the tuple of tensors whose names `bert_model.tasks.spec.OUTPUT_NAMES`
gives for the task. The model is switched to eager attention, the op sequence ONNX Runtime's BERT optimizer
fuses into one `Attention` node per layer (see ../shared/README.md, "Export and optimization").
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from bert_model.config import BertConfig
from bert_model.heads import (
    BertForMaskedLM,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
)
from bert_model.modeling import BertModel
from bert_model.registry import resolve_model_path
from bert_model.tasks.spec import OUTPUT_NAMES

ARCHITECTURE_TASKS: dict[str, str] = {
    "BertForSequenceClassification": "classify",
    "BertForQuestionAnswering": "qa",
    "BertForTokenClassification": "ner",
    "BertModel": "embed",
    "BertForMaskedLM": "fill-mask",
    "BertForPreTraining": "fill-mask",
}
TASK_CLASSES: dict[str, type[nn.Module]] = {
    "classify": BertForSequenceClassification,
    "qa": BertForQuestionAnswering,
    "ner": BertForTokenClassification,
    "embed": BertModel,
    "fill-mask": BertForMaskedLM,
}
"""The class each task loads: a pretraining checkpoint (`bertserve pretrain`'s, Hugging Face's BertForPreTraining)
serves fill-mask through its masked-LM head; its NSP head and pooler are not read."""


def task_of_folder(folder: Path) -> str:
    """The serving task of a checkpoint folder, from config.json `architectures` (no entry: `embed`); a
    masked-LM or pretraining checkpoint is `fill-mask` (`load_task_model(..., task="embed")` serves its encoder)."""
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(f"{folder} is not a model folder: no config.json")
    try:
        data = json.loads(config_file.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{config_file} is not valid JSON: {error}") from error
    if not isinstance(data, dict):
        raise ValueError(f"{config_file} must hold a JSON object")
    architectures = data.get("architectures") or ["BertModel"]
    for architecture in architectures:
        if architecture in ARCHITECTURE_TASKS:
            return ARCHITECTURE_TASKS[architecture]
    raise ValueError(
        f"{folder}: architectures {architectures} name no servable task; expected one of {sorted(ARCHITECTURE_TASKS)}"
    )


def load_task_model(name_or_path: str | Path, task: str | None = None) -> tuple[nn.Module, str, Path]:
    """Load a model folder or built-in name in eval mode with eager attention; returns (model, task, folder)."""
    folder = resolve_model_path(name_or_path)
    task = task or task_of_folder(folder)
    if task not in TASK_CLASSES:
        raise ValueError(f"unknown task {task!r}; choose one of {sorted(TASK_CLASSES)}")
    model_class = TASK_CLASSES[task]
    model = model_class.from_pretrained(folder, attn_implementation="eager")  # type: ignore[attr-defined]
    model.eval()
    return model, task, folder


def labels_of(model: nn.Module) -> list[str]:
    """Class names by index (empty for qa / embed / fill-mask)."""
    config: BertConfig = model.config  # type: ignore[assignment]
    if isinstance(model, (BertForSequenceClassification, BertForTokenClassification)):
        return [config.id2label[i] for i in range(config.num_labels)]
    return []


def encoder_of(model: nn.Module) -> BertModel:
    return model if isinstance(model, BertModel) else model.bert  # type: ignore[return-value]


class ExportWrapper(nn.Module):
    """forward(input_ids, attention_mask, token_type_ids) -> the task's output tensors, in OUTPUT_NAMES order."""

    def __init__(self, model: nn.Module, task: str) -> None:
        super().__init__()
        if task not in OUTPUT_NAMES:
            raise ValueError(f"unknown task {task!r}; choose one of {sorted(OUTPUT_NAMES)}")
        self.model = model
        self.task = task
        self.output_names = OUTPUT_NAMES[task]

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        output = self.model(input_ids, attention_mask, token_type_ids)
        return tuple(getattr(output, name) for name in self.output_names)
