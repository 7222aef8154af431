"""Structured logs: one JSON object per line (time, level, logger, message, and any `extra=` fields).

Configured once by the CLI / `create_app`; uvicorn's own loggers are routed through the same handler so the
whole process speaks one format. Plain text with `log_json=False` (handy in a terminal).

Records are formatted and written off the calling thread, by the standard library's `QueueListener`: the event
loop, which logs one access line per request, only puts a record on a queue, and an output that stalls (a full
pipe) cannot stall the requests. The listener is stopped (what is queued written) at interpreter exit.

What clients can make the server log is bounded twice. At most `MAX_QUEUED` records wait for the listener: past
that (an output slower than the requests), records are dropped and counted, and the count is logged with the next
record there is room for. uvicorn logs a warning per malformed request head (and per head this service cuts for
its size or its pipeline's depth, `service.http_api.connections`): `RepeatedClientErrors` lets one such line
through per `CLIENT_ERROR_INTERVAL_S`, the next one carrying how many were held back (`held_back`), so a client
opening connection after connection cannot write a line for each.
"""

from __future__ import annotations

import atexit
import io
import json
import logging
import logging.handlers
import queue
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TextIO

MAX_QUEUED = 10_000
"""Most records waiting for the listener (some 20 s of access lines at 500 requests/s); past it, new ones are
dropped and counted."""
STOP_TIMEOUT_S = 10.0
"""Most seconds a stop waits for the queued records to be written."""
CLIENT_ERROR_INTERVAL_S = 10.0
"""At most one line per this many seconds for each of uvicorn's warnings about a client's request
(`CLIENT_ERRORS`)."""
CLIENT_ERRORS = frozenset({"Invalid HTTP request received.", "Unsupported upgrade request."})
"""uvicorn's warnings (logger `uvicorn.error`) about what one client sent: a malformed or cut head, an upgrade to a
protocol the server does not speak."""

BATCH_INTERVAL_S = 0.05
"""The listener writes what waits at most this often: one write of many lines instead of one per line."""

Records = queue.SimpleQueue[logging.LogRecord | None]
"""The records waiting for the listener (None: the listener's stop). A SimpleQueue: a put from the event loop is
one call into C, with no Python-level lock and condition."""

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


class _BoundedQueueHandler(logging.handlers.QueueHandler):
    """The root logger's handler: puts each record on the listener's bounded queue. A record that finds the queue
    full is dropped and counted; the count goes on the queue, as a warning, after the next record that fits."""

    def __init__(self, records: Records) -> None:
        super().__init__(records)
        self.dropped = 0
        self._lock = threading.Lock()

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        """The message's arguments merged now (they may change later); the formatting, exception included, is
        the listener's, so that the JSON formatter still sees `extra=` fields and `exc_info`."""
        if record.args:
            record.msg, record.args = record.getMessage(), None
        return record

    def enqueue(self, record: logging.LogRecord) -> None:
        records: Records = self.queue  # type: ignore[assignment]
        if records.qsize() >= MAX_QUEUED:
            with self._lock:
                self.dropped += 1
            return
        records.put(record)
        if self.dropped:
            with self._lock:
                dropped, self.dropped = self.dropped, 0
            if records.qsize() < MAX_QUEUED:
                records.put(_dropped_warning(dropped))
            else:
                with self._lock:
                    self.dropped += dropped


def _dropped_warning(count: int) -> logging.LogRecord:
    message = f"{count} log records dropped: more than {MAX_QUEUED} waited for the log output"
    return logging.getLogger(__name__).makeRecord(__name__, logging.WARNING, "", 0, message, (), None)


class _Batch(io.StringIO):
    """What the listener's handler writes, held until the batch is written to `output` in one call."""

    def __init__(self, output: TextIO) -> None:
        super().__init__()
        self.output = output

    def flush(self) -> None:
        """Nothing: the handler flushes after every record, the batch is written by `write_out`."""

    def write_out(self) -> None:
        text = self.getvalue()
        if text:
            self.seek(0)
            self.truncate()
            self.output.write(text)
            self.output.flush()


class _Listener(logging.handlers.QueueListener):
    """The standard listener, writing what waits in one go, at most every `BATCH_INTERVAL_S`: the standard one
    writes and flushes record by record, a system call each, and takes the interpreter lock from the event loop
    each time, at one access line per request. Its stop waits at most `STOP_TIMEOUT_S` for the output (the
    standard one waits for ever on a stalled output)."""

    def __init__(self, records: Records, handler: logging.Handler, batch: _Batch) -> None:
        super().__init__(records, handler, respect_handler_level=True)
        self.records = records
        self.batch = batch

    def _monitor(self) -> None:
        while True:
            record = self.records.get()
            while record is not None:
                self.handle(record)
                try:
                    record = self.records.get_nowait()
                except queue.Empty:
                    break
            self.batch.write_out()
            if record is None:
                return
            time.sleep(BATCH_INTERVAL_S)

    def stop(self) -> None:
        thread = self._thread
        if thread is None:
            return
        self.records.put(None)  # the listener's sentinel
        thread.join(STOP_TIMEOUT_S)
        self._thread = None


_listener: _Listener | None = None
_queueing: _BoundedQueueHandler | None = None


def log_request(method: str, route: str, status: int, ms: float, request_id: str) -> None:
    """One request's access line (logger `service.access`, message `request`, at info)."""
    if _ACCESS_LOGGER.isEnabledFor(logging.INFO):
        extra = {"method": method, "route": route, "status": status, "ms": ms, "request_id": request_id}
        _ACCESS_LOGGER.info("request", extra=extra)


def _stop_writer() -> None:
    """Write what is queued (and the count of records dropped since the last that fitted), end the listener."""
    global _listener, _queueing
    if _listener is not None:
        _listener.stop()
        if _queueing is not None and _queueing.dropped:
            for handler in _listener.handlers:
                handler.handle(_dropped_warning(_queueing.dropped))
            _listener.batch.write_out()
        _listener = _queueing = None


def configure_logging(level: str = "info", json_lines: bool = True) -> None:
    """Send the service's and uvicorn's logs to stderr in one format, written by the listener's thread."""
    global _listener, _queueing
    batch = _Batch(sys.stderr)
    handler = logging.StreamHandler(batch)
    handler.setFormatter(
        JsonFormatter() if json_lines else logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    )
    _stop_writer()
    records: Records = queue.SimpleQueue()
    _queueing = _BoundedQueueHandler(records)
    _listener = _Listener(records, handler, batch)
    _listener.start()
    atexit.register(_stop_writer)
    root = logging.getLogger()
    for existing in list(root.handlers):
        root.removeHandler(existing)
    root.addHandler(_queueing)
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
