"""The served OpenAPI schema: FastAPI's, plus what only the loaded models tell (which `model` names exist).

Before the models are loaded the schema is FastAPI's own (`model`: any string, an example per route). Once they
are, each task request's `model` field lists the loaded models of that task, with the task's default as its
example: a schema-valid request names a model the server has.
Reference: https://fastapi.tiangolo.com/how-to/extending-openapi/
"""

from __future__ import annotations

import copy
from typing import Any

from fastapi import FastAPI

REQUEST_TASKS = {"ClassifyRequest": "classify", "QARequest": "qa", "NERRequest": "ner"}
"""Request body schema -> the task whose models its `model` field names."""


def describe_loaded_models(app: FastAPI) -> None:
    """Make `app.openapi()` list the loaded models once the service is ready (built once, then cached)."""
    base = app.openapi
    loaded: dict[str, Any] = {}

    def openapi() -> dict[str, Any]:
        service = app.state.service
        if not service.state.ready:
            return base()
        if not loaded:
            loaded.update(with_models(base(), service.list_models()))
        return loaded

    app.openapi = openapi  # type: ignore[method-assign]


def with_models(schema: dict[str, Any], models: list[dict[str, Any]]) -> dict[str, Any]:
    """A copy of `schema` whose task requests' `model` fields enumerate `models` (`GET /v1/models` entries)."""
    schema = copy.deepcopy(schema)
    components = schema.get("components", {}).get("schemas", {})
    for name, task in REQUEST_TASKS.items():
        field = components.get(name, {}).get("properties", {}).get("model")
        names = [model["name"] for model in models if model["task"] == task]
        if field is None or not names:
            continue
        default = next(model["name"] for model in models if model["task"] == task and model["is_default"])
        field["anyOf"] = [{"type": "string", "enum": names}, {"type": "null"}]
        field["examples"] = [default]
    return schema
