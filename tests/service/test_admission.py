"""Admission at the door, through a real server: bounds on requests receiving their body and at work shared by REST
and gRPC (429 / RESOURCE_EXHAUSTED at once, probes and metrics still answered; slow bodies hold no place at work),
and slow or bloated clients cut at the configured timeouts and sizes (raw sockets that dribble bytes; a gRPC call
whose message never comes)."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import httpx
import pytest

from service.grpc_api.stubs import bert_pb2 as pb
from service.grpc_api.stubs import bert_pb2_grpc as pb_grpc
from tests.service.server import ServerProcess, serving

pytestmark = pytest.mark.integration

DOOR = 2
RECEIVING = 4
HEADER_TIMEOUT_S = 1.0
BODY_TIMEOUT_S = 2.0
MAX_HEADER_BYTES = 4096


@pytest.fixture(scope="module")
def guarded_server(tiny_bundles: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    env = {
        "BERTSERVE_MAX_IN_PROGRESS": str(DOOR),
        "BERTSERVE_MAX_RECEIVING": str(RECEIVING),
        "BERTSERVE_HEADER_TIMEOUT_S": str(HEADER_TIMEOUT_S),
        "BERTSERVE_BODY_TIMEOUT_S": str(BODY_TIMEOUT_S),
        "BERTSERVE_MAX_HEADER_BYTES": str(MAX_HEADER_BYTES),
    }
    log = tmp_path_factory.mktemp("admission") / "server.log"
    with serving([tiny_bundles["classify"]], log, env, clean_exit=True) as server:
        yield server


def _connect(server: ServerProcess) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.http_port), timeout=10)
    sock.settimeout(10)
    return sock


def _read_all(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    chunks = []
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def _held_requests(server: ServerProcess, count: int) -> list[socket.socket]:
    """`count` requests whose headers arrived and whose body never comes: each holds a receiving place."""
    held = []
    for _ in range(count):
        sock = _connect(server)
        sock.sendall(b"POST /classify HTTP/1.1\r\nhost: x\r\ncontent-length: 40\r\n\r\n{")
        held.append(sock)
    return held


def _wait_gauge(server: ServerProcess, gauge: str, expected: int, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if f"{gauge} {float(expected)}" in httpx.get(server.url + "/metrics").text:
            return
        time.sleep(0.02)
    raise AssertionError(f"never {gauge} {expected}:\n{httpx.get(server.url + '/metrics').text}")


def _wait_in_progress(server: ServerProcess, expected: int, timeout: float = 5.0) -> None:
    _wait_gauge(server, "bertserve_in_progress", expected, timeout)


def _wait_receiving(server: ServerProcess, expected: int, timeout: float = 5.0) -> None:
    _wait_gauge(server, "bertserve_receiving", expected, timeout)


def test_slow_bodies_beyond_the_work_bound_do_not_hold_back_other_requests(guarded_server: ServerProcess) -> None:
    held = _held_requests(guarded_server, DOOR + 1)
    try:
        _wait_receiving(guarded_server, DOOR + 1)
        for _ in range(3):
            answer = httpx.post(guarded_server.url + "/classify", json={"inputs": "a fine film"}, timeout=10)
            assert answer.status_code == 200, answer.text
        with grpc.insecure_channel(guarded_server.grpc_target) as channel:
            reply = pb_grpc.ClassifierStub(channel).Classify(
                pb.ClassifyRequest(inputs=[pb.TextInput(text="a fine film")]), timeout=10
            )
            assert len(reply.results) == 1
        _wait_in_progress(guarded_server, 0)
    finally:
        for sock in held:
            sock.close()
    _wait_receiving(guarded_server, 0)  # a slow client that goes away gives its place back


def test_a_full_door_refuses_rest_and_grpc_at_once_and_still_answers_probes(guarded_server: ServerProcess) -> None:
    held = _held_requests(guarded_server, RECEIVING)
    try:
        _wait_receiving(guarded_server, RECEIVING)
        start = time.perf_counter()
        refused = httpx.post(guarded_server.url + "/classify", json={"inputs": "a fine film"}, timeout=10)
        refused_s = time.perf_counter() - start
        assert refused.status_code == 429, refused.text
        assert refused.headers["retry-after"] == "1"
        assert refused.json()["error"]["code"] == "overloaded"
        assert "max_receiving" in refused.json()["error"]["message"]
        assert refused_s < 5.0, refused_s  # refused at the door, not held to the 10 s timeout
        with grpc.insecure_channel(guarded_server.grpc_target) as channel:
            stub = pb_grpc.ClassifierStub(channel)
            with pytest.raises(grpc.RpcError) as error:
                stub.Classify(pb.ClassifyRequest(inputs=[pb.TextInput(text="a fine film")]), timeout=10)
            assert error.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "max_receiving" in (error.value.details() or "")
        for path in ("/health/live", "/health/ready", "/metrics", "/playground"):
            assert httpx.get(guarded_server.url + path, timeout=5).status_code == 200, path
        metrics = httpx.get(guarded_server.url + "/metrics").text
        assert 'bertserve_door_rejected_total{bound="receiving",transport="http"} 1.0' in metrics
        assert 'bertserve_door_rejected_total{bound="receiving",transport="grpc"} 1.0' in metrics
        # the held bodies never come: each is answered 408 at the body timeout and its connection closed
        for sock in held:
            answer = _read_all(sock)
            assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
            assert b"request_timeout" in answer
    finally:
        for sock in held:
            sock.close()
    _wait_receiving(guarded_server, 0)
    assert httpx.post(guarded_server.url + "/classify", json={"inputs": "a fine film"}, timeout=10).status_code == 200
    assert (
        f'bertserve_slow_clients_cut_total{{phase="body",transport="http"}} {float(RECEIVING)}'
        in httpx.get(guarded_server.url + "/metrics").text
    )


def test_headers_sent_a_byte_at_a_time_are_cut_at_the_header_timeout(guarded_server: ServerProcess) -> None:
    sock = _connect(guarded_server)
    head = b"POST /classify HTTP/1.1\r\nhost: x\r\nx-slow: " + b"a" * 100
    start = time.perf_counter()
    try:
        sent = 0
        with pytest.raises(OSError):  # the server closes the connection under the dribble
            for byte in head:
                sock.sendall(bytes([byte]))
                sent += 1
                time.sleep(0.1)
            raise AssertionError(f"the whole head went through ({sent} bytes in {time.perf_counter() - start:.1f} s)")
        elapsed = time.perf_counter() - start
        assert HEADER_TIMEOUT_S - 0.2 < elapsed < HEADER_TIMEOUT_S + 1.5, elapsed
    finally:
        sock.close()


def test_a_connection_that_sends_nothing_is_closed_at_the_header_timeout(guarded_server: ServerProcess) -> None:
    sock = _connect(guarded_server)
    start = time.perf_counter()
    try:
        answer = _read_all(sock)
    finally:
        sock.close()
    elapsed = time.perf_counter() - start
    assert HEADER_TIMEOUT_S - 0.2 < elapsed < HEADER_TIMEOUT_S + 1.5, elapsed
    assert answer.startswith(b"HTTP/1.1 408 "), answer


def test_a_keep_alive_connection_gets_a_fresh_header_timeout_per_request(guarded_server: ServerProcess) -> None:
    with httpx.Client(base_url=guarded_server.url, timeout=10) as client:
        for _ in range(2):  # idle longer than the header timeout between requests: kept alive all the same
            assert client.post("/classify", json={"inputs": "a fine film"}).status_code == 200
            time.sleep(HEADER_TIMEOUT_S * 1.3)
        assert client.get("/health/live").status_code == 200


def test_a_kept_alive_connections_next_head_is_timed_from_its_own_first_byte(guarded_server: ServerProcess) -> None:
    sock = _connect(guarded_server)
    try:
        sock.sendall(b"GET /health/live HTTP/1.1\r\nhost: x\r\n\r\n")
        answer = b""
        while b"\r\n\r\n" not in answer:
            answer += sock.recv(65536)
        assert answer.startswith(b"HTTP/1.1 200 "), answer
        time.sleep(HEADER_TIMEOUT_S * 0.6)  # past most of the first head's deadline
        start = time.perf_counter()
        sock.sendall(b"GET /health/live HTTP/1.1\r\nhost: x\r\n")  # a head that never ends
        rest = _read_all(sock)
    finally:
        sock.close()
    elapsed = time.perf_counter() - start
    assert HEADER_TIMEOUT_S - 0.2 < elapsed < HEADER_TIMEOUT_S + 1.5, elapsed
    assert b"HTTP/1.1 408 " in rest, rest


def test_oversized_headers_get_431_and_the_connection_closed(guarded_server: ServerProcess) -> None:
    sock = _connect(guarded_server)
    try:
        sock.sendall(b"GET /health/live HTTP/1.1\r\nhost: x\r\nx-big: " + b"b" * (MAX_HEADER_BYTES + 100))
        answer = _read_all(sock)
    finally:
        sock.close()
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
    assert b"headers_too_large" in answer


def _head(extra: bytes) -> bytes:
    return b"GET /health/live HTTP/1.1\r\nhost: x\r\n" + extra + b"\r\n"


def _read_answer(sock: socket.socket) -> bytes:
    """One whole response read from `sock` (the only one expected on it)."""
    return _read_answers(sock, 1)[0]


def _read_answers(sock: socket.socket, count: int) -> list[bytes]:
    """`count` whole responses (each its head and `content-length` bytes of body) read from `sock`; pipelined
    answers may come in one read, so what one read brings past an answer begins the next."""
    answers: list[bytes] = []
    data = b""
    while len(answers) < count:
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            assert chunk, (answers, data)
            data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        lines = head.lower().split(b"\r\n")
        length = next(int(line.split(b":")[1]) for line in lines if line.startswith(b"content-length:"))
        while len(rest) < length:
            chunk = sock.recv(65536)
            assert chunk, (answers, data)
            rest += chunk
        answers.append(head + b"\r\n\r\n" + rest[:length])
        data = rest[length:]
    assert not data, data  # nothing more than was asked for
    return answers


@pytest.mark.parametrize(
    "extra",
    [
        pytest.param(b"x-big: " + b"b" * (MAX_HEADER_BYTES + 100) + b"\r\n", id="one-large-header"),
        pytest.param(b"".join(b"x-h%04d: %s\r\n" % (i, b"v" * 40) for i in range(120)), id="many-small-headers"),
        pytest.param(b"", id="long-url"),
    ],
)
def test_an_oversized_head_that_arrives_whole_gets_431(guarded_server: ServerProcess, extra: bytes) -> None:
    """A complete head over the limit in one segment (parsed to its end in one read), on a new connection and as
    a kept-alive connection's next request: 431 and closed, never served."""
    long_url = b"GET /health/live?" + b"q" * (MAX_HEADER_BYTES + 100) + b" HTTP/1.1\r\nhost: x\r\n\r\n"
    head = _head(extra) if extra else long_url
    assert len(head) > MAX_HEADER_BYTES
    for kept_alive in (False, True):
        sock = _connect(guarded_server)
        try:
            if kept_alive:
                sock.sendall(_head(b""))
                assert _read_answer(sock).startswith(b"HTTP/1.1 200 ")
            sock.sendall(head)
            answer = _read_all(sock)
        finally:
            sock.close()
        assert answer.startswith(b"HTTP/1.1 431 "), (kept_alive, answer[:200])
        assert b"headers_too_large" in answer


