"""HTTP/1.1 connections that slow or bloated request heads cannot hold: uvicorn's protocol with time and size
limits on what arrives before a request reaches the app.

uvicorn bounds none of this itself: its keep-alive timeout runs only between requests and any byte cancels it,
nothing times a request head (a client may send its headers a byte a second for ever), and its httptools parser
collects headers without a size limit (h11's `h11_max_incomplete_event_size` is not used with httptools).
`guarded_protocol` returns uvicorn's httptools protocol extended with:

- a head deadline: a new connection, and a kept-alive one from the first byte of its next request, must deliver
  the request line and headers within `header_timeout_s`; else 408 and the connection closed;
- a head size limit: a head over `max_header_bytes` gets 431 and the connection closed. Two counts enforce it:
  the bytes received while a head is incomplete (a head that never ends, or one header that keeps growing), and
  what the parser hands over of a head (its URL, header names and values), which catches a whole head parsed in
  one read, before the request reaches the app;
- a body deadline for a request answered before its body was read (413, 429): the rest of the body must arrive
  within `body_timeout_s` of the answer (the app's own body timeout covers bodies it reads), else closed;
- a pipeline depth: uvicorn queues every request a client pipelines behind one at work, as many as one read holds
  (some 6,000 minimal heads in 256 KB, 14 MB of request state), before it stops reading. Past `MAX_PIPELINED`
  waiting requests the parser stops: the requests already queued are answered, in order, nothing more is read,
  then the connection is half-closed and what the client still sends is read and dropped for `LINGER_S` before
  it is closed (a close with unread bytes would be a reset, which can destroy the answers in the client's kernel
  before it reads them).

A connection in any of these phases costs a socket and this object, no task and no thread. `on_cut(phase)` is
told of every cut (headers, header_size, body, pipeline) for the metrics.

References: https://www.uvicorn.org/settings/#timeouts , RFC 9110 sections 15.5.9 (408) and RFC 6585 section 5
(431).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

MAX_PIPELINED = 16
"""Most requests a connection may have waiting behind the one at work (HTTP/1.1 pipelining, which no common
client uses); the next one ends the connection once the ones queued are answered."""

LINGER_S = 2.0
"""How long a connection ended for its pipeline's depth reads and drops what its client still sends after the
last answer and the FIN, before it is closed."""

CUT_RESPONSES = {
    "headers": (408, "Request Timeout", "request_timeout", "the request headers did not arrive within {timeout}"),
    "header_size": (431, "Request Header Fields Too Large", "headers_too_large", "the request head is over {limit}"),
}
"""phase -> (status, reason, error code, message) of the answer written before a cut connection is closed."""


def guarded_protocol(
    header_timeout_s: float,
    max_header_bytes: int,
    body_timeout_s: float,
    on_cut: Callable[[str], None] | None = None,
) -> type[asyncio.Protocol]:
    """uvicorn's HTTP/1.1 protocol (httptools) with the limits above; pass it as `uvicorn.Config(http=...)`."""
    if header_timeout_s <= 0 or body_timeout_s <= 0 or max_header_bytes < 1:
        raise ValueError(
            f"need positive timeouts and header size, got header_timeout_s={header_timeout_s}, "
            f"body_timeout_s={body_timeout_s}, max_header_bytes={max_header_bytes}"
        )

    class GuardedHttpProtocol(_Guarded):
        limits = _Limits(header_timeout_s, max_header_bytes, body_timeout_s, on_cut)

    return GuardedHttpProtocol


@dataclass(frozen=True)
class _Limits:
    header_timeout_s: float
    max_header_bytes: int
    body_timeout_s: float
    on_cut: Callable[[str], None] | None


class _StopParsing(Exception):
    """Raised in a parser callback to stop parsing what a connection sent (a head over the limit, a request
    beyond the pipeline's depth): httptools raises it on as an `HttpParserCallbackError`, which uvicorn logs as an
    invalid request (a warning, as for a malformed head; `service.operations.logs` writes one such line per 10 s) and
    answers with `send_400_response`, here the connection's cut (for the pipeline's depth, its drain)."""


