"""Batch-width benchmark: how fast a bundle's CPU variants run real batches padded to multiples of 1, 8, 16, 32.

    python -m bertserve.benchmarks.widths artifacts/bundles/minilm-sst2 --data ../shared/data/sst2/dev.half-a.tsv
    python -m bertserve.benchmarks.widths artifacts/bundles/minilm-squad \
        --data ../shared/data/squad_v1.1/dev-v1.1.half-a.json
    make bench-widths             # both, under the shared CPU lock

The batcher pads each batch to its longest sequence rounded up to the backend's `width_multiple`
(`bert_model.tasks.features.padded_width`); this measures what each multiple costs or saves, per variant. Inputs are the
data file's examples turned into features by the service's own pipeline (qa: the model's windows), in a seeded
random order; every group of `--group` features is sorted by length and cut into batches of `--batch-size`, as
the batcher cuts its length-sorted queue under load. Each variant is loaded as the service loads it
(`OrtBackend`, one stream, `--threads`); every pass runs all batches once at one multiple, the multiples taking
turns in interleaved rounds (order reversed every other round); per multiple the median pass over `--rounds`
rounds, and its ratio to multiple 1 (the longest row) from the same rounds. Torch-free.
Results: a JSON file and a Markdown table (default artifacts/bench/widths-<bundle>.{json,md}) by
`report.write_report`, which names the date, the machine and the command.
Data: classify a classification file (TSV / CSV / JSONL with a text column, or `.txt`: one text per line), qa
SQuAD JSON, ner a CoNLL file (its words joined by spaces).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np

from bert_model.tasks.features import Feature, collate, padded_width
from bert_model.tasks.readers import read_conll, read_squad, read_text_dataset
from bertserve.benchmarks.report import command_line, provenance, render, write_report
from bundles.runtimes import CPU_RUNTIMES, can_run
from bundles.serving import ServingBundle, open_bundle
from service.backends.ort_backend import OrtBackend
from service.engine.inputs import ClassifyInput, NERInput, QAInput
from service.engine.pipelines import make_pipeline
from service.errors import ServiceError

MULTIPLES = (1, 8, 16, 32)
SHUFFLE_SEED = 0
"""Seed of the features' random order before they are grouped and cut into batches."""
TASKS = ("classify", "qa", "ner")


def read_features(bundle: ServingBundle, data: Path, limit: int) -> list[Feature]:
    """The data file's first `limit` examples as the service's features (one per text, or per QA window)."""
    pipeline = make_pipeline(bundle)
    task = bundle.task
    if task == "classify":
        if data.suffix == ".txt":
            texts = [line.strip() for line in data.read_text(encoding="utf-8").splitlines() if line.strip()]
            request: Any = ClassifyInput(texts=texts[:limit])
        else:
            examples = read_text_dataset(data, require_labels=False)[:limit]
            pairs = [example.pair or "" for example in examples] if examples and examples[0].pair else None
            request = ClassifyInput(texts=[example.text for example in examples], pairs=pairs)
    elif task == "qa":
        squad = read_squad(data)[:limit]
        request = QAInput(questions=[e.question for e in squad], contexts=[e.context for e in squad])
    elif task == "ner":
        request = NERInput(texts=[" ".join(sentence.words) for sentence in read_conll(data)[:limit]])
    else:
        raise ValueError(f"{bundle.path} is a {task!r} bundle; the width benchmark runs {', '.join(TASKS)} bundles")
    return pipeline.features(request)


def cut_batches(features: list[Feature], batch_size: int, group: int, seed: int) -> list[list[Feature]]:
    """Shuffle, then sort each group of `group` features by length and cut it into batches of `batch_size`."""
    order = list(features)
    random.Random(seed).shuffle(order)
    batches = []
    for start in range(0, len(order), group):
        chunk = sorted(order[start : start + group], key=len)
        batches += [chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size)]
    return batches


def cpu_variants(bundle: ServingBundle) -> list[str]:
    """The bundle's variants this process runs on a CPU (OpenVINO ones when `openvino` imports)."""
    variants = bundle.manifest.variants
    return [name for name, spec in variants.items() if spec.provider in CPU_RUNTIMES and can_run(spec.provider)]


async def time_variant(
    bundle: ServingBundle, variant: str, feeds: dict[int, list[dict[str, np.ndarray]]], rounds: int, threads: int
) -> dict[int, list[float]]:
    """Seconds of one pass over all batches, per multiple and round (interleaved, order reversed every other)."""
    backend = OrtBackend(bundle.path, bundle.manifest, variant=variant, intra_op_threads=threads, openvino_streams=1)
    await backend.start()
    try:
        passes: dict[int, list[float]] = {multiple: [] for multiple in feeds}
        order = list(feeds)
        for multiple in order:  # warm-up: every shape once
            for feed in feeds[multiple]:
                await backend.time_call(feed)
        for round_index in range(rounds):
            for multiple in order if round_index % 2 == 0 else order[::-1]:
                passes[multiple].append(sum([await backend.time_call(feed) for feed in feeds[multiple]]))
        return passes
    finally:
        await backend.close()


