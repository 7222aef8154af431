"""The served OpenAPI schema: FastAPI's, plus what only this server knows, so that a request valid by the schema
is one the server takes.

From the settings: at most `max_inputs_per_request` inputs in a list, texts of at most `max_text_chars`
characters. Once the models are loaded: each task request's `model` lists the loaded models of that task and ""
(the task's default, as omitted or null; the default is the example), and QA's `doc_stride` stays below the
context tokens of every loaded QA model's windows, and the routes of a task without a loaded model (they answer
422 "no ... model is loaded") are left out. Before that the schema holds for any model (`model`: any name, an
example per route).
Reference: https://fastapi.tiangolo.com/how-to/extending-openapi/
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

from fastapi import FastAPI

from service.settings import ServiceSettings

REQUEST_TASKS = {
    "ClassifyRequest": "classify",
    "QARequest": "qa",
    "NERRequest": "ner",
    "EmbedRequest": "embed",
    "OpenAIEmbeddingsRequest": "embed",
    "FillMaskRequest": "fill-mask",
}
"""Request body schema -> the task whose models its `model` field names."""


def describe_server(app: FastAPI) -> None:
    """Make `app.openapi()` state the server's limits, and its models once they are loaded (then cached)."""
    base = app.openapi
    loaded: dict[str, Any] = {}

    def openapi() -> dict[str, Any]:
        engine, settings = app.state.engine, app.state.settings
        if not engine.state.ready:
            return with_security(with_limits(base(), settings), settings)
        if not loaded:
            schema = with_security(with_limits(base(), settings), settings)
            loaded.update(with_models(schema, engine.list_models(), _qa_context_rooms(engine)))
        return loaded

    app.openapi = openapi  # type: ignore[method-assign]


def with_limits(schema: dict[str, Any], settings: ServiceSettings) -> dict[str, Any]:
    """A copy of `schema` whose input lists and texts carry the per-request limits of `settings`."""
    schema = copy.deepcopy(schema)
    for node in _nodes(schema.get("components", {}).get("schemas", {})):
        if node.get("minItems") == 1:  # the lists of inputs (service.http_api.schemas.AT_LEAST_ONE)
            node["maxItems"] = settings.max_inputs_per_request
        if node.get("type") == "string" and "pattern" in node:  # the texts (service.http_api.schemas.Text)
            node["maxLength"] = settings.max_text_chars
    return schema


BEARER = "HTTPBearer"
OPEN_PATHS = ("/health/live", "/health/ready", "/metrics")
"""Routes that answer without the API key (`service.http_api.middleware.PROBE_PATHS`)."""


def with_security(schema: dict[str, Any], settings: ServiceSettings) -> dict[str, Any]:
    """With an API key: the bearer scheme, required by every operation but the probes and metrics (the door checks
    it, `service.http_api.middleware.DoorMiddleware`); without one, `schema` as it is."""
    if settings.api_key is None:
        return schema
    schema = copy.deepcopy(schema)
    schemes = schema.setdefault("components", {}).setdefault("securitySchemes", {})
    schemes[BEARER] = {"type": "http", "scheme": "bearer", "description": "`Authorization: Bearer <api key>`."}
    for path, operations in schema.get("paths", {}).items():
        if path in OPEN_PATHS:
            continue
        for operation in operations.values():
            operation["security"] = [{BEARER: []}]
    return schema


def with_models(schema: dict[str, Any], models: list[dict[str, Any]], qa_rooms: list[int]) -> dict[str, Any]:
    """A copy of `schema` whose task requests name the loaded `models` (`GET /models` entries) and whose
    `doc_stride` is below the smallest of `qa_rooms` (context tokens per window of each QA model)."""
    schema = copy.deepcopy(schema)
    components = schema.get("components", {}).get("schemas", {})
    for name, task in REQUEST_TASKS.items():
        properties = components.get(name, {}).get("properties", {})
        names = [model["name"] for model in models if model["task"] == task]
        if "model" in properties and names:
            default = next(model["name"] for model in models if model["task"] == task and model["is_default"])
            properties["model"]["anyOf"] = [{"type": "string", "enum": [*names, ""]}, {"type": "null"}]
            properties["model"]["examples"] = [default]
    served = {model["task"] for model in models}
    for path, operations in list(schema.get("paths", {}).items()):
        request = _request_schema(operations.get("post", {}))
        if request in REQUEST_TASKS and REQUEST_TASKS[request] not in served:
            del schema["paths"][path]
    stride = components.get("QARequest", {}).get("properties", {}).get("doc_stride")
    if stride is not None and qa_rooms:
        for option in stride.get("anyOf", []):
            if option.get("type") == "integer":
                option["maximum"] = min(qa_rooms) - 1
    return schema


def _request_schema(operation: dict[str, Any]) -> str:
    """The component name of an operation's JSON request body ("" when it has none)."""
    reference = operation.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema", {})
    return str(reference.get("$ref", "")).rpartition("/")[2]


def _qa_context_rooms(engine: Any) -> list[int]:
    return [model.pipeline.windows.context_room for model in engine.models.values() if model.bundle.task == "qa"]


def _nodes(value: Any) -> Iterator[dict[str, Any]]:
    """Every JSON object inside `value`, depth first."""
    if isinstance(value, dict):
        yield value
        for child in value.values():
            yield from _nodes(child)
    elif isinstance(value, list):
        for child in value:
            yield from _nodes(child)
