"""Does next-sentence prediction help at our scale? BERT's objective against RoBERTa's, at equal wall time.

Liu et al. (2019), "RoBERTa", section 4.2 found that removing NSP and packing full sentences across documents
matches or improves downstream scores. This benchmark repeats the comparison on one machine:

1. one WordPiece vocabulary and two data folders from the same corpus (by default the one of `make pretrain-demo`:
   WikiText-2 valid + test and Tiny Shakespeare), both with dynamic masking and the same held-out documents:
   `mlm-nsp` (BERT's sentence pairs with next-sentence labels) and `mlm` (full sentences packed across document
   boundaries, no NSP);
2. for each seed, the two `mini` runs side by side, one thread each, with the same wall-clock budget and the
   `pretrain-demo` recipe otherwise (so both meet the same load from anything else on the machine);
3. every checkpoint's masked-LM accuracy on both held-out splits (the same text, as pairs and packed, with fixed
   masks), and its next-sentence accuracy where it has that head;
4. the same short fine-tune from every checkpoint on RTE (sentence pairs) and on a subset of SST-2, scored on RTE
   dev and on `sst2/dev.half-a.tsv` (the final step's model: no checkpoint selection on the scored set).

Run (about an hour with the defaults, on 2 cores):
`OMP_WAIT_POLICY=PASSIVE python -m bertserve.benchmarks.nsp_ablation --data ../shared/data [--minutes 10] [--seeds 1,2]`
(OpenMP threads that spin-wait run several times slower when other processes share the cores).
Runs already finished in `--out` are reused, so an interrupted benchmark continues where it stopped. The figures
go to `<report-dir>/nsp-ablation.json` and `.md` through `report.write_report` (date, machine, command).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from statistics import mean

from bert_model.finetuning.options import ClassifyOptions, FinetuneRun, TrainingOptions
from bert_model.finetuning.run import finetune
from bert_model.heads import BertForMaskedLM
from bert_model.pretraining.build import OBJECTIVES, DataOptions, build_pretraining_data
from bert_model.pretraining.evaluation import held_out_mlm
from bert_model.pretraining.shards import META_FILE
from bert_model.pretraining.vocab import train_wordpiece
from bert_model.tokenization import BertTokenizer
from bert_model.training import read_metrics
from bertserve.benchmarks.report import command_line, provenance, write_report

CORPUS = ("wikitext-2-raw/wiki.valid.raw", "wikitext-2-raw/wiki.test.raw", "tinyshakespeare/input.txt")
"""The corpus of `make pretrain-demo`, relative to the data folder."""
PRETRAIN_RECIPE = [
    *("--config", "mini", "--max-steps", "100000", "--batch-size", "32", "--micro-batch-size", "16", "--lr", "1e-3"),
    *("--dropout", "0", "--attention-init", "local", "--mlm-bias-init", "unigram", "--bf16"),
    *("--eval-every", "0", "--eval-max-instances", "1000", "--log-every", "50"),
]
"""`make pretrain-demo`'s options (bf16 where the CPU has it natively), evaluated once at the end."""
LABELS = {"mlm-nsp": "MLM + NSP (BERT)", "mlm": "MLM only, packed (RoBERTa)"}


@dataclass(frozen=True)
class Task:
    """One downstream fine-tune: data files, columns and how much training."""

    name: str
    train: str
    eval: str
    options: ClassifyOptions
    epochs: float
    max_train_examples: int | None = None


TASKS = (
    Task(
        "rte",
        "rte/glue_tsv_converted/train.tsv",
        "rte/glue_tsv_converted/dev.tsv",
        ClassifyOptions(max_seq_length=128, text_column="sentence1", pair_column="sentence2", label_column="label"),
        epochs=3.0,
    ),
    Task(
        "sst2",
        "sst2/train.tsv.gz",
        "sst2/dev.half-a.tsv",
        ClassifyOptions(max_seq_length=64, label_map={"0": "negative", "1": "positive"}),
        epochs=1.0,
        max_train_examples=10_000,
    ),
)


@dataclass
class Settings:
    """What one benchmark run measures and where it keeps its files."""

    data: Path
    out: Path
    report_dir: Path
    minutes: float = 10.0
    seeds: tuple[int, ...] = (1, 2)
    vocab: Path | None = None
    """An existing tokenizer folder to use instead of training a vocabulary (e.g. pretrain-demo's)."""
    finetune_lr: float = 1e-4
    finetune_seed: int = 42
    threads: int = 2
    """Threads of each fine-tune and evaluation (the paired pretraining runs take one each)."""


@dataclass
class RunFigures:
    """One pretraining run and everything measured from its checkpoint."""

    objective: str
    seed: int
    steps: int = 0
    train_seconds: float = 0.0
    sequences_per_s: float = 0.0
    load_average: list[float] = field(default_factory=list)
    """1-minute load average before and after the pair of runs."""
    own_eval: dict[str, float] = field(default_factory=dict)
    """The run's own final held-out evaluation (mlm_acc, nsp_acc where it has NSP)."""
    mlm_on: dict[str, float] = field(default_factory=dict)
    """Masked-LM accuracy on each data folder's held-out split, by objective of that folder."""
    downstream: dict[str, float] = field(default_factory=dict)
    """Accuracy (%) of the fine-tune on each task."""


