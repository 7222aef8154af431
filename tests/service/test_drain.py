"""SIGTERM under load with real keep-alive clients: no request ends in a connection reset, on either door.

16 httpx clients (one keep-alive connection pool each) post to /classify and /qa, and 4 gRPC clients call
QA.Extract over one channel each, while the server gets SIGTERM. Every request must end in 200 / OK, a clean
503 / UNAVAILABLE, or a refused connection once the server is gone; a client honours Retry-After on a 503
and stops when the server refuses it, as a client behind a load balancer would.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from service.grpc_api.stubs import bert_pb2 as pb
from service.grpc_api.stubs import bert_pb2_grpc as pb_grpc
from tests.service.server import ServerProcess

DRAIN_S = 2.0
CLIENTS = 16
GRPC_CLIENTS = 4
BODIES = {
    "/classify": {"inputs": ["a gentle, funny and moving film", "dull and far too long"]},
    "/qa": {"question": "Which river?", "context": "Paris lies on the river Seine, in the north of France."},
}


class Tally:
    """Outcomes by kind, with the time of each served request relative to the signal."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts: Counter[str] = Counter()
        self.resets: list[str] = []
        self.signal_at: float | None = None
        self.closing_after_signal = 0
        self.served_after_signal = 0

    def add(self, kind: str, detail: str = "") -> None:
        with self.lock:
            self.counts[kind] += 1
            if kind == "reset":
                self.resets.append(detail)


def http_client(url: str, path: str, tally: Tally, stop: threading.Event) -> None:
    with httpx.Client(base_url=url, timeout=30) as client:
        while not stop.is_set():  # until refused (or the test's own deadline)
            sent = time.monotonic()
            try:
                response = client.post(path, json=BODIES[path])
            except httpx.ConnectError:
                tally.add("refused")
                return
            except httpx.TransportError as error:  # ReadError, RemoteProtocolError, WriteError: a reset
                tally.add("reset", f"{path}: {type(error).__name__}: {error}")
                continue
            tally.add(str(response.status_code))
            # sent well after the signal (its handling takes a moment): served during the drain
            if tally.signal_at is not None and sent > tally.signal_at + 0.5 and response.status_code == 200:
                with tally.lock:
                    tally.served_after_signal += 1
                    tally.closing_after_signal += response.headers.get("connection") == "close"
            if response.status_code == 503:
                time.sleep(float(response.headers.get("retry-after", "1")))


def grpc_client(target: str, tally: Tally, stop: threading.Event) -> None:
    request = pb.ExtractRequest(inputs=[pb.QAInput(**BODIES["/qa"])])  # type: ignore[arg-type]
    with grpc.insecure_channel(target) as channel:
        stub = pb_grpc.QAStub(channel)
        while not stop.is_set():
            try:
                stub.Extract(request, timeout=30)
                tally.add("grpc-ok")
            except grpc.RpcError as error:
                code, detail = error.code(), error.details() or ""
                if code == grpc.StatusCode.UNAVAILABLE and tally.signal_at is not None:
                    # refused or turned away after the drain: the server is going; a client goes elsewhere
                    tally.add("grpc-unavailable")
                    return
                since = time.monotonic() - tally.signal_at if tally.signal_at else None
                tally.add("reset", f"gRPC {code.name}: {detail} ({since} s after the signal)")


@pytest.mark.integration
def test_sigterm_under_keep_alive_load_resets_nobody(tiny_bundles: dict[str, Path], tmp_path: Path) -> None:
    env = {"BERTSERVE_DRAIN_S": str(DRAIN_S), "BERTSERVE_LOG_LEVEL": "info", "BERTSERVE_MAX_QUEUE": "100000"}
    server = ServerProcess(list(tiny_bundles.values()), tmp_path / "server.log", env)
    tally, stop = Tally(), threading.Event()
    try:
        server.wait_ready()
        threads = [
            threading.Thread(target=http_client, args=(server.url, path, tally, stop))
            for path in [*BODIES] * (CLIENTS // 2)
        ]
        threads += [
            threading.Thread(target=grpc_client, args=(server.grpc_target, tally, stop)) for _ in range(GRPC_CLIENTS)
        ]
        for thread in threads:
            thread.start()
        time.sleep(1.5)
        tally.signal_at = time.monotonic()
        server.process.send_signal(15)

        # during the drain: unready on both doors, requests still served
        time.sleep(DRAIN_S / 2)
        ready = httpx.get(server.url + "/health/ready", timeout=5)
        assert ready.status_code == 503 and ready.json()["status"] == "shutting_down"
        assert ready.headers["connection"] == "close"
        with grpc.insecure_channel(server.grpc_target) as channel:
            health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
            assert health.status == health_pb2.HealthCheckResponse.NOT_SERVING

        code = server.process.wait(30)
        elapsed = time.monotonic() - tally.signal_at
        for thread in threads:
            thread.join(10)  # each client stops on its own once refused
    finally:
        stop.set()
        server.terminate()
    logs = server.logs()
    print(
        f"drain: {dict(tally.counts)}, {len(tally.resets)} resets, served during the drain {tally.served_after_signal}"
    )
    assert code == 0, logs
    assert tally.resets == [], (tally.resets[:5], tally.counts, logs[-3000:])
    assert set(tally.counts) <= {"200", "503", "refused", "grpc-ok", "grpc-unavailable"}, tally.counts
    assert tally.counts["200"] > 50 and tally.counts["grpc-ok"] > 5, tally.counts
    # served on during the drain, each response asking the client to leave its connection
    assert tally.served_after_signal > 0 and tally.closing_after_signal == tally.served_after_signal, tally.counts
    assert tally.counts["refused"] == CLIENTS, tally.counts  # every HTTP client ended on a refused connection
    assert DRAIN_S <= elapsed < DRAIN_S + 15, elapsed
    assert "stop signal received: draining" in logs and "drain over" in logs and '"stopped"' in logs


@pytest.mark.integration
def test_an_idle_keep_alive_connection_outlives_the_clients_own_expiry(
    tiny_bundles: dict[str, Path], tmp_path: Path
) -> None:
    """The server keeps an idle connection longer than clients do (httpx: 5 s), so a client never sends a
    request on a connection the server is closing at that moment (a reset under load)."""
    server = ServerProcess([tiny_bundles["classify"]], tmp_path / "server.log")
    try:
        server.wait_ready()
        transport = httpx.HTTPTransport(limits=httpx.Limits(keepalive_expiry=60))
        with httpx.Client(base_url=server.url, transport=transport, timeout=30) as client:
            first = client.post("/classify", json=BODIES["/classify"])
            time.sleep(6.0)  # longer than uvicorn's own default keep-alive (5 s)
            second = client.post("/classify", json=BODIES["/classify"])
            # the same connection served both: the server did not close it while it sat idle
            assert first.status_code == second.status_code == 200
            assert second.extensions["network_stream"] is first.extensions["network_stream"]
    finally:
        server.terminate()
