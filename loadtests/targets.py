"""The servers a run sends load to: our service (started with `bertserve serve`, batching on or off), the naive
peer (`python -m loadtests.peers.naive_server`), the triton peer (`python -m loadtests.peers.triton_peer`, which starts
Triton in its own venv), or a service already running at `--host` / `--grpc-host`.

Servers started here listen on 127.0.0.1 on free ports, log to the run folder, and are stopped with SIGTERM
(then SIGKILL after a grace period). Readiness is polled over the wire: `GET /health/ready` (ours),
`GET /health` (naive), the standard gRPC health service for a gRPC-only external target.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from loadtests.endpoints import Mix, format_mix

REPO = Path(__file__).resolve().parents[1]
LOOPBACK = "127.0.0.1"
TRITON_PYTHON = REPO / ".venv-triton" / "bin" / "python"
"""The Triton venv's interpreter (`make triton-venv`), which runs the triton peer's Triton side."""


class TargetStartError(RuntimeError):
    """A server the runner started did not become ready; the message ends with its log."""


@dataclass
class Target:
    """One system under test in a run."""

    label: str
    """`naive`, `triton`, `ours-no-batching`, `ours-batching` or `external`."""
    kind: str
    """`naive`, `triton`, `ours` or `external`."""
    mix: Mix
    batching: bool | None = None
    command: list[str] = field(default_factory=list)
    """How the runner starts it (empty for an external target)."""
    http_url: str | None = None
    grpc_target: str | None = None
    ready_path: str = "/health/ready"

    def summary_entry(self) -> dict[str, Any]:
        """The start of its entry in a run's summary.json: what it is and how it was reached (`ready_s`, the
        seconds a started server took to become ready, is filled in by the runner)."""
        return {
            "kind": self.kind,
            "batching": self.batching,
            "mix": format_mix(self.mix),
            "command": self.command,
            "http_url": self.http_url,
            "grpc_target": self.grpc_target,
            "ready_s": None,
        }


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def ours_command(
    models: list[str], batching: bool, request_timeout_s: float, extra: list[str], bundles_dir: Path | None
) -> tuple[list[str], str, str]:
    """(`bertserve serve ...` argv, REST URL, gRPC target) on free loopback ports."""
    http_port, grpc_port = free_port(), free_port()
    command = [sys.executable, "-m", "bertserve", "serve", "--models", ",".join(models), "--host", LOOPBACK]
    command += ["--http-port", str(http_port), "--grpc-port", str(grpc_port)]
    command += ["--batching" if batching else "--no-batching", "--request-timeout-s", str(request_timeout_s)]
    if bundles_dir is not None:
        command += ["--bundles-dir", str(bundles_dir)]
    return [*command, *extra], f"http://{LOOPBACK}:{http_port}", f"{LOOPBACK}:{grpc_port}"


PEER_MODULES = {"naive": "loadtests.peers.naive_server", "triton": "loadtests.peers.triton_peer"}


def peer_command(peer: str, models: dict[str, str]) -> tuple[list[str], str]:
    """(`python -m <the peer's module> ...` argv, REST URL) on a free loopback port; `models`: task -> the model
    folder or name the peer loads (the naive peer: a checkpoint; the triton peer: a serving bundle)."""
    port = free_port()
    command = [sys.executable, "-m", PEER_MODULES[peer], "--host", LOOPBACK, "--port", str(port)]
    for task_name, model in models.items():
        command += ["--model", f"{task_name}={model}"]
    return command, f"http://{LOOPBACK}:{port}"


def triton_venv_problem(python: Path = TRITON_PYTHON) -> str | None:
    """Why the triton peer cannot start here (None when its venv is in place)."""
    if not python.is_file():
        return f"no Triton venv at {python.parent.parent} (build it with `make triton-venv`)"
    return None


def http_ready(url: str, timeout_s: float = 2.0) -> tuple[bool, str]:
    """(200?, what happened) for a GET of `url`."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return response.status == 200, f"HTTP {response.status}"
    except urllib.error.HTTPError as error:
        return False, f"HTTP {error.code}"
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        return False, str(reason)


