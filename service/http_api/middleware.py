"""Pure ASGI middleware of the REST front door, and its error response.

`DoorMiddleware` admits a request before any work is done, in this order: its API key (when the server has one),
read from the headers before the body (401); its declared body size (413); a place at the door among the requests
*receiving* their body (`service.engine.admission.Door`, shared with gRPC: 429); its whole body within
`max_bytes` (413) and `timeout_s` (408, the connection closed); a place among the requests *at work*, once the body
is in and before it is parsed (429). The place is given back as the answer starts, so that a closed-loop client's
next request never finds its own previous one still counted. A client that closes its connection before its answer
cancels its request: the engine drops its queued work (`bertserve_abandoned{transport="http"}`). Health, metrics
and the playground page are not counted (their bodies are still limited), so a full server still answers them.

`MetricsMiddleware` counts requests by route template and status, observes latency, logs one JSON line per request,
adds the request id and server time to every response, and while the server drains says `Connection: close`.

Pure ASGI (not BaseHTTPMiddleware), so that bodies are counted and timed as they arrive.
Reference: https://www.starlette.io/middleware/#pure-asgi-middleware
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.engine.admission import Door, Ticket, bearer_matches
from service.engine.engine import EngineState
from service.error_messages import clip_message
from service.errors import (
    RETRY_AFTER_S,
    Internal,
    PayloadTooLarge,
    RequestTimeout,
    ServiceError,
    Unauthenticated,
    http_status,
)
from service.operations.logs import log_request
from service.operations.metrics import ServiceMetrics

log = logging.getLogger("service.http")

REQUEST_ID_HEADER = "x-request-id"
SERVER_TIME_HEADER = "x-server-time-ms"
SERVER_HEADERS = (REQUEST_ID_HEADER, SERVER_TIME_HEADER)
"""Headers the metrics middleware adds to every HTTP response."""

PROBE_PATHS = frozenset({"/health/live", "/health/ready", "/metrics"})
"""Open without the API key and never counted at the door: probes and metrics must answer on a full server."""
PAGE_PATHS = frozenset({"/", "/playground", "/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json"})
PAGE_PREFIXES = ("/playground/",)
"""The playground and the API docs: never counted at the door; open without the API key only where the server
says so (`public_docs`)."""

ABANDONED = "bertserve.abandoned"
"""Scope key set on a request whose client went away before its answer (logged and counted with status 499, the
status nginx gives a request its client closed)."""

MAX_MESSAGE_BYTES = 4096
"""Most bytes of an error message in a response (`clip_message`): messages quote what the caller sent (a model
name, a fill-mask target), and a value of a megabyte is not sent back whole."""

_ID_PREFIX = os.urandom(8).hex()
_ID_COUNTER = itertools.count()


def new_request_id() -> str:
    """32 hex digits: a random prefix drawn once per process + a counter: unique across processes as a uuid4 is."""
    return f"{_ID_PREFIX}{next(_ID_COUNTER):016x}"


def error_response(error: ServiceError, headers: dict[str, str] | None = None) -> JSONResponse:
    """`{"error": {code, message}}` with the status of `service.errors.HTTP_STATUS` (the one HTTP mapping), the
    message cut to `MAX_MESSAGE_BYTES`; 429 and 503 say when to retry, 401 which scheme to use."""
    status = http_status(error)
    extra = dict(headers or {})
    if status in (429, 503):
        extra["retry-after"] = str(RETRY_AFTER_S)
    elif status == 401:
        extra["www-authenticate"] = "Bearer"
    body = {"error": {"code": error.code, "message": clip_message(error.message, MAX_MESSAGE_BYTES)}}
    return JSONResponse(body, status_code=status, headers=extra or None)


def service_error_response(error: ServiceError) -> JSONResponse:
    """A domain error's answer; a 5xx other than 503 (a bug or a failed backend) is logged."""
    response = error_response(error)
    if response.status_code >= 500 and response.status_code != 503:
        log.error("request failed", extra={"code": error.code, "error": error.message})
    return response


