"""The Open Inference Protocol v2 over REST (KServe's data plane; Triton's HTTP API), so that `tritonclient.http`
and other v2 clients work unchanged: server live / ready / metadata, model ready / metadata, and `infer` with
named tensors (`service.engine.tensors`), in the JSON form and in the binary tensor data extension (a JSON head of
`Inference-Header-Content-Length` bytes followed by the tensors' raw bytes), which `tritonclient.http` uses.

Errors are the protocol's: `{"error": "<message>"}` (a string), with the status of the service's error table.
Reference: https://kserve.github.io/website/latest/modelserving/data_plane/v2_protocol/ , Triton's
binary_tensor_data extension.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import Field, ValidationError

from service.engine.engine import Engine, LoadedModel
from service.engine.tensors import (
    INPUTS,
    MODEL_VERSION,
    OUTPUTS,
    Tensor,
    from_json,
    from_raw,
    protocol_model,
    result_tensors,
    task_input,
    to_json,
    to_raw,
)
from service.error_messages import clip_message, describe_problems
from service.errors import InvalidInput, InvalidJson, ServiceError, http_status
from service.http_api.middleware import MAX_MESSAGE_BYTES, unexpected_error_response
from service.http_api.v2_schemas import (
    V2InferRequest,
    V2InferResponse,
    V2InputTensor,
    V2ModelMetadata,
    V2RequestedOutput,
    V2ServerMetadata,
    error_responses,
    inline_schema,
)

HEADER_LENGTH = "inference-header-content-length"
SERVER_NAME = "bertserve"
VERSION = "1.0.0"
RESERVED_PARAMETERS = frozenset(
    {"binary_data_output", "timeout", "priority", "sequence_id", "sequence_start", "sequence_end"}
)
"""Request parameters of the protocol or of Triton's clients, taken and not acted on beyond `binary_data_output`."""

Timeout = Callable[[Request], float | None]
Version = Annotated[
    str,
    Field(
        description="The model's version: every model has one, 1 ('' = it).",
        json_schema_extra={"enum": ["", MODEL_VERSION]},
    ),
]


def add_v2_routes(app: FastAPI, responses: dict[int | str, dict[str, Any]], timeout: Timeout) -> None:
    tags: dict[str, Any] = {"tags": ["open-inference-protocol"]}
    errors = error_responses(responses)
    # the health answers are the status alone, with an empty body, as the protocol has them
    status_only: dict[str, Any] = {**tags, "response_class": Response}
    health: dict[int | str, dict[str, Any]] = {200: {"description": "Yes."}, 503: {"description": "No."}}

    @app.get("/v2", response_model=V2ServerMetadata, responses=errors, **tags)
    async def server_metadata() -> Any:
        """Server metadata: name, version, extensions."""
        return {"name": SERVER_NAME, "version": VERSION, "extensions": ["binary_tensor_data"]}

    @app.get("/v2/health/live", responses=health, **status_only)
    async def server_live(request: Request) -> Response:
        """200 while the process can serve."""
        return Response(status_code=503 if _engine(request).state.failure else 200)

    @app.get("/v2/health/ready", responses=health, **status_only)
    async def server_ready(request: Request) -> Response:
        """200 while every model is loaded and the server takes requests."""
        return Response(status_code=200 if _ready(_engine(request)) else 503)

    ready = {**responses, 200: {"description": "Yes."}, 400: {"description": "No: not loaded, or not ready."}}

    @app.get("/v2/models/{name}/ready", responses=ready, **status_only)
    @app.get("/v2/models/{name}/versions/{version}/ready", responses=ready, **status_only)
    async def model_ready(name: str, request: Request, version: Version = "") -> Response:
        """200 when the model is loaded and the server takes requests."""
        engine = _engine(request)
        known = name in engine.models and version in ("", MODEL_VERSION)
        return Response(status_code=200 if known and _ready(engine) else 400)

    @app.get("/v2/models/{name}", response_model=V2ModelMetadata, responses=errors, **tags)
    @app.get("/v2/models/{name}/versions/{version}", response_model=V2ModelMetadata, responses=errors, **tags)
    async def model_metadata(name: str, request: Request, version: Version = "") -> Response:
        """The model's input and output tensors."""
        return await _answer(lambda: _metadata(protocol_model(_engine(request), name, version)))

    binary = {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}
    infer_responses = {
        **errors,
        200: {"description": "The outputs (binary_data: a JSON head, then the raw tensors).", "content": binary},
    }
    request_schema = inline_schema(V2InferRequest)
    body = {"requestBody": {"required": True, "content": {"application/json": {"schema": request_schema}}}}
    infer_route: dict[str, Any] = {
        **tags,
        "response_model": V2InferResponse,
        "responses": infer_responses,
        "openapi_extra": body,
    }

    @app.post("/v2/models/{name}/infer", **infer_route)
    @app.post("/v2/models/{name}/versions/{version}/infer", **infer_route)
    async def infer(name: str, request: Request, version: Version = "") -> Response:
        """Run the model on named tensors (JSON, or the binary tensor data extension)."""
        engine = _engine(request)

        async def run() -> Response:
            return await _infer(engine, protocol_model(engine, name, version), request, timeout(request))

        return await _answer(run)


