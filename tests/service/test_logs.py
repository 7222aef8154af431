"""Structured logs: JSON lines with the `extra=` fields, formatted and written off the calling thread."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator

import pytest

from service import logs


@pytest.fixture()
def stderr() -> Iterator[None]:
    """The root logger as it was, once the test has configured it."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    logs._stop_listener()
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
    logs._stop_listener()  # flushes the queue

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
    logs._stop_listener()
    line = json.loads(capsys.readouterr().err.splitlines()[0])
    assert "ValueError: boom" in line["exception"]