def unexpected_error_response(error: Exception) -> JSONResponse:
    """500 `internal` with the id of the log line that holds the traceback of `error`."""
    internal = Internal("internal error")
    log.error("unexpected error", exc_info=error, extra={"error_id": internal.error_id})
    return error_response(internal)


class DoorMiddleware:
    """Authenticate, bound and count each request before the app sees it (see the module docstring); `door` None:
    the key and the body limits only."""

    def __init__(
        self,
        app: ASGIApp,
        door: Door | None,
        max_bytes: int,
        timeout_s: float = 20.0,
        metrics: ServiceMetrics | None = None,
        api_key: bytes | None = None,
        public_pages: bool = False,
    ) -> None:
        self.app = app
        self.door = door
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s
        self.metrics = metrics
        self.api_key = api_key
        self.public_pages = public_pages

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        refusal = self._refusal(scope, path)
        if refusal is not None:
            await error_response(refusal)(scope, receive, send)
            return
        ticket: Ticket | None = None
        if self.door is not None and not _uncounted(path):
            ticket = self.door.arrive("http")
            if ticket is None:
                await error_response(self.door.refusal("receiving"))(scope, receive, send)
                return
        try:
            body = await self._body(scope, receive, send)
            if body is None:
                return  # answered (408, 413) or the client went away
            if ticket is not None and not ticket.admit():
                assert self.door is not None
                await error_response(self.door.refusal())(scope, receive, send)
                return
            await self._serve(scope, receive, send, body, ticket)
        finally:
            if ticket is not None:
                ticket.close()

    def _refusal(self, scope: Scope, path: str) -> ServiceError | None:
        """What refuses the request from its head alone: a missing or wrong API key, a declared body too large."""
        if self.api_key is not None and path not in PROBE_PATHS and not (self.public_pages and _is_page(path)):
            authorization = first_header(scope, b"authorization")
            if not bearer_matches(authorization, self.api_key):
                return Unauthenticated("missing or wrong API key: send `Authorization: Bearer <key>`")
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            return self._too_large(declared)
        return None

    async def _serve(self, scope: Scope, receive: Receive, send: Send, body: bytes, ticket: Ticket | None) -> None:
        """Run the app on `body`; its door place is given back as its answer starts, and a client that goes away
        before that cancels it."""
        exchange = _Exchange(receive, send, body, ticket)
        task = asyncio.current_task()
        assert task is not None
        watcher = asyncio.create_task(exchange.watch(task, self.metrics))
        try:
            await self.app(scope, exchange.receive, exchange.send)
        except asyncio.CancelledError:
            if not exchange.abandoned:
                raise  # a cancellation of our own caller (the server's shutdown), not the client's
            task.uncancel()  # the client went away: nothing to answer, nothing to log as an error
            scope[ABANDONED] = True
        finally:
            watcher.cancel()

    async def _body(self, scope: Scope, receive: Receive, send: Send) -> bytes | None:
        """The whole body; None once answered with 408 / 413, or if the client went away."""
        chunks: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(self.timeout_s):
                while True:
                    message = await receive()
                    if message["type"] != "http.request":
                        return None  # client went away
                    chunks.append(message.get("body", b""))
                    size += len(chunks[-1])
                    if size > self.max_bytes:
                        await error_response(self._too_large(size))(scope, receive, send)
                        return None
                    if not message.get("more_body", False):
                        return chunks[0] if len(chunks) == 1 else b"".join(chunks)
        except TimeoutError:
            if self.metrics is not None:
                self.metrics.slow_clients.labels("http", "body").inc()
            error = RequestTimeout(
                f"the request body did not arrive within {self.timeout_s:g} s ({size} bytes came); send it at once"
            )
            await error_response(error, {"connection": "close"})(scope, receive, send)
            return None

    def _too_large(self, size: int) -> PayloadTooLarge:
        return PayloadTooLarge(
            f"the request body has more than {self.max_bytes} bytes ({size}); send fewer or shorter inputs"
        )


