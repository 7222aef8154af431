"""Checkpoint folders: load Hugging Face BERT-family checkpoints into our modules and save folders that
`transformers` loads back as the same family and architecture.

The contract is the Hugging Face parameter naming (`bert.encoder.layer.0.attention.self.query.weight`,
`cls.predictions.*`, `cls.seq_relationship.*`, `classifier.*`, `qa_outputs.*`); `bert_model.weights.LAYOUTS`
maps the other families' names (`roberta.*`, `distilbert.transformer.*`, `lm_head.*`, ...) onto it on load and
back on save. Tensors are read by `bert_model.weights` (safetensors, or weights-only `pytorch_model.bin`), those
of a composite folder rebuilt by `bert_model.adapters`. Every copy is shape-checked; missing and unexpected keys
are reported by name.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Self

import torch
from safetensors.torch import save_file
from torch import nn

from bert_model.adapters import load_composite_state
from bert_model.config import META_KEY, BertConfig
from bert_model.registry import resolve_model_path
from bert_model.weights import BASE_PREFIX, read_state_dict, to_family_names, to_our_names

logger = logging.getLogger(__name__)

_BASE_TOP_LEVEL = ("embeddings.", "embeddings_project.", "encoder.", "pooler.")
# Keys that old checkpoints carry but that are buffers here (position and token-type id ranges).
_DROPPED_KEYS = tuple(
    f"{prefix}embeddings.{name}" for prefix in ("", BASE_PREFIX) for name in ("position_ids", "token_type_ids")
)


@dataclass
class LoadReport:
    """What `from_pretrained` did with the keys of a checkpoint."""

    source: str
    missing_head_keys: list[str] = field(default_factory=list)
    """Head parameters absent from the checkpoint, left freshly initialised (expected for a new head)."""
    unexpected_keys: list[str] = field(default_factory=list)
    """Checkpoint keys this model has no use for (e.g. the MLM head when loading a classifier)."""


def normalize_keys(state: dict[str, torch.Tensor], has_base_prefix: bool) -> dict[str, torch.Tensor]:
    """Rename checkpoint keys to this model's naming: TF-era LayerNorm names, `bert.` prefix, tied biases."""
    out: dict[str, torch.Tensor] = {}
    for key, tensor in state.items():
        if key in _DROPPED_KEYS:
            continue
        key = key.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")
        if has_base_prefix and key.startswith(_BASE_TOP_LEVEL):
            key = BASE_PREFIX + key
        elif not has_base_prefix and key.startswith(BASE_PREFIX):
            key = key[len(BASE_PREFIX) :]
        if key == "cls.predictions.decoder.bias":
            key = "cls.predictions.bias"  # the same parameter, tied in the module
        out.setdefault(key, tensor)
    return out


