"""Structured logs: one JSON object per line (time, level, logger, message, and any `extra=` fields).

Configured once by the CLI / `create_app`; uvicorn's own loggers are routed through the same handler so the
whole process speaks one format. Plain text with `log_json=False` (handy in a terminal).

Records are formatted and written on a thread of its own (`bs-log`), which wakes every `TICK_S` to write what came
meanwhile: the event loop, which logs one access line per request, only appends to a deque, without waking another
thread per line (a wake-up per line was some 5% of the event loop's time under load); a warning or worse wakes the
writer at once. An access line (`log_request`) becomes a record on the writer's thread, from the few values the
request gives. The writer is stopped (what is queued written) at interpreter exit.

What clients can make the server log is bounded twice. At most `MAX_QUEUED` records wait for the writer: past
that (an output slower than the requests, e.g. a stalled pipe), records are dropped and counted, and the writer
says how many once it catches up. uvicorn logs a warning per malformed request head (and per head this service
cuts for its size or its pipeline's depth, `service.http_api.connections`): `RepeatedClientErrors` lets one such
line through per `CLIENT_ERROR_INTERVAL_S`, the next one carrying how many were held back (`held_back`), so a
client opening connection after connection cannot write a line for each.
"""

from __future__ import annotations

import atexit
import collections
import json
import logging
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from service.operations.threads import name_this_thread

LOG_THREAD = "bs-log"
"""The thread that formats and writes log records."""
TICK_S = 0.1
"""How often the writer wakes to write the info-level records that came meanwhile."""
MAX_QUEUED = 10_000
"""Most records waiting for the writer (some 20 s of access lines at 500 requests/s); past it, new ones are
dropped and counted."""
CLIENT_ERROR_INTERVAL_S = 10.0
"""At most one line per this many seconds for each of uvicorn's warnings about a client's request
(`CLIENT_ERRORS`)."""
CLIENT_ERRORS = frozenset({"Invalid HTTP request received.", "Unsupported upgrade request."})
"""uvicorn's warnings (logger `uvicorn.error`) about what one client sent: a malformed or cut head, an upgrade to a
protocol the server does not speak."""

_STANDARD = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__)
_STANDARD |= {"message", "asctime", "taskName", "color_message"}
_ACCESS_LOGGER = logging.getLogger("service.access")


class JsonFormatter(logging.Formatter):
    """Render a record as a JSON line; extra attributes become fields."""

    def format(self, record: logging.LogRecord) -> str:
        payload: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                payload[key] = value if isinstance(value, str | int | float | bool | type(None)) else str(value)
        if record.exc_info:
            payload["exception"] = self.formatException(record.exc_info)
        return json.dumps(payload, ensure_ascii=False)


class _Access(tuple[float, str, str, int, float, str]):
    """An access line's values (time, method, route, status, ms, request id); its record is made when written."""

    __slots__ = ()

    def record(self) -> logging.LogRecord:
        created, method, route, status, ms, request_id = self
        extra = {"method": method, "route": route, "status": status, "ms": ms, "request_id": request_id}
        record = _ACCESS_LOGGER.makeRecord(_ACCESS_LOGGER.name, logging.INFO, "", 0, "request", (), None, extra=extra)
        record.created, record.msecs = created, (created - int(created)) * 1000
        return record


