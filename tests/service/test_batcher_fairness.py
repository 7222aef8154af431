"""Short requests beside long ones: fair order in a batcher (a request that comes behind a long request's features
is next, and is not padded into a batch of much longer rows), and the process-wide gate that keeps a core free for
short requests while long batches run (`LongBatchGate`)."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from service.engine.batcher import BatchConfig, Batcher, LongBatchGate
from tests.service.test_batcher import FakeBackend, feat


class CountingBackend(FakeBackend):
    """A FakeBackend that records, per call, its width and how many calls of rows wider than `wide` ran at once."""

    def __init__(self, delay: float, wide: int, running: list[int]) -> None:
        super().__init__(delay=delay)
        self.wide = wide
        self.running = running  # shared by the backends of one test: [calls of wide rows running now, most seen]

    async def __call__(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        wide = arrays["input_ids"].shape[1] > self.wide
        if wide:
            self.running[0] += 1
            self.running[1] = max(self.running[1], self.running[0])
        try:
            return await super().__call__(arrays)
        finally:
            if wide:
                self.running[0] -= 1


def _batcher(backend: FakeBackend, gate: LongBatchGate | None = None, **config: object) -> Batcher:
    settings = BatchConfig(**config)  # type: ignore[arg-type]
    return Batcher("m", backend, settings, output_names=("logits", "tokens"), sequence_outputs=("tokens",), gate=gate)


def test_a_short_request_behind_a_long_one_goes_next_and_alone() -> None:
    """32 features of 200 tokens queued behind a running call, then one of 10 tokens: it runs in the next call, on
    its own width (main: after the long request's features, padded to 200 in a batch of them)."""

    async def go() -> tuple[list[tuple[int, int]], int]:
        backend = FakeBackend(delay=0.02)
        batcher = _batcher(backend, max_batch_size=8, max_wait_s=0, window=16)
        await batcher.start()
        deadline = time.perf_counter() + 10
        long = asyncio.ensure_future(batcher.submit([feat(200, i) for i in range(32)], deadline))
        await asyncio.sleep(0.005)  # the long request's first batch is running
        await batcher.submit([feat(10, 99)], deadline)
        calls_before_short = len(backend.calls)
        await long
        await batcher.close()
        return backend.calls, calls_before_short

    calls, calls_at_answer = asyncio.run(go())
    assert calls[1] == (1, 10), calls  # right after the running call, on its own width
    assert calls_at_answer == 2
    assert sum(rows for rows, width in calls if width == 200) == 32


def test_the_stretch_limit_keeps_short_rows_out_of_batches_of_long_rows() -> None:
    """Rows of 10 and 200 tokens queued together, a call costing more than any padding: no call pads a 10 to 200
    (2 x 10 + 64 < 200); without the limit they share calls."""

    async def go(stretch: float | None) -> list[tuple[int, int]]:
        backend = FakeBackend(delay=0.02)
        batcher = _batcher(backend, max_batch_size=8, max_wait_s=0, max_stretch=stretch, call_overhead_tokens=100_000)
        await batcher.start()
        deadline = time.perf_counter() + 10
        blocker = asyncio.ensure_future(batcher.submit([feat(7, 98)], deadline))
        await asyncio.sleep(0.005)
        lengths = [200, 10, 200, 10, 200, 10]
        await asyncio.gather(blocker, *(batcher.submit([feat(n, i)], deadline) for i, n in enumerate(lengths)))
        await batcher.close()
        return backend.calls[1:]

    assert sorted(asyncio.run(go(2.0))) == [(3, 10), (3, 200)]
    assert asyncio.run(go(None)) == [(6, 200)]
    with pytest.raises(ValueError, match="max_stretch"):
        BatchConfig(max_stretch=0.5)


def _gated_run(hold_s: float, with_short: bool) -> tuple[int, list[float]]:
    """Two models on one gate, each running 2 calls at once: model A gets long requests (rows of 200), model B
    short ones (rows of 10) every 20 ms. Returns the most calls of long rows seen at once and B's latencies."""
    running = [0, 0]
    gate = LongBatchGate(short_width=128, hold_s=hold_s)

    async def go() -> list[float]:
        long_model = _batcher(
            CountingBackend(0.05, 128, running), gate, max_batch_size=2, max_wait_s=0, max_concurrency=2
        )
        short_model = _batcher(
            CountingBackend(0.005, 128, running), gate, max_batch_size=2, max_wait_s=0, max_concurrency=2
        )
        await long_model.start()
        await short_model.start()
        deadline = time.perf_counter() + 20
        latencies: list[float] = []

        async def short(i: int) -> None:
            start = time.perf_counter()
            await short_model.submit([feat(10, i)], deadline)
            latencies.append(time.perf_counter() - start)

        longs = [asyncio.ensure_future(long_model.submit([feat(200, i) for i in range(8)], deadline)) for _ in range(2)]
        shorts = []
        for i in range(15 if with_short else 0):
            shorts.append(asyncio.ensure_future(short(i)))
            await asyncio.sleep(0.02)
        await asyncio.gather(*longs, *shorts)
        await long_model.close()
        await short_model.close()
        return latencies

    latencies = asyncio.run(go())
    assert gate.short_in_progress == 0 and gate.long_running == 0
    return running[1], latencies


def test_while_short_requests_come_at_most_one_long_batch_runs_in_the_process() -> None:
    most_long, latencies = _gated_run(hold_s=1.0, with_short=True)
    assert most_long == 1
    # a short request never waits for a long call: its model has a free slot and the long model is held to one
    assert max(latencies) < 0.045, latencies


def test_without_short_requests_long_batches_use_every_slot() -> None:
    most_long, _ = _gated_run(hold_s=0.0, with_short=False)
    assert most_long == 2


def test_a_model_whose_requests_are_all_bulk_never_holds_its_long_batches_back() -> None:
    """QA-like: one model gets requests of 10 tokens among requests of 200. Counted as short, the 10-token ones
    hold the 200-token batches to one at a time; with `short_requests=False` both slots run long batches."""

    async def go(short_requests: bool) -> int:
        running = [0, 0]
        gate = LongBatchGate(short_width=128, hold_s=1.0)
        backend = CountingBackend(0.03, 128, running)
        model = Batcher(
            "qa",
            backend,
            BatchConfig(max_batch_size=2, max_wait_s=0, max_concurrency=2),
            output_names=("logits", "tokens"),
            sequence_outputs=("tokens",),
            gate=gate,
            short_requests=short_requests,
        )
        await model.start()
        deadline = time.perf_counter() + 20
        submits = [model.submit([feat(200 if i % 3 else 10, i)], deadline) for i in range(24)]
        await asyncio.gather(*submits)
        await model.close()
        assert gate.short_in_progress == 0
        return running[1]

    assert asyncio.run(go(short_requests=True)) == 1
    assert asyncio.run(go(short_requests=False)) == 2


class TokenTimedBackend(FakeBackend):
    """A FakeBackend whose call takes `per_token` seconds per padded token (as a CPU runtime's does)."""

    def __init__(self, per_token: float) -> None:
        super().__init__()
        self.per_token = per_token

    async def __call__(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.delay = self.per_token * arrays["input_ids"].size
        return await super().__call__(arrays)


def _same_model_run(gate: LongBatchGate | None) -> tuple[list[tuple[int, int]], list[float]]:
    """One model, one call at a time: a request of 8 rows of 200 tokens, then short ones (10 tokens) every 20 ms.
    Returns the calls' shapes and the short requests' latencies."""
    backend = TokenTimedBackend(per_token=25e-6)  # a row of 200: 5 ms; 8 of them: 40 ms

    async def go() -> list[float]:
        batcher = _batcher(backend, gate, max_batch_size=8, max_wait_s=0)
        await batcher.start()
        deadline = time.perf_counter() + 20
        latencies: list[float] = []

        async def short(i: int) -> None:
            start = time.perf_counter()
            await batcher.submit([feat(10, i)], deadline)
            latencies.append(time.perf_counter() - start)

        shorts = [asyncio.ensure_future(short(0))]
        await asyncio.sleep(0.002)  # the short request is in progress when the long one comes
        long = asyncio.ensure_future(batcher.submit([feat(200, i) for i in range(8)], deadline))
        for i in range(1, 6):
            await asyncio.sleep(0.02)
            shorts.append(asyncio.ensure_future(short(i)))
        await asyncio.gather(long, *shorts)
        await batcher.close()
        return latencies

    latencies = asyncio.run(go())
    return backend.calls, latencies


def test_while_short_requests_come_a_long_batch_holds_at_most_the_priority_tokens() -> None:
    """Beside short requests a long request's rows run one call of at most `long_tokens` at a time, so a short one
    waits on one row (5 ms) at most; without the gate its rows run as one call of 8 (40 ms) that a short one waits
    behind."""
    calls, latencies = _same_model_run(LongBatchGate(short_width=128, long_tokens=256))
    assert [shape for shape in calls if shape[1] == 200] == [(1, 200)] * 8
    assert max(latencies) < 0.02, latencies
    calls, latencies = _same_model_run(None)
    assert (8, 200) in calls
    assert max(latencies) > 0.015, latencies  # one arrived halfway through the 40-ms call


def test_many_short_rows_are_bulk_work_and_short_requests_are_batched_apart() -> None:
    """A request of 16 sentences (more rows than short_rows) is bulk work: beside short requests its rows run in calls
    of at most long_tokens, and a short request's rows never share a call with them."""
    backend = TokenTimedBackend(per_token=1e-4)
    gate = LongBatchGate(short_width=128, short_rows=8, long_tokens=20)

    async def go() -> None:
        batcher = _batcher(backend, gate, max_batch_size=8, max_wait_s=0)
        await batcher.start()
        deadline = time.perf_counter() + 20
        first = asyncio.ensure_future(batcher.submit([feat(10, 99)], deadline))
        await asyncio.sleep(0.002)
        bulk = asyncio.ensure_future(batcher.submit([feat(10, 100 + i) for i in range(16)], deadline))
        shorts = []
        for i in range(4):
            await asyncio.sleep(0.003)
            shorts.append(asyncio.ensure_future(batcher.submit([feat(10, i)], deadline)))
        await asyncio.gather(first, bulk, *shorts)
        await batcher.close()

    asyncio.run(go())
    bulk_ids = {feat(10, 100 + i).input_ids[0] for i in range(16)}
    calls, start = [], 0
    for rows, _ in backend.calls:
        calls.append([token in bulk_ids for token in backend.seen_ids[start : start + rows]])
        start += rows
    assert sum(map(sum, calls)) == 16
    assert all(len(set(kinds)) == 1 for kinds in calls), calls  # no call mixes bulk and short rows
    assert all(len(kinds) <= 2 for kinds in calls if kinds[0]), calls  # 2 x 10 tokens fit long_tokens


def test_short_requests_go_ahead_of_a_held_long_batch_and_held_long_batches_take_turns() -> None:
    """Two models on one gate, each with a bulk request of 12 rows of 200 tokens (a call of one row: 20 ms); model
    B also gets short requests. B's short rows run while B's long batch is held for A's, and the two models' long
    batches alternate instead of A's keeping the one long slot until its request is done."""
    gate = LongBatchGate(short_width=128, long_tokens=200)
    finished: dict[str, float] = {}

    async def go() -> list[float]:
        a = _batcher(TokenTimedBackend(1e-4), gate, max_batch_size=8, max_wait_s=0)
        b = _batcher(TokenTimedBackend(1e-4), gate, max_batch_size=8, max_wait_s=0)
        await a.start()
        await b.start()
        deadline = time.perf_counter() + 20
        start = time.perf_counter()
        latencies: list[float] = []

        async def bulk(name: str, batcher: Batcher) -> None:
            await batcher.submit([feat(200, i) for i in range(12)], deadline)
            finished[name] = time.perf_counter() - start

        async def short(i: int) -> None:
            begun = time.perf_counter()
            await b.submit([feat(10, i)], deadline)
            latencies.append(time.perf_counter() - begun)

        first = asyncio.ensure_future(short(0))
        await asyncio.sleep(0.002)
        bulks = [asyncio.ensure_future(bulk("a", a))]
        await asyncio.sleep(0.005)
        bulks.append(asyncio.ensure_future(bulk("b", b)))
        shorts = [first]
        for i in range(1, 12):
            await asyncio.sleep(0.02)
            shorts.append(asyncio.ensure_future(short(i)))
        await asyncio.gather(*bulks, *shorts)
        await a.close()
        await b.close()
        return latencies

    latencies = asyncio.run(go())
    assert max(latencies) < 0.06, latencies  # at most one long call (20 ms) ahead of a short one, plus its own
    # turns: B's long batches are not all kept waiting until A's request is done (then A ends 0.23 s before B)
    assert finished["b"] - finished["a"] < 0.17, finished


def test_rows_held_back_for_another_model_do_not_run_back_to_back_ahead_of_short_requests() -> None:
    """A bulk request waits while another model's long batch holds the one long slot, and the short requests that
    come meanwhile move the virtual time on, so its held rows keep the earliest tags. Once the slot is free, a short
    request still waits on at most one long call (20 ms) before its own, not on every held row (8: 0.16 s)."""
    gate = LongBatchGate(short_width=128, long_tokens=200)

    async def go() -> list[float]:
        batcher = _batcher(TokenTimedBackend(1e-4), gate, max_batch_size=8, max_wait_s=0)
        await batcher.start()
        deadline = time.perf_counter() + 20
        latencies: list[tuple[float, float]] = []

        async def short(i: int) -> None:
            begun = time.perf_counter()
            await batcher.submit([feat(10, i)], deadline)
            latencies.append((begun, time.perf_counter() - begun))

        gate.long_started()  # another model's long batch
        shorts = [asyncio.ensure_future(short(0))]
        await asyncio.sleep(0.002)
        bulk = asyncio.ensure_future(batcher.submit([feat(200, i) for i in range(8)], deadline))
        for i in range(1, 40):
            await asyncio.sleep(0.005)
            shorts.append(asyncio.ensure_future(short(i)))
        gate.long_ended()
        opened = time.perf_counter()
        for i in range(40, 80):
            await asyncio.sleep(0.005)
            shorts.append(asyncio.ensure_future(short(i)))
        await asyncio.gather(bulk, *shorts)
        await batcher.close()
        return [latency for begun, latency in latencies if begun > opened]

    after = asyncio.run(go())
    assert max(after) < 0.06, sorted(after)[-5:]


def test_a_request_of_several_rows_is_not_starved_by_a_stream_of_one_row_requests() -> None:
    """A request of 3 long rows (one a call: the token budget) beside 16 closed-loop clients of one short row each:
    its rows wait a bounded number of calls, not until the stream stops (each new one-row request used to get the
    virtual time of the last call, ahead of the request's later rows, for as long as requests kept coming)."""
    backend = FakeBackend(delay=0.005)

    async def go() -> float:
        batcher = _batcher(backend, max_batch_size=4, max_wait_s=0, max_batch_tokens=256)
        await batcher.start()
        deadline = time.perf_counter() + 20
        stop = time.perf_counter() + 1.0

        async def client(i: int) -> None:
            while time.perf_counter() < stop:
                await batcher.submit([feat(10, i)], deadline)

        clients = [asyncio.ensure_future(client(i)) for i in range(16)]
        await asyncio.sleep(0.05)
        start = time.perf_counter()
        await batcher.submit([feat(200, 100 + i) for i in range(3)], deadline)
        waited = time.perf_counter() - start
        await asyncio.gather(*clients)
        await batcher.close()
        return waited

    assert asyncio.run(go()) < 0.2  # a few calls of 5 ms; starved, it waited for the stream's end (~0.95 s)
