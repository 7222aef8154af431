"""The parts of admission without a server: the door's count, the tokenization executor's bounded queue, queue
reservations, and a QA request judged against its model's queue before any of its windows is built."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import bert_model.tasks.qa as qa_module
from service.admission import BoundedExecutor, Door, QueueReservations
from service.batcher import BatchConfig, Batcher
from service.bundles import open_bundle
from service.errors import InvalidInput, Overloaded
from service.inference import INLINE_CHARACTERS, InferenceService
from service.metrics import ServiceMetrics
from service.pipelines import QAInput, make_pipeline
from service.settings import ServiceSettings


def _sample(metrics: ServiceMetrics, name: str, labels: dict[str, str] | None = None) -> float | None:
    return metrics.registry.get_sample_value(name, labels or {})


def test_the_door_counts_requests_in_progress_and_refuses_beyond_its_limit() -> None:
    metrics = ServiceMetrics()
    door = Door(2, metrics)
    assert door.enter("http") and door.enter("grpc")
    assert _sample(metrics, "bertserve_in_progress") == 2
    assert not door.enter("grpc") and not door.enter("http") and not door.enter("http")
    assert _sample(metrics, "bertserve_door_rejected_total", {"transport": "http"}) == 2
    assert _sample(metrics, "bertserve_door_rejected_total", {"transport": "grpc"}) == 1
    door.leave()
    assert door.enter("http")  # a place came free
    assert "2 requests in progress" in door.refusal().message
    with pytest.raises(ValueError, match="at least 1"):
        Door(0, metrics)


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


def test_reservations_hold_queue_places_until_released() -> None:
    metrics = ServiceMetrics()
    batcher = Batcher("m", _never, BatchConfig(max_queue=10), output_names=["logits"])
    reservations = QueueReservations(metrics)
    with reservations.reserve(batcher, 6):
        reservations.check(batcher, 4)
        with pytest.raises(Overloaded, match="6 sequences queued"):
            reservations.check(batcher, 5)
        assert _sample(metrics, "bertserve_rejected_total", {"model": "m", "reason": "queue_full"}) == 1
    reservations.check(batcher, 10)
    assert reservations.held("m") == 0
    with pytest.raises(InvalidInput, match="more than this model's queue holds"):
        reservations.check(batcher, 11)


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
    monkeypatch.setattr(InferenceService, "_make_backend", lambda self, bundle: backend)
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
    service = InferenceService(settings)

    async def scenario() -> None:
        await service.load()
        try:
            built.clear()
            first = asyncio.ensure_future(service.qa(request))
            while len(built) < windows:  # the first request's windows are built and queued
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.05)
            with pytest.raises(Overloaded, match="at capacity"):
                await service.qa(request)
            assert len(built) == windows  # the refused request built none
            backend.gate.set()
            assert len((await first).results) == 1
        finally:
            backend.gate.set()
            await service.close()

    asyncio.run(scenario())
