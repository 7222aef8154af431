"""Reading the tensors of a checkpoint folder: `model.safetensors` (or a sharded index), or `pytorch_model.bin`
with `torch.load(weights_only=True)`, never a full pickle.

The lowest layer of checkpoint handling: `bert_model.checkpoint` (plain folders into modules) and
`bert_model.adapters` (composite folders over a base model) both read weights through it.
"""

from __future__ import annotations

import json
import pickle
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
