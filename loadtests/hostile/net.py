"""The hostile profile's clients: one call over REST (aiohttp) or gRPC (grpc.aio, typed or raw bytes), raw TCP
requests (one connection each: the flood, malformed HTTP), slow clients (a byte a second), and the server's RSS.

Every call ends as a `Call`: what was sent, the status (HTTP code, gRPC status name, or what the connection did:
`reset`, `closed` without an answer, `no-answer` within the client's timeout), when it started and how long it took.
`status_class` sorts statuses into the classes the profile's bounds speak of.
RSS: from /proc/<pid>/status (the process and its descendants) when the runner started the server, else from
the `process_resident_memory_bytes` gauge of the server's /metrics (prometheus-client's process collector,
exported only when the server registers it).
References: https://docs.aiohttp.org/en/stable/client_reference.html, https://grpc.github.io/grpc/python/grpc_asyncio.html,
RFC 9112 (HTTP/1.1 message syntax), https://en.wikipedia.org/wiki/Slowloris_(computer_security).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import grpc.aio

CLIENT_ERRORS_GRPC = frozenset(
    {"INVALID_ARGUMENT", "NOT_FOUND", "OUT_OF_RANGE", "UNIMPLEMENTED", "FAILED_PRECONDITION", "UNAUTHENTICATED",
     "PERMISSION_DENIED", "ALREADY_EXISTS", "CANCELLED"}
)  # fmt: skip
SERVER_ERRORS_GRPC = frozenset({"INTERNAL", "UNKNOWN", "DATA_LOSS", "ABORTED"})
FIVE_XX_CLASSES = frozenset({"server-error", "unavailable", "timeout"})
"""The classes of 5xx statuses (500 and the others; 503; 504) and of their gRPC counterparts."""
STATUS_CLASSES = ("ok", "client-error", "rejected", "unavailable", "timeout", "server-error", "connection")
"""ok; client-error (4xx but 429, gRPC INVALID_ARGUMENT ...); rejected (429, RESOURCE_EXHAUSTED); unavailable (503,
UNAVAILABLE); timeout (504, DEADLINE_EXCEEDED, or no answer within the client's timeout); server-error (500 and the
other 5xx, INTERNAL, UNKNOWN, DATA_LOSS); connection (reset or closed without an answer)."""
DETAIL_BYTES = 400
"""What a call keeps of an error answer's body or gRPC details (enough for the server's message)."""


@dataclass
class Call:
    """One request of the profile and how it ended."""

    phase: str
    name: str
    """What was sent: `/qa doc_stride`, `small /classify`, `flood /classify`, a malformed case's name ..."""
    status: str
    """HTTP status code, gRPC status name, `reset`, `closed` or `no-answer`."""
    start_s: float
    """Seconds from the start of the profile."""
    latency_ms: float
    detail: str = ""

    @property
    def end_s(self) -> float:
        return self.start_s + self.latency_ms / 1000.0


def status_class(status: str) -> str:
    """The class of a `Call.status` (see STATUS_CLASSES)."""
    if status.isdigit():
        code = int(status)
        if 200 <= code < 300:
            return "ok"
        if code == 429:
            return "rejected"
        if code == 503:
            return "unavailable"
        if code in (408, 504):
            return "timeout"
        return "client-error" if 400 <= code < 500 else "server-error"
    named = {"OK": "ok", "RESOURCE_EXHAUSTED": "rejected", "UNAVAILABLE": "unavailable"}
    if status in named:
        return named[status]
    if status in ("DEADLINE_EXCEEDED", "no-answer"):
        return "timeout"
    if status in CLIENT_ERRORS_GRPC:
        return "client-error"
    if status in SERVER_ERRORS_GRPC:
        return "server-error"
    return "connection"


class Clock:
    """Seconds since the profile started (one clock for every call, RSS sample and phase boundary)."""

    def __init__(self) -> None:
        self.origin = time.perf_counter()

    def now(self) -> float:
        return time.perf_counter() - self.origin


