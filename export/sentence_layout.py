"""How an encoder folder turns token states into one sentence vector: its sentence-transformers layout, if any.

A sentence-transformers model folder (sentence_transformers/models: Transformer, Pooling, Normalize) lists its
modules in `modules.json`; the `Pooling` module's `config.json` has one `pooling_mode_*` flag set, a `Normalize`
module L2-normalizes the pooled vector, and `sentence_bert_config.json` holds the `max_seq_length` the model
was trained and is used with. A plain BERT folder has none of these: mean pooling, no normalization (the
manifest says which applied). Modules the service cannot reproduce (Dense projections, other pooling modes,
several modes at once) are refused rather than served with vectors that differ from the model's.
Torch-free.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bert_model.tasks.embeddings import POOLING_MODES

MODULES_FILE = "modules.json"
SENTENCE_CONFIG_FILE = "sentence_bert_config.json"
POOLING_FLAGS: dict[str, str] = {
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
}
UNSUPPORTED_FLAGS = ("pooling_mode_mean_sqrt_len_tokens", "pooling_mode_weightedmean_tokens", "pooling_mode_lasttoken")
PASSIVE_MODULES = ("Transformer", "Pooling", "Normalize")
DEFAULT_POOLING = "mean"


@dataclass(frozen=True)
class EmbeddingSettings:
    """The pooling and normalization of an encoder's sentence vectors, and where they were read."""

    pooling: str
    """One of bert_model.tasks.embeddings.POOLING_MODES."""
    normalize: bool
    """Whether the pooled vector is L2-normalized."""
    source: str
    """The files the settings come from, or why the defaults apply."""
    max_seq_length: int | None = None
    """The sentence-transformers `max_seq_length` (inputs are truncated to it), when the folder gives one."""

    def task_settings(self) -> dict[str, Any]:
        """The manifest's `task_settings` of an embed bundle."""
        return {"pooling": self.pooling, "normalize": self.normalize}


def embedding_settings(folder: Path) -> EmbeddingSettings:
    """Read `folder`'s sentence-transformers layout; without `modules.json`: mean pooling, no normalization."""
    modules_file = folder / MODULES_FILE
    if not modules_file.is_file():
        return EmbeddingSettings(DEFAULT_POOLING, False, f"default: {folder} has no {MODULES_FILE}")
    modules = _read_json(modules_file)
    if not isinstance(modules, list) or not all(isinstance(m, dict) and "type" in m for m in modules):
        raise ValueError(f"{modules_file} must be a list of modules, each with a `type`")
    kinds = [str(module["type"]).rsplit(".", 1)[-1] for module in modules]
    others = [kind for kind in kinds if kind not in PASSIVE_MODULES]
    if others:
        raise ValueError(
            f"{modules_file}: module(s) {others} change the sentence vector and cannot be served from the encoder's "
            f"outputs; only {', '.join(PASSIVE_MODULES)} are supported"
        )
    pooling, read = DEFAULT_POOLING, [MODULES_FILE]
    for module, kind in zip(modules, kinds, strict=True):
        if kind == "Pooling":
            config_file = folder / str(module.get("path", "")) / "config.json"
            pooling = _pooling_mode(config_file)
            read.append(str(config_file.relative_to(folder)))
    return EmbeddingSettings(pooling, "Normalize" in kinds, " + ".join(read), _max_seq_length(folder))


def _pooling_mode(config_file: Path) -> str:
    config = _read_json(config_file)
    if not isinstance(config, dict):
        raise ValueError(f"{config_file} must hold a JSON object")
    unsupported = [flag for flag in UNSUPPORTED_FLAGS if config.get(flag)]
    chosen = [mode for flag, mode in POOLING_FLAGS.items() if config.get(flag)]
    if unsupported or len(chosen) != 1:
        raise ValueError(
            f"{config_file}: pooling {unsupported + chosen or 'none'} is not supported; exactly one of "
            f"{', '.join(POOLING_FLAGS)} must be true (serving pools with one of {', '.join(POOLING_MODES)})"
        )
    return chosen[0]


def _max_seq_length(folder: Path) -> int | None:
    config_file = folder / SENTENCE_CONFIG_FILE
    if not config_file.is_file():
        return None
    config = _read_json(config_file)
    value = config.get("max_seq_length") if isinstance(config, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _read_json(path: Path) -> Any:
    if not path.is_file():
        raise FileNotFoundError(f"sentence-transformers layout: {path} is missing")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not valid JSON: {error}") from error