class PreTrainedMixin:
    """`from_pretrained` / `save_pretrained` for every model class (needs `config` and nn.Module)."""

    config: BertConfig
    architecture_suffix: ClassVar[str] = ""
    """The class's name in `transformers` after the family prefix (`Model`, `ForMaskedLM`, ...)."""
    tied_weights: ClassVar[dict[str, str]] = {}
    load_report: LoadReport | None = None

    @property
    def architecture(self) -> str:
        """The `transformers` class this model saves as (`RobertaForSequenceClassification`, ...)."""
        return self.config.architecture(self.architecture_suffix)

    # ---- initialisation ---------------------------------------------------------------------------------
    def init_weights(self) -> None:
        """BERT's initialisation: N(0, initializer_range) weights, zero biases, unit LayerNorm; then any module's
        `init_fixed_weights()` (e.g. DistilBERT's sinusoidal positions)."""
        assert isinstance(self, nn.Module)
        std = self.config.initializer_range
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, mean=0.0, std=std)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, mean=0.0, std=std)
                if module.padding_idx is not None:
                    with torch.no_grad():
                        module.weight[module.padding_idx].zero_()
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
        for module in self.modules():
            init_fixed = getattr(module, "init_fixed_weights", None)
            if callable(init_fixed):
                init_fixed()

    # ---- loading ----------------------------------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, name_or_path: str | Path, **config_overrides: Any) -> Self:
        """Load a checkpoint folder or built-in name (e.g. `minilm`); keyword arguments override config fields."""
        folder = resolve_model_path(name_or_path)
        config = BertConfig.load(folder)
        if config_overrides:
            config = config.replace(**config_overrides)
        state = load_checkpoint_state(folder, config)
        model = cls(config)  # type: ignore[call-arg]
        model.load_report = model.load_checked(state, source=str(folder))
        model.eval()  # type: ignore[attr-defined]
        return model

    def load_checked(self, state: dict[str, torch.Tensor], source: str = "state dict") -> LoadReport:
        """Copy `state` (the family's names or ours) into this model, refusing shape mismatches and missing encoder
        weights."""
        assert isinstance(self, nn.Module)
        has_prefix = any(name.startswith(BASE_PREFIX) for name, _ in self.named_parameters())
        state = normalize_keys(to_our_names(state, self.config.model_type, self.architecture_suffix), has_prefix)
        own = self.state_dict()
        report = LoadReport(source=source)
        mismatches = []
        for key, tensor in state.items():
            if key in self.tied_weights:
                continue
            if key not in own:
                report.unexpected_keys.append(key)
            elif tuple(tensor.shape) != tuple(own[key].shape):
                mismatches.append(
                    f"{key!r}: checkpoint has {tuple(tensor.shape)}, model expects {tuple(own[key].shape)}"
                )
        if mismatches:
            raise ValueError(
                f"shape mismatch for {len(mismatches)} parameter(s) from {source}: " + "; ".join(mismatches[:4])
            )
        missing = [
            k for k in own if k not in state and k not in self.tied_weights and k != "cls.predictions.decoder.bias"
        ]
        base_missing = [k for k in missing if _is_encoder_key(k, has_prefix)]
        if base_missing:
            raise ValueError(
                f"checkpoint {source} lacks {len(base_missing)} encoder weight(s), e.g. {base_missing[:3]}: "
                "it is not a complete BERT checkpoint for this config"
            )
        report.missing_head_keys = missing
        usable = {k: v for k, v in state.items() if k in own and k not in self.tied_weights}
        self.load_state_dict(usable, strict=False)
        if report.missing_head_keys:
            logger.warning("%s: newly initialised (not in %s): %s", type(self).__name__, source, missing)
        if report.unexpected_keys:
            logger.info("%s: unused keys of %s: %s", type(self).__name__, source, report.unexpected_keys)
        return report

    # ---- saving -----------------------------------------------------------------------------------------
    def save_pretrained(self, path: str | Path) -> Path:
        """Write `config.json` + `model.safetensors` (loadable by `transformers` too); returns the folder."""
        assert isinstance(self, nn.Module)
        folder = Path(path)
        folder.mkdir(parents=True, exist_ok=True)
        self.config.save(folder, architecture=self.architecture)
        save_file(self.checkpoint_tensors(), str(folder / "model.safetensors"), metadata={"format": "pt"})
        return folder

    def checkpoint_tensors(self) -> dict[str, torch.Tensor]:
        """The state dict as saved, in the family's names: tied copies dropped, the tied MLM bias written under
        both names where the family does so (BERT, RoBERTa, ALBERT)."""
        assert isinstance(self, nn.Module)
        tensors: dict[str, torch.Tensor] = {}
        for key, tensor in self.state_dict().items():
            if key in self.tied_weights:
                continue
            tensors[key] = tensor.detach().contiguous().clone()
        return to_family_names(tensors, self.config.model_type, self.architecture_suffix)


def load_checkpoint_state(folder: Path, config: BertConfig) -> dict[str, torch.Tensor]:
    """Full weights of a folder: a plain checkpoint, or a base model + adapter + head composite."""
    composite = config.extra.get(META_KEY, {})
    if isinstance(composite, dict) and composite.get("base_model"):
        return load_composite_state(folder, config)
    return read_state_dict(folder)


def _is_encoder_key(key: str, has_prefix: bool) -> bool:
    bare = key[len(BASE_PREFIX) :] if has_prefix and key.startswith(BASE_PREFIX) else key
    if has_prefix and not key.startswith(BASE_PREFIX):
        return False
    return bare.startswith(("embeddings.", "embeddings_project.", "encoder."))