def grpc_serving(target: str, timeout_s: float = 3.0) -> tuple[bool, str]:
    """(SERVING?, what happened) from the standard grpc.health.v1 service."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(target) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=timeout_s)
        except grpc.RpcError as error:
            return False, f"{error.code().name}: {error.details()}"
    return reply.status == health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.ServingStatus.Name(
        reply.status
    )


def check_external(target: Target) -> None:
    """ValueError (before any load) when an external target does not answer its health checks."""
    if target.http_url is not None:
        ok, what = http_ready(target.http_url + "/health/ready")
        if not ok:
            raise ValueError(
                f"--host {target.http_url} is not ready (GET /health/ready: {what}): start the service first"
            )
    if target.grpc_target is not None:
        ok, what = grpc_serving(target.grpc_target)
        if not ok:
            raise ValueError(f"--grpc-host {target.grpc_target} is not serving (gRPC health: {what})")


def _stat_fields(pid: int | str) -> list[str]:
    """The fields of /proc/<pid>/stat after the command name (the state is field 0); OSError when gone."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds process `pid` has used (Linux /proc; None when it is gone or elsewhere)."""
    try:
        fields = _stat_fields(pid)
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _process_stats() -> dict[int, tuple[int, float]]:
    """pid -> (parent pid, user + system CPU seconds) of every process /proc shows."""
    ticks = os.sysconf("SC_CLK_TCK")
    stats: dict[int, tuple[int, float]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = _stat_fields(entry.name)
        except (OSError, IndexError):
            continue  # ended meanwhile
        stats[int(entry.name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / ticks)  # ppid, utime, stime
    return stats


class RunningServer:
    """A server process started for one target; a context manager that always stops it."""

    def __init__(self, target: Target, log_path: Path) -> None:
        self.target = target
        self.log_path = log_path
        self._log: IO[str] | None = None
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> RunningServer:
        self._log = open(self.log_path, "w")
        # no drain on stop: the runner is this server's only client, and it has stopped sending
        environment = {
            **os.environ,
            "BERTSERVE_LOG_LEVEL": "warning",
            "BERTSERVE_DRAIN_S": "0",
            "PYTHONPATH": str(REPO),
        }
        self.process = subprocess.Popen(
            self.target.command, cwd=REPO, env=environment, stdout=self._log, stderr=subprocess.STDOUT
        )
        return self

    def wait_ready(self, timeout_s: float) -> float:
        """Seconds until the health check answered 200; TargetStartError if the process died or time ran out."""
        assert self.process is not None and self.target.http_url is not None
        start = time.monotonic()
        what = "no answer"
        while time.monotonic() - start < timeout_s:
            if self.process.poll() is not None:
                raise TargetStartError(
                    f"{self.target.label} exited with status {self.process.returncode} before it was ready:\n"
                    f"{self.log_tail()}"
                )
            ok, what = http_ready(self.target.http_url + self.target.ready_path, timeout_s=1.0)
            if ok:
                return time.monotonic() - start
            time.sleep(0.25)
        raise TargetStartError(f"{self.target.label} not ready after {timeout_s:.0f}s ({what}):\n{self.log_tail()}")

    def cpu_seconds(self) -> float | None:
        """User + system CPU seconds the server process and its live descendants have used so far (Linux
        /proc; None elsewhere): the triton peer's work runs in child processes."""
        if self.process is None:
            return None
        stats = _process_stats()
        if self.process.pid not in stats:
            return None
        total, todo = 0.0, [self.process.pid]
        while todo:
            pid = todo.pop()
            total += stats[pid][1]
            todo += [child for child, (parent, _) in stats.items() if parent == pid]
        return total

    def log_tail(self, lines: int = 15) -> str:
        if self._log is not None:
            self._log.flush()
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def __exit__(self, *_: object) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self._log is not None:
            self._log.close()
