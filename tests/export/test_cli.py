"""`bertserve export` through the CLI: a bundle and a Triton repository, guards' options, one-line user errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bertserve.commands.export import register


@pytest.fixture()
def cli() -> tuple[CliRunner, object]:
    import typer

    app = typer.Typer()

    @app.callback()
    def root() -> None:
        """Test app."""

    register(app)
    return CliRunner(), app


def test_export_command_writes_bundle_and_triton_repo(cli: tuple, tiny_models: dict[str, Path], tmp_path: Path) -> None:
    runner, app = cli
    result = runner.invoke(
        app,
        [
            "export",
            str(tiny_models["classify"]),
            "--out",
            str(tmp_path / "b"),
            "--variants",
            "cpu-fp32,cpu-int8",
            "--max-seq-len",
            "64",
            "--data-dir",
            str(tmp_path),
            "--triton-repo",
            str(tmp_path / "repo"),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "cpu-int8: cpu-int8.onnx int8" in result.output
    assert (tmp_path / "repo" / "b" / "config.pbtxt").is_file()
    assert json.loads((tmp_path / "b" / "manifest.json").read_text())["max_seq_length"] == 64


def test_export_command_user_errors_are_one_line(cli: tuple, tiny_models: dict[str, Path], tmp_path: Path) -> None:
    runner, app = cli
    result = runner.invoke(
        app, ["export", str(tiny_models["classify"]), "--out", str(tmp_path / "b"), "--variants", "cpu-int4"]
    )
    assert result.exit_code == 2
    assert "error: unknown variant 'cpu-int4'" in result.output
    assert not (tmp_path / "b").exists()


def test_export_command_takes_an_eval_set_and_a_guard_limit(
    cli: tuple, tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    from tests.export.test_task_guard import squad_file

    runner, app = cli
    data = squad_file(tmp_path)
    command = ["export", str(tiny_models["qa"]), "--out", str(tmp_path / "b"), "--variants", "cpu-fp32,gpu-fp16"]
    result = runner.invoke(app, [*command, "--max-seq-len", "64", "--eval-data", str(data), "--guard-limit", "4"])
    assert result.exit_code == 0, result.output
    assert f"guard: eval-set on 4 examples of {data}" in result.output
    assert "'metric': 'squad_f1'" in result.output
    missing = runner.invoke(app, [*command, "--eval-data", str(tmp_path / "none.json")])
    assert missing.exit_code != 0 and "none.json does not exist" in missing.output


def test_the_standalone_export_command_takes_the_export_subcommand_as_the_image_build_calls_it(
    tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    """The serving image's bundle stage runs `python -m bertserve.commands.export export NAME --out ...`."""
    from bertserve.commands.export import standalone_app

    app = standalone_app()

    out = tmp_path / "b"
    result = CliRunner().invoke(
        app,
        ["export", str(tiny_models["classify"]), "--out", str(out), "--variants", "cpu-fp32", "--max-seq-len", "64"],
    )
    assert result.exit_code == 0, result.output
    assert (out / "manifest.json").is_file()