# ---- REST and gRPC calls -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RestRequest:
    name: str
    path: str
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()
    method: str = "POST"


async def rest_call(
    session: aiohttp.ClientSession, base_url: str, request: RestRequest, clock: Clock, phase: str, timeout_s: float
) -> Call:
    """Send `request` (its body as is, `content-type: application/json` unless its headers say otherwise)."""
    headers = {"content-type": "application/json", **dict(request.headers)}
    start = clock.now()
    status, detail = "no-answer", ""
    try:
        async with session.request(
            request.method,
            base_url + request.path,
            data=request.body,
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=timeout_s),
        ) as response:
            text = await response.read()
            status = str(response.status)
            if response.status >= 400:
                detail = text[:DETAIL_BYTES].decode("utf-8", "replace")
    except TimeoutError:
        status = "no-answer"
    except aiohttp.ClientError as error:
        status, detail = _connection_status(error), f"{type(error).__name__}: {error}"[:200]
    return Call(phase, request.name, status, start, (clock.now() - start) * 1000.0, detail)


def _connection_status(error: BaseException) -> str:
    text = f"{type(error).__name__} {error}".lower()
    return "reset" if "reset" in text or "refused" in text else "closed"


@dataclass(frozen=True)
class GrpcRequest:
    """A gRPC call: `method` is `/bert.v1.Service/Method`; `message` a protobuf message or raw bytes."""

    name: str
    method: str
    message: Any
    timeout_s: float | None = None
    """The call's deadline; None = the phase's client timeout."""
    metadata: tuple[tuple[str, str], ...] = ()


async def grpc_call(
    channel: grpc.aio.Channel, request: GrpcRequest, clock: Clock, phase: str, timeout_s: float
) -> Call:
    """Send `request` through a generic unary-unary call (raw bytes go as they are; the answer is not parsed)."""
    serializer = None if isinstance(request.message, bytes) else type(request.message).SerializeToString
    call = channel.unary_unary(request.method, request_serializer=serializer, response_deserializer=None)
    start = clock.now()
    status, detail = "OK", ""
    try:
        await call(request.message, timeout=request.timeout_s or timeout_s, metadata=request.metadata or None)
    except grpc.aio.AioRpcError as error:
        status, detail = error.code().name, (error.details() or "")[:DETAIL_BYTES]
    return Call(phase, request.name, status, start, (clock.now() - start) * 1000.0, detail)


# ---- raw TCP -------------------------------------------------------------------------------------------------
STATUS_LINE = re.compile(rb"^HTTP/1\.[01] (\d{3})")


