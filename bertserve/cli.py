"""`bertserve`: the one command-line entry point.

Each pipeline stage has one module of subcommands in `bertserve.commands`, exposing `register(app)`; this module
only composes them. The stages themselves are libraries: they know nothing of the command line. Command modules
import their heavy dependencies (torch, onnx) inside the command bodies, so that `bertserve serve` never imports
torch.
"""

from __future__ import annotations

import importlib

import typer

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
    "bertserve.commands.info",
    "bertserve.commands.pretrain",
    "bertserve.commands.finetune",
    "bertserve.commands.export",
    "bertserve.commands.bench",
    "bertserve.commands.serve",
    "bertserve.commands.loadtest",
)


def build_app() -> typer.Typer:
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register(app)
    return app


def main() -> None:
    build_app()()