# ---- data ---------------------------------------------------------------------------------------------------
def corpus_files(data: Path) -> list[Path]:
    files = [data / name for name in CORPUS]
    missing = [str(path) for path in files if not path.is_file()]
    if missing:
        raise FileNotFoundError(f"corpus files missing under {data}: {missing}")
    return files


def vocabulary(settings: Settings) -> Path:
    """The tokenizer folder: `--vocab`, or one trained on the corpus once (pretrain-demo's size, 8192)."""
    if settings.vocab is not None:
        return settings.vocab
    folder = settings.out / "vocab"
    if not (folder / "tokenizer.json").is_file():
        train_wordpiece([str(p) for p in corpus_files(settings.data)], 8192).save(folder)
    return folder


def data_folder(settings: Settings, objective: str, vocab: Path) -> Path:
    """The data folder of one objective (pretrain-demo's options otherwise), built once."""
    folder = settings.out / f"data-{objective}"
    if not (folder / META_FILE).is_file():
        options = DataOptions(
            max_seq_length=128, objective=objective, dupe_factor=5, dynamic_masking=True, eval_fraction=0.1
        )
        build_pretraining_data(corpus_files(settings.data), BertTokenizer.from_pretrained(vocab), folder, options, True)
    return folder


# ---- pretraining --------------------------------------------------------------------------------------------
def pretrain_command(settings: Settings, data: Path, out: Path, seed: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "bertserve",
        "pretrain",
        "--data",
        str(data),
        "--out",
        str(out),
        "--seed",
        str(seed),
        "--time-budget",
        str(settings.minutes),
        "--no-progress",
        *PRETRAIN_RECIPE,
    ]


def pretrain_pair(settings: Settings, datas: dict[str, Path], seed: int) -> list[float]:
    """Both objectives' runs of one seed, side by side on one thread each (those not finished before); returns the
    1-minute load average before and after them, as recorded when they ran."""
    record = settings.out / "runs" / f"load-seed{seed}.json"
    before = os.getloadavg()[0]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    processes = []
    for objective, data in datas.items():
        out = run_folder(settings, objective, seed)
        if (out / "config.json").is_file():
            continue  # finished before
        out.parent.mkdir(parents=True, exist_ok=True)
        log = (out.parent / f"{out.name}.log").open("w")
        processes.append(
            subprocess.Popen(pretrain_command(settings, data, out, seed), env=env, stdout=log, stderr=subprocess.STDOUT)
        )
    for process in processes:
        if process.wait() != 0:
            raise RuntimeError(f"pretraining failed: {' '.join(map(str, process.args))}")  # type: ignore[arg-type]
    if processes or not record.is_file():
        record.write_text(json.dumps([before, os.getloadavg()[0]]) + "\n")
    return [float(value) for value in json.loads(record.read_text())]


def run_folder(settings: Settings, objective: str, seed: int) -> Path:
    return settings.out / "runs" / f"{objective}-seed{seed}"


def run_figures(folder: Path, figures: RunFigures) -> None:
    """Steps, time and throughput of a finished run and its own final evaluation, from its metrics.jsonl."""
    records = read_metrics(folder / "metrics.jsonl")
    train = [r for r in records if r["split"] == "train"]
    evals = [r for r in records if r["split"] == "eval"]
    figures.steps = int(train[-1]["step"])
    figures.train_seconds = float(train[-1]["elapsed_s"])
    figures.sequences_per_s = figures.steps * 32 / max(figures.train_seconds, 1e-9)
    figures.own_eval = {k: float(evals[-1][k]) for k in ("mlm_acc", "nsp_acc") if k in evals[-1]}


# ---- measuring checkpoints ----------------------------------------------------------------------------------
def cross_evaluate(folder: Path, datas: dict[str, Path]) -> dict[str, float]:
    model = BertForMaskedLM.from_pretrained(folder)
    return {objective: float(held_out_mlm(model, data)["mlm_acc"]) for objective, data in datas.items()}


def fine_tune(settings: Settings, checkpoint: Path, task: Task) -> float:
    """Accuracy (%) of the task's fine-tune from `checkpoint` (reused when its folder already holds the result)."""
    out = checkpoint.parent / f"{checkpoint.name}-{task.name}"
    results = out / "eval_results.json"
    if not results.is_file():
        training = TrainingOptions(
            epochs=task.epochs,
            batch_size=32,
            learning_rate=settings.finetune_lr,
            seed=settings.finetune_seed,
            bf16=True,
            eval_every=10**9,  # only the final step: no selection on the scored set
            max_train_examples=task.max_train_examples,
            threads=settings.threads,
        )
        run = FinetuneRun(
            "classify",
            str(checkpoint),
            str(settings.data / task.train),
            str(out),
            str(settings.data / task.eval),
            training,
            task.options,
        )
        finetune(run)
    return float(json.loads(results.read_text())["accuracy"])


