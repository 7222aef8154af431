"""Pretraining metrics: exact sums over a window, so that processes and accumulation steps add up, and their
means (the mlm_loss, nsp_loss, mlm_acc, nsp_acc of each `metrics.jsonl` line; an MLM-only run has no nsp_*).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import torch


class BatchSums(NamedTuple):
    """The sums of one forward pass, what `Sums` accumulates over a window."""

    mlm_loss_sum: torch.Tensor
    """MLM cross-entropy summed over the masked tokens."""
    mlm_count: int
    """Masked tokens."""
    mlm_hits: torch.Tensor
    """Masked tokens predicted right."""
    nsp_loss_sum: torch.Tensor | float
    """NSP cross-entropy summed over the sequences with a next-sentence label."""
    nsp_count: int
    """Sequences with a next-sentence label (0 in an MLM-only run)."""
    nsp_hits: torch.Tensor | int
    """Sequences whose next-sentence label is predicted right."""
    sequences: int
    """Sequences."""


_FIELDS = BatchSums._fields


@dataclass
class Sums:
    """Running sums of one window, in the order of `BatchSums`' fields (one float64 vector, for all-reduce)."""

    values: torch.Tensor = field(default_factory=lambda: torch.zeros(len(_FIELDS), dtype=torch.float64))

    def add(self, sums: BatchSums) -> None:
        self.values += torch.tensor([float(_detached(part)) for part in sums], dtype=torch.float64)

    def summary(self) -> dict[str, float]:
        """Means: mlm_loss per masked token, nsp_loss per sequence, loss = their sum, accuracies in [0, 1]; the
        nsp_* entries only when some sequence had a next-sentence label."""
        s = dict(zip(_FIELDS, self.values.tolist(), strict=True))
        mlm_loss = s["mlm_loss_sum"] / max(s["mlm_count"], 1.0)
        means = {
            "loss": mlm_loss,
            "mlm_loss": mlm_loss,
            "mlm_acc": s["mlm_hits"] / max(s["mlm_count"], 1.0),
            "masked_tokens": int(s["mlm_count"]),
            "sequences": int(s["sequences"]),
        }
        if s["nsp_count"] > 0:
            nsp_loss = s["nsp_loss_sum"] / s["nsp_count"]
            means |= {"loss": mlm_loss + nsp_loss, "nsp_loss": nsp_loss, "nsp_acc": s["nsp_hits"] / s["nsp_count"]}
        return means


def _detached(value: torch.Tensor | float) -> torch.Tensor | float:
    return value.detach() if isinstance(value, torch.Tensor) else value