def http_bytes(host: str, method: str, path: str, body: bytes = b"", headers: Sequence[tuple[str, str]] = ()) -> bytes:
    """An HTTP/1.1 request on one connection (`connection: close`), with content-length unless the headers set
    transfer-encoding."""
    lines = [f"{method} {path} HTTP/1.1", f"host: {host}", "connection: close"]
    names = {name.lower() for name, _ in headers}
    if "transfer-encoding" not in names and "content-length" not in names:
        lines.append(f"content-length: {len(body)}")
    if "content-type" not in names:
        lines.append("content-type: application/json")
    lines += [f"{name}: {value}" for name, value in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


async def tcp_exchange(
    host: str, port: int, payload: bytes, timeout_s: float, go: asyncio.Event | None = None
) -> tuple[str, str]:
    """Open a connection, (wait for `go`,) send `payload`, read to the end: (status, first bytes of the answer).
    Status: the HTTP code of the answer, `closed` (no answer before EOF), `reset`, or `no-answer` (timeout)."""
    writer: asyncio.StreamWriter | None = None
    try:
        async with asyncio.timeout(timeout_s):
            reader, writer = await asyncio.open_connection(host, port)
            if go is not None:
                await go.wait()
            writer.write(payload)
            await writer.drain()
            answer = await _read_answer(reader)
    except TimeoutError:
        return "no-answer", ""
    except OSError as error:
        return _connection_status(error), str(error)[:120]
    finally:
        if writer is not None:
            writer.close()
    match = STATUS_LINE.match(answer)
    return (match.group(1).decode() if match else "closed"), answer[:200].decode("latin-1")


async def _read_answer(reader: asyncio.StreamReader, limit: int = 1 << 20) -> bytes:
    """One HTTP response (its head, and its body by content-length or chunked framing), or what came before the
    server closed the connection; at most about `limit` bytes are kept."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = await reader.read(65536)
        if not chunk or len(data) > limit:
            return data + chunk
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    fields = dict(_header_fields(head))
    if fields.get(b"transfer-encoding", b"").strip().lower() == b"chunked":
        while not body.endswith(b"0\r\n\r\n"):
            chunk = await reader.read(65536)
            if not chunk:
                break
            body = (body + chunk)[-limit:]
        return head + b"\r\n\r\n" + body
    length = int(fields[b"content-length"]) if fields.get(b"content-length", b"").strip().isdigit() else None
    while length is None or len(body) < length:
        chunk = await reader.read(65536)
        if not chunk:
            break
        body = (body + chunk)[:limit]
    return head + b"\r\n\r\n" + body


def _header_fields(head: bytes) -> list[tuple[bytes, bytes]]:
    pairs = []
    for line in head.split(b"\r\n")[1:]:
        name, sep, value = line.partition(b":")
        if sep:
            pairs.append((name.strip().lower(), value.strip()))
    return pairs


@dataclass
class SlowResult:
    kind: str
    cut_s: float | None
    """Seconds from connecting until the server closed the connection or answered; None = never within the limit."""
    how: str
    """`closed`, `reset`, an HTTP status code (the server answered, e.g. 408), `not cut` or `connect failed`."""
    bytes_sent: int


SLOW_PREFIXES = {
    "headers": b"POST /classify HTTP/1.1\r\nhost: 127.0.0.1\r\nx-slow: ",
    "body": b"POST /classify HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
    b"content-length: 100000\r\n\r\n",
    "idle": b"",
}
"""What a slow client sends at once: `headers` then dribbles the value of a header that never ends, `body` sends
whole headers then dribbles a body it announced as 100,000 bytes; `idle` connects and sends nothing."""


async def slow_client(host: str, port: int, kind: str, interval_s: float, limit_s: float) -> SlowResult:
    """Dribble one byte every `interval_s` seconds (none for `idle`) until the server closes the connection or
    answers, or `limit_s` seconds pass."""
    start = time.perf_counter()
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout=10)
    except (OSError, TimeoutError) as error:
        return SlowResult(kind, None, f"connect failed: {error}"[:80], 0)
    sent = 0
    answer = asyncio.ensure_future(reader.read(65536))
    try:
        if SLOW_PREFIXES[kind]:
            writer.write(SLOW_PREFIXES[kind])
            sent += len(SLOW_PREFIXES[kind])
        while time.perf_counter() - start < limit_s:
            done, _ = await asyncio.wait({answer}, timeout=interval_s)
            if done:
                return _slow_end(kind, start, answer, sent)
            if kind != "idle":
                writer.write(b"a")
                sent += 1
                await writer.drain()
        return SlowResult(kind, None, "not cut", sent)
    except OSError as error:
        return SlowResult(kind, time.perf_counter() - start, _connection_status(error), sent)
    finally:
        answer.cancel()
        writer.close()


def _slow_end(kind: str, start: float, answer: asyncio.Future[bytes], sent: int) -> SlowResult:
    elapsed = time.perf_counter() - start
    try:
        data = answer.result()
    except OSError as error:
        return SlowResult(kind, elapsed, _connection_status(error), sent)
    match = STATUS_LINE.match(data)
    return SlowResult(kind, elapsed, match.group(1).decode() if match else "closed", sent)


PIPELINED_HEAD = b"GET /health/live HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n"
"""One request of a pipelining client: a minimal kept-alive GET, as small a head as a server will take."""


@dataclass
class PipelineResult:
    sent: int
    """Requests written (pipelined in one write; fewer reached the server when it closed the connection early)."""
    answers: int
    """Responses read before the connection ended."""
    end_s: float | None
    """Seconds from the write until the server closed the connection or answered every request; None: neither
    within the limit."""
    how: str
    """`closed` (by the server), `reset`, `all answered`, `not ended` or `connect failed`."""


async def pipelined_client(host: str, port: int, requests: int, limit_s: float) -> PipelineResult:
    """Write `requests` minimal GETs on one connection at once (HTTP/1.1 pipelining), then read until the server
    closes the connection or has answered them all, at most `limit_s` seconds. A server that queues what it has
    read keeps each request's state until its turn; one that stops reading, or closes, keeps none."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout=10)
    except (OSError, TimeoutError) as error:
        return PipelineResult(0, 0, None, f"connect failed: {error}"[:80])
    start = time.perf_counter()
    answers, tail = 0, b""
    try:
        async with asyncio.timeout(limit_s):
            writer.write(PIPELINED_HEAD * requests)
            with contextlib.suppress(OSError):  # the server may close before it has read everything
                await writer.drain()
            while answers < requests:
                chunk = await reader.read(65536)
                if not chunk:
                    return PipelineResult(requests, answers, time.perf_counter() - start, "closed")
                data = tail + chunk
                answers += data.count(b"HTTP/1.1 ")
                tail = data[-8:]  # a status line cut between two reads is counted in the next; 8 bytes hold none whole
        return PipelineResult(requests, answers, time.perf_counter() - start, "all answered")
    except TimeoutError:
        return PipelineResult(requests, answers, None, "not ended")
    except OSError as error:
        return PipelineResult(requests, answers, time.perf_counter() - start, _connection_status(error))
    finally:
        writer.close()


# ---- the server's RSS ----------------------------------------------------------------------------------------
class RssProbe:
    """Reads the server's resident set size in bytes; `source` says from where; None when it cannot be read."""

    source = "none"

    async def read(self) -> int | None:
        return None


class ProcRss(RssProbe):
    """VmRSS of process `pid` and its descendants, from /proc (the descendants looked up every few seconds)."""

    FAMILY_EVERY_S = 5.0

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.source = f"/proc/{pid}/status (and its descendants)"
        self._family: list[int] = [pid]
        self._found_at = -math.inf

    async def read(self) -> int | None:
        if time.monotonic() - self._found_at > self.FAMILY_EVERY_S:
            self._family, self._found_at = descendants(self.pid), time.monotonic()
        sizes = [size for size in map(_vm_rss, self._family) if size is not None]
        return sum(sizes) if sizes else None


def descendants(pid: int) -> list[int]:
    """`pid` and every process below it."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    family, todo = [], [pid]
    while todo:
        current = todo.pop()
        family.append(current)
        todo += children.get(current, [])
    return family


def _vm_rss(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


RSS_METRIC = re.compile(r"^process_resident_memory_bytes(?:\{[^}]*\})?\s+(\S+)\s*$", re.MULTILINE)


class MetricsRss(RssProbe):
    """`process_resident_memory_bytes` from the server's /metrics."""

    def __init__(self, session: aiohttp.ClientSession, base_url: str) -> None:
        self.session = session
        self.url = base_url + "/metrics"
        self.source = f"process_resident_memory_bytes of {self.url}"

    async def read(self) -> int | None:
        try:
            async with self.session.get(self.url, timeout=aiohttp.ClientTimeout(total=5)) as response:
                text = await response.text()
        except (aiohttp.ClientError, TimeoutError):
            return None
        return parse_rss_metric(text)


def parse_rss_metric(text: str) -> int | None:
    """The value of `process_resident_memory_bytes` in a Prometheus exposition (None when absent)."""
    match = RSS_METRIC.search(text)
    if match is None:
        return None
    try:
        value = float(match.group(1))
    except ValueError:
        return None
    return int(value) if math.isfinite(value) else None
