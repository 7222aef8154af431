"""The pretraining commands end to end: vocab -> data -> pretrain, one-line errors, an interrupted run that
resumes, and torchrun with 2 CPU processes (gloo) matching one process at the same global batch."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bert_model.training import read_metrics
from bertserve.cli import build_app

RUNNER = CliRunner()
ONE_THREAD = {**os.environ, "OMP_NUM_THREADS": "1"}
TRAIN = ["--batch-size", "8", "--lr", "2e-3", "--log-every", "1", "--no-progress", "--device", "cpu"]


def cli(*args: str | Path) -> tuple[int, str]:
    result = RUNNER.invoke(build_app(), [str(a) for a in args])
    return result.exit_code, result.output


def _pretrain_command(*args: str | Path) -> list[str]:
    return [sys.executable, "-m", "bertserve", "pretrain", *(str(a) for a in args)]


def test_vocab_data_pretrain_commands(corpus_file: Path, tmp_path: Path) -> None:
    code, output = cli("pretrain-vocab", corpus_file, "--size", "150", "--out", tmp_path / "vocab")
    assert code == 0, output
    code, output = cli(
        "pretrain-data", corpus_file, "--tokenizer", tmp_path / "vocab", "--out", tmp_path / "data",
        "--max-seq-length", "48", "--dupe-factor", "1", "--whole-word", "--eval-fraction", "0.1",
    )  # fmt: skip
    assert code == 0, output
    assert "NotNext" in output and (tmp_path / "data" / "meta.json").is_file()
    code, output = cli(
        "pretrain",
        "--config",
        "tiny",
        "--data",
        tmp_path / "data",
        "--out",
        tmp_path / "run",
        "--max-steps",
        "3",
        *TRAIN,
    )
    assert code == 0, output
    assert "finished at step 3" in output and "held-out" in output
    assert (tmp_path / "run" / "model.safetensors").is_file() and (tmp_path / "run" / "vocab.txt").is_file()


@pytest.mark.parametrize(
    ("content", "message"),
    [("\n \n\n", "holds no text"), ("One document only.\nStill the same one.\n", "only one training document")],
)
def test_bad_corpus_gives_a_one_line_error(tokenizer_dir: Path, tmp_path: Path, content: str, message: str) -> None:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(content)
    code, output = cli(
        "pretrain-data", corpus, "--tokenizer", tokenizer_dir, "--out", tmp_path / "d", "--max-seq-length", "48"
    )
    assert code == 2 and output.startswith("error:") and message in output, output


def test_unreadable_corpus_and_long_sequences_give_one_line_errors(
    tokenizer_dir: Path, data_folder: Path, tiny_config: Path, tmp_path: Path
) -> None:
    code, output = cli("pretrain-data", tmp_path / "missing.txt", "--tokenizer", tokenizer_dir, "--out", tmp_path / "d")
    assert code == 2 and "missing.txt does not exist" in output
    code, output = cli("pretrain-vocab", tmp_path, "--out", tmp_path / "v")
    assert code == 2 and "not a regular file" in output
    small = tmp_path / "small.json"
    small.write_text(tiny_config.read_text().replace('"max_position_embeddings": 64', '"max_position_embeddings": 32'))
    code, output = cli("pretrain", "--config", small, "--data", data_folder, "--out", tmp_path / "run", *TRAIN)
    assert code == 2 and "above the model's max_position_embeddings 32" in output, output


@pytest.fixture(scope="module")
def tokenizer_dir(data_folder: Path) -> Path:
    return data_folder / "tokenizer"


@pytest.mark.integration
def test_interrupted_run_resumes(data_folder: Path, tiny_config: Path, tmp_path: Path) -> None:
    args = ["--config", tiny_config, "--data", data_folder, "--out", tmp_path, "--max-steps", "100000", *TRAIN]
    process = subprocess.Popen(
        _pretrain_command(*args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=ONE_THREAD
    )
    metrics = tmp_path / "metrics.jsonl"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (not metrics.is_file() or len(metrics.read_text().splitlines()) < 5):
        time.sleep(0.2)
    process.send_signal(signal.SIGINT)
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 0, output
    assert "stopped (resume with --resume)" in output
    stopped_at = read_metrics(metrics)[-1]["step"]
    assert stopped_at >= 5
    code, output = cli("pretrain", *args[:6], "--max-steps", "100000", "--stop-after", "3", "--resume", *TRAIN)
    assert code == 0, output
    steps = [r["step"] for r in read_metrics(metrics) if r["split"] == "train"]
    assert steps == list(range(1, stopped_at + 4))  # no gap, no repeat


@pytest.mark.integration
def test_torchrun_two_processes_match_one_process(data_folder: Path, tiny_config: Path, tmp_path: Path) -> None:
    """Same global batch (8): one process vs 2 gloo processes x 2 accumulation steps of 2; dropout off."""
    common = ["--config", tiny_config, "--data", data_folder, "--max-steps", "6", "--dropout", "0", *TRAIN]
    env = ONE_THREAD
    single = subprocess.run(
        _pretrain_command(*common, "--out", tmp_path / "one"), capture_output=True, text=True, env=env, timeout=120
    )
    assert single.returncode == 0, single.stdout + single.stderr
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    double = subprocess.run(
        [*torchrun, "-m", "bertserve", "pretrain", *map(str, common), "--out", str(tmp_path / "two"),
         "--micro-batch-size", "2"],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert double.returncode == 0, double.stdout + double.stderr
    one = read_metrics(tmp_path / "one" / "metrics.jsonl")
    two = read_metrics(tmp_path / "two" / "metrics.jsonl")
    assert [r["step"] for r in one] == [r["step"] for r in two] and len(one) == 7  # 6 train lines + final eval
    for a, b in zip(one, two, strict=True):
        for key in ("loss", "mlm_loss", "nsp_loss"):
            assert abs(a[key] - b[key]) < 1e-4, (a, b)
        assert a["masked_tokens"] == b["masked_tokens"] and a["sequences"] == b["sequences"]
