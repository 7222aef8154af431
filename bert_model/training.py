"""What the pretraining and the fine-tuning loops share: the learning-rate shape, AdamW's parameter groups, the
`metrics.jsonl` log, the result of a run, and whether bf16 autocast is worth using on this machine.

- Schedule (Devlin et al. 2019, appendix A.2 and A.3): linear warm-up to the peak rate, then linear decay to zero.
- Weight decay (Loshchilov & Hutter 2019, decoupled) skips biases and LayerNorm parameters, as in the reference
  implementation of BERT.
- Precision: bf16 autocast pays only where the CPU multiplies bf16 in hardware (AVX512_BF16 dot products or AMX
  tiles). Elsewhere (AVX2, or AVX-512 without BF16) oneDNN emulates it through conversions, many times slower than
  fp32, so a requested bf16 run trains in fp32 instead and says so once (`resolve_bf16`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

logger = logging.getLogger(__name__)

NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})
"""CPU features (as /proc/cpuinfo and torch's cpuinfo name them) that compute bf16 matrix products natively."""
_WARNED: set[str] = set()
"""Activities (`training`, `evaluating`) whose fp32 fallback was already announced in this process."""


def cpu_flags() -> frozenset[str]:
    """The features of this CPU: torch's own cpuinfo query, else the `flags` line of /proc/cpuinfo (Linux)."""
    query = getattr(torch._C._cpu, "_get_cpu_capability", None)
    if callable(query):
        capability = query()
        if isinstance(capability, dict):
            return frozenset(name for name, present in capability.items() if present is True)
    return _proc_cpuinfo_flags()


def _proc_cpuinfo_flags(path: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    try:
        text = path.read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


def native_bf16(flags: Collection[str] | None = None) -> bool:
    """Whether the CPU (with these feature `flags`, default: this machine's) computes bf16 natively."""
    return bool(NATIVE_BF16_FLAGS & set(cpu_flags() if flags is None else flags))


def resolve_bf16(
    requested: bool,
    device_type: str = "cpu",
    flags: Collection[str] | None = None,
    activity: str = "training",
    announce: bool = True,
) -> bool:
    """Whether to run under bf16 autocast: as requested on an accelerator, on a CPU only where bf16 is native.

    A request the CPU cannot honour falls back to fp32 with one warning line per activity and process (a run
    asks once per loop, evaluation asks again: the user is told once); `announce=False` keeps it quiet (the other
    processes of a distributed run, whose main process says it).
    """
    if not requested or device_type != "cpu" or native_bf16(flags):
        return requested
    if announce and activity not in _WARNED:
        _WARNED.add(activity)
        logger.warning("bf16 requested but this CPU has no native bf16 (AVX512_BF16/AMX): %s in fp32", activity)
    return False


def lr_multiplier(step: float, warmup_steps: int, total_steps: int) -> float:
    """Factor of the peak rate for optimizer step `step` (0-based): linear warm-up, then linear decay to 0."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    return max(0.0, (total_steps - step) / max(1, total_steps - warmup_steps))


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Two groups of the trainable parameters: decayed weights, and biases + LayerNorm parameters without decay
    (each parameter once: `named_parameters` yields a tied parameter once)."""
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    for name, parameter in model.named_parameters():
        if parameter.requires_grad:
            (no_decay if name.endswith("bias") or "LayerNorm" in name else decay).append(parameter)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


class MetricsLog:
    """Appends one JSON object per line to a `metrics.jsonl` file. Without a path it writes nothing (a process
    other than the main one of a distributed run, a loop run without an output folder)."""

    def __init__(self, path: Path | None, *, append: bool = False) -> None:
        """`append`: keep the lines already in the file (a resumed run); otherwise the file starts empty."""
        self.path = path
        if path is not None and not append:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("")

    def write(self, record: dict[str, Any]) -> None:
        if self.path is not None:
            with self.path.open("a") as handle:
                handle.write(json.dumps(record) + "\n")

    def truncate_after(self, step: int) -> None:
        """On resume: drop the lines logged after the checkpoint's step (they will be logged again)."""
        if self.path is None or not self.path.is_file():
            return
        kept = [line for line in self.path.read_text().splitlines() if line and json.loads(line)["step"] <= step]
        self.path.write_text("".join(line + "\n" for line in kept))


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """All records of a metrics.jsonl file."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


@dataclass
class TrainResult:
    """How a training loop ended."""

    steps: int = 0
    """Optimizer steps done (a resumed run counts those before the interruption)."""
    seconds: float = 0.0
    """Wall time of the loop (a resumed run counts the time before the interruption)."""
    completed: bool = True
    """False when the run stopped before its last step (interrupted or `--stop-after`): it can be resumed."""
    last_train: dict[str, Any] = field(default_factory=dict)
    """The last training record of the log (means over its window)."""
    last_eval: dict[str, Any] | None = None
    """The last evaluation record, if any."""
    best_step: int | None = None
    """Step of the best evaluation by the task's primary metric (fine-tuning keeps that checkpoint)."""
    best_metric: float | None = None
    """The primary metric at `best_step`."""
