"""Run a PyTorch task model over `bert_model.tasks` features and return per-feature numpy output rows.

The rows go to the same post-processing functions the service applies to ONNX Runtime outputs. Output names
follow the serving contract (`bundles.spec.OUTPUT_NAMES`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from bert_model.finetuning.batching import fit_segments, inference_batches, model_inputs
from bert_model.tasks.features import Feature

SEQUENCE_OUTPUTS = ("start_logits", "end_logits")


def autocast(enabled: bool) -> contextlib.AbstractContextManager[None]:
    """bf16 autocast on CPU when `enabled`, else a no-op (the caller decides: `bert_model.training.resolve_bf16`)."""
    if not enabled:
        return contextlib.nullcontext()
    return torch.autocast("cpu", dtype=torch.bfloat16)


def predict_rows(
    model: nn.Module,
    features: Sequence[Feature],
    output_names: Sequence[str],
    *,
    pad_id: int = 0,
    batch_size: int = 64,
    bf16: bool = False,
    progress: bool = False,
) -> dict[str, list[np.ndarray]]:
    """For each output name, one float32 row per feature (in feature order), trimmed to the feature's length."""
    rows: dict[str, list[np.ndarray | None]] = {name: [None] * len(features) for name in output_names}
    was_training = model.training
    model.eval()
    batches = inference_batches([len(f) for f in features], batch_size)
    try:
        with torch.inference_mode(), autocast(bf16):
            for batch in _progress(batches, progress):
                outputs = model(**fit_segments(model_inputs([features[i] for i in batch], pad_id), model))
                for name in output_names:
                    values = getattr(outputs, name).float().numpy()
                    per_token = name in SEQUENCE_OUTPUTS or values.ndim == 3  # (B, S) or (B, S, C)
                    for row, index in enumerate(batch):
                        rows[name][index] = values[row, : len(features[index])] if per_token else values[row]
    finally:
        model.train(was_training)
    return {name: [r for r in values if r is not None] for name, values in rows.items()}


def _progress(batches: list[list[int]], enabled: bool) -> Iterator[list[int]]:
    if not enabled:
        yield from batches
        return
    yield from tqdm(batches, desc="evaluate", unit="batch", leave=False, mininterval=5.0)
