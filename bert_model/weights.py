"""Reading the tensors of a checkpoint folder: `model.safetensors` (or a sharded index), or `pytorch_model.bin`
with `torch.load(weights_only=True)`, never a full pickle; and the parameter names of each family's checkpoints.

The lowest layer of checkpoint handling: `bert_model.checkpoint` (plain folders into modules) and
`bert_model.adapters` (composite folders over a base model) both read weights through it.

Our modules are named as Hugging Face's BERT (`bert.encoder.layer.0.attention.self.query.weight`, `cls.predictions.*`).
A `Layout` maps those names onto a family's own (`distilbert.transformer.layer.0.attention.q_lin.weight`,
`lm_head.*`, ...) and back, as pairs of dotted name prefixes; `*` stands for a layer index. A name of ours never
starts with a prefix of the family's, so mapping a state dict that is already in our names changes nothing.
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file

WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
"""Weight files of a checkpoint folder, in order of preference."""


def read_state_dict(folder: Path) -> dict[str, torch.Tensor]:
    """All tensors of the checkpoint in `folder` (safetensors preferred, sharded indexes supported)."""
    for name in WEIGHT_FILES:
        path = folder / name
        if path.is_file():
            break
    else:
        raise FileNotFoundError(f"no weights in {folder}: expected one of {', '.join(WEIGHT_FILES)}")
    if name.endswith(".index.json"):
        shards = sorted(set(json.loads(path.read_text())["weight_map"].values()))
        state: dict[str, torch.Tensor] = {}
        for shard in shards:
            state.update(_read_file(folder / shard))
        return state
    return _read_file(path)


def _read_file(path: Path) -> dict[str, torch.Tensor]:
    if path.suffix == ".safetensors":
        return load_file(str(path))
    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        raise ValueError(
            f"{path} holds more than tensors and is refused (only weights_only loading is allowed): {error}"
        ) from error
    if not isinstance(loaded, dict):
        raise ValueError(f"{path} does not hold a state dict (got {type(loaded).__name__})")
    return loaded


# ---- family layouts -----------------------------------------------------------------------------------------
OURS, THEIRS = 0, 1
Rename = tuple[str, str | None]
"""(our dotted prefix, the family's); None: the family's checkpoint has no such tensor (a tied duplicate)."""
BASE_PREFIX = "bert."
"""Attribute under which every head model holds its encoder."""


@dataclass(frozen=True)
class Layout:
    """The parameter names of one family's checkpoints, relative to ours."""

    base_prefix: str
    """Attribute of the encoder in its head models (`roberta`, `distilbert`, ...)."""
    encoder: tuple[Rename, ...] = ()
    """Renames inside the encoder (names without the base prefix)."""
    heads: dict[str, tuple[Rename, ...]] = field(default_factory=dict)
    """Renames of head parameters, by architecture suffix (`ForMaskedLM`, ...)."""

    def theirs(self, key: str, head: str) -> str | None:
        """The family's name of our parameter `key` in a model with that head; None if it saves no such tensor."""
        if key.startswith(BASE_PREFIX):
            renamed = _rename(key.removeprefix(BASE_PREFIX), self.encoder, OURS)
            return None if renamed is None else f"{self.base_prefix}.{renamed}"
        return _rename(key, self.heads.get(head, ()) + self.encoder, OURS)

    def ours(self, key: str, head: str) -> str:
        """Our name of the family's parameter `key` (unknown names are returned unchanged)."""
        prefix = self.base_prefix + "."
        in_encoder = key.startswith(prefix)
        renames = self.encoder if in_encoder else self.heads.get(head, ()) + self.encoder
        renamed = _rename(key.removeprefix(prefix) if in_encoder else key, renames, THEIRS)
        assert renamed is not None, "every rename has a name of ours"
        return BASE_PREFIX + renamed if in_encoder else renamed


def _layer(names: dict[str, str], theirs_layer: str) -> tuple[Rename, ...]:
    """Renames of the parameters inside layer `*`: ours `encoder.layer.*.<name>` <-> `<theirs_layer>.<theirs>`."""
    return tuple((f"encoder.layer.*.{ours}", f"{theirs_layer}.{theirs}") for ours, theirs in names.items())


def _lm_head(dense: str, layer_norm: str, decoder: str, bias: str | None) -> tuple[Rename, ...]:
    """The masked-LM transform and decoder; `bias` is the family's name of the decoder bias kept beside it."""
    return (
        ("cls.predictions.transform.dense", dense),
        ("cls.predictions.transform.LayerNorm", layer_norm),
        ("cls.predictions.decoder", decoder),
        ("cls.predictions.bias", bias),
    )


_ROBERTA = Layout(
    "roberta", heads={"ForMaskedLM": _lm_head("lm_head.dense", "lm_head.layer_norm", "lm_head.decoder", "lm_head.bias")}
)
LAYOUTS: dict[str, Layout] = {
    "bert": Layout("bert"),
    "roberta": _ROBERTA,
    "xlm-roberta": _ROBERTA,
    "electra": Layout(
        "electra",
        heads={
            "ForMaskedLM": _lm_head(
                "generator_predictions.dense", "generator_predictions.LayerNorm", "generator_lm_head", None
            )
        },
    ),
    "distilbert": Layout(
        "distilbert",
        encoder=_layer(
            {
                "attention.self.query": "attention.q_lin",
                "attention.self.key": "attention.k_lin",
                "attention.self.value": "attention.v_lin",
                "attention.output.dense": "attention.out_lin",
                "attention.output.LayerNorm": "sa_layer_norm",
                "intermediate.dense": "ffn.lin1",
                "output.dense": "ffn.lin2",
                "output.LayerNorm": "output_layer_norm",
            },
            "transformer.layer.*",
        ),
        heads={
            "ForMaskedLM": _lm_head("vocab_transform", "vocab_layer_norm", "vocab_projector", None),
            # Leaf names: `classifier.out_proj.*` of ours must not match DistilBERT's `classifier` prefix.
            "ForSequenceClassification": (
                ("classifier.dense", "pre_classifier"),
                ("classifier.out_proj.weight", "classifier.weight"),
                ("classifier.out_proj.bias", "classifier.bias"),
            ),
        },
    ),
    "albert": Layout(
        "albert",
        encoder=(
            ("embeddings_project", "encoder.embedding_hidden_mapping_in"),
            ("pooler.dense.weight", "pooler.weight"),
            ("pooler.dense.bias", "pooler.bias"),
            *_layer(
                {
                    "attention.self.query": "attention.query",
                    "attention.self.key": "attention.key",
                    "attention.self.value": "attention.value",
                    "attention.output.dense": "attention.dense",
                    "attention.output.LayerNorm": "attention.LayerNorm",
                    "intermediate.dense": "ffn",
                    "output.dense": "ffn_output",
                    "output.LayerNorm": "full_layer_layer_norm",
                },
                "encoder.albert_layer_groups.0.albert_layers.*",
            ),
        ),
        heads={
            "ForMaskedLM": _lm_head(
                "predictions.dense", "predictions.LayerNorm", "predictions.decoder", "predictions.bias"
            )
        },
    ),
}
"""Checkpoint names of each supported model_type (bert_model.config.FAMILIES has the same keys)."""


def to_our_names(state: dict[str, torch.Tensor], model_type: str, head: str = "Model") -> dict[str, torch.Tensor]:
    """A family checkpoint's tensors under our names (Hugging Face BERT's); names already ours pass unchanged."""
    layout = LAYOUTS[model_type]
    return {layout.ours(key, head): tensor for key, tensor in state.items()}


def to_family_names(state: dict[str, torch.Tensor], model_type: str, head: str = "Model") -> dict[str, torch.Tensor]:
    """Our tensors under the family's checkpoint names, tied duplicates the family does not save left out."""
    layout = LAYOUTS[model_type]
    renamed = {layout.theirs(key, head): tensor for key, tensor in state.items()}
    return {key: tensor for key, tensor in renamed.items() if key is not None}


def _rename(key: str, renames: Sequence[Rename], side: int) -> str | None:
    """`key` with the longest matching prefix on `side` replaced by the other side's (unchanged if none matches)."""
    segments = key.split(".")
    best: tuple[Rename, int] | None = None
    for rename in renames:
        pattern = rename[side]
        if pattern is None:
            continue
        length = _prefix_length(pattern.split("."), segments)
        if length and (best is None or length > best[1]):
            best = (rename, length)
    if best is None:
        return key
    rename, length = best
    source, target = rename[side], rename[1 - side]
    if target is None or source is None:
        return None
    indexes = iter(s for p, s in zip(source.split("."), segments, strict=False) if p == "*")
    replaced = [next(indexes) if part == "*" else part for part in target.split(".")]
    return ".".join(replaced + segments[length:])


def _prefix_length(pattern: list[str], segments: list[str]) -> int:
    """len(pattern) if it is a dotted prefix of segments (`*` matching a layer index), else 0."""
    if len(pattern) > len(segments):
        return 0
    matches = all(p == s or (p == "*" and s.isdigit()) for p, s in zip(pattern, segments, strict=False))
    return len(pattern) if matches else 0
