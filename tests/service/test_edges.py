"""The server at its edges, against real servers (subprocess, free ports, real HTTP and gRPC clients): work nobody
waits for is dropped, a stop never answers 500, SIGHUP drains like SIGTERM, the API key guards every route but the
probes and is decided before the body is read, a finished request frees its place before its answer, the same
bad input is refused alike over REST and gRPC, and either front door serves without the other."""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from pathlib import Path

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from service.grpc_api.stubs import bert_pb2 as pb
from service.grpc_api.stubs import bert_pb2_grpc as pb_grpc
from tests.service.server import ServerProcess, serving

pytestmark = pytest.mark.integration

LONG_CONTEXT = " ".join(
    f"Sentence {i} says that the old mill by the river was built in {1700 + i}." for i in range(300)
)
"""About 300 windows of the tiny QA model (64 tokens), one window per call."""


def _metric(server: ServerProcess, name: str, labels: str = "") -> float:
    """A Prometheus sample's value from /metrics (0 when absent)."""
    wanted = f"{name}{{{labels}}}" if labels else name
    for line in httpx.get(server.url + "/metrics", timeout=10).text.splitlines():
        if line.startswith(wanted + " "):
            return float(line.split()[-1])
    return 0.0


def test_work_of_a_client_that_went_away_is_not_computed(tiny_bundles: dict[str, Path], tmp_path: Path) -> None:
    """Ten long QA requests whose clients close their connections: counted as abandoned, and their queued windows
    are dropped instead of computed (a legitimate request after them does not wait for them)."""
    args = ("--max-batch-size", "1", "--max-queue", "8192")
    with serving([tiny_bundles["qa"]], tmp_path / "server.log", None, *args) as server:
        body = {"question": "When was the mill built?", "context": LONG_CONTEXT * 4}
        start = time.perf_counter()
        windows = int(httpx.post(server.url + "/qa", json=body, timeout=120).headers["x-backend-calls"])
        alone_s = time.perf_counter() - start
        assert windows > 400, windows
        before = _metric(server, "bertserve_tokens_total", 'model="tiny-qa"')
        # ten at once take about ten times as long as one alone: a client that gives up after a third of one
        # alone's time has its request admitted and queued, and none of the ten can be finished by then
        give_up_s = max(alone_s / 3, 0.05)

        def abandon() -> None:
            with pytest.raises(httpx.TimeoutException):
                httpx.post(server.url + "/qa", json=body, timeout=give_up_s)

        threads = [threading.Thread(target=abandon) for _ in range(10)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        deadline = time.monotonic() + 10
        while _metric(server, "bertserve_abandoned_total", 'transport="http"') < 10 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _metric(server, "bertserve_abandoned_total", 'transport="http"') == 10
        time.sleep(0.5)
        computed = _metric(server, "bertserve_tokens_total", 'model="tiny-qa"') - before
        per_request = 64 * windows  # at most, tokens of one request's windows
        assert computed < 3 * per_request, (computed, per_request)  # far from the 10 requests' 10 x
        assert _metric(server, "bertserve_queue_depth", 'model="tiny-qa"') == 0


def test_a_stop_with_long_work_in_flight_answers_200_or_503_never_500(
    tiny_bundles: dict[str, Path], tmp_path: Path
) -> None:
    """SIGTERM while long QA requests run: every REST caller gets 200, or 503 with Retry-After; every gRPC caller
    OK or UNAVAILABLE; the process exits 0."""
    env = {"BERTSERVE_DRAIN_S": "0.2", "BERTSERVE_SHUTDOWN_GRACE_S": "0.5"}
    args = ("--max-batch-size", "1", "--max-queue", "60000")
    server = ServerProcess([tiny_bundles["qa"]], tmp_path / "server.log", env, *args)
    server.wait_ready()
    body = {"question": "When was the mill built?", "context": LONG_CONTEXT * 4}  # some seconds of work each
    rest: list[httpx.Response] = []
    codes: list[grpc.StatusCode] = []

    def call_rest() -> None:
        rest.append(httpx.post(server.url + "/qa", json=body, timeout=60))

    def call_grpc() -> None:
        with grpc.insecure_channel(server.grpc_target) as channel:
            request = pb.ExtractRequest(inputs=[pb.QAInput(question=body["question"], context=body["context"])])
            try:
                pb_grpc.QAStub(channel).Extract(request, timeout=60)
                codes.append(grpc.StatusCode.OK)
            except grpc.RpcError as error:
                codes.append(error.code())

    threads = [threading.Thread(target=call_rest) for _ in range(6)]
    threads += [threading.Thread(target=call_grpc) for _ in range(3)]
    for thread in threads:
        thread.start()
    time.sleep(1.0)  # every request queued, the first windows computing
    code = server.terminate(timeout=60)
    for thread in threads:
        thread.join(timeout=60)
    assert code == 0, server.logs()
    assert len(rest) == 6 and len(codes) == 3
    for response in rest:
        assert response.status_code in (200, 503), (response.status_code, response.text)
        if response.status_code == 503:
            assert response.headers["retry-after"] and response.json()["error"]["code"] == "not_ready"
    assert any(response.status_code == 503 for response in rest)  # the work did not fit the grace period
    assert set(codes) <= {grpc.StatusCode.OK, grpc.StatusCode.UNAVAILABLE}, codes


def test_sighup_drains_like_sigterm(tiny_bundles: dict[str, Path], tmp_path: Path) -> None:
    env = {"BERTSERVE_DRAIN_S": "1"}
    server = ServerProcess([tiny_bundles["classify"]], tmp_path / "server.log", env)
    server.wait_ready()
    server.process.send_signal(signal.SIGHUP)
    time.sleep(0.3)
    during = httpx.get(server.url + "/health/ready", timeout=5)
    assert during.status_code == 503 and during.json()["status"] == "shutting_down"
    assert httpx.post(server.url + "/classify", json={"inputs": "still served while draining"}).status_code == 200
    assert server.process.wait(30) == 0, server.logs()


KEY = "s3cret"


@pytest.fixture(scope="module")
def keyed(tiny_bundles: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> ServerProcess:
    log = tmp_path_factory.mktemp("keyed") / "server.log"
    with serving([tiny_bundles["classify"]], log, {"BERTSERVE_API_KEY": KEY}) as server:
        yield server


@pytest.mark.parametrize("path", ["/docs", "/redoc", "/openapi.json", "/", "/playground", "/v1/models"])
def test_with_a_key_every_route_but_the_probes_needs_it(keyed: ServerProcess, path: str) -> None:
    assert httpx.get(keyed.url + path).status_code == 401
    assert httpx.get(keyed.url + path, headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
    for probe in ("/health/live", "/health/ready", "/metrics"):
        assert httpx.get(keyed.url + probe).status_code == 200


def test_the_key_is_checked_before_the_body_and_its_scheme_in_any_case(keyed: ServerProcess) -> None:
    url = keyed.url + "/classify"
    json_type = {"content-type": "application/json"}
    assert httpx.post(url, content=b"{not json", headers=json_type).status_code == 401
    assert httpx.post(url, content=b"x" * 3_000_000, headers=json_type).status_code == 401
    for scheme in ("bearer", "BEARER", "Bearer"):
        answer = httpx.post(url, json={"inputs": "hello"}, headers={"Authorization": f"{scheme} {KEY}"})
        assert answer.status_code == 200, (scheme, answer.text)
    with grpc.insecure_channel(keyed.grpc_target) as channel:
        stub = pb_grpc.ClassifierStub(channel)
        request = pb.ClassifyRequest(inputs=[pb.TextInput(text="hello")])
        assert stub.Classify(request, metadata=[("authorization", f"bearer {KEY}")], timeout=10).results


def test_clients_at_the_bound_are_never_refused(tiny_bundles: dict[str, Path], tmp_path: Path) -> None:
    """64 closed-loop clients, 32 over REST and 32 over gRPC, at max_in_progress 64: a finished request frees its
    place before its answer is sent, so a client's next request always finds one."""
    with serving([tiny_bundles["classify"]], tmp_path / "server.log", {"BERTSERVE_MAX_IN_PROGRESS": "64"}) as server:
        statuses = asyncio.run(_closed_loop(server, seconds=4.0))
    assert statuses["refused"] == 0, statuses
    assert statuses["ok"] > 200, statuses


async def _closed_loop(server: ServerProcess, seconds: float) -> dict[str, int]:
    counts = {"ok": 0, "refused": 0, "other": 0}
    stop = time.monotonic() + seconds

    async def rest_client(client: httpx.AsyncClient) -> None:
        while time.monotonic() < stop:
            status = (await client.post("/classify", json={"inputs": "a gripping film"})).status_code
            counts["ok" if status == 200 else "refused" if status == 429 else "other"] += 1

    async def grpc_client(stub: pb_grpc.ClassifierStub) -> None:
        request = pb.ClassifyRequest(inputs=[pb.TextInput(text="a gripping film")])
        while time.monotonic() < stop:
            try:
                await stub.Classify(request, timeout=30)
                counts["ok"] += 1
            except grpc.aio.AioRpcError as error:
                counts["refused" if error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED else "other"] += 1

    limits = httpx.Limits(max_connections=32, max_keepalive_connections=32)
    async with (
        httpx.AsyncClient(base_url=server.url, limits=limits, timeout=30) as client,
        grpc.aio.insecure_channel(server.grpc_target) as channel,
    ):
        stub = pb_grpc.ClassifierStub(channel)
        await asyncio.gather(*(rest_client(client) for _ in range(32)), *(grpc_client(stub) for _ in range(32)))
    return counts


@pytest.mark.parametrize(
    ("rest", "grpc_request"),
    [
        ({"inputs": ["fine", "  "]}, pb.ClassifyRequest(inputs=[pb.TextInput(text="fine"), pb.TextInput(text="  ")])),
        ({"inputs": "x", "model": "nope"}, pb.ClassifyRequest(inputs=[pb.TextInput(text="x")], model="nope")),
    ],
)
def test_the_same_bad_input_is_refused_alike_over_both_front_doors(
    server: ServerProcess, rest: dict, grpc_request: pb.ClassifyRequest
) -> None:
    answer = httpx.post(server.url + "/classify", json=rest)
    assert answer.status_code == 422
    with grpc.insecure_channel(server.grpc_target) as channel, pytest.raises(grpc.RpcError) as caught:
        pb_grpc.ClassifierStub(channel).Classify(grpc_request, timeout=10)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details() == answer.json()["error"]["message"]


def test_each_front_door_serves_alone(tiny_bundles: dict[str, Path], tmp_path: Path) -> None:
    """gRPC with the REST server off (`--http-port -1`) and REST with gRPC off (`--grpc-port -1`): the two front
    doors are siblings over one engine, and either runs without the other."""
    request = pb.ClassifyRequest(inputs=[pb.TextInput(text="a fine film")])
    grpc_only = ServerProcess([tiny_bundles["classify"]], tmp_path / "grpc-only.log", None, "--http-port", "-1")
    try:
        with grpc.insecure_channel(grpc_only.grpc_target) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline:
                assert grpc_only.process.poll() is None, grpc_only.logs()
                try:
                    status = health.Check(health_pb2.HealthCheckRequest(), timeout=2).status
                    if status == health_pb2.HealthCheckResponse.SERVING:
                        break
                except grpc.RpcError:
                    pass
                time.sleep(0.1)
            assert len(pb_grpc.ClassifierStub(channel).Classify(request, timeout=30).results) == 1
        with pytest.raises(httpx.ConnectError):
            httpx.get(grpc_only.url + "/health/live", timeout=2)
    finally:
        assert grpc_only.terminate() == 0, grpc_only.logs()
    with serving([tiny_bundles["classify"]], tmp_path / "rest-only.log", None, "--grpc-port", "-1") as rest_only:
        assert httpx.post(rest_only.url + "/classify", json={"inputs": "a fine film"}, timeout=30).status_code == 200
        with grpc.insecure_channel(rest_only.grpc_target) as channel, pytest.raises(grpc.FutureTimeoutError):
            grpc.channel_ready_future(channel).result(timeout=2)


def test_an_idle_server_stops_without_waiting_out_its_grace_period(
    tiny_bundles: dict[str, Path], tmp_path: Path
) -> None:
    """The grace period bounds the wait for in-flight work; with none, a stop ends as soon as both doors close."""
    env = {"BERTSERVE_SHUTDOWN_GRACE_S": "60"}
    with serving([tiny_bundles["classify"]], tmp_path / "idle.log", env) as server:
        assert httpx.post(server.url + "/classify", json={"inputs": "a fine film"}, timeout=30).status_code == 200
        started = time.monotonic()
        assert server.terminate(timeout=90) == 0
        assert time.monotonic() - started < 30, "the stop waited out the grace period with nothing in flight"