def measure(settings: Settings) -> list[RunFigures]:
    vocab = vocabulary(settings)
    datas = {objective: data_folder(settings, objective, vocab) for objective in OBJECTIVES}
    runs: list[RunFigures] = []
    for seed in settings.seeds:
        load = pretrain_pair(settings, datas, seed)
        for objective in OBJECTIVES:
            figures = RunFigures(objective, seed, load_average=load)
            folder = run_folder(settings, objective, seed)
            run_figures(folder, figures)
            figures.mlm_on = cross_evaluate(folder, datas)
            figures.downstream = {task.name: fine_tune(settings, folder, task) for task in TASKS}
            runs.append(figures)
    return runs


# ---- report -------------------------------------------------------------------------------------------------
def _row(label: str, seed: str, runs: list[RunFigures]) -> str:
    """One table row: the mean over `runs` of each figure, accuracies in %."""

    def average(values: list[float], scale: float = 100.0, digits: int = 1) -> str:
        return f"{scale * mean(values):.{digits}f}" if values else "—"

    nsp = [r.own_eval["nsp_acc"] for r in runs if "nsp_acc" in r.own_eval]
    cells = [
        label,
        seed,
        average([float(r.steps) for r in runs], 1.0, 0),
        average([r.mlm_on["mlm-nsp"] for r in runs]),
        average([r.mlm_on["mlm"] for r in runs]),
        average(nsp),
        average([r.downstream["rte"] for r in runs], 1.0),
        average([r.downstream["sst2"] for r in runs], 1.0),
    ]
    return "| " + " | ".join(cells) + " |"


def markdown(settings: Settings, runs: list[RunFigures]) -> str:
    lines = [
        f"`mini` from scratch, {settings.minutes:g} minutes of pretraining per run (the two objectives of a seed "
        "side by side, one thread each), then the same fine-tune from every checkpoint: RTE 3 epochs on train, "
        "scored on dev; SST-2 1 epoch on the first 10,000 train phrases, scored on dev.half-a "
        f"(lr {settings.finetune_lr:g}, batch 32, seed {settings.finetune_seed}, the final step's model). "
        "Accuracies in %; held-out MLM on the same held-out documents, as NSP pairs and as packed sequences, "
        "with fixed masks.",
        "",
        "| objective | seed | steps | held-out MLM, pairs | held-out MLM, packed | NSP | RTE | SST-2 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for objective in OBJECTIVES:
        mine = [r for r in runs if r.objective == objective]
        lines += [_row(LABELS[objective], str(r.seed), [r]) for r in mine]
        lines.append(_row(f"**{LABELS[objective]}**", "mean", mine))
    loads = sorted({round(value, 1) for r in runs for value in r.load_average})
    lines += ["", f"1-minute load average at the start and end of the pairs: {', '.join(map(str, loads))}."]
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None) -> Settings:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, required=True, help="The shared data folder (corpus, RTE, SST-2).")
    parser.add_argument("--out", type=Path, default=Path("artifacts/nsp-ablation"), help="Runs and data folders.")
    parser.add_argument("--report-dir", type=Path, default=Path("artifacts/bench"), help="Where the report goes.")
    parser.add_argument("--minutes", type=float, default=10.0, help="Wall-clock budget of each pretraining run.")
    parser.add_argument("--seeds", default="1,2", help="Comma-separated pretraining seeds (each runs both objectives).")
    parser.add_argument("--vocab", type=Path, help="Use this tokenizer folder instead of training a vocabulary.")
    parser.add_argument("--finetune-lr", type=float, default=1e-4, help="Peak learning rate of the fine-tunes.")
    parser.add_argument("--threads", type=int, default=2, help="Threads of the fine-tunes and evaluations.")
    args = parser.parse_args(argv)
    seeds = tuple(int(seed) for seed in args.seeds.split(",") if seed.strip())
    if not seeds or args.minutes <= 0:
        parser.error("give at least one seed and a positive --minutes")
    return Settings(
        args.data.resolve(),
        args.out.resolve(),
        args.report_dir,
        args.minutes,
        seeds,
        args.vocab.resolve() if args.vocab else None,
        args.finetune_lr,
        threads=args.threads,
    )


def main(argv: list[str] | None = None) -> None:
    settings = parse_args(argv)
    origin = provenance(command_line("python -m bertserve.benchmarks.nsp_ablation", argv))
    started = time.perf_counter()
    runs = measure(settings)
    paths = {"data", "out", "report_dir", "vocab"}
    figures = {
        "settings": {k: str(v) if k in paths and v is not None else v for k, v in asdict(settings).items()},
        "pretrain_recipe": " ".join(PRETRAIN_RECIPE),
        "runs": [asdict(run) for run in runs],
        "wall_minutes": round((time.perf_counter() - started) / 60, 1),
    }
    tables = markdown(settings, runs)
    json_path, md_path = write_report(settings.report_dir, "nsp-ablation", origin, figures, tables)
    print(tables, end="")
    print(f"wrote {json_path} and {md_path}")


if __name__ == "__main__":
    main()
