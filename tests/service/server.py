"""Start the real server (`bertserve serve`) in a subprocess on free ports, with torch made unimportable."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]

# `sys.modules['torch'] = None` makes any `import torch` raise ImportError: the server must not need it.
LAUNCH = (
    "import sys; sys.modules['torch'] = None; "
    "from bertserve.cli import main; sys.argv = ['bertserve', 'serve', *sys.argv[1:]]; main()"
)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ServerProcess:
    """A running `bertserve serve` with its ports, log file and process handle."""

    def __init__(
        self,
        models: list[Path] | list[str],
        log_path: Path,
        env: dict[str, str] | None = None,
        *args: str,
        launch: str = LAUNCH,
    ):
        """`launch`: the Python code that starts the server (LAUNCH; a test may prefix it with a fault to inject)."""
        self.http_port = free_port()
        self.grpc_port = free_port()
        self.log_path = log_path
        # no drain after SIGTERM unless a test asks for one: nothing balances load onto these servers
        environment = {**os.environ, "BERTSERVE_LOG_LEVEL": "warning", "BERTSERVE_DRAIN_S": "0", **(env or {})}
        command = [
            sys.executable,
            "-c",
            launch,
            "--models",
            ",".join(str(m) for m in models),
            "--host",
            "127.0.0.1",
            "--http-port",
            str(self.http_port),
            "--grpc-port",
            str(self.grpc_port),
            *args,
        ]
        self._log = open(log_path, "w")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(command, cwd=REPO, env=environment, stdout=self._log, stderr=subprocess.STDOUT)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def grpc_target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def wait_live(self, timeout: float = 60.0) -> None:
        self._wait("/health/live", timeout)

    def wait_ready(self, timeout: float = 90.0) -> None:
        self._wait("/health/ready", timeout)

    def _wait(self, path: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited with {self.process.returncode}:\n{self.logs()}")
            try:
                if httpx.get(self.url + path, timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise TimeoutError(f"server not {path} after {timeout}s:\n{self.logs()}")

    def logs(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text()

    def terminate(self, timeout: float = 30.0) -> int:
        """SIGTERM and wait; returns the exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()
        return int(self.process.returncode)


@contextmanager
def serving(
    models: list[Path] | list[str],
    log_path: Path,
    env: dict[str, str] | None = None,
    *args: str,
    ready_timeout: float = 90.0,
    clean_exit: bool = False,
) -> Iterator[ServerProcess]:
    """A `ServerProcess` ready inside the block and terminated after it; with `clean_exit`, its exit status after
    SIGTERM must be 0."""
    process = ServerProcess(models, log_path, env, *args)
    try:
        process.wait_ready(ready_timeout)
        yield process
    finally:
        code = process.terminate()
    assert not clean_exit or code == 0, f"the server exited with {code}:\n{process.logs()}"