def test_a_head_within_the_limit_is_served(guarded_server: ServerProcess) -> None:
    sock = _connect(guarded_server)
    try:
        sock.sendall(_head(b"x-big: " + b"b" * (MAX_HEADER_BYTES - 200) + b"\r\n"))
        answer = _read_answer(sock)
    finally:
        sock.close()
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:200]


def test_a_few_pipelined_requests_are_answered_in_order(guarded_server: ServerProcess) -> None:
    sock = _connect(guarded_server)
    try:
        paths = [b"/health/live", b"/health/ready", b"/nowhere", b"/health/live"]
        sock.sendall(b"".join(b"GET " + path + b" HTTP/1.1\r\nhost: x\r\n\r\n" for path in paths))
        statuses = [answer.split(b"\r\n", 1)[0] for answer in _read_answers(sock, len(paths))]
    finally:
        sock.close()
    assert statuses == [b"HTTP/1.1 200 OK", b"HTTP/1.1 200 OK", b"HTTP/1.1 404 Not Found", b"HTTP/1.1 200 OK"]


def test_a_deep_pipeline_is_answered_up_to_its_depth_then_closed(guarded_server: ServerProcess) -> None:
    """6,000 requests pipelined in one write (each would be request state held until its turn): once more than
    MAX_PIPELINED wait behind the one at work, the parser stops; the one at work and those queued are answered,
    then the server half-closes (a FIN, not a reset: the answers reach the client) and goes on serving."""
    from service.http_api.connections import MAX_PIPELINED

    sock = _connect(guarded_server)
    try:
        sock.sendall(_head(b"") * 6000)
        sock.shutdown(socket.SHUT_WR)  # all sent: the server's FIN then ends the read below
        chunks = []
        while chunk := sock.recv(65536):  # a reset raises here
            chunks.append(chunk)
        answer = b"".join(chunks)
    finally:
        sock.close()
    assert answer.count(b"HTTP/1.1 200 ") == MAX_PIPELINED + 1, answer.count(b"HTTP/1.1 200 ")
    assert answer.count(b"HTTP/1.1 ") == MAX_PIPELINED + 1
    assert httpx.get(guarded_server.url + "/health/live").status_code == 200
    assert (
        'bertserve_slow_clients_cut_total{phase="pipeline",transport="http"} 1.0'
        in httpx.get(guarded_server.url + "/metrics").text
    )


