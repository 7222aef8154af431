"""`make bench-gpu`: the gpu-fp16 variant on ONNX Runtime's CUDA and TensorRT execution providers, and the
service's throughput on the GPU; one JSON + Markdown table (default artifacts/bench/bench-gpu.{json,md}).

    python -m bertserve.benchmarks.gpu [--bundles-dir artifacts/bundles] [--out artifacts/bench] [--runs 200]

Needs a CUDA machine (onnxruntime-gpu with the CUDA provider, and TensorRT's libraries for that provider's row);
without the CUDA provider it stops at once with exit code 2 and measures nothing.

1. Bundles: `bert-base-random` (BERT-base shape: 12 layers, hidden 768, 12 heads, intermediate 3072, random
   weights, the embedded MiniLM's WordPiece vocabulary, a two-label classify head; no download) and the
   default `minilm-sst2` and `minilm-squad`, each taken from `--bundles-dir` when its manifest is there, else
   exported with the cpu-fp32 and gpu-fp16 variants (the accuracy guards run as for any export).
2. Per bundle, provider (CUDA; TensorRT with fp16 kernels and an engine cache) and shape (batch 1 / 16 / 64 ×
   length 128 / 384): inputs copied to the GPU once and bound with IO binding, outputs bound on the GPU, so a
   timed run is the graph alone; `--warmup` untimed runs first (TensorRT builds its engine for the shape there),
   then `--runs` timed runs: median and p99 milliseconds, sequences per second.
3. The service (`bertserve.benchmarks.service`) serving minilm-sst2 on the GPU (`BERTSERVE_DEVICE=cuda`, batches
   of up to 64) at 32 concurrent clients: requests/s, p50 / p99, mean batch, with batching on and off.
The report (`report.write_report`) names the date, the machine with its GPU, and the command.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from bertserve.benchmarks.report import command_line, provenance, render, write_report
from bundles.runtimes import CUDA_PROVIDER as CUDA

TENSORRT = "TensorrtExecutionProvider"
SHAPES = tuple((batch, seq_len) for seq_len in (128, 384) for batch in (1, 16, 64))
BASE_NAME = "bert-base-random"
MINILM_BUNDLES = ("minilm-sst2", "minilm-squad")
NO_CUDA_EXIT = 2


def cuda_missing() -> str | None:
    """Why this machine cannot run the benchmark, or None when ONNX Runtime has the CUDA provider."""
    try:
        import onnxruntime as ort
    except ImportError:
        return "onnxruntime is not installed"
    if CUDA not in ort.get_available_providers():
        providers = ", ".join(ort.get_available_providers())
        return (
            f"this ONNX Runtime ({ort.__version__}) has no {CUDA} (providers: {providers}): "
            "run it on a machine with an NVIDIA GPU and onnxruntime-gpu installed"
        )
    return None


def ensure_bundles(bundles_dir: Path) -> dict[str, Path]:
    """The BERT-base-shaped and MiniLM bundles, exported where absent (cpu-fp32 + gpu-fp16)."""
    from export.bundle import build_bundle

    bundles: dict[str, Path] = {}
    for name in (BASE_NAME, *MINILM_BUNDLES):
        target = bundles_dir / name
        if not (target / "manifest.json").is_file():
            source = base_model_folder(bundles_dir / f"{BASE_NAME}-model") if name == BASE_NAME else name
            print(f"exporting {name} -> {target}", flush=True)
            build_bundle(source, target, variants=["cpu-fp32", "gpu-fp16"])
        bundles[name] = target
    return bundles


def base_model_folder(folder: Path) -> Path:
    """A BERT-base-shaped classifier with random weights (seeded) and MiniLM's vocabulary, saved as a model folder."""
    import torch

    from bert_model.config import BertConfig
    from bert_model.heads import BertForSequenceClassification
    from bert_model.tokenization import BertTokenizer

    if (folder / "config.json").is_file():
        return folder
    torch.manual_seed(0)
    tokenizer = BertTokenizer.from_pretrained("minilm")
    config = BertConfig.preset("base", vocab_size=tokenizer.vocab_size).with_labels(["negative", "positive"])
    BertForSequenceClassification(config).eval().save_pretrained(folder)
    tokenizer.save(folder)
    return folder


def session(path: Path, provider: str, cache_dir: Path) -> Any:
    """An ONNX Runtime session over the gpu-fp16 graph, opened with the service's settings, on CUDA or on TensorRT
    (fp16 kernels, an engine cache in `cache_dir`) in front of CUDA."""
    from bundles.runtimes import RuntimeSettings, ort_session

    if provider == TENSORRT:
        trt = {"trt_fp16_enable": True, "trt_engine_cache_enable": True, "trt_engine_cache_path": str(cache_dir)}
        providers: list[Any] = [(TENSORRT, trt), CUDA]
    else:
        providers = [CUDA]
    return ort_session(path, RuntimeSettings(), providers)


