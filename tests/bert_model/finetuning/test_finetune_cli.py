"""The `finetune` / `evaluate` commands: options reach the run, user mistakes are one-line errors."""

from __future__ import annotations

import json

from typer.testing import CliRunner

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
