"""Pretraining throughput: sequences/s of full training steps (forward, backward, AdamW) in fp32 and in bf16
autocast, the FLOP rate that implies, and a projection for BERT-base on one GPU from a stated FLOP rate.

Run: `python -m bertserve.benchmarks.pretraining [--config mini] [--seq-length 128] [--batch-size 32] [--json PATH]`
(`make bench-pretrain`, under the shared CPU lock). The report (`report.render`, and `report.report_json` for
`--json`) names the date, the machine and the command.

FLOPs per training sequence are counted analytically (Kaplan et al. 2020, section 2.1; Narayanan et al. 2021,
appendix): per token and layer 8·H² (Q, K, V, output projections) + 4·H·I (feed-forward) + 4·S·H (attention
scores and weighted sum) multiply-adds x 2, forward only; the MLM head costs 2·H² + 2·H·V per masked token
(only masked positions are decoded); backward is twice the forward, so a training step is 3x the forward.
The GPU projection divides a stated rate (peak from the vendor's datasheet x an assumed model-FLOP utilisation,
both printed and settable) by the FLOPs of a BERT-base sequence: it is an estimate, not a measurement.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any

import torch

from bert_model.config import PRESETS, BertConfig
from bert_model.heads import BertForPreTraining
from bert_model.training import native_bf16
from bertserve.benchmarks.report import command_line, provenance, render, report_json

# NVIDIA A100 SXM4 datasheet: 312 TFLOP/s dense BF16 tensor-core peak. Published BERT pretraining runs reach
# roughly 40-50% of peak (model FLOP utilisation); 40% is the default assumption.
DEFAULT_GPU_NAME = "NVIDIA A100 SXM4 80GB"
DEFAULT_GPU_PEAK_TFLOPS = 312.0
DEFAULT_GPU_UTILISATION = 0.40


def training_flops_per_sequence(config: BertConfig, seq_length: int, masked_per_seq: float) -> float:
    """Forward + backward FLOPs of one pretraining sequence (see the module docstring)."""
    h, i, layers, v = config.hidden_size, config.intermediate_size, config.num_hidden_layers, config.vocab_size
    per_token_layer = 2 * (4 * h * h + 2 * h * i + 2 * seq_length * h)
    encoder = seq_length * layers * per_token_layer
    mlm_head = masked_per_seq * 2 * (h * h + h * v)
    return 3.0 * (encoder + mlm_head)


@dataclass
class BenchResult:
    precision: str
    sequences_per_s: float
    ms_per_step: float
    achieved_gflops: float


def synthetic_batch(config: BertConfig, batch: int, seq_length: int) -> dict[str, torch.Tensor]:
    """Random ids (never special: ids >= 5), 15% of positions labelled, half NotNext; full-length sequences
    (seeded: every run measures the same batch)."""
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(5, config.vocab_size, (batch, seq_length), generator=generator)
    chosen = torch.rand(batch, seq_length, generator=generator) < 0.15
    labels = torch.where(chosen, input_ids, torch.full_like(input_ids, -100))
    token_type_ids = torch.zeros_like(input_ids)
    token_type_ids[:, seq_length // 2 :] = 1
    return {
        "input_ids": input_ids,
        "attention_mask": torch.ones_like(input_ids),
        "token_type_ids": token_type_ids,
        "labels": labels,
        "next_sentence_label": torch.randint(0, 2, (batch,), generator=generator),
    }


def measure(config: BertConfig, batch: dict[str, torch.Tensor], bf16: bool, steps: int, repeats: int) -> float:
    """Median seconds per training step over `repeats` timings of `steps` steps (after 3 warm-up steps)."""
    torch.manual_seed(0)
    model = BertForPreTraining(config)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = model(**batch).loss
        assert loss is not None
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(3):
        step()
    timings = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(steps):
            step()
        timings.append((time.perf_counter() - start) / steps)
    return statistics.median(timings)


def run(args: argparse.Namespace) -> dict[str, Any]:
    config = BertConfig.preset(args.config, vocab_size=args.vocab_size)
    batch = synthetic_batch(config, args.batch_size, args.seq_length)
    masked = float((batch["labels"] != -100).sum()) / args.batch_size
    flops = training_flops_per_sequence(config, args.seq_length, masked)
    results = []
    # bf16 is timed only where training would use it: without native bf16 the trainers fall back to fp32
    precisions = ("fp32", "bf16-autocast") if native_bf16() else ("fp32",)
    for precision in precisions:
        seconds = measure(config, batch, precision != "fp32", args.steps, args.repeats)
        rate = args.batch_size / seconds
        results.append(BenchResult(precision, rate, seconds * 1000, rate * flops / 1e9))
    base = BertConfig.preset("base")
    base_flops = training_flops_per_sequence(base, args.seq_length, round(0.15 * args.seq_length))
    gpu_rate = args.gpu_peak_tflops * 1e12 * args.gpu_utilisation
    return {
        "cpu_threads": torch.get_num_threads(),
        "load_average_1min_after": os.getloadavg()[0],  # > threads means other processes shared the cores
        "config": args.config,
        "vocab_size": args.vocab_size,
        "seq_length": args.seq_length,
        "batch_size": args.batch_size,
        "gflop_per_training_sequence": flops / 1e9,
        "results": [asdict(r) for r in results],
        "bf16_speedup": results[1].sequences_per_s / results[0].sequences_per_s if len(results) > 1 else None,
        "projection": {
            "model": "BERT-base (12 layers, hidden 768, vocab 30522)",
            "gflop_per_training_sequence": base_flops / 1e9,
            "gpu": args.gpu_name,
            "gpu_peak_tflops": args.gpu_peak_tflops,
            "assumed_utilisation": args.gpu_utilisation,
            "sequences_per_s": gpu_rate / base_flops,
            "cpu_sequences_per_s_at_measured_rate": results[-1].achieved_gflops * 1e9 / base_flops,
            "cpu_measured_precision": results[-1].precision,
        },
    }


def markdown(report: dict[str, Any]) -> str:
    lines = [
        f"# {report['config']} (vocab {report['vocab_size']}), batch {report['batch_size']} x {report['seq_length']} "
        f"tokens, {report['cpu_threads']} CPU threads, {report['gflop_per_training_sequence']:.2f} GFLOP/sequence, "
        f"load average {report['load_average_1min_after']:.1f}",
        "| precision | sequences/s | ms/step | achieved GFLOP/s |",
        "|---|---|---|---|",
    ]
    for r in report["results"]:
        lines.append(
            f"| {r['precision']} | {r['sequences_per_s']:.1f} | {r['ms_per_step']:.0f} | {r['achieved_gflops']:.0f} |"
        )
    if report["bf16_speedup"] is None:
        lines.append("bf16 autocast: not measured (no native bf16 on this CPU: training runs in fp32)")
    else:
        lines.append(f"bf16 autocast speed-up: {report['bf16_speedup']:.2f}x")
    p = report["projection"]
    lines.append(
        f"\nProjection, {p['model']}, {report['seq_length']} tokens: {p['gflop_per_training_sequence']:.1f} "
        f"GFLOP/sequence.\n  {p['gpu']}: {p['gpu_peak_tflops']:.0f} TFLOP/s bf16 peak (datasheet) x "
        f"{p['assumed_utilisation']:.0%} assumed utilisation -> {p['sequences_per_s']:.0f} sequences/s.\n"
        f"  This CPU at its measured {p['cpu_measured_precision']} rate: "
        f"{p['cpu_sequences_per_s_at_measured_rate']:.2f} sequences/s."
    )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="mini", choices=sorted(PRESETS))
    parser.add_argument("--vocab-size", type=int, default=8192)
    parser.add_argument("--seq-length", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=8, help="training steps per timing")
    parser.add_argument("--repeats", type=int, default=3, help="timings; the median is reported")
    parser.add_argument("--gpu-name", default=DEFAULT_GPU_NAME)
    parser.add_argument("--gpu-peak-tflops", type=float, default=DEFAULT_GPU_PEAK_TFLOPS)
    parser.add_argument("--gpu-utilisation", type=float, default=DEFAULT_GPU_UTILISATION)
    parser.add_argument("--json", dest="json_path", help="also write the report as JSON here")
    args = parser.parse_args(argv)
    origin = provenance(command_line("python -m bertserve.benchmarks.pretraining", argv))
    report = run(args)
    print(render(origin, markdown(report)), end="")
    if args.json_path:
        with open(args.json_path, "w") as handle:
            handle.write(report_json(origin, report))


if __name__ == "__main__":
    main()
