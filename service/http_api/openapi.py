"""The served OpenAPI schema: FastAPI's, plus what only this server knows, so that a request valid by the schema
is one the server takes.

From the settings: at most `max_inputs_per_request` inputs in a list, texts of at most `max_text_chars`
characters. Once the models are loaded: each task request's `model` lists the loaded models of that task and ""
(the task's default, as omitted or null; the default is the example), a model named in the path or by a request
that takes any model (`/tokenize`, `/decode`) is one of the loaded ones, token ids stay below every loaded
vocabulary, `dimensions` within every embedding size, fill-mask texts hold a mask token, QA's `doc_stride`
stays below the context tokens of every loaded QA model's windows, and the routes of a task without a loaded
model (they answer 422 "no ... model is loaded") are left out, as is a body of such a task that a route takes
beside another (`POST /`: TEI's rerank body). `/embed_all` names the embedding models whose bundles put out token
embeddings, and is left out when the default one's does not (a bundle exported before them answers 422). Before
that the schema holds for any model (`model`: any name, an example per route).
Reference: https://fastapi.tiangolo.com/how-to/extending-openapi/
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI

from service.engine.pipelines import TOKEN_EMBEDDINGS
from service.settings import ServiceSettings

REQUEST_TASKS = {
    "ClassifyRequest": "classify",
    "QARequest": "qa",
    "NERRequest": "ner",
    "EmbedRequest": "embed",
    "EmbedAllRequest": "embed",
    "OpenAIEmbeddingsRequest": "embed",
    "FillMaskRequest": "fill-mask",
    "PredictRequest": "classify",
    "TeiRerankRequest": "rerank",
    "CohereRerankRequest": "rerank",
}
"""Request body schema -> the task whose models its `model` field names."""

ANY_MODEL_REQUESTS = ("TokenizeRequest", "DecodeRequest")
"""Request body schemas whose `model` names any loaded model."""

MODEL_PATH_PARAMETERS = ("name", "model_id")
"""Path parameters that name a loaded model (`/models/{name}`, `/v1/models/{model_id}`, `/v2/models/{name}`)."""


@dataclass(frozen=True)
class ServedModels:
    """What the schema states about the loaded models."""

    entries: list[dict[str, Any]]
    """`GET /models` entries."""
    qa_rooms: list[int]
    """Context tokens per window of each QA model."""
    vocab_sizes: list[int]
    """Each model's vocabulary size."""
    embedding_sizes: list[int]
    """Each embedding model's vector size (once its warm-up has read it)."""
    mask_tokens: list[str]
    """Each fill-mask model's mask token."""
    token_embedding_models: list[str]
    """The embedding models whose bundles put out token embeddings (`/embed_all`)."""


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
            loaded.update(with_models(schema, served_models(engine)))
        return loaded

    app.openapi = openapi  # type: ignore[method-assign]


def with_limits(schema: dict[str, Any], settings: ServiceSettings) -> dict[str, Any]:
    """A copy of `schema` whose input lists and texts carry the per-request limits of `settings`."""
    schema = copy.deepcopy(schema)
    for node in _nodes(schema.get("components", {}).get("schemas", {})):
        if node.get("minItems") == 1 and "maxItems" not in node:  # lists of inputs (schemas.AT_LEAST_ONE)
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


def served_models(engine: Any) -> ServedModels:
    """The loaded models of `engine`, as the schema states them."""
    models = list(engine.models.values())
    return ServedModels(
        entries=engine.list_models(),
        qa_rooms=[model.pipeline.windows.context_room for model in models if model.bundle.task == "qa"],
        vocab_sizes=[model.bundle.tokenizer.vocab_size for model in models],
        embedding_sizes=[
            size for model in models if (size := getattr(model.pipeline, "vector_size", None)) is not None
        ],
        mask_tokens=[model.pipeline.mask_token for model in models if model.bundle.task == "fill-mask"],
        token_embedding_models=[
            model.name for model in models if TOKEN_EMBEDDINGS in model.bundle.manifest.on_request_outputs
        ],
    )


def with_models(schema: dict[str, Any], served: ServedModels) -> dict[str, Any]:
    """A copy of `schema` whose requests and paths name the `served` models, whose token ids are below every
    vocabulary and whose `doc_stride` is below the smallest QA window's context tokens."""
    schema = copy.deepcopy(schema)
    components = schema.get("components", {}).get("schemas", {})
    _name_models(components, served.entries)
    _name_paths(schema.get("paths", {}), served.entries)
    _name_token_embedding_models(schema, served)
    ids = components.get("DecodeRequest", {}).get("properties", {}).get("ids")
    if ids is not None and served.vocab_sizes:
        _set_maximum(ids, min(served.vocab_sizes) - 1)
    if served.embedding_sizes:
        for name in ("EmbedRequest", "OpenAIEmbeddingsRequest"):
            dimensions = components.get(name, {}).get("properties", {}).get("dimensions")
            if dimensions is not None:
                _set_maximum(dimensions, min(served.embedding_sizes))
    masked = components.get("FillMaskRequest", {}).get("properties", {}).get("inputs")
    if masked is not None and served.mask_tokens:
        pattern = "|".join(re.escape(token) for token in sorted(set(served.mask_tokens)))
        for node in _nodes(masked):
            if node.get("type") == "string":
                node["pattern"] = pattern  # a text with a mask token (so not blank either)
    stride = components.get("QARequest", {}).get("properties", {}).get("doc_stride")
    if stride is not None and served.qa_rooms:
        _set_maximum(stride, min(served.qa_rooms) - 1)
    return schema


