"""The `finetune` / `evaluate` commands: options reach the run, user mistakes are one-line errors."""

from __future__ import annotations

import json
from dataclasses import fields

import pytest
from typer.testing import CliRunner

from bert_model.adapters import LoRAConfig
from bert_model.finetuning.options import (
    ClassifyOptions,
    FinetuneRun,
    NEROptions,
    QAOptions,
    RerankOptions,
    TrainingOptions,
)
from bertserve.cli import build_app

runner = CliRunner()


def test_finetune_then_evaluate_through_the_cli(tiny_base, conll_files, tmp_path) -> None:
    train, dev = conll_files
    out = tmp_path / "ner"
    args = ["finetune", "ner", "--model", str(tiny_base), "--train", str(train), "--eval", str(dev), "--out", str(out)]
    args += ["--max-steps", "3", "--batch-size", "8", "--max-seq-length", "32", "--stride", "8", "--seed", "7"]
    result = runner.invoke(build_app(), args)
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["steps"] == 3 and "f1" in summary["eval"]
    run = json.loads((out / "run.json").read_text())
    assert run["run"]["training"]["seed"] == 7 and run["run"]["task_options"]["stride"] == 8
    result = runner.invoke(build_app(), ["evaluate", str(out), "--data", str(dev)])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout.strip().splitlines()[-1])["task"] == "ner"


def test_bad_input_is_a_one_line_error_with_file_and_line(tiny_base, tmp_path) -> None:
    bad = tmp_path / "train.txt"
    bad.write_text("EU B-ORG\nrejects\n")
    args = ["finetune", "ner", "--model", str(tiny_base), "--train", str(bad), "--out", str(tmp_path / "o")]
    result = runner.invoke(build_app(), args)
    assert result.exit_code == 2
    assert f"error: {bad}:2: expected a word and a tag" in result.output


def test_empty_dataset_is_refused(tiny_base, tmp_path) -> None:
    empty = tmp_path / "train.tsv"
    empty.write_text("sentence\tlabel\n")
    args = ["finetune", "classify", "--model", str(tiny_base), "--train", str(empty), "--out", str(tmp_path / "o")]
    result = runner.invoke(build_app(), args)
    assert result.exit_code == 2 and "the data set is empty" in result.output


def test_bad_options_are_refused_before_work(tiny_base, tmp_path) -> None:
    args = ["finetune", "qa", "--train", "x.json", "--out", str(tmp_path), "--doc-stride", "400"]
    result = runner.invoke(build_app(), args)
    assert result.exit_code == 2 and "doc_stride" in result.output
    result = runner.invoke(build_app(), ["finetune", "classify", "--train", "x", "--out", "o", "--label-map", "0:neg"])
    assert result.exit_code == 2 and "RAW=NAME" in result.output


TRAINING_ON_CLI = [
    "epochs",
    "max_steps",
    "batch_size",
    "learning_rate",
    "warmup_ratio",
    "weight_decay",
    "seed",
    "bf16",
    "eval_every",
    "eval_limit",
    "max_train_examples",
    "threads",
]
"""The TrainingOptions fields that are options, in the commands' order; the other fields are set in Python only."""
LORA_ON_CLI = ["lora", "lora_rank", "lora_alpha", "lora_targets", "lora_layernorm", "lora_bias"]


def _params(task: str) -> dict:
    import typer

    group = typer.main.get_command(build_app())
    return {param.name: param for param in group.commands["finetune"].commands[task].params}  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("task", "options_class"),
    [("classify", ClassifyOptions), ("qa", QAOptions), ("ner", NEROptions), ("rerank", RerankOptions)],
)
def test_finetune_options_are_the_dataclass_fields(task: str, options_class: type) -> None:
    """Each command's options: the run's, the CLI fields of TrainingOptions, LoRA's, and every field of the task's
    options class, each with the dataclass's default (QA trains 2 epochs by default) and a help text."""
    params = _params(task)
    task_fields = [f.name for f in fields(options_class)]
    assert list(params) == ["train", "out", "model", "eval_path", *TRAINING_ON_CLI, *LORA_ON_CLI, *task_fields]
    assert {f.name for f in fields(TrainingOptions)} - set(TRAINING_ON_CLI) == {
        "max_grad_norm",
        "eval_batch_size",
        "length_grouping",
        "lora",
        "log_every",
    }
    training = {f.name: f.default for f in fields(TrainingOptions)} | ({"epochs": 2.0} if task == "qa" else {})
    task_defaults = {f.name: f.default for f in fields(options_class)}
    for name, default in {**{n: training[n] for n in TRAINING_ON_CLI}, **task_defaults}.items():
        assert params[name].default == default, name
        assert params[name].help, name  # type: ignore[attr-defined]
    lora = LoRAConfig()
    assert [params[name].default for name in LORA_ON_CLI] == [
        False,
        lora.rank,
        lora.alpha,
        ",".join(lora.target_modules),
        lora.train_layernorm,
        lora.train_bias,
    ]
    assert params["learning_rate"].opts == ["--lr"] and params["eval_path"].opts == ["--eval"]


def test_finetune_options_reach_the_run(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """Given values, parsed lists and mappings, and the untouched defaults arrive in the FinetuneRun."""
    from bert_model.finetuning import run

    runs: list[FinetuneRun] = []

    def record(given: FinetuneRun) -> dict:
        runs.append(given)
        return {"steps": 0, "wall_seconds": 0.0, "eval": {}}

    monkeypatch.setattr(run, "finetune", record)
    args = ["finetune", "classify", "--train", "t.tsv", "--out", str(tmp_path), "--eval", "d.tsv", "--lr", "1e-3"]
    args += ["--epochs", "1.5", "--bf16", "--lora", "--lora-rank", "4", "--no-lora-bias", "--lora-targets", "query"]
    args += ["--max-seq-length", "64", "--label-map", "0=neg,1=pos", "--labels", "neg, pos"]
    result = runner.invoke(build_app(), args)
    assert result.exit_code == 0, result.output
    (given,) = runs
    assert (given.task, given.model, given.train, given.eval, given.out) == (
        "classify",
        "minilm",
        "t.tsv",
        "d.tsv",
        str(tmp_path),
    )
    training = given.training
    assert (training.epochs, training.learning_rate, training.bf16, training.batch_size) == (1.5, 1e-3, True, 32)
    assert training.lora is not None and (training.lora.rank, training.lora.alpha) == (4, 32.0)
    assert training.lora.target_modules == ("query",) and not training.lora.train_bias and training.lora.train_layernorm
    assert given.task_options == ClassifyOptions(64, None, None, None, {"0": "neg", "1": "pos"}, ["neg", "pos"])
    result = runner.invoke(build_app(), ["finetune", "qa", "--train", "t.json", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert runs[1].training.epochs == 2.0 and runs[1].training.lora is None and runs[1].task_options == QAOptions()
