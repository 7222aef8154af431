"""Pure ASGI middleware: the door (requests in progress), the request body's size and time limits, request
metrics + access log; the HTTP error response.

- `AdmissionMiddleware` counts a request in the service's door (`service.admission.Door`, shared with gRPC) as
  soon as its headers arrived, before its body is read; beyond the door's limit it answers 429 at once.
  Health, metrics and the playground page are not counted, so a full server still answers them.
- `BodyLimitMiddleware` reads the whole body before the app sees it, within `max_bytes` (413) and `timeout_s`
  from the end of the headers (408 and the connection closed): a client that sends its body slowly holds no
  worker, only a waiting coroutine, and not for longer than the timeout.

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

from service.admission import Door
from service.errors import PayloadTooLarge, ServiceError, http_status
from service.metrics import ServiceMetrics

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


def error_response(error: ServiceError) -> JSONResponse:
    """`{"error": {code, message}}` with the status of `service.errors.HTTP_STATUS` (the one HTTP mapping)."""
    status = http_status(error)
    headers = {"retry-after": "1"} if status in (429, 503) else None
    if status == 401:
        headers = {"www-authenticate": "Bearer"}
    body = {"error": {"code": error.code, "message": error.message}}
    return JSONResponse(body, status_code=status, headers=headers)


class AdmissionMiddleware:
    """Count each request in `door` from its arrival to its response's end; 429 at once when the door is full."""

    def __init__(self, app: ASGIApp, door: Door) -> None:
        self.app = app
        self.door = door

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or _uncounted(scope.get("path", "")):
            await self.app(scope, receive, send)
            return
        if not self.door.enter("http"):
            await error_response(self.door.refusal())(scope, receive, send)
            return
        try:
            await self.app(scope, receive, send)
        finally:
            self.door.leave()


def _uncounted(path: str) -> bool:
    return path in UNCOUNTED_PATHS or path.startswith(UNCOUNTED_PREFIXES)


class BodyLimitMiddleware:
    """Read the whole body (up to `max_bytes`, 413 beyond; within `timeout_s`, 408 after) before the app runs,
    then hand it to the app in one piece."""

    def __init__(self, app: ASGIApp, max_bytes: int, timeout_s: float = 20.0, metrics: ServiceMetrics | None = None):
        self.app = app
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
        chunks: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(self.timeout_s):
                while True:
                    message = await receive()
                    if message["type"] != "http.request":
                        return  # client went away
                    chunks.append(message.get("body", b""))
                    size += len(chunks[-1])
                    if size > self.max_bytes:
                        await self._reject(scope, receive, send, size)
                        return
                    if not message.get("more_body", False):
                        break
        except TimeoutError:
            await self._timed_out(scope, receive, send, size)
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": chunks[0] if len(chunks) == 1 else b"".join(chunks)}

        await self.app(scope, replay, send)

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
    """Count requests by route template and status, observe latency, and log one JSON line per request."""

    def __init__(self, app: ASGIApp, metrics: ServiceMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500
        request_id = _header(scope, REQUEST_ID_HEADER.encode()) or new_request_id()

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                server_ms = f"{(time.perf_counter() - start) * 1000:.3f}".encode()
                extra = [(REQUEST_ID_HEADER.encode(), request_id.encode()), (SERVER_TIME_HEADER.encode(), server_ms)]
                message["headers"] = [*message.get("headers", []), *extra]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            elapsed = time.perf_counter() - start
            route = _route_template(scope)
            self.metrics.observe_request("http", route, str(status), elapsed)
            if route not in ("/metrics", "/health/live", "/health/ready"):
                log.info(
                    "request",
                    extra={
                        "method": scope.get("method"),
                        "route": route,
                        "status": status,
                        "ms": round(elapsed * 1000, 2),
                        "request_id": request_id,
                    },
                )


def _route_template(scope: Scope) -> str:
    route = scope.get("route")
    path = getattr(route, "path", None)
    return path if isinstance(path, str) else "unmatched"
