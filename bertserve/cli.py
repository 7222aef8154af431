"""`bertserve`: the one command-line entry point.

Each stage's package owns its subcommands in a `cli.py` exposing `register(app)`; this module only composes
them. Command modules import their heavy dependencies (torch, onnx) inside the command bodies, so that
`bertserve serve` never imports torch.
"""

from __future__ import annotations

import importlib

import typer

from bertserve import info_command

app = typer.Typer(
    name="bertserve",
    help="BERT from pretraining to a load-tested service.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def root() -> None:
    """BERT from pretraining to a load-tested service."""


# Stage packages that contribute subcommands, in pipeline order.
COMMAND_MODULES: tuple[str, ...] = (
    "bert_model.pretraining.cli",
    "bert_model.finetuning.cli",
    "export.cli",
    "bertserve.benchmarks.cli",
    "service.cli",
    "loadtests.cli",
)


def build_app() -> typer.Typer:
    info_command.register(app)
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register(app)
    return app


def main() -> None:
    build_app()()
