"""Resumable checkpoints of a pretraining run: `OUT/checkpoint/`.

```
checkpoint/
  config.json, model.safetensors   the model (loads with from_pretrained too)
  trainer_state.pt                 step, data position, optimizer state, elapsed time (the schedule's position), options
  rng-rank{R}.pt                   each process's torch (and CUDA) generator state, for identical dropout
```

Everything that decides the next step is saved, so that N steps + resume + N steps equals 2N steps. The folder
is written next to the old one and swapped in by renames, so an interruption while saving keeps the previous
checkpoint. `trainer_state.pt` holds only tensors and plain values: it loads with `torch.load(weights_only=True)`.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bert_model.heads import BertForPreTraining
from bert_model.pretraining.dataset import StreamState
from bert_model.pretraining.distributed import DistContext, barrier
from bert_model.weights import read_state_dict

CHECKPOINT_DIR = "checkpoint"
STATE_FILE = "trainer_state.pt"
# Options that must not change between a run and its resumption (they change what the steps compute).
RESUME_INVARIANTS = ("batch_size", "seed", "optimizer", "max_steps", "data_fingerprint")


@dataclass
class ResumeState:
    step: int
    stream: StreamState
    elapsed_s: float


def checkpoint_path(out: Path) -> Path:
    return out / CHECKPOINT_DIR


def save_checkpoint(
    out: Path,
    model: BertForPreTraining,
    optimizer: torch.optim.Optimizer,
    resume: ResumeState,
    options: dict[str, Any],
    context: DistContext,
) -> Path:
    """Write the checkpoint of every process (collective: all processes call it)."""
    final = checkpoint_path(out)
    staging = out / (CHECKPOINT_DIR + ".tmp")
    if context.is_main:
        shutil.rmtree(staging, ignore_errors=True)
        model.save_pretrained(staging)
        state = {
            "step": resume.step,
            "stream": {"epoch": resume.stream.epoch, "position": resume.stream.position},
            "elapsed_s": resume.elapsed_s,
            "optimizer": optimizer.state_dict(),
            "world_size": context.world_size,
            "options": {k: options[k] for k in RESUME_INVARIANTS},
        }
        torch.save(state, staging / STATE_FILE)
    barrier(context)
    rng = {"torch": torch.get_rng_state()}
    if context.device.type == "cuda":
        rng["cuda"] = torch.cuda.get_rng_state(context.device)
    torch.save(rng, staging / f"rng-rank{context.rank}.pt")
    barrier(context)
    if context.is_main:
        previous = out / (CHECKPOINT_DIR + ".old")
        shutil.rmtree(previous, ignore_errors=True)
        if final.exists():
            final.rename(previous)
        staging.rename(final)
        shutil.rmtree(previous, ignore_errors=True)
    barrier(context)
    return final


def load_checkpoint(
    out: Path,
    model: BertForPreTraining,
    optimizer: torch.optim.Optimizer,
    options: dict[str, Any],
    context: DistContext,
) -> ResumeState:
    """Restore everything `save_checkpoint` wrote; refuses a checkpoint of an incompatible run."""
    folder = checkpoint_path(out)
    if not (folder / STATE_FILE).is_file():
        raise FileNotFoundError(f"nothing to resume in {out}: no {CHECKPOINT_DIR}/{STATE_FILE}")
    state = torch.load(folder / STATE_FILE, map_location="cpu", weights_only=True)
    _check_same_run(state, options, context, folder)
    model.load_checked(read_state_dict(folder), source=str(folder))
    optimizer.load_state_dict(state["optimizer"])
    rng = torch.load(folder / f"rng-rank{context.rank}.pt", weights_only=True)
    torch.set_rng_state(rng["torch"])
    if "cuda" in rng and context.device.type == "cuda":
        torch.cuda.set_rng_state(rng["cuda"], context.device)
    return ResumeState(step=int(state["step"]), stream=StreamState(**state["stream"]), elapsed_s=state["elapsed_s"])


def _check_same_run(state: dict[str, Any], options: dict[str, Any], context: DistContext, folder: Path) -> None:
    if state["world_size"] != context.world_size:
        raise ValueError(
            f"the checkpoint in {folder} was written by {state['world_size']} processes; resume it with the same "
            f"number (this run has {context.world_size})"
        )
    for name in RESUME_INVARIANTS:
        if state["options"][name] != options[name]:
            raise ValueError(
                f"cannot resume {folder}: it was trained with {name}={state['options'][name]!r}, "
                f"this run asks for {name}={options[name]!r}"
            )
