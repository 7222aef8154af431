"""The parts of admission without a server: the door's count, the tokenization executor's bounded queue, the
queue's one capacity rule, and a QA request judged against its model's queue before any of its windows is built."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

import bert_model.tasks.qa as qa_module
from bundles.serving import open_bundle
from service.engine.admission import BoundedExecutor, Door
from service.engine.batcher import BatchConfig, Batcher
from service.engine.engine import INLINE_CHARACTERS, Engine
from service.engine.inputs import QAInput
from service.engine.pipelines import make_pipeline
from service.errors import InvalidInput, Overloaded
from service.grpc_api.server import AdmissionInterceptor
from service.http_api.middleware import DoorMiddleware
from service.operations.metrics import ServiceMetrics
from service.settings import ServiceSettings


def _sample(metrics: ServiceMetrics, name: str, labels: dict[str, str] | None = None) -> float | None:
    return metrics.registry.get_sample_value(name, labels or {})


def test_the_door_counts_receiving_and_working_requests_under_their_own_limits() -> None:
    metrics = ServiceMetrics()
    door = Door(2, metrics, receiving_limit=4)
    tickets = [door.arrive("http"), door.arrive("grpc"), door.arrive("http"), door.arrive("http")]
    assert all(tickets) and door.receiving == 4 and door.in_progress == 0
    assert door.arrive("grpc") is None  # the receiving bound is full
    assert _sample(metrics, "bertserve_door_rejected_total", {"transport": "grpc", "bound": "receiving"}) == 1
    first, second, third, fourth = (ticket for ticket in tickets if ticket is not None)
    assert first.admit() and second.admit()
    assert door.receiving == 2 and door.in_progress == 2
    assert _sample(metrics, "bertserve_in_progress") == 2 and _sample(metrics, "bertserve_receiving") == 2
    assert not third.admit()  # the work bound is full: refused, and its receiving place given back
    assert third.stage == "closed" and door.receiving == 1 and door.in_progress == 2
    assert _sample(metrics, "bertserve_door_rejected_total", {"transport": "http", "bound": "in_progress"}) == 1
    first.close()
    first.close()  # idempotent
    assert door.in_progress == 1 and fourth.admit() and door.in_progress == 2 and door.receiving == 0
    fifth = door.arrive("http")
    assert fifth is not None
    fifth.close()  # a request that went away while receiving
    second.close()
    fourth.close()
    third.close()
    assert door.receiving == 0 and door.in_progress == 0
    assert "2 requests in progress" in door.refusal().message and "max_in_progress" in door.refusal().message
    assert "max_receiving" in door.refusal("receiving").message
    with pytest.raises(ValueError, match="at least 1"):
        Door(0, metrics)
    with pytest.raises(ValueError, match="at least 1"):
        Door(1, metrics, receiving_limit=0)


class _Exchange:
    """One ASGI request driven by hand: the body messages it is given, the messages it sends back."""

    def __init__(self, body: bytes | None, path: str = "/classify") -> None:
        self.scope = {"type": "http", "method": "POST", "path": path, "headers": [(b"content-length", b"2")]}
        self.incoming: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        if body is not None:  # None: a slow client whose body never comes
            self.incoming.put_nowait({"type": "http.request", "body": body, "more_body": False})
        self.sent: list[dict[str, Any]] = []

    async def receive(self) -> dict[str, Any]:
        return await self.incoming.get()

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)

    @property
    def status(self) -> int | None:
        return next((m["status"] for m in self.sent if m["type"] == "http.response.start"), None)

    def header(self, name: bytes) -> bytes | None:
        start = next(m for m in self.sent if m["type"] == "http.response.start")
        return dict(start["headers"]).get(name)

    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.sent if m["type"] == "http.response.body")


def test_slow_bodies_hold_receiving_places_only_and_work_is_counted_once_the_body_is_in() -> None:
    metrics = ServiceMetrics()
    door = Door(1, metrics, receiving_limit=2)
    gate = asyncio.Event()
    bodies: list[bytes] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        bodies.append((await receive())["body"])
        await gate.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    middleware = DoorMiddleware(app, door, max_bytes=1024, timeout_s=0.5, metrics=metrics)

    def start(exchange: _Exchange) -> asyncio.Task[None]:
        return asyncio.ensure_future(middleware(exchange.scope, exchange.receive, exchange.send))

    async def scenario() -> None:
        working = _Exchange(b"{}")
        work_task = start(working)
        await asyncio.sleep(0.01)
        assert door.in_progress == 1 and door.receiving == 0 and bodies == [b"{}"]
        slow = [_Exchange(None), _Exchange(None)]
        slow_tasks = [start(exchange) for exchange in slow]
        await asyncio.sleep(0.01)
        assert door.receiving == 2 and door.in_progress == 1  # slow bodies hold no place at work
        refused_on_arrival = _Exchange(b"{}")
        await start(refused_on_arrival)
        assert refused_on_arrival.status == 429 and b"max_receiving" in refused_on_arrival.body()
        assert refused_on_arrival.header(b"retry-after") == b"1"
        for exchange in slow:  # a slow client gives its receiving place back by going away
            exchange.incoming.put_nowait({"type": "http.disconnect"})
        await asyncio.gather(*slow_tasks)
        assert door.receiving == 0 and all(exchange.status is None for exchange in slow)
        refused_at_work = _Exchange(b"{}")
        await start(refused_at_work)  # its body came at once; the work bound is full
        assert refused_at_work.status == 429 and b"max_in_progress" in refused_at_work.body()
        assert door.receiving == 0 and len(bodies) == 1  # refused before the app read its body
        late = _Exchange(None)
        late_task = start(late)
        gate.set()
        await work_task
        assert working.status == 200 and door.in_progress == 0
        await late_task  # cut at the body timeout
        assert late.status == 408 and door.receiving == 0
        uncounted = _Exchange(b"{}", path="/health/live")
        await start(uncounted)
        assert uncounted.status == 200 and door.in_progress == 0

    asyncio.run(scenario())
    rejected = "bertserve_door_rejected_total"
    assert _sample(metrics, rejected, {"transport": "http", "bound": "receiving"}) == 1
    assert _sample(metrics, rejected, {"transport": "http", "bound": "in_progress"}) == 1


def test_grpc_calls_are_counted_receiving_until_their_message_is_in_then_at_work() -> None:
    metrics = ServiceMetrics()
    door = Door(1, metrics, receiving_limit=2)
    gate = asyncio.Event()

    async def echo(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        await gate.wait()
        return request

    async def never_sends() -> Any:
        await asyncio.sleep(30)
        yield b""

    async def scenario() -> None:
        server = grpc.aio.server(interceptors=[AdmissionInterceptor(door, receive_timeout_s=10)])
        handler = grpc.method_handlers_generic_handler("t.T", {"Echo": grpc.unary_unary_rpc_method_handler(echo)})
        server.add_generic_rpc_handlers((handler,))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                unary, streaming = channel.unary_unary("/t.T/Echo"), channel.stream_unary("/t.T/Echo")
                working = asyncio.ensure_future(unary(b"w", timeout=10))
                slow = asyncio.ensure_future(streaming(never_sends(), timeout=10))
                while door.in_progress < 1 or door.receiving < 1:
                    await asyncio.sleep(0.01)
                with pytest.raises(grpc.aio.AioRpcError) as at_work:  # its message came; the work bound is full
                    await unary(b"x", timeout=10)
                assert at_work.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                assert "max_in_progress" in (at_work.value.details() or "")
                second_slow = asyncio.ensure_future(streaming(never_sends(), timeout=10))
                while door.receiving < 2:
                    await asyncio.sleep(0.01)
                with pytest.raises(grpc.aio.AioRpcError) as on_arrival:
                    await unary(b"y", timeout=10)
                assert on_arrival.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                assert "max_receiving" in (on_arrival.value.details() or "")
                gate.set()
                assert await working == b"w"
                for call in (slow, second_slow):
                    call.cancel()
                await asyncio.gather(slow, second_slow, return_exceptions=True)
                # the server hears of a client's cancellation a moment after the client's call ends
                deadline = time.monotonic() + 5
                while door.receiving and time.monotonic() < deadline:
                    await asyncio.sleep(0.01)
                assert await unary(b"again", timeout=10) == b"again"
        finally:
            await server.stop(0)
        assert door.in_progress == 0 and door.receiving == 0

    asyncio.run(scenario())
    rejected = "bertserve_door_rejected_total"
    assert _sample(metrics, rejected, {"transport": "grpc", "bound": "receiving"}) == 1
    assert _sample(metrics, rejected, {"transport": "grpc", "bound": "in_progress"}) == 1


def test_the_executor_refuses_jobs_beyond_its_threads_and_queue_at_once() -> None:
    executor = BoundedExecutor(threads=1, queue=1)
    release = threading.Event()

    async def scenario() -> list[Any]:
        running = asyncio.ensure_future(executor.run(release.wait, 10))
        queued = asyncio.ensure_future(executor.run(lambda: "queued"))
        await asyncio.sleep(0.05)
        start = time.perf_counter()
        with pytest.raises(Overloaded, match="busy tokenizing"):
            await executor.run(lambda: "refused")
        refused_in = time.perf_counter() - start
        assert refused_in < 0.05 and executor.jobs == 2
        # post-processing of a request already admitted is never refused
        unbounded = asyncio.ensure_future(executor.run(lambda: "post", bounded=False))
        release.set()
        results = await asyncio.gather(running, queued, unbounded)
        await asyncio.sleep(0.01)
        assert executor.jobs == 0
        assert await executor.run(lambda: "again") == "again"
        return results

    try:
        assert asyncio.run(scenario()) == [True, "queued", "post"]
    finally:
        release.set()
        executor.close()


def test_a_caller_that_goes_away_gives_its_queued_job_back() -> None:
    executor = BoundedExecutor(threads=1, queue=1)
    release = threading.Event()
    calls: list[str] = []

    async def scenario() -> None:
        running = asyncio.ensure_future(executor.run(release.wait, 10))
        queued = asyncio.ensure_future(executor.run(calls.append, "ran"))
        await asyncio.sleep(0.05)
        queued.cancel()  # the client disconnected while its job waited for a thread
        await asyncio.sleep(0.05)
        assert executor.jobs == 1
        release.set()
        await running

    try:
        asyncio.run(scenario())
        assert calls == []  # never ran
    finally:
        release.set()
        executor.close()


def test_the_queue_admits_rows_once_and_holds_them_until_they_are_queued() -> None:
    """One capacity rule (`Batcher.reserve`): reserved rows count beside queued ones until their features are
    queued in their place (or the reservation is released); a request that could never fit says so."""
    metrics = ServiceMetrics()
    batcher = Batcher("m", _never, BatchConfig(max_queue=10), output_names=["logits"], observer=metrics)

    async def scenario() -> None:
        await batcher.start()
        with batcher.reserve(6):
            batcher.reserve(4).release()
            with pytest.raises(Overloaded, match="6 sequences queued"):
                batcher.reserve(5)
            assert _sample(metrics, "bertserve_rejected_total", {"model": "m", "reason": "queue_full"}) == 1
        batcher.reserve(10).release()
        with pytest.raises(InvalidInput, match="more than this model's queue holds"):
            batcher.reserve(11)
        with pytest.raises(InvalidInput, match="split it like this"):
            batcher.reserve(11, lambda limit: f"more than {limit}: split it like this")
        await batcher.close()

    asyncio.run(scenario())


async def _never(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    raise AssertionError("not called")


class GatedBackend:
    """Answers QA batches with zero logits once `gate` is set."""

    kind = "gated"
    variant = "gated"
    batches_itself = False
    width_multiple = 1
    concurrency = 1

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.calls = 0

    async def start(self) -> None:
        self.gate = asyncio.Event()

    async def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.calls += 1
        await self.gate.wait()
        shape = inputs["input_ids"].shape
        return {"start_logits": np.zeros(shape, np.float32), "end_logits": np.zeros(shape, np.float32)}

    async def infer_alone(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return await self.infer(inputs)

    async def close(self) -> None:
        self.gate.set()


def test_a_qa_request_that_cannot_fit_the_queue_is_refused_before_its_windows_are_built(
    tiny_bundles: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = GatedBackend()
    monkeypatch.setattr(Engine, "_make_backend", lambda self, bundle: backend)
    built: list[int] = []

    class CountedFeature(qa_module.QAFeature):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            built.append(self.request_index)

    monkeypatch.setattr(qa_module, "QAFeature", CountedFeature)
    context = "The committee met in the old town hall to discuss the river crossing and its costs. " * 25
    assert len(context) > INLINE_CHARACTERS  # tokenized on the executor: requests interleave
    request = QAInput(questions=["Where did the committee meet?"], contexts=[context])
    windows = len(make_pipeline(open_bundle(tiny_bundles["qa"])).features(request))
    batch = 4
    assert windows > 2 * batch, windows
    # one request fits the queue; a second does not while the first waits beside its running batch
    settings = ServiceSettings(
        models=[str(tiny_bundles["qa"])],
        warmup_rounds=0,
        grpc_port=-1,
        max_queue=windows + windows // 2,
        max_batch_size=batch,
    )
    service = Engine(settings)

    async def scenario() -> None:
        await service.load()
        service.set_ready()
        try:
            built.clear()
            first = asyncio.ensure_future(service.submit(request))
            while len(built) < windows:  # the first request's windows are built and queued
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.05)
            with pytest.raises(Overloaded, match="at capacity"):
                await service.submit(request)
            assert len(built) == windows  # the refused request built none
            backend.gate.set()
            assert len((await first).results) == 1
        finally:
            backend.gate.set()
            await service.close()

    asyncio.run(scenario())


def test_a_qa_request_larger_than_the_queue_is_refused_with_the_limit_and_how_to_split_it(
    tiny_bundles: dict[str, Path],
) -> None:
    context = "The committee met in the old town hall to discuss the river crossing and its costs. " * 25
    question = "Where did the committee meet?"
    windows = len(make_pipeline(open_bundle(tiny_bundles["qa"])).features(QAInput([question], [context])))
    settings = ServiceSettings(models=[str(tiny_bundles["qa"])], warmup_rounds=0, grpc_port=-1, max_queue=windows + 1)
    service = Engine(settings)

    async def scenario() -> tuple[str, str]:
        await service.load()
        service.set_ready()
        try:
            with pytest.raises(InvalidInput) as several:
                await service.submit(QAInput([question] * 3, [context] * 3))
            with pytest.raises(InvalidInput) as alone:
                await service.submit(QAInput([question, question], ["short", context + context]))
            assert next(iter(service.models.values())).batcher.backend_calls == 0
            return several.value.message, alone.value.message
        finally:
            await service.close()

    several, alone = asyncio.run(scenario())
    limit = windows + 1
    assert f"needs {3 * windows} windows of " in several and f"({limit}, the server's max_queue setting)" in several
    assert f"split it into requests of at most {limit} windows" in several and "at most 1 inputs" in several
    assert "input 1 alone needs" in alone and "send it in parts of at most" in alone


def test_the_queue_depth_gauge_reads_the_batcher_when_scraped() -> None:
    metrics = ServiceMetrics()
    depth = [3]
    metrics.watch_queue_depth("m", lambda: depth[0])

    def scraped() -> float:
        (value,) = [
            sample.value
            for family in text_string_to_metric_families(metrics.exposition().decode())
            for sample in family.samples
            if sample.name == "bertserve_queue_depth" and sample.labels == {"model": "m"}
        ]
        return value

    assert scraped() == 3
    depth[0] = 0
    assert scraped() == 0