def test_malformed_heads_on_many_connections_write_at_most_one_log_line(guarded_server: ServerProcess) -> None:
    """uvicorn logs a warning per malformed head: 30 connections in a row, each with a malformed head, get their
    400 each but add at most one line to the log (one per 10 s)."""
    message = "Invalid HTTP request received."

    def lines() -> int:
        return guarded_server.log_path.read_text().count(message)

    before = lines()
    for _ in range(30):
        sock = _connect(guarded_server)
        try:
            sock.sendall(b"NOT HTTP AT ALL\r\n\r\n")
            assert _read_all(sock).startswith(b"HTTP/1.1 400 ")
        finally:
            sock.close()
    time.sleep(0.5)  # a warning is written at once: well within this
    assert lines() - before <= 1
    assert httpx.get(guarded_server.url + "/health/live").status_code == 200


def test_a_grpc_call_whose_message_never_comes_is_cancelled_at_the_body_timeout(guarded_server: ServerProcess) -> None:
    async def call() -> grpc.aio.AioRpcError:
        async with grpc.aio.insecure_channel(guarded_server.grpc_target) as channel:
            # the unary method called as a client stream that never sends its message
            method = channel.stream_unary(
                "/bert.v1.Classifier/Classify",
                request_serializer=pb.ClassifyRequest.SerializeToString,
                response_deserializer=pb.ClassifyResponse.FromString,
            )

            async def nothing() -> AsyncIterator[pb.ClassifyRequest]:
                await asyncio.sleep(30)
                yield pb.ClassifyRequest()

            with pytest.raises(grpc.aio.AioRpcError) as error:
                await method(nothing(), timeout=20)
            return error.value

    start = time.perf_counter()
    error = asyncio.run(call())
    elapsed = time.perf_counter() - start
    assert error.code() == grpc.StatusCode.CANCELLED, (error.code(), error.details(), elapsed)
    assert "did not arrive" in (error.details() or "")
    assert BODY_TIMEOUT_S - 0.2 < elapsed < BODY_TIMEOUT_S + 2, elapsed
    _wait_receiving(guarded_server, 0)
    _wait_in_progress(guarded_server, 0)