def time_shape(sess: Any, batch: int, seq_len: int, vocab: int, warmup: int, runs: int) -> dict[str, float]:
    """Median / p99 ms and seq/s of one shape through IO binding, inputs and outputs on the GPU."""
    import onnxruntime as ort

    rng = np.random.default_rng(0)
    ids = rng.integers(1000, vocab, size=(batch, seq_len), dtype=np.int64)
    feed = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
    binding = sess.io_binding()
    names = {node.name for node in sess.get_inputs()}
    for name, array in feed.items():
        if name in names:
            binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(array, "cuda", 0))
    for node in sess.get_outputs():
        binding.bind_output(node.name, "cuda")
    for _ in range(warmup):
        sess.run_with_iobinding(binding)
    times = []
    for _ in range(runs):
        binding.synchronize_inputs()
        start = time.perf_counter()
        sess.run_with_iobinding(binding)
        binding.synchronize_outputs()
        times.append((time.perf_counter() - start) * 1000)
    median = statistics.median(times)
    return {"median_ms": median, "p99_ms": float(np.percentile(times, 99)), "sequences_per_s": batch * 1000 / median}


def bench_providers(bundles: dict[str, Path], warmup: int, runs: int, cache_dir: Path) -> list[dict[str, Any]]:
    import onnxruntime as ort

    from bert_model.tokenization import BertTokenizer
    from bundles.spec import TOKENIZER_DIR, BundleManifest

    rows: list[dict[str, Any]] = []
    for name, folder in bundles.items():
        manifest = BundleManifest.read(folder)
        graph = folder / manifest.variants["gpu-fp16"].file
        vocab = BertTokenizer.from_pretrained(folder / TOKENIZER_DIR).vocab_size
        for provider in (CUDA, TENSORRT):
            if provider not in ort.get_available_providers():
                rows.append({"bundle": name, "provider": provider, "error": "provider not available"})
                continue
            sess = session(graph, provider, cache_dir)
            for batch, seq_len in SHAPES:
                if seq_len > manifest.max_seq_length:
                    continue
                figures = time_shape(sess, batch, seq_len, vocab, warmup, runs)
                rows.append({"bundle": name, "provider": provider, "batch": batch, "seq_len": seq_len, **figures})
                print(json.dumps(rows[-1]), flush=True)
    return rows


def bench_service(bundle: Path, out_dir: Path, duration: float) -> dict[str, Any]:
    from bertserve.benchmarks import service

    os.environ.update(BERTSERVE_DEVICE="cuda", BERTSERVE_MAX_BATCH_SIZE="64")
    return service.run(str(bundle), 32, duration, 200, out_dir)


def markdown(report: dict[str, Any]) -> str:
    lines = [
        f"GPU benchmark: {report['gpu']}; onnxruntime {report['onnxruntime']}.",
        "",
        "| bundle | provider | batch × seq | median ms | p99 ms | seq/s |",
        "|---|---|---|---|---|---|",
    ]
    for row in report["rows"]:
        if "error" in row:
            lines.append(f"| {row['bundle']} | {row['provider']} | — | {row['error']} | | |")
            continue
        lines.append(
            f"| {row['bundle']} | {row['provider'].removesuffix('ExecutionProvider')} | {row['batch']} × "
            f"{row['seq_len']} | {row['median_ms']:.2f} | {row['p99_ms']:.2f} | {row['sequences_per_s']:.0f} |"
        )
    service = report.get("service")
    if service:
        lines += ["", "| service on GPU, 32 clients | req/s | p50 ms | p99 ms | mean batch |", "|---|---|---|---|---|"]
        for mode in ("batching_on", "batching_off"):
            row = service[mode]
            lines.append(
                f"| {mode.replace('_', ' ')} | {row['requests_per_s']:.1f} | {row['p50_ms']:.1f} | "
                f"{row['p99_ms']:.1f} | {row['mean_batch_size']:.2f} |"
            )
    return "\n".join(lines) + "\n"


def gpu_name() -> str:
    import subprocess

    try:
        result = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unknown GPU"
    return result.stdout.strip().replace("\n", "; ") or "unknown GPU"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bundles-dir", type=Path, default=Path("artifacts/bundles"), help="Bundles taken or built.")
    parser.add_argument("--out", type=Path, default=Path("artifacts/bench"), help="Folder for bench-gpu.{json,md}.")
    parser.add_argument("--warmup", type=int, default=20, help="Untimed runs per shape (TensorRT builds engines).")
    parser.add_argument("--runs", type=int, default=200, help="Timed runs per shape.")
    parser.add_argument("--service-duration", type=float, default=20.0, help="Seconds per service throughput run.")
    parser.add_argument("--no-service", action="store_true", help="Skip the service throughput runs.")
    args = parser.parse_args(argv)
    missing = cuda_missing()
    if missing is not None:
        print(f"bench-gpu needs CUDA and stops here, nothing measured: {missing}", file=sys.stderr)
        return NO_CUDA_EXIT
    import onnxruntime as ort

    args.out.mkdir(parents=True, exist_ok=True)
    gpu = gpu_name()
    origin = provenance(command_line("python -m bertserve.benchmarks.gpu", argv), gpu=gpu)
    bundles = ensure_bundles(args.bundles_dir)
    report: dict[str, Any] = {
        "gpu": gpu,
        "onnxruntime": ort.__version__,
        "warmup": args.warmup,
        "runs": args.runs,
        "rows": bench_providers(bundles, args.warmup, args.runs, args.out / "trt-cache"),
    }
    if not args.no_service:
        report["service"] = bench_service(bundles["minilm-sst2"], args.out, args.service_duration)
    table = markdown(report)
    write_report(args.out, "bench-gpu", origin, report, table)
    print(render(origin, table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
