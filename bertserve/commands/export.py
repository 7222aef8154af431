"""`bertserve export`: the export stage's subcommand (torch is imported lazily)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from bertserve.cli_errors import exit_on_user_error
from export.variant_names import DEFAULT_VARIANTS


def register(app: typer.Typer) -> None:
    app.command("export")(export_command)


def export_command(
    model: Annotated[str, typer.Argument(help="Fine-tuned model folder or built-in name (minilm-sst2, ...).")],
    out: Annotated[Path, typer.Option("--out", help="Bundle folder to write (replaced atomically).")],
    variants: Annotated[
        str, typer.Option(help=f"Comma-separated variants, any of: {', '.join(DEFAULT_VARIANTS)}.")
    ] = ",".join(DEFAULT_VARIANTS),
    max_seq_len: Annotated[
        int | None, typer.Option("--max-seq-len", help="Longest input served (default: the model's maximum).")
    ] = None,
    name: Annotated[str | None, typer.Option(help="Model name in the manifest (default: the folder name).")] = None,
    eval_data: Annotated[
        Path | None,
        typer.Option(
            "--eval-data",
            help="Labelled guard eval set (SQuAD JSON for qa, CoNLL for ner, labelled TSV for classify): variants are "
            "judged on F1 / labels against its gold answers (default: the real data set under --data-dir).",
        ),
    ] = None,
    calibration: Annotated[
        Path | None,
        typer.Option(help="Guard texts without labels, one per line (a tab between a pair): agreement with fp32."),
    ] = None,
    guard_limit: Annotated[
        int, typer.Option(help="Examples the accuracy guards judge (questions, sentences, texts), evenly spaced.")
    ] = 1000,
    data_dir: Annotated[
        Path | None, typer.Option(help="Real data folder (default ../shared/data) for the guards.")
    ] = None,
    strict: Annotated[bool, typer.Option(help="Fail when any variant is refused by its accuracy guard.")] = False,
    task: Annotated[
        str | None,
        typer.Option(
            help="Serve as this task instead of the folder's own: rerank for a one-output classifier saved without a "
            "reranker's marker (default: from config.json; a CrossEncoder folder is a reranker)."
        ),
    ] = None,
    triton_repo: Annotated[
        Path | None, typer.Option("--triton-repo", help="Also write a Triton model repository here.")
    ] = None,
    triton_gpu: Annotated[bool, typer.Option(help="Triton model on GPU (gpu-fp16, TensorRT fp16).")] = False,
) -> None:
    """Export a model to a serving bundle: fused ONNX variants, accuracy-checked against PyTorch."""
    with exit_on_user_error():
        from export.bundle import build_bundle

        result = build_bundle(
            model,
            out,
            variants=variants,
            max_seq_len=max_seq_len,
            name=name,
            eval_data=eval_data,
            calibration=calibration,
            data_dir=data_dir,
            guard_limit=guard_limit,
            strict=strict,
            task=task,
        )
        guard = result.manifest.source["guard_inputs"]
        typer.echo(f"guard: {guard['judgment']} on {guard['count']} examples of {guard['source']}")
        for variant, spec in result.manifest.variants.items():
            figures = {k: v for k, v in spec.parity.items() if k not in ("guard_source", "inputs")}
            typer.echo(f"{variant}: {spec.file} {spec.precision} {spec.provider} parity {figures}")
        for variant, why in result.refused.items():
            typer.echo(f"{variant}: refused, not written ({why})", err=True)
        for variant, why in result.batch_dependent.items():
            typer.echo(f"{variant}: written, not served batched ({why})", err=True)
        typer.echo(f"wrote {result.path}")
        if triton_repo is not None:
            from export.triton import TritonOptions, write_triton_repository

            folder = write_triton_repository(result.path, triton_repo, TritonOptions(gpu=triton_gpu))
            typer.echo(f"wrote Triton model {folder}")


def standalone_app() -> typer.Typer:
    """The export subcommand alone, as `python -m bertserve.commands.export export ...` runs it. The serving
    image's bundle stage runs that with only bert_model/, bundles/, export/ and bertserve/ copied in, so that a
    change to the service's sources does not invalidate the image layer that exports the default models."""
    app = typer.Typer(name="export", no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
    register(app)

    @app.callback()
    def _group() -> None:
        """Keep `export` a subcommand: typer runs a lone command without its name."""

    return app


if __name__ == "__main__":
    standalone_app()()
