"""Sentence embeddings from an encoder's token states: pooling, L2 normalization, dimension truncation.

Pooling follows sentence-transformers' `Pooling` module (sentence_transformers/models/Pooling.py):
- mean: the average of the token vectors under the attention mask (sum / max(count, 1e-9));
- cls: the first token's vector ([CLS]);
- max: the element-wise maximum over the tokens under the mask (masked positions set to -1e9 first).
`l2_normalize` is `torch.nn.functional.normalize(p=2, dim=-1, eps=1e-12)`; `truncate_dimensions` keeps the
first `dimensions` components and renormalizes, as OpenAI's `dimensions` option and Matryoshka models do.
A bundle's graph pools and normalizes (export/wrapper.py follows `pool` and `l2_normalize`) and outputs both
vectors; `embedding_postprocess` picks the one a request asks for, or truncates the pooled one.
Torch-free: numpy only; computed in float32 like the reference.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike

from bert_model.tasks.features import Feature

Pooling = Literal["mean", "cls", "max"]
POOLING_MODES: tuple[str, ...] = ("mean", "cls", "max")
NORMALIZE_EPS = 1e-12
MASKED_MAX = -1e9
"""The value masked positions take before max pooling (sentence-transformers' choice)."""


def pool(last_hidden_state: ArrayLike, attention_mask: ArrayLike, mode: str = "mean") -> np.ndarray:
    """(B, S, H) token states and a (B, S) 0/1 mask -> (B, H) sentence vectors (float32)."""
    states = np.asarray(last_hidden_state, dtype=np.float32)
    mask = np.asarray(attention_mask)
    if states.ndim != 3:
        raise ValueError(f"last_hidden_state must have shape (batch, sequence, hidden), got {states.shape}")
    if mask.shape != states.shape[:2]:
        raise ValueError(f"attention_mask has shape {mask.shape}, expected {states.shape[:2]}")
    weights = mask.astype(np.float32)[:, :, None]  # (B, S, 1)
    if mode == "mean":
        total = (states * weights).sum(axis=1)  # (B, H)
        count = np.maximum(weights.sum(axis=1), 1e-9)  # (B, 1)
        return (total / count).astype(np.float32)
    if mode == "cls":
        return states[:, 0].copy()
    if mode == "max":
        return np.where(weights > 0, states, np.float32(MASKED_MAX)).max(axis=1)
    raise ValueError(f"pooling must be one of {', '.join(POOLING_MODES)}, got {mode!r}")


def l2_normalize(vectors: ArrayLike) -> np.ndarray:
    """Each row divided by its Euclidean norm (at least 1e-12, so a zero row stays zero), float32."""
    values = np.asarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(values, axis=-1, keepdims=True)
    return (values / np.maximum(norms, NORMALIZE_EPS)).astype(np.float32)


def truncate_dimensions(vectors: ArrayLike, dimensions: int) -> np.ndarray:
    """The first `dimensions` components of each row, L2-normalized again (unit length, like the input)."""
    values = np.asarray(vectors, dtype=np.float32)
    size = values.shape[-1]
    if isinstance(dimensions, bool) or not isinstance(dimensions, int) or not 1 <= dimensions <= size:
        raise ValueError(f"dimensions must be an integer between 1 and {size} (the model's size), got {dimensions!r}")
    return l2_normalize(values[..., :dimensions])


def embedding_postprocess(
    features: Sequence[Feature],
    pooled: Sequence[np.ndarray],
    normalized: Sequence[np.ndarray] | None = None,
    *,
    normalize: bool = True,
    dimensions: int | None = None,
) -> dict[int, np.ndarray]:
    """Per request index: its sentence vector, float32 (H,) or (dimensions,). One feature per input (no windows);
    each output row is that feature's (H,) pooled vector (the graph's `pooled_embedding`) and, when given, its
    L2-normalized copy (`normalized_embedding`, else normalized here). The normalized vector unless `normalize` is
    false (the pooled one); with `dimensions`, the pooled vector's first `dimensions` components, renormalized."""
    if len(features) != len(pooled) or (normalized is not None and len(normalized) != len(pooled)):
        raise ValueError(f"{len(pooled)} output rows for {len(features)} features")
    results: dict[int, np.ndarray] = {}
    for index, (feature, output) in enumerate(zip(features, pooled, strict=True)):
        vector = np.asarray(output, dtype=np.float32)
        if vector.ndim != 1:
            raise ValueError(f"embedding rows must be (hidden,) vectors, got shape {vector.shape}")
        if dimensions is not None:
            vector = truncate_dimensions(vector, dimensions)  # unit length whatever `normalize` says
        elif normalize:
            vector = l2_normalize(vector) if normalized is None else np.asarray(normalized[index], np.float32)
        results[feature.request_index] = vector
    return results