def run(
    bundle_dir: Path,
    data: Path,
    *,
    variants: list[str] | None = None,
    multiples: tuple[int, ...] = MULTIPLES,
    limit: int = 400,
    batch_size: int = 8,
    group: int = 16,
    rounds: int = 4,
    threads: int = 2,
) -> dict[str, Any]:
    bundle = open_bundle(bundle_dir)
    available = cpu_variants(bundle)
    chosen = variants or available
    unknown = [name for name in chosen if name not in available]
    if unknown:
        raise ValueError(f"variants {unknown} are not CPU variants of {bundle_dir} this process runs ({available})")
    if 1 not in multiples:
        multiples = (1, *multiples)
    features = read_features(bundle, data, limit)
    if not features:
        raise ValueError(f"{data} gave no inputs")
    batches = cut_batches(features, batch_size, group, SHUFFLE_SEED)
    pad_id = bundle.tokenizer.pad_id
    max_width = bundle.manifest.max_seq_length
    feeds = {
        multiple: [
            collate(batch, pad_id, pad_to=padded_width(max(map(len, batch)), multiple, max_width)) for batch in batches
        ]
        for multiple in multiples
    }
    results = {}
    for variant in chosen:
        passes = asyncio.run(time_variant(bundle, variant, feeds, rounds, threads))
        base = statistics.median(passes[1])
        results[variant] = {
            str(multiple): {
                "median_ms_per_batch": statistics.median(seconds) * 1000 / len(batches),
                "vs_longest_row": base / statistics.median(seconds),
                "padded_tokens": int(sum(feed["input_ids"].size for feed in feeds[multiple])),
            }
            for multiple, seconds in passes.items()
        }
    return {
        "bundle": str(bundle_dir),
        "task": bundle.task,
        "data": str(data),
        "features": len(features),
        "real_tokens": sum(map(len, features)),
        "batches": len(batches),
        "batch_size": batch_size,
        "group": group,
        "rounds": rounds,
        "threads": threads,
        "results": results,
    }


def markdown(report: dict[str, Any]) -> str:
    multiples = list(next(iter(report["results"].values())))
    lines = [
        f"Batch widths: {report['bundle']} ({report['task']}), {report['features']} features of {report['data']} "
        f"({report['real_tokens'] / report['features']:.1f} tokens on average) in {report['batches']} batches of "
        f"at most {report['batch_size']} (length-sorted groups of {report['group']}), {report['threads']} threads, "
        f"median of {report['rounds']} interleaved rounds",
        "",
        "| variant | " + " | ".join(f"×{m}: ms / batch (vs ×1)" for m in multiples) + " |",
        "|---|" + "---:|" * len(multiples),
    ]
    for variant, by_multiple in report["results"].items():
        cells = [
            f"{by_multiple[m]['median_ms_per_batch']:.2f} ({by_multiple[m]['vs_longest_row']:.2f}×)" for m in multiples
        ]
        lines.append(f"| {variant} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--data", type=Path, required=True, help="classification file / SQuAD JSON / CoNLL file")
    parser.add_argument("--variants", default="", help="comma-separated (default: every CPU variant)")
    parser.add_argument("--multiples", default=",".join(map(str, MULTIPLES)))
    parser.add_argument("--limit", type=int, default=400, help="examples read from the data file")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--group", type=int, default=16, help="features sorted by length together")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("artifacts/bench"))
    args = parser.parse_args(argv)
    origin = provenance(command_line("python -m bertserve.benchmarks.widths", argv))
    try:
        multiples = tuple(int(item) for item in args.multiples.split(",") if item.strip())
        if not multiples or min(multiples) < 1:
            raise ValueError(f"--multiples must be positive integers, got {args.multiples!r}")
        for name in ("limit", "batch_size", "group", "rounds", "threads"):
            if getattr(args, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
        if not args.data.is_file():
            raise ValueError(f"--data {args.data} is not a file")
        report = run(
            args.bundle,
            args.data,
            variants=[name.strip() for name in args.variants.split(",") if name.strip()] or None,
            multiples=multiples,
            limit=args.limit,
            batch_size=args.batch_size,
            group=args.group,
            rounds=args.rounds,
            threads=args.threads,
        )
    except (ValueError, FileNotFoundError, ServiceError) as error:  # ServiceError: inputs the pipeline refuses
        print(f"error: {error}", file=sys.stderr)
        return 2
    text = markdown(report)
    stem = f"widths-{args.bundle.resolve().name}"
    write_report(args.out, stem, origin, report, text)
    print(render(origin, text))
    print(f"written: {args.out / stem}.json, .md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
