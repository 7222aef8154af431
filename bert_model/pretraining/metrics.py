"""Pretraining metrics: exact sums over a window, so that processes and accumulation steps add up, and their
means (the mlm_loss, nsp_loss, mlm_acc, nsp_acc of each `metrics.jsonl` line).
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
    nsp_loss_sum: torch.Tensor
    """NSP cross-entropy summed over the sequences."""
    nsp_count: int
    """Sequences."""
    nsp_hits: torch.Tensor
    """Sequences whose next-sentence label is predicted right."""


_FIELDS = BatchSums._fields


@dataclass
class Sums:
    """Running sums of one window, in the order of `BatchSums`' fields (one float64 vector, for all-reduce)."""

    values: torch.Tensor = field(default_factory=lambda: torch.zeros(len(_FIELDS), dtype=torch.float64))

    def add(self, sums: BatchSums) -> None:
        self.values += torch.tensor([float(_detached(part)) for part in sums], dtype=torch.float64)

    def summary(self) -> dict[str, float]:
        """Means: mlm_loss per masked token, nsp_loss per sequence, loss = their sum, accuracies in [0, 1]."""
        s = dict(zip(_FIELDS, self.values.tolist(), strict=True))
        mlm_loss = s["mlm_loss_sum"] / max(s["mlm_count"], 1.0)
        nsp_loss = s["nsp_loss_sum"] / max(s["nsp_count"], 1.0)
        return {
            "loss": mlm_loss + nsp_loss,
            "mlm_loss": mlm_loss,
            "nsp_loss": nsp_loss,
            "mlm_acc": s["mlm_hits"] / max(s["mlm_count"], 1.0),
            "nsp_acc": s["nsp_hits"] / max(s["nsp_count"], 1.0),
            "masked_tokens": int(s["mlm_count"]),
            "sequences": int(s["nsp_count"]),
        }


def _detached(value: torch.Tensor | int) -> torch.Tensor | int:
    return value.detach() if isinstance(value, torch.Tensor) else value
