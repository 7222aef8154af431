"""The REST front door: `create_app(settings, engine)` builds the FastAPI app over an engine, without side effects.

`service.serve` loads the engine and starts this app beside the gRPC front door; while the engine loads, REST
answers `/health/*` and 503 `not_ready` to work. Once the server has failed for good (loading failed, or a model's
batch loop or backend died: see `service.engine.batcher.Batcher`), `/health/live` and `/health/ready` answer 503
`failed` with the reason.
Domain errors map to HTTP through `service.errors.http_status` only: validation problems are 422 with a message
naming the field and what to send instead, a body that is not JSON 400 `invalid_json`, one sent as another media
type 415, an unknown route 404 and a wrong method 405.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from typing import Any

import orjson
from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from service.engine.engine import RESPONSE_HEADERS, Engine
from service.engine.inputs import ClassifyInput, NERInput, QAInput
from service.error_messages import describe_problems
from service.errors import (
    InvalidInput,
    InvalidJson,
    MethodNotAllowed,
    RouteNotFound,
    ServiceError,
    UnsupportedMediaType,
)
from service.http_api.direct_routes import DirectRoutes, direct_routes
from service.http_api.encoder_routes import add_encoder_routes
from service.http_api.hf_routes import add_hf_routes
from service.http_api.middleware import (
    SERVER_HEADERS,
    DoorMiddleware,
    MetricsMiddleware,
    error_response,
    service_error_response,
    unexpected_error_response,
)
from service.http_api.openai_routes import add_openai_routes
from service.http_api.openapi import describe_server
from service.http_api.playground import add_playground_routes
from service.http_api.rendering import task_response
from service.http_api.rerank_routes import add_rerank_routes
from service.http_api.schemas import (
    Answer,
    ClassifyRequest,
    Entity,
    ErrorResponse,
    Health,
    LabelScore,
    ModelList,
    NERRequest,
    QARequest,
    TextPair,
)
from service.http_api.tei_routes import add_tei_routes
from service.http_api.v2_routes import add_v2_routes
from service.operations.metrics import CONTENT_TYPE
from service.settings import ServiceSettings

log = logging.getLogger(__name__)

ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse, "description": text}
    for code, text in (
        (400, "The body is not valid JSON."),
        (401, "Missing or wrong API key (when the server requires one)."),
        (408, "The body did not arrive within the server's body timeout (the connection is closed)."),
        (413, "The body is larger than the server's limit."),
        (415, "The body is not sent as JSON (Content-Type: application/json)."),
        (422, "Invalid input: the message says which field and what to change."),
        (429, "The server is at capacity (requests in progress, tokenization, or the model's queue): retry later."),
        (503, "Models are still loading, or the server is shutting down."),
        (504, "The request's deadline passed."),
    )
}


class JsonRequest(Request):
    """A request whose JSON body is parsed by orjson: whatever does not parse (invalid UTF-8, nesting deeper than
    orjson's 1,024 levels, an integer beyond 64 bits, a syntax error) raises `JSONDecodeError`, which FastAPI turns
    into a `json_invalid` validation error (the standard library's parser raises others for some of these)."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = orjson.loads(await self.body())
        return self._json


class JsonRoute(APIRoute):
    """A route whose body, where it has one, must be JSON: sent as another media type it is refused with 415
    naming the type (a body without a Content-Type is read as JSON). A bug of the route is answered 500 `internal`
    by the route itself, so that it passes through the service's middleware like every other answer."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        takes_body = self.body_field is not None

        async def route(request: Request) -> Response:
            if takes_body:
                _check_media_type(request.headers.get("content-type"))
            try:
                return await handler(JsonRequest(request.scope, request.receive))
            except (ServiceError, StarletteHTTPException, RequestValidationError):
                raise  # the app's exception handlers answer these
            except Exception as error:  # a bug: 500 `internal`, answered here so the metrics and request id see it
                return unexpected_error_response(error)

        return route


def _check_media_type(content_type: str | None) -> None:
    if content_type is None:
        return
    media = content_type.split(";", 1)[0].strip().lower()
    if media != "application/json" and not (media.startswith("application/") and media.endswith("+json")):
        raise UnsupportedMediaType(
            f"the body must be JSON, sent with Content-Type: application/json; got Content-Type {content_type[:100]!r}"
        )


def create_app(settings: ServiceSettings | None = None, engine: Engine | None = None) -> FastAPI:
    """The REST app over `engine` (a new, unloaded one for `settings` when not given)."""
    settings = settings or ServiceSettings()
    engine = engine or Engine(settings)
    app = FastAPI(
        title="bertserve",
        version="1.0.0",
        summary="BERT classification, question answering, NER, embeddings and fill-mask with server-side tokenization.",
        # The service records its own spans (service/operations/tracing.py) and Prometheus metrics; FastAPI's native
        # telemetry would look up the unconfigured global providers on every request.
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    app.router.route_class = JsonRoute
    app.state.settings = settings
    app.state.engine = engine
    app.state.metrics = engine.metrics
    _add_error_handlers(app)
    _add_routes(app)
    if settings.playground:
        add_playground_routes(app)
    key = settings.api_key.get_secret_value().encode() if settings.api_key is not None else None
    app.add_middleware(DirectRoutes, routes=direct_routes(app.routes))  # innermost: inside the door
    app.add_middleware(
        DoorMiddleware,
        door=engine.door,
        max_bytes=settings.max_body_bytes,
        timeout_s=settings.body_timeout_s,
        metrics=engine.metrics,
        api_key=key,
        public_pages=settings.public_docs,
    )
    if settings.cors_origins:  # outside the door: a browser's preflight carries no API key
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type"],
            expose_headers=[*RESPONSE_HEADERS, *SERVER_HEADERS],
        )
    app.add_middleware(MetricsMiddleware, metrics=engine.metrics, state=engine.state)
    describe_server(app)
    return app


# ---- errors ---------------------------------------------------------------------------------------------
def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ServiceError)
    async def service_error(_: Request, error: ServiceError) -> JSONResponse:
        return service_error_response(error)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, error: RequestValidationError) -> JSONResponse:
        problems = error.errors()
        invalid = next((problem for problem in problems if problem.get("type") == "json_invalid"), None)
        if invalid is not None:
            reason, where = invalid.get("ctx", {}).get("error", ""), invalid.get("loc", ("body", "?"))[-1]
            refusal = InvalidJson(f"the request body is not valid JSON: {reason} at byte {where}; send a JSON object")
            return error_response(refusal)
        return error_response(InvalidInput(describe_problems(problems)))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
        # routing: the HTTP layer's own statuses, mapped through the one table like every other answer
        if error.status_code == 405:
            allowed = _allowed_methods(request)
            refusal = MethodNotAllowed(f"{request.method} is not allowed on {request.url.path}; use {allowed}")
            return error_response(refusal, {"allow": allowed} if allowed else None)
        if error.status_code == 404:
            return error_response(RouteNotFound(f"no route {request.url.path}; the API is described at /docs"))
        return error_response(InvalidInput(str(error.detail)))

    @app.exception_handler(Exception)
    async def unexpected(_: Request, error: Exception) -> JSONResponse:
        return unexpected_error_response(error)


def _allowed_methods(request: Request) -> str:
    """The methods of every route at the request's path (the router's 405 names only the first route's)."""
    methods: set[str] = set()
    for route in request.app.router.routes:
        match, _ = route.matches(request.scope)
        if match != Match.NONE:
            methods |= getattr(route, "methods", None) or set()
    return ", ".join(sorted(methods))


# ---- routes ---------------------------------------------------------------------------------------------
def engine_of(request: Request) -> Engine:
    engine: Engine = request.app.state.engine
    return engine


def request_timeout(request: Request) -> float | None:
    """The caller's own deadline, from the `x-request-timeout-ms` header (capped by the server's timeout)."""
    value = request.headers.get("x-request-timeout-ms")
    if value is None:
        return None
    try:
        milliseconds = float(value)
    except ValueError:
        raise InvalidInput(f"x-request-timeout-ms must be a number of milliseconds, got {value[:100]!r}") from None
    if not 0 < milliseconds < 1e9:
        raise InvalidInput(f"x-request-timeout-ms must be positive, got {value[:100]!r}")
    return milliseconds / 1000


def _add_routes(app: FastAPI) -> None:
    common: dict[str, Any] = {"responses": ERROR_RESPONSES, "tags": ["tasks"]}

    @app.post("/classify", response_model=list[LabelScore] | list[list[LabelScore]], **common)
    async def classify(body: ClassifyRequest, request: Request) -> Any:
        """Classify texts or text pairs: `[{label, score}]` per input, best first."""
        single = not isinstance(body.inputs, list)
        items: list[str | TextPair] = list(body.inputs) if isinstance(body.inputs, list) else [body.inputs]
        task_input = ClassifyInput.from_items(
            [(item, None) if isinstance(item, str) else (item.text, item.text_pair) for item in items],
            top_k=body.top_k,
            truncate=body.truncate,
            function_to_apply=body.function_to_apply,
        )
        outcome = await engine_of(request).submit(task_input, model=body.model, timeout_s=request_timeout(request))
        return task_response(outcome.results[0] if single else outcome.results, outcome)

    @app.post("/qa", response_model=Answer | list[Answer] | list[list[Answer]], **common)
    async def qa(body: QARequest, request: Request) -> Any:
        """Extract answers `{answer, score, start, end}` (character offsets into the context)."""
        single = body.inputs is None
        pairs = [(body.question, body.context)] if single else [(p.question, p.context) for p in body.inputs or []]
        task_input = QAInput(
            questions=[q or "" for q, _ in pairs],
            contexts=[c or "" for _, c in pairs],
            top_k=body.top_k,
            max_answer_len=body.max_answer_len,
            handle_impossible_answer=body.handle_impossible_answer,
            doc_stride=body.doc_stride,
            truncate=body.truncate,
        )
        outcome = await engine_of(request).submit(task_input, model=body.model, timeout_s=request_timeout(request))
        shaped = [answers[0] if body.top_k == 1 else answers for answers in outcome.results]
        return task_response(shaped[0] if single else shaped, outcome)

    @app.post("/ner", response_model=list[Entity] | list[list[Entity]], **common)
    async def ner(body: NERRequest, request: Request) -> Any:
        """Find entities `{entity_group, score, word, start, end}` (character offsets into the text)."""
        single = isinstance(body.inputs, str)
        texts = [body.inputs] if isinstance(body.inputs, str) else list(body.inputs)
        task_input = NERInput(texts=texts, aggregation_strategy=body.aggregation_strategy, truncate=body.truncate)
        outcome = await engine_of(request).submit(task_input, model=body.model, timeout_s=request_timeout(request))
        return task_response(outcome.results[0] if single else outcome.results, outcome)

    add_encoder_routes(app, ERROR_RESPONSES, request_timeout)
    add_openai_routes(app, ERROR_RESPONSES, request_timeout)
    add_tei_routes(app, ERROR_RESPONSES, request_timeout)
    add_rerank_routes(app, ERROR_RESPONSES, request_timeout)
    add_hf_routes(app, ERROR_RESPONSES, request_timeout)
    add_v2_routes(app, ERROR_RESPONSES, request_timeout)

    @app.get("/models", response_model=ModelList, responses=ERROR_RESPONSES, tags=["models"])
    async def models(request: Request) -> Any:
        """The loaded models: task, labels, variant, maximum length, and which is each task's default."""
        return {"models": engine_of(request).list_models()}

    @app.get("/metrics", tags=["health"], response_class=Response)
    async def metrics(request: Request) -> Response:
        """Prometheus metrics."""
        return Response(request.app.state.metrics.exposition(), media_type=CONTENT_TYPE)

    _add_health_routes(app)


def _add_health_routes(app: FastAPI) -> None:
    @app.get("/health/live", response_model=Health, responses={503: {"model": Health}}, tags=["health"])
    async def live(request: Request) -> Any:
        """Liveness: 200 while the process can serve (models may still be loading), 503 once it has failed."""
        failure = engine_of(request).state.failure
        if failure is not None:
            return JSONResponse({"status": "failed", "detail": failure}, status_code=503)
        return {"status": "live"}

    @app.get("/health/ready", response_model=Health, responses={503: {"model": Health}}, tags=["health"])
    async def ready(request: Request) -> Any:
        """Readiness: 200 once every model is loaded and warmed up; 503 before that, while shutting down, and once
        the server has failed."""
        state = engine_of(request).state
        if state.failure is not None:
            return JSONResponse({"status": "failed", "detail": state.failure}, status_code=503)
        if state.ready and not state.draining:
            return {"status": "ready"}
        status = "shutting_down" if state.draining or state.shutting_down else "loading"
        return JSONResponse({"status": status, "detail": None}, status_code=503)


__all__ = ["JsonRoute", "create_app", "engine_of", "request_timeout"]
