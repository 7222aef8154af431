"""Numerically stable score functions over numpy logits: softmax, sigmoid and top-k.

Softmax subtracts the row maximum before exponentiating (Goodfellow et al., "Deep Learning", section 4.1),
so large logits never overflow; computations run in float64 and results come back as float32 or Python floats.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike


def softmax(logits: ArrayLike, axis: int = -1) -> np.ndarray:
    """Softmax along `axis`, stable for any finite logits (float64 internally, float32 out).

    `-inf` entries (masked positions) get probability 0; a row of only `-inf` raises ValueError.
    """
    values = np.asarray(logits, dtype=np.float64)
    if values.size == 0:
        return values.astype(np.float32)
    if np.isnan(values).any():
        raise ValueError("logits contain NaN")
    peak = np.max(values, axis=axis, keepdims=True)
    if np.isneginf(peak).any():
        raise ValueError("softmax over a row where every logit is -inf")
    exp = np.exp(values - peak)
    return (exp / np.sum(exp, axis=axis, keepdims=True)).astype(np.float32)


def log_softmax(logits: ArrayLike, axis: int = -1) -> np.ndarray:
    """log(softmax(logits)) without underflow (float64)."""
    values = np.asarray(logits, dtype=np.float64)
    peak = np.max(values, axis=axis, keepdims=True)
    shifted = values - peak
    return shifted - np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))


def sigmoid(logits: ArrayLike) -> np.ndarray:
    """Element-wise logistic function, stable for large |x| (float32 out)."""
    values = np.asarray(logits, dtype=np.float64)
    out = np.empty_like(values)
    positive = values >= 0
    out[positive] = 1.0 / (1.0 + np.exp(-values[positive]))
    exp = np.exp(values[~positive])
    out[~positive] = exp / (1.0 + exp)
    return out.astype(np.float32)


def top_k(scores: ArrayLike, k: int | None) -> tuple[np.ndarray, np.ndarray]:
    """Indices and values of the `k` largest entries of a 1-D array, best first (`None` = all).

    Ties keep index order (a stable sort), so results are deterministic.
    """
    values = np.asarray(scores)
    if values.ndim != 1:
        raise ValueError(f"top_k expects a 1-D array, got shape {values.shape}")
    if k is not None and (not isinstance(k, int) or isinstance(k, bool) or k < 1):
        raise ValueError(f"k must be a positive integer or None, got {k!r}")
    order = np.argsort(-values, kind="stable")
    if k is not None:
        order = order[:k]
    return order, values[order]
