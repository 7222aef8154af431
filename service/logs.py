"""Structured logs: one JSON object per line (time, level, logger, message, and any `extra=` fields).

Configured once by the CLI / `create_app`; uvicorn's own loggers are routed through the same handler so the
whole process speaks one format. Plain text with `log_json=False` (handy in a terminal).

A record is formatted and written on a thread of its own (`bs-log`): the event loop, which logs one access line
per request, only puts the record on a queue. The listener is stopped (the queue flushed) at interpreter exit.
"""

from __future__ import annotations

import atexit
import json
import logging
import logging.handlers
import queue
import sys
import time
from typing import Any

from service.worker_threads import name_this_thread

LOG_THREAD = "bs-log"
"""The thread that formats and writes log records."""

_STANDARD = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__)
_STANDARD |= {"message", "asctime", "taskName", "color_message"}


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


class _DeferredQueueHandler(logging.handlers.QueueHandler):
    """Queue the record itself: the message's arguments are merged now (they may change later), the formatting
    and the write happen on the listener's thread. (`QueueHandler.prepare` would format on the caller's thread.)"""

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        if record.args:
            record.msg, record.args = record.getMessage(), None
        return record


class _NamedListener(logging.handlers.QueueListener):
    def _monitor(self) -> None:
        name_this_thread(LOG_THREAD)
        super()._monitor()  # type: ignore[misc]  # the listener thread's body, not in typeshed


_listener: _NamedListener | None = None


def _stop_listener() -> None:
    global _listener
    if _listener is not None:
        _listener.stop()  # writes what is still queued
        _listener = None


def configure_logging(level: str = "info", json_lines: bool = True) -> None:
    """Send the service's and uvicorn's logs to stderr in one format, written by the `bs-log` thread."""
    global _listener
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        JsonFormatter() if json_lines else logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    )
    _stop_listener()
    records: queue.SimpleQueue[logging.LogRecord] = queue.SimpleQueue()
    _listener = _NamedListener(records, handler)
    _listener.start()
    atexit.register(_stop_listener)
    root = logging.getLogger()
    for existing in list(root.handlers):
        root.removeHandler(existing)
    root.addHandler(_DeferredQueueHandler(records))
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True
    logging.getLogger("uvicorn.access").setLevel(logging.WARNING)  # our middleware logs requests