def _name_models(components: dict[str, Any], models: list[dict[str, Any]]) -> None:
    """Each request's `model`: the loaded models it may name, and "" (the default)."""
    for name, task in REQUEST_TASKS.items():
        properties = components.get(name, {}).get("properties", {})
        names = [model["name"] for model in models if model["task"] == task]
        if "model" in properties and names:
            default = next(model["name"] for model in models if model["task"] == task and model["is_default"])
            properties["model"]["anyOf"] = [{"type": "string", "enum": [*names, ""]}, {"type": "null"}]
            properties["model"]["examples"] = [default]
    every_name = [model["name"] for model in models]
    for name in ANY_MODEL_REQUESTS:
        properties = components.get(name, {}).get("properties", {})
        if "model" in properties and every_name:
            properties["model"]["anyOf"] = [{"type": "string", "enum": [*every_name, ""]}, {"type": "null"}]


def _name_paths(paths: dict[str, Any], models: list[dict[str, Any]]) -> None:
    """Drop the routes of tasks no loaded model serves, and the bodies of such tasks from a route that takes one of
    several; a model in a path is a loaded one."""
    served_tasks = {model["task"] for model in models}
    every_name = [model["name"] for model in models]
    for path, operations in list(paths.items()):
        request = _request_schema(operations.get("post", {}))
        if request in REQUEST_TASKS and REQUEST_TASKS[request] not in served_tasks:
            del paths[path]
            continue
        _drop_unserved_bodies(operations.get("post", {}), served_tasks)
        for operation in operations.values():
            for parameter in operation.get("parameters", []):
                if parameter.get("in") == "path" and parameter.get("name") in MODEL_PATH_PARAMETERS and every_name:
                    parameter["schema"] = {**parameter["schema"], "enum": every_name}


def _drop_unserved_bodies(operation: dict[str, Any], served_tasks: set[str]) -> None:
    """Of a JSON body that is one of several schemas, drop those of tasks no loaded model serves."""
    body = operation.get("requestBody", {}).get("content", {}).get("application/json", {})
    choices = body.get("schema", {}).get("oneOf")
    if not choices:
        return
    tasks = [REQUEST_TASKS.get(str(choice.get("$ref", "")).rpartition("/")[2]) for choice in choices]
    kept = [choice for choice, task in zip(choices, tasks, strict=True) if task is None or task in served_tasks]
    if kept and len(kept) < len(choices):
        body["schema"] = kept[0] if len(kept) == 1 else {**body["schema"], "oneOf": kept}


def _name_token_embedding_models(schema: dict[str, Any], served: ServedModels) -> None:
    """`/embed_all`'s `model`: the embedding models with token embeddings, and "" (the default) when the default
    embedding model has them; without that, the route is left out."""
    paths = schema.get("paths", {})
    default = next((m["name"] for m in served.entries if m["task"] == "embed" and m["is_default"]), None)
    for path, operations in list(paths.items()):
        if _request_schema(operations.get("post", {})) != "EmbedAllRequest":
            continue
        if default not in served.token_embedding_models:
            del paths[path]
            continue
        properties = schema["components"]["schemas"]["EmbedAllRequest"]["properties"]
        names = [*served.token_embedding_models, ""]
        properties["model"]["anyOf"] = [{"type": "string", "enum": names}, {"type": "null"}]


def _set_maximum(field: dict[str, Any], maximum: int) -> None:
    """Every integer inside `field` at most `maximum`."""
    for node in _nodes(field):
        if node.get("type") == "integer":
            node["maximum"] = maximum


def _request_schema(operation: dict[str, Any]) -> str:
    """The component name of an operation's JSON request body ("" when it has none)."""
    reference = operation.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema", {})
    return str(reference.get("$ref", "")).rpartition("/")[2]


def _nodes(value: Any) -> Iterator[dict[str, Any]]:
    """Every JSON object inside `value`, depth first."""
    if isinstance(value, dict):
        yield value
        for child in value.values():
            yield from _nodes(child)
    elif isinstance(value, list):
        for child in value:
            yield from _nodes(child)
