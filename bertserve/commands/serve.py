"""`bertserve serve`: REST + gRPC over one batched engine. Imports no torch.

Every field of `service.settings.ServiceSettings` is an option, built from the field itself: its name
(`max_queue` -> `--max-queue`), its description (the help), its default (shown in the help). So the options
cannot drift from the settings. Options given on the command line win over environment variables
(`BERTSERVE_<NAME>`), which win over the defaults: an option left out passes nothing, so pydantic-settings
reads the environment and the defaults itself.
"""

from __future__ import annotations

import inspect
import types
import typing
from pathlib import Path
from typing import Any

import typer
from pydantic.fields import FieldInfo

from bertserve.cli_errors import exit_on_user_error
from service.settings import ServiceSettings

SWITCHES = {
    "batching": ("--batching", "--no-batching"),
    "truncate": ("--truncate", "--reject-long"),
    "log_json": ("--log-json", "--log-text"),
}
"""On/off names of boolean settings whose off switch reads better than `--no-<name>`."""


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)


def serve(**given: Any) -> None:
    """Serve REST (default :8000) and gRPC (default :50051) over one dynamically batched engine."""
    with exit_on_user_error():
        settings = build_settings({name: value for name, value in given.items() if value is not None})
    from service.serve import serve as run_server

    run_server(settings)


def build_settings(overrides: dict[str, Any]) -> ServiceSettings:
    """ServiceSettings from CLI overrides + env; checks that every bundle exists and that the ports are free
    before anything starts."""
    from pydantic import ValidationError

    from bundles.serving import find_bundles
    from service.operations.ports import ensure_port_free

    try:
        settings = ServiceSettings(**overrides)
    except ValidationError as error:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'settings'}: {e['msg']}" for e in error.errors())
        raise ValueError(problems) from None
    find_bundles(settings.models, settings.bundles_dir)
    if settings.http_port >= 0:
        ensure_port_free(settings.host, settings.http_port, "--http-port")
    if settings.grpc_port >= 0:
        ensure_port_free(settings.host, settings.grpc_port, "--grpc-port")
    return settings


# ---- options from the settings fields ------------------------------------------------------------------
def option_parameter(name: str, field: FieldInfo) -> inspect.Parameter:
    """The `serve` parameter of one setting: a typer option whose value is None unless it is given."""
    kind = _option_type(field.annotation)
    declaration = "/".join(_switches(name)) if kind is bool else f"--{name.replace('_', '-')}"
    shown = shown_default(name, field)
    option = typer.Option(None, declaration, help=option_help(name, field), show_default=shown or False)
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=kind | None)


def option_help(name: str, field: FieldInfo) -> str:
    """The field's description, its choices or list syntax, and its environment variable."""
    notes = [field.description or ""]
    choices = _choices(field.annotation)
    if choices:
        notes.append(f"One of: {', '.join(choices)}.")
    if _is_list(field.annotation):
        notes.append("Comma-separated (or a JSON list).")
    notes.append(f"(env BERTSERVE_{name.upper()})")
    return " ".join(notes)


def shown_default(name: str, field: FieldInfo) -> str | None:
    """The default as the command line would give it (a switch's name for a bool); None for an unset one."""
    value = field.get_default(call_default_factory=True)
    if value is None or value == "" or value == []:
        return None
    if isinstance(value, bool):
        on, off = _switches(name)
        return (on if value else off).removeprefix("--")
    if isinstance(value, list):
        return ",".join(map(str, value))
    return str(value)


def _switches(name: str) -> tuple[str, str]:
    dashed = name.replace("_", "-")
    return SWITCHES.get(name, (f"--{dashed}", f"--no-{dashed}"))


def _option_type(annotation: Any) -> type:
    """The click-facing type: optional, literal, list and secret settings are given as text."""
    args = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        return _option_type(args[0])
    if annotation in (bool, int, float, Path):
        return annotation
    return str


def _choices(annotation: Any) -> tuple[str, ...]:
    return tuple(map(str, typing.get_args(annotation))) if typing.get_origin(annotation) is typing.Literal else ()


def _is_list(annotation: Any) -> bool:
    return typing.get_origin(annotation) is list or any(
        typing.get_origin(arg) is list for arg in typing.get_args(annotation)
    )


serve.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
    [option_parameter(name, field) for name, field in ServiceSettings.model_fields.items()]
)
