"""Pretraining metrics: exact sums over a window (so that processes and accumulation steps add up), and the
`metrics.jsonl` log, one JSON object per line with at least step, split, mlm_loss, nsp_loss, mlm_acc,
nsp_acc and lr.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

# Order of the sums in a stats vector.
_FIELDS = ("mlm_loss_sum", "mlm_count", "mlm_hits", "nsp_loss_sum", "nsp_count", "nsp_hits")


@dataclass
class Sums:
    """Running sums of one window: per-token MLM loss and hits, per-sequence NSP loss and hits."""

    values: torch.Tensor = field(default_factory=lambda: torch.zeros(len(_FIELDS), dtype=torch.float64))

    def add(
        self,
        mlm_loss_sum: torch.Tensor,
        mlm_count: int,
        mlm_hits: torch.Tensor,
        nsp_loss_sum: torch.Tensor,
        nsp_count: int,
        nsp_hits: torch.Tensor,
    ) -> None:
        parts = (mlm_loss_sum, mlm_count, mlm_hits, nsp_loss_sum, nsp_count, nsp_hits)
        self.values += torch.tensor([float(_detached(p)) for p in parts], dtype=torch.float64)

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


class MetricsLog:
    """Appends JSON lines to `OUT/metrics.jsonl` (main process only)."""

    def __init__(self, path: Path, enabled: bool) -> None:
        self.path = path
        self.enabled = enabled

    def write(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        with self.path.open("a") as handle:
            handle.write(json.dumps(_rounded(record)) + "\n")

    def truncate_after(self, step: int) -> None:
        """On resume: drop lines logged after the checkpoint's step (they will be logged again)."""
        if not self.enabled or not self.path.is_file():
            return
        kept = [line for line in self.path.read_text().splitlines() if line and json.loads(line)["step"] <= step]
        self.path.write_text("".join(line + "\n" for line in kept))


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """All records of a metrics.jsonl file."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def _detached(value: torch.Tensor | int) -> torch.Tensor | int:
    return value.detach() if isinstance(value, torch.Tensor) else value


def _rounded(record: dict[str, Any]) -> dict[str, Any]:
    return {k: round(v, 7) if isinstance(v, float) else v for k, v in record.items()}
