"""Loading a task model for export and wrapping it so that its forward takes and returns plain tensors.

`torch.onnx.export` traces `forward(input_ids, attention_mask, token_type_ids)`; the wrapper turns the output
dataclasses of bert_model.heads into the tuple of tensors whose names `bundles.spec.OUTPUT_NAMES`
gives for the task. The model is switched to eager attention, the op sequence ONNX Runtime's BERT optimizer
fuses into one `Attention` node per layer (see ../shared/README.md, "Export and optimization").

Only what the answer needs leaves the graph (spec.OUTPUT_NAMES):
- embed: the token states pooled under the attention mask as sentence-transformers' `Pooling` module does (mean:
  sum / max(count, 1e-9); cls: the first token; max: masked positions at -1e9 first), (B, H), and that vector
  L2-normalized as its `Normalize` module does (divided by max(norm, 1e-12)). The numpy references are
  `bert_model.tasks.embeddings.pool` and `l2_normalize`. Then the token states themselves, (B, S, H): the encoder's
  last hidden state, which sentence-transformers calls `token_embeddings` (the service fetches it only for the
  requests that ask for every token's vector, `bundles.spec.ON_REQUEST_OUTPUTS`).
- fill-mask: the masked-LM head at the mask tokens only, (B, M, V) with M the batch's most masks in one row (at
  least 1). A row's mask positions come first, in position order, from TopK(k=M, smallest) over a key that is the
  position for a mask token and S + the position otherwise: the keys are distinct, so the order does not rest on
  how a runtime breaks ties. The hidden states there are gathered and the head (transform + decoder tied to the
  word embeddings) runs on M rows instead of S, which also saves the (S, H) x (H, V) product.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from bert_model.config import FAMILIES, BertConfig, check_model_type
from bert_model.heads import (
    BertForMaskedLM,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
)
from bert_model.modeling import BertModel
from bert_model.registry import resolve_model_path
from bert_model.tasks.embeddings import MASKED_MAX, NORMALIZE_EPS, POOLING_MODES
from bundles.spec import OUTPUT_NAMES
from export.rerank_layout import rerank_settings

HEAD_TASKS: dict[str, str] = {
    "ForSequenceClassification": "classify",
    "ForQuestionAnswering": "qa",
    "ForTokenClassification": "ner",
    "Model": "embed",
    "ForMaskedLM": "fill-mask",
}
"""The serving task of each `transformers` architecture suffix, the same in every family."""
ARCHITECTURE_TASKS: dict[str, str] = {
    family.class_prefix + suffix: task for family in FAMILIES.values() for suffix, task in HEAD_TASKS.items()
} | {"BertForPreTraining": "fill-mask"}
"""Architecture name in config.json (`RobertaForQuestionAnswering`, ...) -> its serving task."""
TASK_CLASSES: dict[str, type[nn.Module]] = {
    "classify": BertForSequenceClassification,
    "rerank": BertForSequenceClassification,
    "qa": BertForQuestionAnswering,
    "ner": BertForTokenClassification,
    "embed": BertModel,
    "fill-mask": BertForMaskedLM,
}
"""The class each task loads: a pretraining checkpoint (`bertserve pretrain`'s, Hugging Face's BertForPreTraining)
serves fill-mask through its masked-LM head; its NSP head and pooler are not read."""


def task_of_folder(folder: Path) -> str:
    """The serving task of a checkpoint folder of any supported family, from config.json `architectures` (no entry:
    `embed`); a masked-LM or pretraining checkpoint is `fill-mask` (`load_task_model(..., task="embed")` serves its
    encoder), a one-output sequence classifier that says it is a cross-encoder `rerank`. An unsupported
    `model_type` gets the one message every loader gives."""
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(f"{folder} is not a model folder: no config.json")
    try:
        data = json.loads(config_file.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{config_file} is not valid JSON: {error}") from error
    if not isinstance(data, dict):
        raise ValueError(f"{config_file} must hold a JSON object")
    model_type = check_model_type(data.get("model_type", "bert"))
    architectures = data.get("architectures") or [FAMILIES[model_type].class_prefix + "Model"]
    for architecture in architectures:
        if architecture in ARCHITECTURE_TASKS:
            task = ARCHITECTURE_TASKS[architecture]
            # A one-output classifier whose folder says it is a cross-encoder serves as a reranker (rerank_layout.py).
            return "rerank" if task == "classify" and rerank_settings(folder) is not None else task
    raise ValueError(
        f"{folder}: architectures {architectures} name no servable task; expected a {model_type} architecture ending "
        f"in one of {sorted(HEAD_TASKS)} (e.g. {FAMILIES[model_type].class_prefix}ForSequenceClassification)"
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


@dataclass(frozen=True)
class GraphOptions:
    """What a graph computes after the encoder, beyond its task's head."""

    pooling: str = "mean"
    """embed: how token states become the sentence vector (one of bert_model.tasks.embeddings.POOLING_MODES)."""
    mask_token_id: int | None = None
    """fill-mask: the tokenizer's mask token id, whose positions the masked-LM head runs at (required)."""

    def __post_init__(self) -> None:
        if self.pooling not in POOLING_MODES:
            raise ValueError(f"pooling must be one of {', '.join(POOLING_MODES)}, got {self.pooling!r}")


