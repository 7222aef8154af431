"""Structured logs: JSON lines with the `extra=` fields, formatted and written off the calling thread, through a
bounded queue."""

from __future__ import annotations

import calendar
import json
import logging
import threading
import time
from collections.abc import Iterator

import pytest

from service.operations import logs


@pytest.fixture()
def stderr() -> Iterator[None]:
    """The root logger as it was, once the test has configured it."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    logs._stop_writer()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)


def test_a_record_becomes_one_json_line_written_by_the_log_thread(
    stderr: None, capsys: pytest.CaptureFixture[str]
) -> None:
    writers: list[str] = []

    class Spy(logs.JsonFormatter):
        def format(self, record: logging.LogRecord) -> str:
            writers.append(threading.current_thread().name)
            return super().format(record)

    logs.configure_logging("info", json_lines=True)
    assert logs._listener is not None
    logs._listener.handlers[0].setFormatter(Spy())
    values = {"n": 1}
    logging.getLogger("service.http").info("seen %(n)s", values, extra={"route": "/classify", "status": 200})
    values["n"] = 2  # the message is what the caller meant when it logged
    logging.getLogger("service.http").debug("below the level")
    logs._stop_writer()  # writes what is queued

    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert len(lines) == 1
    assert lines[0]["message"] == "seen 1"
    assert (lines[0]["route"], lines[0]["status"], lines[0]["level"]) == ("/classify", 200, "info")
    assert writers and threading.current_thread().name not in writers


def test_exceptions_keep_their_traceback(stderr: None, capsys: pytest.CaptureFixture[str]) -> None:
    logs.configure_logging("info", json_lines=True)
    try:
        raise ValueError("boom")
    except ValueError:
        logging.getLogger("service").exception("batch failed")
    logs._stop_writer()
    line = json.loads(capsys.readouterr().err.splitlines()[0])
    assert "ValueError: boom" in line["exception"]


def test_an_access_line_is_written_while_serving_with_its_request_values(
    stderr: None, capsys: pytest.CaptureFixture[str]
) -> None:
    logs.configure_logging("info", json_lines=True)
    before = time.time()
    logs.log_request("POST", "/classify", 200, 1.25, "req-1")
    written: list[str] = []
    deadline = time.monotonic() + 5
    while not written and time.monotonic() < deadline:  # written by the listener as it comes, not by a stop
        time.sleep(0.01)
        written = capsys.readouterr().err.splitlines()
    logs._stop_writer()
    assert len(written) == 1, written
    line = json.loads(written[0])
    expected = {"level": "info", "logger": "service.access", "message": "request", "method": "POST"}
    assert {key: line[key] for key in expected} == expected
    assert (line["route"], line["status"], line["ms"], line["request_id"]) == ("/classify", 200, 1.25, "req-1")
    stamp = time.strptime(line["ts"][:19], "%Y-%m-%dT%H:%M:%S")
    assert abs(calendar.timegm(stamp) + int(line["ts"][20:23]) / 1000 - before) < 1  # when it was logged


def test_access_lines_below_the_level_are_not_written(stderr: None, capsys: pytest.CaptureFixture[str]) -> None:
    logs.configure_logging("warning", json_lines=True)
    logs.log_request("POST", "/classify", 200, 1.0, "req-2")
    logging.getLogger("service").warning("queue full")
    logs._stop_writer()
    err = capsys.readouterr().err
    assert [json.loads(line)["message"] for line in err.splitlines()] == ["queue full"]


def test_records_past_the_queue_bound_are_dropped_and_counted(
    stderr: None, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An output slower than the requests (here a handler held on its first record) cannot grow the queue past
    MAX_QUEUED; the next record that fits is followed by a warning saying how many were dropped."""
    monkeypatch.setattr(logs, "MAX_QUEUED", 20)
    logs.configure_logging("info", json_lines=True)
    assert logs._listener is not None
    entered, release = threading.Event(), threading.Event()
    handler = logs._listener.handlers[0]
    original = handler.handle

    def held(record: logging.LogRecord) -> bool:
        entered.set()
        release.wait(10)
        return original(record)

    monkeypatch.setattr(handler, "handle", held)
    logging.getLogger("service").warning("first")
    assert entered.wait(5)  # the listener holds "first"; what follows queues behind it
    for index in range(20 + 35):
        logs.log_request("POST", "/classify", 200, 1.0, f"req-{index}")
    assert logs._listener.queue.qsize() == 20  # type: ignore[attr-defined]
    release.set()
    deadline = time.monotonic() + 5
    while logs._listener.queue.qsize() and time.monotonic() < deadline:  # type: ignore[attr-defined]
        time.sleep(0.01)
    logs.log_request("POST", "/classify", 200, 1.0, "after")
    logs._stop_writer()
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert [line["message"] for line in lines[:2]] == ["first", "request"]
    assert [line["request_id"] for line in lines[1:21]] == [f"req-{index}" for index in range(20)]
    assert len(lines) == 23
    assert lines[21]["request_id"] == "after"
    assert lines[22]["level"] == "warning"
    assert lines[22]["message"].startswith("35 log records dropped")


def test_records_dropped_at_the_end_are_counted_when_the_logs_stop(
    stderr: None, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(logs, "MAX_QUEUED", 3)
    logs.configure_logging("info", json_lines=True)
    assert logs._listener is not None
    release = threading.Event()
    handler = logs._listener.handlers[0]
    original = handler.handle
    monkeypatch.setattr(handler, "handle", lambda record: release.wait(10) and original(record))
    for index in range(10):
        logs.log_request("POST", "/classify", 200, 1.0, f"req-{index}")
    release.set()
    logs._stop_writer()
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert lines[-1]["message"].startswith(f"{10 - len(lines) + 1} log records dropped"), lines
    assert 4 <= len(lines) <= 5  # 3 queued, maybe 1 taken by the listener before the rest; then the count


def test_a_client_error_is_logged_once_per_interval_with_the_count_held_back() -> None:
    now = [100.0]
    client_errors = logs.RepeatedClientErrors(interval_s=10.0, clock=lambda: now[0])
    logger = logging.getLogger("test.client_errors")

    def record(message: str) -> logging.LogRecord:
        return logger.makeRecord(logger.name, logging.WARNING, "", 0, message, (), None)

    passed = []
    last_passed = None
    for second in range(25):  # one malformed request a second for 25 s, and other warnings between them
        now[0] = 100.0 + second
        line = record("Invalid HTTP request received.")
        if client_errors.filter(line):
            passed.append((second, getattr(line, "held_back", 0)))
            last_passed = line
        assert client_errors.filter(record("queue full"))
    assert passed == [(0, 0), (10, 9), (20, 9)]
    assert last_passed is not None
    assert last_passed.getMessage() == "Invalid HTTP request received. (9 more since the last such line, not logged)"
