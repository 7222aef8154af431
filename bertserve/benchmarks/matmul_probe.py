"""How fast this machine's matrix units run right now: one fp32 and one bf16 matmul rate, measured side by side.

A model benchmark divides by the cores' nominal peaks, but on a virtual machine the matrix units can be shared:
on Intel Xeons the AMX tiles belong to the physical core, so a neighbour on its sibling hyperthread (another
tenant) slows our bf16 / int8 tile work while our fp32 AVX-512 work barely moves. `probe()` times the same
matmul (a BERT feed-forward's shape: 2048 tokens × 384 @ 384 × 1536) in fp32 and in bf16 for a fixed wall time
each, through PyTorch (oneDNN picks AMX tiles for bf16 where the CPU has them). `bench-model` probes before and
after its measurements and records both, so a reader sees whether the int8 / bf16 figures met a full-rate or a
shared matrix unit: the bf16 / fp32 ratio of one probe is what to compare between runs and machines.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

SHAPE = (2048, 384, 1536)
"""rows × inner × columns of the probed matmul."""


@dataclass(frozen=True)
class MatmulRates:
    fp32_gflops: float
    bf16_gflops: float

    @property
    def bf16_over_fp32(self) -> float:
        return self.bf16_gflops / self.fp32_gflops

    def describe(self) -> str:
        return (
            f"matmul {SHAPE[0]}×{SHAPE[1]} @ {SHAPE[1]}×{SHAPE[2]}: fp32 {self.fp32_gflops:.0f} GFLOP/s, "
            f"bf16 {self.bf16_gflops:.0f} GFLOP/s ({self.bf16_over_fp32:.1f}× fp32)"
        )


PROBE_SECONDS = 0.5
"""Wall time each precision's matmul is timed for."""


def probe(threads: int | None = None) -> MatmulRates:
    """Time the fp32 and the bf16 matmul for PROBE_SECONDS each (after a short warm-up) on `threads` threads."""
    seconds = PROBE_SECONDS
    import torch

    previous = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        generator = torch.Generator().manual_seed(0)
        rows, inner, columns = SHAPE
        left = torch.randn(rows, inner, generator=generator)
        right = torch.randn(inner, columns, generator=generator)
        flop = 2.0 * rows * inner * columns
        rates = []
        for dtype in (torch.float32, torch.bfloat16):
            a, b = left.to(dtype), right.to(dtype)
            _rate(a, b, flop, min(0.1, seconds))  # warm-up: oneDNN builds its kernel on the first call
            rates.append(_rate(a, b, flop, seconds))
        return MatmulRates(fp32_gflops=rates[0], bf16_gflops=rates[1])
    finally:
        torch.set_num_threads(previous)


def _rate(a: torch.Tensor, b: torch.Tensor, flop: float, seconds: float) -> float:
    import torch

    calls, start = 0, time.perf_counter()
    with torch.inference_mode():
        while True:
            torch.matmul(a, b)
            calls += 1
            elapsed = time.perf_counter() - start
            if elapsed >= seconds:
                return flop * calls / elapsed / 1e9