class _Guarded(HttpToolsProtocol):
    limits: _Limits

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._timer: asyncio.TimerHandle | None = None
        self._head_bytes: int | None = None
        """Bytes received since the current head began; None while no head is awaited."""
        self._in_message = False
        """The request's headers arrived and its body is not complete yet."""
        self._head_size = 0
        """Bytes of the current head the parser has handed over: URL, header names and values, 4 per header line."""
        self._stopped_for: str | None = None
        """The phase of the cut for which a parser callback stopped the parser (`_stop_parsing`)."""
        self._lingering = False
        """Drained and half-closed: closed at the client's FIN or after `LINGER_S`."""

    # ---- asyncio.Protocol -------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._await_head()  # a new connection owes its first request head

    def data_received(self, data: bytes) -> None:
        if self._stopped_for == "pipeline":  # draining: the requests queued are answered, what arrives is dropped
            return
        if self._head_bytes is not None:
            self._head_bytes += len(data)
        super().data_received(data)
        if self._head_bytes is not None and self._head_bytes > self.limits.max_header_bytes:
            self._cut("header_size")

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_timer()
        super().connection_lost(exc)

    # ---- httptools parser callbacks ---------------------------------------------------------------
    def on_message_begin(self) -> None:
        if self._head_bytes is None:
            self._await_head()  # the first byte of a request on a kept-alive (or pipelining) connection
        self._head_size = 0
        super().on_message_begin()

    def on_url(self, url: bytes) -> None:
        self._count_head(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_head(len(name) + len(value) + 4)  # ": " and the line's CRLF
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._stop_timer()
        self._head_bytes = None
        self._in_message = True
        if len(self.pipeline) >= MAX_PIPELINED:
            self._stop_parsing("pipeline")
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._in_message = False
        self._stop_timer()  # a body timer for a request answered before its body came
        super().on_message_complete()

    # ---- uvicorn ----------------------------------------------------------------------------------
    def send_400_response(self, msg: str) -> None:
        if self._stopped_for == "pipeline":
            self._stop_timer()
            self._head_bytes = None
            self._in_message = False
            self._drain()
            return
        if self._stopped_for is not None:  # the parser was stopped by `_stop_parsing`, not by a malformed request
            self._cut(self._stopped_for)
            return
        super().send_400_response(msg)

    def on_response_complete(self) -> None:
        super().on_response_complete()  # starts the next queued request, and resumes reading
        if self._stopped_for == "pipeline":
            self._drain()
            return
        if self._in_message and not self.transport.is_closing() and self._timer is None:
            self._timer = self.loop.call_later(self.limits.body_timeout_s, self._cut, "body")

    # ---- the limits -------------------------------------------------------------------------------
    def _await_head(self) -> None:
        self._stop_timer()
        self._head_bytes = 0
        self._timer = self.loop.call_later(self.limits.header_timeout_s, self._cut, "headers")

    def _count_head(self, size: int) -> None:
        self._head_size += size
        if self._head_size > self.limits.max_header_bytes:
            self._stop_parsing("header_size")

    def _stop_parsing(self, phase: str) -> None:
        self._stopped_for = phase
        raise _StopParsing(phase)

    def _drain(self) -> None:
        """Answer the requests queued (uvicorn starts each when the one before it is answered) without reading
        more, then half-close and drop what still comes for `LINGER_S`."""
        if self._lingering or self.transport.is_closing():
            return
        if self.pipeline or (self.cycle is not None and not self.cycle.response_complete):
            self.flow.pause_reading()
            return
        if self.limits.on_cut is not None:
            self.limits.on_cut("pipeline")
        self._lingering = True
        self.flow.resume_reading()  # to drop what the client still sends (data_received), not to leave it unread
        self.transport.write_eof()
        self._timer = self.loop.call_later(LINGER_S, self.transport.close)

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _cut(self, phase: str) -> None:
        self._stop_timer()
        self._head_bytes = None
        if self.transport.is_closing():
            return
        if self.limits.on_cut is not None:
            self.limits.on_cut(phase)
        if phase in CUT_RESPONSES and (self.cycle is None or self.cycle.response_complete):
            self.transport.write(self._answer(phase))
        self.transport.close()

    def _answer(self, phase: str) -> bytes:
        status, reason, code, message = CUT_RESPONSES[phase]
        limits = self.limits
        text = message.format(timeout=f"{limits.header_timeout_s:g} s", limit=f"{limits.max_header_bytes} bytes")
        body = json.dumps({"error": {"code": code, "message": text}}).encode()
        head = (
            f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
            "connection: close\r\n\r\n"
        )
        return head.encode("ascii") + body


__all__ = ["guarded_protocol"]
