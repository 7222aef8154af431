"""Three api replicas behind HAProxy on a real Docker engine (docker-compose.scale.yml), under load.

Run by `make scale-test` (and so by CI, after `make compose-test`, whose api image it reuses); not part of
`make test`. Scenarios, in order, on one stack:
1. share: each replica serves a third (±20%) of a steady locust load (REST and gRPC), and of the calls of one gRPC
   channel, counted by each replica's own /metrics; Prometheus scrapes all three and records the queue series.
2. kill: SIGKILL of one replica under load. Failed calls are at most those in flight on it while the kill command
   ran (the process dies at some moment in it), none of the calls sent after; HAProxy marks it down within its
   check interval x fall (+ the check timeout); `docker compose up` brings it back and it serves again.
3. rolling restart: each replica in turn stopped with SIGTERM (exit 0 after its drain), started, healthy and back
   in the balancer before the next: no failed call, no connection reset.
Load is sent only to the balancer's ports on 127.0.0.1; each replica's /metrics is read inside its container.
Figures go to stdout (`-s`) and to $SCALE_TEST_RESULTS (JSON) when set.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from service.grpc_api.stubs import bert_pb2 as pb
from service.grpc_api.stubs import bert_pb2_grpc as pb_grpc
from tests.containers.test_compose_stack import DOCKER_TOOLS, _engine
from tests.service.server import REPO, free_port

pytestmark = [pytest.mark.containers, pytest.mark.scale]

PROJECT = "bertserve-scale-test"
FILES = ("-f", "docker-compose.yml", "-f", "docker-compose.scale.yml")
REPLICAS = 3
SHARE_TOLERANCE = 0.2
HAPROXY_CFG = (REPO / "docker" / "haproxy" / "haproxy.cfg").read_text()
CHECK_INTERVAL_S = float(re.search(r"default-server .*\binter (\d+)s", HAPROXY_CFG).group(1))  # type: ignore[union-attr]
FALL = int(re.search(r"default-server .*\bfall (\d+)", HAPROXY_CFG).group(1))  # type: ignore[union-attr]
CHECK_TIMEOUT_S = float(re.search(r"timeout check (\d+)s", HAPROXY_CFG).group(1))  # type: ignore[union-attr]
MARK_DOWN_S = CHECK_INTERVAL_S * FALL + CHECK_TIMEOUT_S
"""How long HAProxy may take to mark a dead replica down: `fall` failed checks, `inter` apart, each up to the
check timeout."""
SENTENCES = (
    "a gentle, funny and moving film",
    "dull, far too long and badly acted",
    "the best thing I have seen this year",
    "a tedious mess",
    "an honest, warm story told with care",
    "nothing works in this film",
)
ROUTES = ("/classify", "/bert.v1.Classifier/Classify")
"""The routes the load calls, as each replica's bertserve_requests_total labels them."""
RESULTS: dict[str, Any] = {}


