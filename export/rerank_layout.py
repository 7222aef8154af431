"""Whether a one-output sequence classifier folder is a cross-encoder reranker, and how its score is read.

A sequence classifier with one output is a regression head, a single-label scorer or a reranker; its
architecture (`BertForSequenceClassification`) is the same in all three. A folder is served as the rerank task when
it says it is a reranker, in one of these ways:
- ours: config.json `bertserve.task.name` is `rerank` (`bertserve finetune rerank` writes it);
- a sentence-transformers (v4 and later) CrossEncoder: `config_sentence_transformers.json` with
  `"model_type": "CrossEncoder"`, and its `activation_fn`;
- an older sentence-transformers CrossEncoder: config.json `sbert_ce_default_activation_function`.
The score is the head's logit passed through the model's activation: sigmoid (CrossEncoder's default for one
output) or none (Identity). Another activation is refused rather than served with scores the model would not give.
Torch-free.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bert_model.config import META_KEY

CROSS_ENCODER_CONFIG = "config_sentence_transformers.json"
LEGACY_ACTIVATION_KEY = "sbert_ce_default_activation_function"
ACTIVATIONS: dict[str, str] = {
    "torch.nn.modules.activation.Sigmoid": "sigmoid",
    "torch.nn.modules.linear.Identity": "none",
}
"""sentence-transformers' activation class names -> the service's (`bert_model.tasks.rerank.ACTIVATIONS`)."""
DEFAULT_ACTIVATION = "sigmoid"


@dataclass(frozen=True)
class RerankSettings:
    """How a reranker's logit becomes its score, and where that was read."""

    activation: str
    source: str

    def task_settings(self) -> dict[str, Any]:
        """The manifest's `task_settings` of a rerank bundle."""
        return {"activation": self.activation}


def rerank_settings(folder: Path) -> RerankSettings | None:
    """`folder`'s reranker settings when its files say it is a one-output reranker; None otherwise."""
    config = _read_json(folder / "config.json")
    if not isinstance(config, dict) or _num_labels(config) != 1:
        return None
    meta = config.get(META_KEY)
    task = meta.get("task") if isinstance(meta, dict) else None
    if isinstance(task, dict) and task.get("name") == "rerank":
        return RerankSettings(DEFAULT_ACTIVATION, f"{folder / 'config.json'}: {META_KEY}.task.name")
    cross_encoder = _read_json(folder / CROSS_ENCODER_CONFIG) if (folder / CROSS_ENCODER_CONFIG).is_file() else None
    if isinstance(cross_encoder, dict) and cross_encoder.get("model_type") == "CrossEncoder":
        where = f"{folder / CROSS_ENCODER_CONFIG}: activation_fn"
        return RerankSettings(_activation(cross_encoder.get("activation_fn"), where), where)
    if LEGACY_ACTIVATION_KEY in config:
        where = f"{folder / 'config.json'}: {LEGACY_ACTIVATION_KEY}"
        return RerankSettings(_activation(config[LEGACY_ACTIVATION_KEY], where), where)
    return None


def default_rerank_settings(folder: Path) -> RerankSettings:
    """The settings of a folder served as a reranker on request (`--task rerank`): its own when it states them,
    else CrossEncoder's default for one output."""
    return rerank_settings(folder) or RerankSettings(DEFAULT_ACTIVATION, "default: sigmoid, as CrossEncoder's")


def _activation(name: Any, where: str) -> str:
    if name is None:
        return DEFAULT_ACTIVATION
    if name not in ACTIVATIONS:
        raise ValueError(f"{where}: activation {name!r} is not served; supported: {sorted(ACTIVATIONS)}")
    return ACTIVATIONS[name]


def _num_labels(config: dict[str, Any]) -> int:
    labels = config.get("id2label")
    if isinstance(labels, dict) and labels:
        return len(labels)
    value = config.get("num_labels", 2)
    return value if isinstance(value, int) else 2


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
