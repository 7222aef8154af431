"""Process-group set-up for data-parallel pretraining under `torchrun` (PyTorch DDP), or a single process.

`torchrun --nproc_per_node N` (and, across machines, `--nnodes M --node_rank K --rdzv_endpoint HOST:PORT`)
sets RANK, WORLD_SIZE, LOCAL_RANK and the rendezvous variables; we only read them. The backend is NCCL on GPUs
and gloo on CPU. Reference: PyTorch "Getting Started with Distributed Data Parallel" and the torchrun docs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistContext:
    """This process's place in the job."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def pick_device(preference: str, local_rank: int = 0) -> torch.device:
    """`auto` takes CUDA when present, else the CPU; `cpu` and `cuda` are taken as asked."""
    if preference not in ("auto", "cpu", "cuda"):
        raise ValueError(f"device must be auto, cpu or cuda, got {preference!r}")
    if preference == "cuda" and not torch.cuda.is_available():
        raise ValueError("device cuda was asked for, but CUDA is not available")
    if preference == "cuda" or (preference == "auto" and torch.cuda.is_available()):
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def init_distributed(device_preference: str = "auto") -> DistContext:
    """Join the torchrun process group when WORLD_SIZE > 1; otherwise a single-process context."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = pick_device(device_preference, local_rank)
    if world_size > 1 and not dist.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    return DistContext(rank=rank, world_size=world_size, local_rank=local_rank, device=device)


def all_reduce_sum(tensor: torch.Tensor, context: DistContext) -> torch.Tensor:
    """Sum `tensor` over all processes (in place; a no-op for one process)."""
    if context.distributed:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def all_reduce_max(tensor: torch.Tensor, context: DistContext) -> torch.Tensor:
    """Element-wise maximum of `tensor` over all processes (in place; a no-op for one process)."""
    if context.distributed:
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return tensor


def barrier(context: DistContext) -> None:
    if context.distributed:
        dist.barrier()


def shutdown(context: DistContext) -> None:
    if context.distributed and dist.is_initialized():
        dist.destroy_process_group()
