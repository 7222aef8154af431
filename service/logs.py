"""Structured logs: one JSON object per line (time, level, logger, message, and any `extra=` fields).

Configured once by the CLI / `create_app`; uvicorn's own loggers are routed through the same handler so the
whole process speaks one format. Plain text with `log_json=False` (handy in a terminal).

Records are formatted and written on a thread of its own (`bs-log`), which wakes every `TICK_S` to write what came
meanwhile: the event loop, which logs one access line per request, only appends to a deque, without waking another
thread per line (a wake-up per line was some 5% of the event loop's time under load); a warning or worse wakes the
writer at once. An access line (`log_request`) becomes a record on the writer's thread, from the few values the
request gives. The writer is stopped (what is queued written) at interpreter exit.
"""

from __future__ import annotations

import atexit
import collections
import json
import logging
import sys
import threading
import time
from typing import Any

from service.worker_threads import name_this_thread

LOG_THREAD = "bs-log"
"""The thread that formats and writes log records."""
TICK_S = 0.1
"""How often the writer wakes to write the info-level records that came meanwhile."""

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


class _Writer:
    """The `bs-log` thread: writes the queued records through `handler` every `TICK_S`, or at once when woken."""

    def __init__(self, handler: logging.Handler) -> None:
        self.handler = handler
        self._records: collections.deque[logging.LogRecord | _Access] = collections.deque()
        self._wake = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=LOG_THREAD, daemon=True)
        self._thread.start()

    def put(self, record: logging.LogRecord | _Access, urgent: bool = False) -> None:
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
    logging.getLogger("uvicorn.access").setLevel(logging.WARNING)  # our middleware logs requests