class _Exchange:
    """One request's messages once its body is in: the app reads the body, then (if it asks again) waits for the
    client to go away; its answer's start gives the door place back; a client that goes away before it cancels the
    request's task."""

    __slots__ = ("_body", "_gone", "_receive", "_send", "_ticket", "abandoned", "responded")

    def __init__(self, receive: Receive, send: Send, body: bytes, ticket: Ticket | None) -> None:
        self._receive, self._send, self._ticket = receive, send, ticket
        self._body: bytes | None = body
        self._gone: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        self.responded = False
        self.abandoned = False

    async def watch(self, task: asyncio.Task[object], metrics: ServiceMetrics | None) -> None:
        message = await self._receive()  # the body is read: the next message is the client going away
        self._gone.set_result(message)
        if not self.responded:
            self.abandoned = True
            if metrics is not None:
                metrics.abandoned.labels("http").inc()
            task.cancel()

    async def receive(self) -> Message:
        if self._body is not None:
            body, self._body = self._body, None
            return {"type": "http.request", "body": body}
        return await asyncio.shield(self._gone)

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.responded = True
            if self._ticket is not None:
                self._ticket.close()
        await self._send(message)


def _is_page(path: str) -> bool:
    return path in PAGE_PATHS or path.startswith(PAGE_PREFIXES)


def _uncounted(path: str) -> bool:
    return path in PROBE_PATHS or _is_page(path)


def first_header(scope: Scope, wanted: bytes) -> bytes | None:
    """The first header of that (lower-case) name, as Starlette reads it."""
    for name, value in scope.get("headers", []):
        if name == wanted:
            return bytes(value)
    return None


def _content_length(scope: Scope) -> int | None:
    value = first_header(scope, b"content-length")
    try:
        return int(value[:32]) if value is not None else None
    except ValueError:
        return None


class MetricsMiddleware:
    """Count requests by route template and status, observe latency, log one JSON line per request, and add the
    request id and server time to every response; while `state.draining`, `Connection: close` as well.

    The drain's `Connection: close` (after SIGTERM, see service/serve.py): a keep-alive client that gets it closes
    that connection itself and opens a new one for its next request, so no idle connection is left for the server
    to close under a request already on its way (which the client would see as a reset with no response).
    Reference: RFC 9112 section 9.6 (tear-down)."""

    def __init__(self, app: ASGIApp, metrics: ServiceMetrics, state: EngineState | None = None) -> None:
        self.app = app
        self.metrics = metrics
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500
        given = first_header(scope, _REQUEST_ID)
        request_id = given.decode("latin-1")[:128] if given is not None else new_request_id()

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                server_ms = f"{(time.perf_counter() - start) * 1000:.3f}".encode()
                headers = [*message.get("headers", []), (_REQUEST_ID, request_id.encode()), (_SERVER_TIME, server_ms)]
                if self.state is not None and self.state.draining:
                    headers = [(k, v) for k, v in headers if k.lower() != b"connection"]
                    headers.append((b"connection", b"close"))
                message["headers"] = headers
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            elapsed = time.perf_counter() - start
            if scope.get(ABANDONED):
                status = 499
            route = _route_template(scope)
            self.metrics.observe_request("http", route, str(status), elapsed)
            if route not in _UNLOGGED_ROUTES:
                log_request(scope["method"], route, status, round(elapsed * 1000, 2), request_id)


_REQUEST_ID = REQUEST_ID_HEADER.encode()
_SERVER_TIME = SERVER_TIME_HEADER.encode()
_UNLOGGED_ROUTES = frozenset({"/metrics", "/health/live", "/health/ready"})


def _route_template(scope: Scope) -> str:
    route = scope.get("route")
    path = getattr(route, "path", None)
    return path if isinstance(path, str) else "unmatched"


__all__ = [
    "DoorMiddleware",
    "MetricsMiddleware",
    "error_response",
    "first_header",
    "new_request_id",
    "service_error_response",
    "unexpected_error_response",
]
