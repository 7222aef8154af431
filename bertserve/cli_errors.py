"""Turn user mistakes into a one-line error and exit status 2, instead of a traceback.

Shared by every stage's command-line adapter (`bert_model`, `export`, the service's and the load tests'); it lives
here, at the bottom of the dependency graph, so that no stage imports the `bertserve` package that composes them.
Torch-free.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager

import typer

USER_ERRORS = (
    ValueError,
    TypeError,
    FileNotFoundError,
    NotADirectoryError,
    PermissionError,
    json.JSONDecodeError,
)


@contextmanager
def exit_on_user_error() -> Iterator[None]:
    """Print `error: <message>` to stderr and exit 2 on a user-triggerable error."""
    try:
        yield
    except USER_ERRORS as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(code=2) from error