async def _answer(make: Callable[[], Awaitable[Response] | Response]) -> Response:
    """`make()`'s response, or the protocol's error body for a domain error (the status from the service's table)."""
    try:
        result = make()
        return await result if isinstance(result, Awaitable) else result
    except ServiceError as error:
        status = http_status(error)
        headers = {"retry-after": "1"} if status in (429, 503) else None
        return JSONResponse({"error": clip_message(error.message, MAX_MESSAGE_BYTES)}, status, headers=headers)
    except Exception as error:  # a bug: the service's 500 `internal`, with the id of its log line
        internal = unexpected_error_response(error)
        message = orjson.loads(internal.body)["error"]["message"]
        return JSONResponse({"error": message}, internal.status_code)


def _ready(engine: Engine) -> bool:
    state = engine.state
    return state.ready and not state.draining and state.failure is None


def _metadata(model: LoadedModel) -> Response:
    task = model.bundle.task

    def tensors(specs: Any) -> list[dict[str, Any]]:
        return [{"name": s.name, "datatype": s.datatype, "shape": list(s.shape)} for s in specs]

    body = {
        "name": model.name,
        "versions": [MODEL_VERSION],
        "platform": f"{SERVER_NAME}_{task}",
        "inputs": tensors(INPUTS[task]),
        "outputs": tensors(OUTPUTS[task]),
        "parameters": {"labels": ",".join(model.bundle.manifest.labels)} if task == "classify" else {},
    }
    return JSONResponse(body)


async def _infer(engine: Engine, model: LoadedModel, request: Request, timeout_s: float | None) -> Response:
    head, raw = _split_body(await request.body(), request.headers.get(HEADER_LENGTH))
    try:
        body = V2InferRequest.model_validate(head)
    except ValidationError as error:
        raise InvalidInput(describe_problems(error.errors(include_url=False))) from None
    inputs = _input_tensors(body.inputs, raw)
    parameters = body.parameters or {}
    unknown = sorted(set(parameters) - RESERVED_PARAMETERS)
    if unknown:
        raise InvalidInput(f"parameters: {', '.join(unknown)} not taken by this server")
    outcome = await engine.submit(task_input(model.bundle.task, inputs), model=model.name, timeout_s=timeout_s)
    outputs = result_tensors(model.bundle.task, list(model.bundle.manifest.labels), outcome.results)
    binary = _wanted_outputs(body.outputs, outputs, bool(parameters.get("binary_data_output", False)))
    return _response(model, body.id, outputs, binary, outcome.headers())


def _split_body(body: bytes, header_length: str | None) -> tuple[dict[str, Any], bytes]:
    """The JSON head and the raw tensor bytes after it (binary extension), or the whole JSON body."""
    size = len(body)
    if header_length is not None:
        try:
            size = int(header_length)
        except ValueError:
            raise InvalidInput(f"{HEADER_LENGTH} must be a number of bytes, got {header_length[:50]!r}") from None
        if not 0 < size <= len(body):
            raise InvalidInput(f"{HEADER_LENGTH} {size} does not fit the body of {len(body)} bytes")
    try:
        head = orjson.loads(body[:size])
    except orjson.JSONDecodeError as error:
        raise InvalidJson(f"the request's JSON is not valid: {error}") from None
    if not isinstance(head, dict):
        raise InvalidInput("the request must be a JSON object with inputs")
    return head, body[size:]


def _input_tensors(items: list[V2InputTensor], raw: bytes) -> dict[str, Tensor]:
    tensors: dict[str, Tensor] = {}
    offset = 0
    for item in items:
        size = (item.parameters or {}).get("binary_data_size")
        if size is not None:
            if not isinstance(size, int) or isinstance(size, bool) or size < 0 or offset + size > len(raw):
                raise InvalidInput(f"inputs: tensor {item.name}'s binary_data_size {size} does not fit the body")
            tensors[item.name] = from_raw(item.name, item.datatype, item.shape, raw[offset : offset + size])
            offset += size
        else:
            tensors[item.name] = from_json(item.name, item.datatype, item.shape, item.data)
    if offset != len(raw):
        raise InvalidInput(f"the body has {len(raw) - offset} bytes after its tensors")
    return tensors


def _wanted_outputs(
    requested: list[V2RequestedOutput] | None, outputs: list[Tensor], binary_default: bool
) -> dict[str, bool]:
    """Output name -> whether it is sent in binary form; only the requested ones when some are named."""
    if requested is None:
        return {tensor.name: binary_default for tensor in outputs}
    names = {tensor.name for tensor in outputs}
    wanted: dict[str, bool] = {}
    for item in requested:
        if item.name not in names:
            raise InvalidInput(f"outputs: unknown tensor {item.name!r}; this model puts out {', '.join(sorted(names))}")
        wanted[item.name] = bool((item.parameters or {}).get("binary_data", binary_default))
    return wanted


def _response(
    model: LoadedModel, request_id: Any, outputs: list[Tensor], binary: dict[str, bool], headers: dict[str, str]
) -> Response:
    described, blobs = [], []
    for tensor in outputs:
        if tensor.name not in binary:
            continue
        entry: dict[str, Any] = {"name": tensor.name, "datatype": tensor.datatype, "shape": tensor.shape}
        if binary[tensor.name]:
            blob = to_raw(tensor)
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            entry["data"] = to_json(tensor)
        described.append(entry)
    head = {"model_name": model.name, "model_version": MODEL_VERSION, "outputs": described}
    if isinstance(request_id, str):
        head["id"] = request_id
    body = orjson.dumps(head)
    if blobs:
        headers = {**headers, HEADER_LENGTH: str(len(body))}
        return Response(body + b"".join(blobs), media_type="application/octet-stream", headers=headers)
    return Response(body, media_type="application/json", headers=headers)


def _engine(request: Request) -> Engine:
    engine: Engine = request.app.state.engine
    return engine
