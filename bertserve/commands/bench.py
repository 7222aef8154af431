"""`bertserve bench-model`: the model benchmark's command (torch, onnx and the benchmark load inside its body).

The other benchmarks are `python -m bertserve.benchmarks.<name>` scripts behind make targets (see the package).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from bertserve.benchmarks.report import command_line
from bertserve.cli_errors import exit_on_user_error

DEFAULT_BENCH_OUT = Path("artifacts/bench")


def register(app: typer.Typer) -> None:
    app.command("bench-model")(bench_model_command)


def bench_model_command(
    bundle_or_model: Annotated[
        str, typer.Argument(help="A serving bundle, or a model (a bundle with every variant is exported first).")
    ],
    out: Annotated[Path, typer.Option(help="Folder for bench-model.json and bench-model.md.")] = DEFAULT_BENCH_OUT,
    rounds: Annotated[int, typer.Option(help="Interleaved rounds per shape (halved for batch 16).")] = 20,
    variants: Annotated[str | None, typer.Option(help="Only these bundle variants (comma-separated).")] = None,
    data_dir: Annotated[Path | None, typer.Option(help="Real data folder (default ../shared/data).")] = None,
) -> None:
    """Benchmark PyTorch, transformers and every ONNX variant side by side (run under the CPU lock)."""
    import tempfile

    with exit_on_user_error():
        from bertserve.benchmarks.model import run_benchmark
        from bundles.spec import MANIFEST_FILE
        from export.bundle import DEFAULT_DATA_DIR, build_bundle
        from export.variants import RECIPES

        if rounds < 1:
            raise ValueError(f"rounds must be >= 1, got {rounds}")
        data = data_dir or DEFAULT_DATA_DIR
        chosen = [v.strip() for v in variants.split(",")] if variants else None
        args = [bundle_or_model, "--out", str(out), "--rounds", str(rounds)]
        args += [*(["--variants", variants] if variants else []), *(["--data-dir", str(data_dir)] if data_dir else [])]
        command = command_line("bertserve bench-model", args)

        def bench(bundle: Path, only: list[str] | None) -> None:
            run_benchmark(bundle, out, rounds=rounds, variants=only, data_dir=data, log=typer.echo, command=command)

        if (Path(bundle_or_model) / MANIFEST_FILE).is_file():
            bench(Path(bundle_or_model), chosen)
            return
        with tempfile.TemporaryDirectory(prefix="bench-bundle-") as scratch:
            bench(build_bundle(bundle_or_model, Path(scratch) / "bundle", variants=chosen or list(RECIPES)).path, None)