def pool_states(states: torch.Tensor, attention_mask: torch.Tensor, mode: str) -> torch.Tensor:
    """(B, S, H) token states and the (B, S) 0/1 mask -> (B, H) sentence vectors."""
    weights = attention_mask.unsqueeze(-1).to(states.dtype)  # (B, S, 1)
    if mode == "mean":
        return (states * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)
    if mode == "cls":
        return states[:, 0]
    if mode == "max":
        return states.masked_fill(weights == 0, MASKED_MAX).max(dim=1).values
    raise ValueError(f"pooling must be one of {', '.join(POOLING_MODES)}, got {mode!r}")


def mask_positions(input_ids: torch.Tensor, mask_token_id: int) -> torch.Tensor:
    """(B, S) ids -> (B, M) positions: each row's mask tokens in position order, then its other positions in order,
    M = the most mask tokens of a row (at least 1)."""
    is_mask = input_ids == mask_token_id
    seq_len = input_ids.shape[1]
    positions = torch.arange(seq_len, device=input_ids.device)  # (S,)
    key = torch.where(is_mask, positions, positions + seq_len)  # (B, S): distinct per row, masks first
    most = is_mask.sum(dim=1).max().clamp(min=1)
    # k as a tensor: the traced graph computes M per batch (a Python int would be traced as a constant)
    return torch.topk(key, most, dim=1, largest=False, sorted=True).indices  # type: ignore[arg-type]


class MaskedPositionsLM(nn.Module):
    """A masked-LM model's encoder (`bert`) and head (`cls`) under the names of the checkpoint, the head run at the
    mask tokens only: forward(...) -> (B, M, V). Node names stay `/model/bert/...`, `/model/cls/...` inside
    ExportWrapper, as for the other tasks (export/static_quant.py keeps `cls/` in float by name)."""

    def __init__(self, model: nn.Module, mask_token_id: int) -> None:
        super().__init__()
        self.bert = encoder_of(model)
        self.cls = _MaskedLMHead(model.cls.predictions)  # type: ignore[union-attr, arg-type]
        self.mask_token_id = mask_token_id

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor
    ) -> torch.Tensor:
        states = self.bert(input_ids, attention_mask, token_type_ids).last_hidden_state  # (B, S, H)
        positions = mask_positions(input_ids, self.mask_token_id)  # (B, M)
        index = positions.unsqueeze(-1).expand(-1, -1, states.shape[-1])  # (B, M, H)
        return self.cls(torch.gather(states, 1, index))


class _MaskedLMHead(nn.Module):
    """The masked-LM head of BertForMaskedLM (`cls.predictions`) or BertForPreTraining (whose `cls` also holds the
    next-sentence head, unused here)."""

    def __init__(self, predictions: nn.Module) -> None:
        super().__init__()
        self.predictions = predictions

    def forward(self, states: torch.Tensor) -> torch.Tensor:
        return self.predictions(states)


class ExportWrapper(nn.Module):
    """forward(input_ids, attention_mask, token_type_ids) -> the task's output tensors, in OUTPUT_NAMES order."""

    def __init__(self, model: nn.Module, task: str, options: GraphOptions | None = None) -> None:
        super().__init__()
        if task not in OUTPUT_NAMES:
            raise ValueError(f"unknown task {task!r}; choose one of {sorted(OUTPUT_NAMES)}")
        self.options = options or GraphOptions()
        if task == "fill-mask":
            if self.options.mask_token_id is None:
                raise ValueError("a fill-mask graph needs the tokenizer's mask token id (GraphOptions.mask_token_id)")
            model = MaskedPositionsLM(model, self.options.mask_token_id)
        self.model = model
        self.task = task
        self.output_names = OUTPUT_NAMES[task]

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        output = self.model(input_ids, attention_mask, token_type_ids)
        if self.task == "embed":
            states = output.last_hidden_state  # (B, S, H)
            pooled = pool_states(states, attention_mask, self.options.pooling)  # (B, H)
            return pooled, pooled / pooled.norm(dim=-1, keepdim=True).clamp(min=NORMALIZE_EPS), states
        if self.task == "fill-mask":
            return (output,)  # (B, M, V)
        return tuple(getattr(output, name) for name in self.output_names)
