"""The whole server (`service.serve.Server`: engine, REST and gRPC) in this process, on its own event loop in a
thread, for tests that look inside it while real clients talk to it over its ports."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx

from service.serve import Server
from service.settings import ServiceSettings


@contextmanager
def running(settings: ServiceSettings, ready_timeout_s: float = 120.0) -> Iterator[Server]:
    """`settings` served until the block ends (then stopped as by a stop signal); yields once ready."""
    server = Server(settings)
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["failure"] = asyncio.run(server.run(handle_signals=False))
        except BaseException as error:  # surfaced by the caller
            outcome["error"] = error

    thread = threading.Thread(target=run, name="server", daemon=True)
    thread.start()
    try:
        _wait_ready(server, thread, outcome, ready_timeout_s)
        yield server
    finally:
        server.stop()
        thread.join(timeout=60)
    if "error" in outcome:
        raise outcome["error"]


def _wait_ready(server: Server, thread: threading.Thread, outcome: dict[str, Any], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and thread.is_alive():
        port = server.http_port
        if server.engine.state.ready and port is not None and _ready(port):
            return
        time.sleep(0.05)
    raise RuntimeError(f"the server did not become ready: {outcome or server.engine.state}")


def _ready(port: int) -> bool:
    return httpx.get(f"http://127.0.0.1:{port}/health/ready").status_code == 200
