"""FastAPI app factory: routes, error mapping, middleware, and the lifespan that loads models and gRPC.

`create_app(settings)` builds everything without side effects; the lifespan then loads and warms up models in
the background (REST answers `/health/*` meanwhile, and 503 `not_ready` to work), opens the gRPC front door once
they are ready, and flips readiness (HTTP `/health/ready`, gRPC health). The gRPC port refuses connections until
then: a balancer that sends a call to a replica before its first health check (HAProxy does, for a replica its
DNS discovery has just found) sees a refused connection, which it retries on another replica, where an UNAVAILABLE
answer would reach the client. Shutdown stops gRPC with a grace period, then the batchers.
Once the server has failed for good (loading failed, or a model's batch loop or backend died: see
`service.engine.batcher.Batcher`), `/health/live` and `/health/ready` answer 503 `failed` with the reason and gRPC
health says NOT_SERVING; `bertserve serve` (service/serve.py) then drains and exits non-zero.
Domain errors map to HTTP through `service.errors.http_status` only; validation problems become 422 (400 for
a body that is not JSON) with a message that names the field and what to send instead.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp

from service.engine.engine import RESPONSE_HEADERS, InferenceService
from service.engine.inputs import ClassifyInput, NERInput, QAInput
from service.errors import InvalidInput, InvalidJson, ServiceError, Unauthenticated
from service.http_api.direct_routes import DirectRoutes, direct_routes
from service.http_api.encoder_routes import add_encoder_routes
from service.http_api.middleware import (
    SERVER_HEADERS,
    AdmissionMiddleware,
    MetricsMiddleware,
    error_response,
    service_error_response,
    unexpected_error_response,
)
from service.http_api.openapi import describe_server
from service.http_api.playground import add_playground_routes
from service.http_api.rendering import task_response
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
from service.operations.metrics import CONTENT_TYPE, ServiceMetrics
from service.operations.ports import ensure_port_free
from service.settings import ServiceSettings

log = logging.getLogger(__name__)

NO_ANSWER = {"answer": "", "score": 0.0, "start": 0, "end": 0}
"""With top_k 1 each input gets one answer: this one when its context has no span to read (no tokens)."""

ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse, "description": text}
    for code, text in (
        (400, "The body is not valid JSON."),
        (401, "Missing or wrong API key (when the server requires one)."),
        (413, "The body is larger than the server's limit."),
        (422, "Invalid input: the message says which field and what to change."),
        (408, "The body did not arrive within the server's body timeout (the connection is closed)."),
        (429, "The server is at capacity (requests in progress, tokenization, or the model's queue): retry later."),
        (503, "Models are still loading, or the server is shutting down."),
        (504, "The request's deadline passed."),
    )
}

SETUP_ERRORS = (ValueError, TypeError, FileNotFoundError)
"""What loading raises for a bundle or a setting to fix (its message says what): logged without a traceback."""

_bearer = HTTPBearer(auto_error=False, description="`Authorization: Bearer <api key>` when the server sets one.")


class ServiceApp(FastAPI):
    """FastAPI whose own middleware (`add_middleware`) wraps the whole of FastAPI's stack instead of sitting inside
    Starlette's error middleware, FastAPI's exception telemetry and body limit. A task request that the direct
    routes answer (service/http_api/direct_routes.py) then passes through the service's middleware only; everything
    else goes on into FastAPI's stack as before, its unexpected errors still answered by the app's handler (500
    `internal`), and now counted by the metrics middleware and given its request id."""

    def build_middleware_stack(self) -> ASGIApp:
        own, self.user_middleware = self.user_middleware, []
        try:
            app = super().build_middleware_stack()
        finally:
            self.user_middleware = own
        for cls, args, kwargs in reversed(own):
            app = cls(app, *args, **kwargs)
        return app


def create_app(settings: ServiceSettings | None = None) -> FastAPI:
    """The REST app (and, through its lifespan, the gRPC server) for `settings`."""
    settings = settings or ServiceSettings()
    metrics = ServiceMetrics()
    app = ServiceApp(
        title="bertserve",
        version="1.0.0",
        summary="BERT classification, question answering, NER, embeddings and fill-mask with server-side tokenization.",
        lifespan=_lifespan,
        # The service records its own spans (service/operations/tracing.py, on its own provider) and Prometheus metrics.
        # FastAPI's native OpenTelemetry would look up the global providers (environment reads) on every request
        # to find them unconfigured: 6% of the event loop's GIL samples in a py-spy profile under /classify load.
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    app.state.settings = settings
    app.state.metrics = metrics
    app.state.service = InferenceService(settings, metrics)
    app.state.grpc = None
    _add_error_handlers(app)
    _add_routes(app)
    # innermost of the service's middleware: the task routes' valid JSON requests answered without FastAPI's stack
    # and routing (the rest passed on)
    app.add_middleware(DirectRoutes, routes=direct_routes(app.routes, _require_key), api_key=settings.api_key)
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type"],
            expose_headers=[*RESPONSE_HEADERS, *SERVER_HEADERS],
        )
    # counted from arrival among those receiving, at work once the body is in (slow bodies hold no work place)
    app.add_middleware(
        AdmissionMiddleware,
        door=app.state.service.door,
        max_bytes=settings.max_body_bytes,
        timeout_s=settings.body_timeout_s,
        metrics=metrics,
    )
    app.add_middleware(MetricsMiddleware, metrics=metrics, state=app.state.service.state)
    if settings.playground:
        add_playground_routes(app)
    describe_server(app)
    return app


# ---- lifespan -------------------------------------------------------------------------------------------
@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    settings: ServiceSettings = app.state.settings
    service: InferenceService = app.state.service
    if settings.grpc_port >= 0:
        ensure_port_free(settings.host, settings.grpc_port, "--grpc-port")  # now, not once the models are loaded
    loading = asyncio.create_task(_load(app, service, settings), name="load-models")
    try:
        yield
    finally:
        service.state.shutting_down = True
        service.state.ready = False
        if not loading.done():
            loading.cancel()
            await asyncio.gather(loading, return_exceptions=True)
        if app.state.grpc is not None:
            await app.state.grpc.stop(settings.shutdown_grace_s)
        await service.close()
        log.info("stopped")


async def _load(app: FastAPI, service: InferenceService, settings: ServiceSettings) -> None:
    """Load and warm up the models, open the gRPC front door, then report ready; a failure fails the server."""

    async def open_grpc() -> None:
        if settings.grpc_port < 0:
            return
        from service.grpc_api.server import GrpcFrontDoor

        grpc_front = await GrpcFrontDoor.start(service, settings)
        app.state.grpc = grpc_front
        service.failure_hooks.append(lambda _: grpc_front.set_serving(False))

    try:
        await service.load(before_ready=open_grpc)
    except Exception as error:
        reason = f"{type(error).__name__}: {error}"
        service.state.load_error = reason
        # the reason on one line; a traceback only for what is not a user's mistake (a bundle, a setting)
        log.error("loading models failed: %s", reason, exc_info=not isinstance(error, SETUP_ERRORS))
        service.fail(f"loading models failed: {reason}")
        return
    log.info("ready", extra={"models": ",".join(service.models)})


# ---- errors ---------------------------------------------------------------------------------------------
def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ServiceError)
    async def service_error(_: Request, error: ServiceError) -> JSONResponse:
        return service_error_response(error)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, error: RequestValidationError) -> JSONResponse:
        problems = error.errors()
        if any(problem.get("type") == "json_invalid" for problem in problems):
            return error_response(InvalidJson("the request body is not valid JSON; send a JSON object"))
        return error_response(InvalidInput(_describe(problems)))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, error: StarletteHTTPException) -> JSONResponse:
        # routing (404, 405): the HTTP layer's own statuses, not domain errors
        body = {"error": {"code": "http_error", "message": str(error.detail)}}
        return JSONResponse(body, status_code=error.status_code, headers=getattr(error, "headers", None))

    @app.exception_handler(Exception)
    async def unexpected(_: Request, error: Exception) -> JSONResponse:
        return unexpected_error_response(error)


def _describe(problems: Sequence[Any]) -> str:
    """One line naming every invalid field and what was expected."""
    parts = []
    for problem in problems[:5]:
        location = ".".join(str(part) for part in problem.get("loc", ()) if part != "body") or "body"
        parts.append(f"{location}: {problem.get('msg', 'invalid')}")
    more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
    return "; ".join(parts) + more


# ---- routes ---------------------------------------------------------------------------------------------
def _service(request: Request) -> InferenceService:
    service: InferenceService = request.app.state.service
    return service


def _require_key(request: Request, credentials: HTTPAuthorizationCredentials | None = Depends(_bearer)) -> None:
    key = request.app.state.settings.api_key
    if key is None:
        return
    given = credentials.credentials if credentials is not None else ""
    if not secrets.compare_digest(given.encode(), key.get_secret_value().encode()):
        raise Unauthenticated("missing or wrong API key: send `Authorization: Bearer <key>`")


def _timeout(request: Request) -> float | None:
    """The caller's own deadline, from the `x-request-timeout-ms` header (capped by the server's timeout)."""
    value = request.headers.get("x-request-timeout-ms")
    if value is None:
        return None
    try:
        milliseconds = float(value)
    except ValueError:
        raise InvalidInput(f"x-request-timeout-ms must be a number of milliseconds, got {value!r}") from None
    if not 0 < milliseconds < 1e9:
        raise InvalidInput(f"x-request-timeout-ms must be positive, got {value!r}")
    return milliseconds / 1000


def _add_routes(app: FastAPI) -> None:
    # the security scheme appears in OpenAPI (and is enforced) only when the server has an API key
    secured = [Depends(_require_key)] if app.state.settings.api_key is not None else []

    @app.post(
        "/classify",
        response_model=list[LabelScore] | list[list[LabelScore]],
        responses=ERROR_RESPONSES,
        dependencies=secured,
        tags=["tasks"],
    )
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
        outcome = await _service(request).classify(task_input, model=body.model, timeout_s=_timeout(request))
        return task_response(outcome.results[0] if single else outcome.results, outcome)

    @app.post(
        "/qa",
        response_model=Answer | list[Answer] | list[list[Answer]],
        responses=ERROR_RESPONSES,
        dependencies=secured,
        tags=["tasks"],
    )
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
        outcome = await _service(request).qa(task_input, model=body.model, timeout_s=_timeout(request))
        shaped = [(answers or [NO_ANSWER])[0] if body.top_k == 1 else answers for answers in outcome.results]
        return task_response(shaped[0] if single else shaped, outcome)

    @app.post(
        "/ner",
        response_model=list[Entity] | list[list[Entity]],
        responses=ERROR_RESPONSES,
        dependencies=secured,
        tags=["tasks"],
    )
    async def ner(body: NERRequest, request: Request) -> Any:
        """Find entities `{entity_group, score, word, start, end}` (character offsets into the text)."""
        single = isinstance(body.inputs, str)
        texts = [body.inputs] if isinstance(body.inputs, str) else list(body.inputs)
        task_input = NERInput(texts=texts, aggregation_strategy=body.aggregation_strategy, truncate=body.truncate)
        outcome = await _service(request).ner(task_input, model=body.model, timeout_s=_timeout(request))
        return task_response(outcome.results[0] if single else outcome.results, outcome)

    add_encoder_routes(app, secured, ERROR_RESPONSES, _timeout)

    @app.get("/v1/models", response_model=ModelList, responses=ERROR_RESPONSES, dependencies=secured, tags=["models"])
    async def models(request: Request) -> Any:
        """The loaded models: task, labels, variant, maximum length, and which is each task's default."""
        return {"models": _service(request).list_models()}

    @app.get("/metrics", tags=["health"], response_class=Response)
    async def metrics(request: Request) -> Response:
        """Prometheus metrics."""
        return Response(request.app.state.metrics.exposition(), media_type=CONTENT_TYPE)

    _add_health_routes(app)


def _add_health_routes(app: FastAPI) -> None:
    @app.get("/health/live", response_model=Health, responses={503: {"model": Health}}, tags=["health"])
    async def live(request: Request) -> Any:
        """Liveness: 200 while the process can serve (models may still be loading), 503 once it has failed."""
        failure = _service(request).state.failure
        if failure is not None:
            return JSONResponse({"status": "failed", "detail": failure}, status_code=503)
        return {"status": "live"}

    @app.get("/health/ready", response_model=Health, responses={503: {"model": Health}}, tags=["health"])
    async def ready(request: Request) -> Any:
        """Readiness: 200 once every model is loaded and warmed up; 503 before that, while shutting down, and once
        the server has failed."""
        state = _service(request).state
        if state.failure is not None:
            return JSONResponse({"status": "failed", "detail": state.failure}, status_code=503)
        if state.ready and not state.draining:
            return {"status": "ready"}
        status = "shutting_down" if state.draining or state.shutting_down else "loading"
        return JSONResponse({"status": status, "detail": None}, status_code=503)


__all__ = ["create_app"]