class RepeatedClientErrors(logging.Filter):
    """Lets one record of each message in `messages` through per `interval_s`; the next one let through says how
    many were held back since the last (in its message, and as `held_back`). Records of other messages pass. Its
    state is one entry per message of the fixed set."""

    def __init__(
        self,
        messages: frozenset[str] = CLIENT_ERRORS,
        interval_s: float = CLIENT_ERROR_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self.messages = messages
        self.interval_s = interval_s
        self._clock = clock
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.msg
        if not isinstance(message, str) or message not in self.messages:
            return True
        now = self._clock()
        last = self._last.get(message)
        if last is not None and now - last < self.interval_s:
            self._held[message] = self._held.get(message, 0) + 1
            return False
        self._last[message] = now
        held = self._held.pop(message, 0)
        if held:
            record.held_back = held
            record.msg = f"{message} ({held} more since the last such line, not logged)"
        return True


class _Writer:
    """The `bs-log` thread: writes the queued records through `handler` every `TICK_S`, or at once when woken.
    At most `MAX_QUEUED` wait; past that, records are dropped, and counted in a warning written once there is room."""

    def __init__(self, handler: logging.Handler) -> None:
        self.handler = handler
        self._records: collections.deque[logging.LogRecord | _Access] = collections.deque()
        self._dropped = 0
        self._drop_lock = threading.Lock()
        """Held to count a dropped record and to take the count: the rare path, so the common one takes no lock."""
        self._wake = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=LOG_THREAD, daemon=True)
        self._thread.start()

    def put(self, record: logging.LogRecord | _Access, urgent: bool = False) -> None:
        if len(self._records) >= MAX_QUEUED:
            with self._drop_lock:
                self._dropped += 1
            return
        self._records.append(record)  # atomic: no lock, nothing woken
        if urgent:
            self._wake.set()

    def stop(self) -> None:
        """Write what is queued and end the thread."""
        self._stopping = True
        self._wake.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        name_this_thread(LOG_THREAD)
        while not self._stopping:
            self._wake.wait(TICK_S)
            self._wake.clear()
            self._write()
        self._write()

    def _write(self) -> None:
        while self._records:
            item = self._records.popleft()
            self.handler.handle(item.record() if isinstance(item, _Access) else item)
        with self._drop_lock:
            dropped, self._dropped = self._dropped, 0
        if dropped:
            message = f"{dropped} log records dropped: more than {MAX_QUEUED} waited for the log output"
            self.handler.handle(
                logging.getLogger(__name__).makeRecord(__name__, logging.WARNING, "", 0, message, (), None)
            )


class _QueueingHandler(logging.Handler):
    """The root logger's handler: hands each record to the writer. The message's arguments are merged now (they
    may change later); the formatting and the write happen on the writer's thread."""

    def __init__(self, writer: _Writer) -> None:
        super().__init__()
        self.writer = writer

    def emit(self, record: logging.LogRecord) -> None:
        if record.args:
            record.msg, record.args = record.getMessage(), None
        self.writer.put(record, urgent=record.levelno >= logging.WARNING)


_writer: _Writer | None = None


def log_request(method: str, route: str, status: int, ms: float, request_id: str) -> None:
    """One request's access line (logger `service.access`, message `request`, at info): an append on the calling
    thread once `configure_logging` has run."""
    if not _ACCESS_LOGGER.isEnabledFor(logging.INFO):
        return
    access = _Access((time.time(), method, route, status, ms, request_id))
    if _writer is not None:
        _writer.put(access)
    else:  # logging not configured by us: the record goes through the logger's own handlers now
        _ACCESS_LOGGER.handle(access.record())


def _stop_writer() -> None:
    global _writer
    if _writer is not None:
        _writer.stop()  # writes what is still queued
        _writer = None


def configure_logging(level: str = "info", json_lines: bool = True) -> None:
    """Send the service's and uvicorn's logs to stderr in one format, written by the `bs-log` thread."""
    global _writer
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        JsonFormatter() if json_lines else logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    )
    _stop_writer()
    _writer = _Writer(handler)
    atexit.register(_stop_writer)
    root = logging.getLogger()
    for existing in list(root.handlers):
        root.removeHandler(existing)
    root.addHandler(_QueueingHandler(_writer))
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True
    client_errors = logging.getLogger("uvicorn.error")
    for old in [f for f in client_errors.filters if isinstance(f, RepeatedClientErrors)]:
        client_errors.removeFilter(old)
    client_errors.addFilter(RepeatedClientErrors())
    logging.getLogger("uvicorn.access").setLevel(logging.WARNING)  # our middleware logs requests
