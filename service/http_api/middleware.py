"""Pure ASGI middleware: the door (requests receiving, then at work) with the request body's size and time
limits, request metrics + access log + the drain's `Connection: close`; the HTTP error response.

`AdmissionMiddleware` counts a request in the service's door (`service.engine.admission.Door`, shared with gRPC) in two
steps. On its arrival (its headers), among the requests receiving their body: beyond that bound 429 at once. It
then reads the whole body before the app sees it, within `max_bytes` (413) and `timeout_s` from the end of the
headers (408 and the connection closed), and once the body is complete, before it is parsed, among the requests
at work: beyond that bound 429. A client that sends its body slowly so holds a cheap receiving place (a waiting
coroutine and its bytes so far, not longer than the timeout), never a place at work. Health, metrics and the
playground page are not counted (their bodies are still limited), so a full server still answers them.

Pure ASGI (not BaseHTTPMiddleware) so bodies are counted and timed as they arrive.
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

from service.engine.admission import Door, Ticket
from service.engine.engine import ServiceState
from service.error_messages import clip_message
from service.errors import Internal, PayloadTooLarge, ServiceError, http_status
from service.operations.logs import log_request
from service.operations.metrics import ServiceMetrics

log = logging.getLogger("service.http")

REQUEST_ID_HEADER = "x-request-id"
SERVER_TIME_HEADER = "x-server-time-ms"
SERVER_HEADERS = (REQUEST_ID_HEADER, SERVER_TIME_HEADER)
"""Headers this middleware adds to every HTTP response."""

UNCOUNTED_PATHS = frozenset({"/health/live", "/health/ready", "/metrics", "/", "/playground"})
UNCOUNTED_PREFIXES = ("/playground/",)
"""Requests the door does not count: probes, metrics and the playground page must answer on a full server."""


_ID_PREFIX = os.urandom(8).hex()
_ID_COUNTER = itertools.count()


def new_request_id() -> str:
    """32 hex digits: a random prefix drawn once per process + a counter: unique across processes as a uuid4 is,
    without building a UUID object per request (a fifth of uuid4's time)."""
    return f"{_ID_PREFIX}{next(_ID_COUNTER):016x}"


MAX_MESSAGE_BYTES = 4096
"""Most bytes of an error message in a response (`clip_message`): messages quote what the caller sent (a model
name, a fill-mask target), and a value of a megabyte is not sent back whole."""


def error_response(error: ServiceError) -> JSONResponse:
    """`{"error": {code, message}}` with the status of `service.errors.HTTP_STATUS` (the one HTTP mapping), the
    message cut to `MAX_MESSAGE_BYTES`."""
    status = http_status(error)
    headers = {"retry-after": "1"} if status in (429, 503) else None
    if status == 401:
        headers = {"www-authenticate": "Bearer"}
    body = {"error": {"code": error.code, "message": clip_message(error.message, MAX_MESSAGE_BYTES)}}
    return JSONResponse(body, status_code=status, headers=headers)


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


class AdmissionMiddleware:
    """Count each request in `door` as receiving from its arrival, read its whole body (up to `max_bytes`, 413
    beyond; within `timeout_s`, 408 after), count it at work once the body is in, then hand the app its body in
    one piece; 429 at once when either bound of the door is full. `door` None: the body limits only."""

    def __init__(
        self,
        app: ASGIApp,
        door: Door | None,
        max_bytes: int,
        timeout_s: float = 20.0,
        metrics: ServiceMetrics | None = None,
    ) -> None:
        self.app = app
        self.door = door
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await self._reject(scope, receive, send, declared)
            return
        ticket: Ticket | None = None
        if self.door is not None and not _uncounted(scope.get("path", "")):
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
            await self.app(scope, replay_body(body, receive), send)
        finally:
            if ticket is not None:
                ticket.close()

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
                        await self._reject(scope, receive, send, size)
                        return None
                    if not message.get("more_body", False):
                        return chunks[0] if len(chunks) == 1 else b"".join(chunks)
        except TimeoutError:
            await self._timed_out(scope, receive, send, size)
            return None

    async def _reject(self, scope: Scope, receive: Receive, send: Send, size: int) -> None:
        error = PayloadTooLarge(
            f"the request body has more than {self.max_bytes} bytes ({size}); send fewer or shorter inputs"
        )
        await error_response(error)(scope, receive, send)

    async def _timed_out(self, scope: Scope, receive: Receive, send: Send, size: int) -> None:
        if self.metrics is not None:
            self.metrics.slow_clients.labels("http", "body").inc()
        body = {
            "error": {
                "code": "request_timeout",
                "message": f"the request body did not arrive within {self.timeout_s:g} s ({size} bytes came); "
                "send it at once",
            }
        }
        await JSONResponse(body, status_code=408, headers={"connection": "close"})(scope, receive, send)


def _uncounted(path: str) -> bool:
    return path in UNCOUNTED_PATHS or path.startswith(UNCOUNTED_PREFIXES)


def replay_body(body: bytes, receive: Receive) -> Receive:
    """A receive that hands the app the body read, in one message, then passes on (a disconnect)."""
    replayed = False

    async def replay() -> Message:
        nonlocal replayed
        if replayed:
            return await receive()
        replayed = True
        return {"type": "http.request", "body": body}

    return replay


def _header(scope: Scope, wanted: bytes) -> str | None:
    for name, value in scope.get("headers", []):
        if name == wanted:
            return bytes(value).decode("latin-1")[:128]
    return None


def _content_length(scope: Scope) -> int | None:
    value = _header(scope, b"content-length")
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


class MetricsMiddleware:
    """Count requests by route template and status, observe latency, log one JSON line per request, and add the
    request id and server time to every response; while `state.draining`, `Connection: close` as well.

    The drain's `Connection: close` (after SIGTERM, see service/serve.py): a keep-alive client that gets it closes
    that connection itself and opens a new one for its next request, so no idle connection is left for the server
    to close under a request already on its way (which the client would see as a reset with no response).
    Reference: RFC 9112 section 9.6 (tear-down). One wrapper of `send` for both: each costs the event loop a call
    per message."""

    def __init__(self, app: ASGIApp, metrics: ServiceMetrics, state: ServiceState | None = None) -> None:
        self.app = app
        self.metrics = metrics
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500
        request_id = _header(scope, _REQUEST_ID) or new_request_id()

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
