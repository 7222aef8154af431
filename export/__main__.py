"""`python -m export ...`: the export stage's subcommand alone (`export`).

The serving image's bundle stage runs this: it needs only bert_model/ and export/, so changes to the service's
sources do not invalidate the image layer that exports the default models.
"""

from __future__ import annotations

import typer

from export.cli import register

app = typer.Typer(name="python -m export", no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
register(app)


@app.callback()
def _group() -> None:
    """Keep `export` a subcommand: typer runs a lone command without its name, which the image's build calls."""


if __name__ == "__main__":
    app()