# ---- the stack ---------------------------------------------------------------------------------------------
@dataclass
class Stack:
    env: dict[str, str]
    http: str
    grpc_target: str
    stats: str
    prometheus: str
    timings: dict[str, float] = field(default_factory=dict)

    def compose(self, *args: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess[str]:
        command = ["docker", "compose", "-p", PROJECT, *FILES, *args]
        result = subprocess.run(command, cwd=REPO, env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and result.returncode != 0:
            raise AssertionError(f"{' '.join(command)} exited {result.returncode}:\n{result.stderr[-4000:]}")
        return result

    def timed(self, name: str, *args: str, timeout: float = 600) -> None:
        start = time.monotonic()
        self.compose(*args, timeout=timeout)
        self.timings[name] = round(time.monotonic() - start, 1)
        print(f"[scale-test] {name}: {self.timings[name]} s")

    def replicas(self) -> list[str]:
        """The api containers' names, in order."""
        ids = self.compose("ps", "-a", "-q", "api").stdout.split()
        return sorted(docker("inspect", "-f", "{{.Name}}", *ids).split()) if ids else []

    def servers(self) -> dict[tuple[str, str], tuple[str, str]]:
        """(backend, server slot) -> (status, address) of HAProxy's api servers that have an address."""
        table = httpx.get(self.stats + "/stats;csv", timeout=5).text.lstrip("# ")
        found = {}
        for row in csv.DictReader(io.StringIO(table)):
            if row["pxname"].startswith("api_") and row["svname"].startswith("api") and row["addr"]:
                found[(row["pxname"], row["svname"])] = (row["status"], row["addr"].rsplit(":", 1)[0])
        return found

    def slots_of(self, container: str) -> dict[str, str]:
        """backend -> the server slot HAProxy gave this replica's address."""
        address = ip_of(container)
        return {backend: slot for (backend, slot), (_, addr) in self.servers().items() if addr == address}

    def wait_balanced(self, timeout: float = 180) -> float:
        """Seconds until both backends have every running replica UP (HAProxy's checks on /health/ready passed)
        and nothing else."""
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            running = sorted(ip_of(name) for name in self.replicas() if is_running(name))
            state = self.servers()
            up = {b: sorted(addr for (backend, _), (status, addr) in state.items() if backend == b and status == "UP")
                  for b in ("api_rest", "api_grpc")}  # fmt: skip
            if len(running) == REPLICAS and up["api_rest"] == up["api_grpc"] == running:
                return time.monotonic() - start
            time.sleep(0.2)
        raise AssertionError(f"HAProxy never had the {REPLICAS} replicas up in each backend: {self.servers()}")

    def balancer_log(self) -> list[LogLine]:
        text = self.compose("logs", "--no-color", "--no-log-prefix", "balancer").stdout
        return [line for line in map(LogLine.parse, text.splitlines()) if line is not None]

    def balancer_events(self, since: float, limit: int = 16) -> list[str]:
        """HAProxy's server state changes (DNS, checks) logged after the first request that ended at `since` or
        later: they carry no time of their own, their place among the request lines dates them."""
        text = self.compose("logs", "--no-color", "--no-log-prefix", "balancer").stdout
        events: list[str] = []
        reached = False
        for raw in text.splitlines():
            line = LogLine.parse(raw)
            if line is not None:
                reached = reached or line.end >= since
            elif reached and raw.strip() and not raw.startswith("["):  # the "[WARNING] (8) :" copies repeat them
                events.append(raw.strip())
        return events[:limit]


@dataclass(frozen=True)
class LogLine:
    """One request in HAProxy's log (the log-format of docker/haproxy/haproxy.cfg: logged when it ends)."""

    end: float
    backend: str
    server: str
    status: int
    active_s: float
    termination: str
    retries: str

    @property
    def start(self) -> float:
        return self.end - self.active_s

    @classmethod
    def parse(cls, text: str) -> LogLine | None:
        match = re.fullmatch(r"(\d{13}) (api_\w+) (\S+) (-?\d+) (-?\d+) (\S+) (\S+) \S+ \S+", text.strip())
        if match is None:
            return None
        date, backend, server, status, active, termination, retries = match.groups()
        return cls(int(date) / 1000, backend, server, int(status), max(0, int(active)) / 1000, termination, retries)


def docker(*args: str) -> str:
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=True, timeout=120).stdout


def is_running(container: str) -> bool:
    return docker("inspect", "-f", "{{.State.Running}}", container).strip() == "true"


def ip_of(container: str) -> str:
    return docker("inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", container).strip()


def served(container: str) -> dict[str, float]:
    """transport -> requests this replica answered with success, from its own /metrics (read inside it)."""
    probe = "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:8000/metrics').read().decode())"
    text = docker("exec", container, "python", "-c", probe)
    counts = {"http": 0.0, "grpc": 0.0}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sample.labels
            answered = labels.get("status") in ("200", "OK") and labels.get("route") in ROUTES
            if sample.name == "bertserve_requests_total" and answered:
                counts[labels["transport"]] += sample.value
    return counts


STOP_MESSAGES = {"stop signal received": "signal", "drain over": "drain_over", "stopped": "stopped"}
"""Prefixes of the server's log messages of its stop sequence (service/serve.py, the app's lifespan)."""


def stop_sequence(container: str) -> dict[str, float]:
    """Seconds from the stop signal to the end of the drain and to the lifespan's last line, from the server's
    JSON log of its last run."""
    text = subprocess.run(["docker", "logs", container], capture_output=True, text=True, timeout=60)
    seen: dict[str, float] = {}
    for line in (text.stdout + text.stderr).splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        message = str(entry.get("message", "")) if isinstance(entry, dict) else ""
        key = next((name for prefix, name in STOP_MESSAGES.items() if message.startswith(prefix)), None)
        if key is not None:
            seen[key] = time.mktime(time.strptime(entry["ts"][:19], "%Y-%m-%dT%H:%M:%S")) + float(entry["ts"][19:23])
    if "signal" not in seen:
        return {}
    return {f"{key}_after_signal_s": round(seen[key] - seen["signal"], 2) for key in seen if key != "signal"}


def record(name: str, figures: dict[str, Any]) -> None:
    RESULTS[name] = figures
    print(f"[scale-test] {name}: {json.dumps(figures)}")
    if os.environ.get("SCALE_TEST_RESULTS"):
        Path(os.environ["SCALE_TEST_RESULTS"]).write_text(json.dumps(RESULTS, indent=2) + "\n")


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    _engine()
    ports = {name: free_port() for name in ("http", "grpc", "stats", "prometheus")}
    env = {
        **os.environ,
        "BERTSERVE_MODELS": "minilm-sst2",
        "BERTSERVE_HTTP_PORT": str(ports["http"]),
        "BERTSERVE_GRPC_PORT": str(ports["grpc"]),
        "BERTSERVE_BALANCER_STATS_PORT": str(ports["stats"]),
        "BERTSERVE_PROMETHEUS_PORT": str(ports["prometheus"]),
    }
    local = "127.0.0.1"
    stack = Stack(
        env,
        f"http://{local}:{ports['http']}",
        f"{local}:{ports['grpc']}",
        f"http://{local}:{ports['stats']}",
        f"http://{local}:{ports['prometheus']}",
    )
    try:
        tag = os.environ.get("BERTSERVE_IMAGE_TAG", "latest")
        image = subprocess.run(["docker", "image", "inspect", f"bertserve-api:{tag}"], capture_output=True)
        if image.returncode != 0:  # make compose-test builds it; alone, scale-test builds it once
            stack.timed("build_api", "build", "api", timeout=3600)
        stack.timed("build_balancer_prometheus", "build", "balancer", "prometheus")
        stack.timed("up_to_healthy", "up", "-d", "--wait", "--no-build", "--scale", f"api={REPLICAS}", timeout=300)
        stack.timings["balanced"] = round(stack.wait_balanced(), 1)
        yield stack
    finally:
        stack.compose("down", "--remove-orphans", check=False, timeout=180)
        print(f"[scale-test] timings {stack.timings}")
        record("timings", stack.timings)
        if os.environ.get("COMPOSE_TEST_KEEP_ENGINE") != "1":
            subprocess.run([str(DOCKER_TOOLS / "down")], capture_output=True, text=True, timeout=300)


# ---- load -------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Call:
    protocol: str
    start: float
    end: float
    error: str | None
    reset: bool


class Load:
    """Closed-loop callers through the balancer: REST users (each its own keep-alive connection) and gRPC users
    that all share one channel (one HTTP/2 connection). Every call is recorded with its wall-clock times."""

    def __init__(self, stack: Stack, rest_users: int, grpc_users: int) -> None:
        self.stack = stack
        self.calls: list[Call] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.channel = grpc.insecure_channel(stack.grpc_target)
        self.threads = [threading.Thread(target=self._rest, args=(i,), daemon=True) for i in range(rest_users)]
        self.threads += [threading.Thread(target=self._grpc, args=(i,), daemon=True) for i in range(grpc_users)]

    def __enter__(self) -> Load:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for thread in self.threads:
            thread.join(timeout=60)
        self.channel.close()

    def in_flight(self, moment: float) -> int:
        with self._lock:
            done = [call for call in self.calls if call.start <= moment < call.end]
        return len(done)

    def _add(self, call: Call) -> None:
        with self._lock:
            self.calls.append(call)

    def _rest(self, index: int) -> None:
        with httpx.Client(base_url=self.stack.http, timeout=30) as client:
            while not self._stop.is_set():
                body = {"inputs": [SENTENCES[(index + len(self.calls)) % len(SENTENCES)]]}
                start = time.time()
                try:
                    response = client.post("/classify", json=body)
                    error = None if response.status_code == 200 else f"HTTP {response.status_code}"
                    reset = False
                except httpx.TransportError as failure:
                    error, reset = f"{type(failure).__name__}: {failure}", True
                self._add(Call("rest", start, time.time(), error, reset))

    def _grpc(self, index: int) -> None:
        classify = pb_grpc.ClassifierStub(self.channel).Classify
        while not self._stop.is_set():
            request = pb.ClassifyRequest(inputs=[pb.TextInput(text=SENTENCES[(index + len(self.calls)) % 6])])
            start = time.time()
            try:
                classify(request, timeout=30)
                error, reset = None, False
            except grpc.RpcError as failure:
                code = failure.code()
                details = str(failure.details())
                error = f"{code.name}: {details}"
                reset = code == grpc.StatusCode.UNAVAILABLE and "reset" in details.lower()
            self._add(Call("grpc", start, time.time(), error, reset))

    def failures(self) -> list[Call]:
        return [call for call in self.calls if call.error is not None]


def shares(before: dict[str, dict[str, float]], after: dict[str, dict[str, float]], transport: str) -> list[float]:
    deltas = [after[name][transport] - before[name][transport] for name in after]
    total = sum(deltas)
    assert total > 0, (before, after)
    return [round(delta / total, 3) for delta in deltas]


def assert_even(found: list[float]) -> None:
    low, high = (1 - SHARE_TOLERANCE) / REPLICAS, (1 + SHARE_TOLERANCE) / REPLICAS
    assert len(found) == REPLICAS and all(low <= share <= high for share in found), (found, low, high)


# ---- the scenarios ------------------------------------------------------------------------------------------
def test_each_replica_serves_a_third_of_a_steady_locust_load(stack: Stack, tmp_path: Path) -> None:
    replicas = stack.replicas()
    before = {name: served(name) for name in replicas}
    command = [
        *(sys.executable, "-m", "bertserve", "loadtest", "--profile", "steady", "--users", "8", "--duration", "25"),
        *("--host", stack.http, "--grpc-host", stack.grpc_target, "--mix", "/classify=1,Classifier.Classify=1"),
        *("--results-dir", str(tmp_path), "--tag", "scale-share"),
    ]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    after = {name: served(name) for name in replicas}
    (summary_path,) = tmp_path.glob("*-steady/summary.json")
    (target,) = json.loads(summary_path.read_text())["targets"].values()
    everything = target["summary"]["endpoints"]["all"]
    figures: dict[str, Any] = {
        "rest": shares(before, after, "http"),
        "grpc": shares(before, after, "grpc"),
        "requests": everything["requests"],
        "ok": everything["ok"],
    }
    record("share_locust", figures)
    assert everything["ok"] == everything["requests"] > 0
    assert_even(figures["rest"])
    assert_even(figures["grpc"])


def test_one_grpc_channel_spreads_over_every_replica(stack: Stack) -> None:
    replicas = stack.replicas()
    before = {name: served(name) for name in replicas}
    with Load(stack, rest_users=0, grpc_users=6) as load:
        time.sleep(12)
    after = {name: served(name) for name in replicas}
    figures: dict[str, Any] = {
        "grpc": shares(before, after, "grpc"),
        "calls": len(load.calls),
        "failed": len(load.failures()),
    }
    record("share_one_channel", figures)
    assert figures["failed"] == 0, load.failures()[:5]
    assert_even(figures["grpc"])


def test_prometheus_scrapes_every_replica_and_records_the_queue_series(stack: Stack) -> None:
    def query(expression: str) -> list[dict[str, Any]]:
        answer = httpx.get(stack.prometheus + "/api/v1/query", params={"query": expression}, timeout=10).json()
        assert answer["status"] == "success", answer
        return list(answer["data"]["result"])

    up = query('up{job="api"} == 1')
    assert sorted(series["metric"]["instance"].split(":")[0] for series in up) == sorted(
        ip_of(name) for name in stack.replicas()
    )
    expected = (  # the rules run every 2 s here; the load of the tests before is inside their 1 m windows
        'model:bertserve_replicas:count{model="minilm-sst2"} == 3',
        'model:bertserve_queue_depth:sum{model="minilm-sst2"} >= 0',
        'model:bertserve_inference_seconds:mean{model="minilm-sst2"} > 0',
        'model:bertserve_queue_over_compute:ratio{model="minilm-sst2"} >= 0',
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not all(query(expression) for expression in expected):
        time.sleep(1)
    assert [expression for expression in expected if not query(expression)] == []


def test_a_killed_replica_fails_only_its_calls_in_flight_and_comes_back(stack: Stack) -> None:
    victim = stack.replicas()[0]
    slots = stack.slots_of(victim)
    assert set(slots) == {"api_rest", "api_grpc"}, slots
    with Load(stack, rest_users=4, grpc_users=4) as load:
        time.sleep(5)
        killed_at = time.time()
        docker("kill", "--signal", "KILL", victim)
        killed_by = time.time()  # the process died between the two: the docker command takes tens of ms
        marked_down_s = None
        while time.time() - killed_at < MARK_DOWN_S + 5:
            state = stack.servers()
            if all(state.get((backend, slot), ("MAINT", ""))[0] != "UP" for backend, slot in slots.items()):
                marked_down_s = time.time() - killed_at
                break
            time.sleep(0.05)
        in_flight_total = load.in_flight(killed_at)
        time.sleep(4)  # calls sent after the kill, while the others carry the load
        back_at = time.time()
        stack.compose("up", "-d", "--no-build", "--scale", f"api={REPLICAS}", timeout=300)
        stack.wait_balanced()
        back_s = time.time() - back_at
        before = served(victim)
        time.sleep(5)
        after = served(victim)
    log = stack.balancer_log()
    on_victim = [
        line
        for line in log
        if line.start <= killed_by
        and line.end > killed_at
        and (line.server == slots.get(line.backend) or line.retries != "0")
    ]
    failed = load.failures()
    failed_after = [call for call in failed if call.start >= killed_by]
    figures = {
        "marked_down_s": None if marked_down_s is None else round(marked_down_s, 2),
        "mark_down_bound_s": MARK_DOWN_S,
        "in_flight_on_victim": len(on_victim),
        "in_flight_all_replicas": in_flight_total,
        "failed": len(failed),
        "failed_sent_after_kill": len(failed_after),
        "retried_by_balancer": sum(1 for line in log if line.start >= killed_at - 1 and line.retries != "0"),
        "calls": len(load.calls),
        "back_in_s": round(back_s, 1),
        "served_after_return": {k: after[k] - before[k] for k in after},
        # every request HAProxy did not end normally, with its start and end relative to the kill
        "abnormal_ends": [
            f"{line.backend}/{line.server} {line.status} {line.termination} retries {line.retries} "
            f"{line.start - killed_at:+.2f}..{line.end - killed_at:+.2f} s"
            for line in log
            if line.termination != "----" and line.end >= killed_at - 1
        ][:10],
        "failed_calls": [
            f"{call.protocol} {call.start - killed_at:+.2f}..{call.end - killed_at:+.2f} s" for call in failed
        ][:5],
        "errors": sorted({call.error or "" for call in failed})[:5],
        "balancer_events": stack.balancer_events(killed_at) if failed_after else [],
    }
    record("kill", figures)
    assert marked_down_s is not None and marked_down_s <= MARK_DOWN_S, figures
    assert len(failed) <= len(on_victim), figures
    assert failed_after == [], figures
    assert after["http"] > before["http"] and after["grpc"] > before["grpc"], figures


def test_a_rolling_restart_loses_no_call_and_resets_no_connection(stack: Stack) -> None:
    steps = []
    with Load(stack, rest_users=4, grpc_users=4) as load:
        time.sleep(3)
        for name in stack.replicas():
            started = time.monotonic()
            docker("stop", "--time", "40", name)  # SIGTERM: drain, refuse, finish in flight, exit
            stopped_s = time.monotonic() - started
            exit_code = docker("inspect", "-f", "{{.State.ExitCode}}", name).strip()
            stop_log = stop_sequence(name)
            docker("start", name)
            stack.wait_balanced()  # its health checks passed: it is ready, and back in both backends
            steps.append({"replica": name, "exit": exit_code, "stop_s": round(stopped_s, 1), **stop_log,
                          "back_s": round(time.monotonic() - started, 1)})  # fmt: skip
        time.sleep(2)
    failed = load.failures()
    log = stack.balancer_log()
    window = [line for line in log if line.start >= load.calls[0].start]
    figures = {
        "steps": steps,
        "calls": len(load.calls),
        "failed": len(failed),
        "resets": sum(1 for call in load.calls if call.reset),
        "retried_by_balancer": sum(1 for line in window if line.retries != "0"),
        "balancer_5xx": sum(1 for line in window if line.status >= 500),
        # HAProxy's termination state of every request that did not end normally ("SD--": the server's side
        # closed during the response), with its backend and server
        "abnormal_ends": sorted(
            f"{line.backend}/{line.server} {line.termination}" for line in window if line.termination != "----"
        )[:10],
        "errors": sorted({call.error or "" for call in failed})[:5],
    }
    record("rolling_restart", figures)
    assert all(step["exit"] == "0" for step in steps), steps
    assert figures["failed"] == 0 and figures["resets"] == 0, figures
