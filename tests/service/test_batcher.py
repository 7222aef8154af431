"""The batcher with a fake backend: batching proof, bounds, deadlines, failure isolation, output checks."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import grpc
import numpy as np
import pytest

from service.engine.batcher import BatchConfig, Batcher
from service.errors import (
    BackendBroken,
    BackendError,
    BackendUnavailable,
    DeadlineExceeded,
    Internal,
    InvalidInput,
    ModelFailed,
    NotReady,
    Overloaded,
    grpc_status,
    http_status,
)


@dataclass
class Feat:
    input_ids: list[int]
    token_type_ids: list[int]


def feat(length: int, seed: int = 0) -> Feat:
    rng = np.random.default_rng(seed)
    return Feat(list(rng.integers(5, 1000, size=length)), [0] * length)


class FakeBackend:
    """logits = a deterministic function of each row's real tokens (so batching must not change results)."""

    def __init__(self, delay: float = 0.0, fail_when: int | None = None) -> None:
        self.calls: list[tuple[int, int]] = []
        self.seen_ids: list[int] = []
        self.delay = delay
        self.fail_when = fail_when

    async def __call__(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        ids, mask = arrays["input_ids"], arrays["attention_mask"]
        self.calls.append(ids.shape)
        self.seen_ids += [int(row[0]) for row in ids]
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.fail_when is not None and self.fail_when in ids:
            raise RuntimeError("boom")
        real = (ids * mask).astype(np.float64)
        logits = np.stack([real.sum(1), mask.sum(1)], axis=1)
        tokens = real[:, :, None] * np.ones((1, 1, 2))
        return {"logits": logits, "tokens": tokens}


def make(backend, **config) -> Batcher:  # type: ignore[no-untyped-def]
    return Batcher("m", backend, BatchConfig(**config), output_names=("logits", "tokens"), sequence_outputs=("tokens",))


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


def test_64_concurrent_requests_share_few_backend_calls_with_identical_results() -> None:
    features = [[feat(5 + i % 20, seed=i)] for i in range(64)]

    async def go(batching: bool) -> tuple[list, int]:
        backend = FakeBackend(delay=0.005)
        # a call costs more than any padding here: batches fill (the cost of padding: test_cheapest_run...)
        config = {"max_batch_size": 32, "max_wait_s": 0.005, "call_overhead_tokens": 10_000} if batching else {
            "max_batch_size": 1, "max_wait_s": 0}  # fmt: skip
        batcher = make(backend, **config)
        await batcher.start()
        deadline = time.perf_counter() + 10
        results = await asyncio.gather(*(batcher.submit(f, deadline) for f in features))
        await batcher.close()
        return [r.outputs for r in results], len(backend.calls)

    batched, batched_calls = run(go(True))
    alone, alone_calls = run(go(False))
    assert alone_calls == 64
    assert batched_calls <= 4, batched_calls
    for a, b, f in zip(batched, alone, features, strict=True):
        np.testing.assert_array_equal(a[0]["logits"], b[0]["logits"])
        np.testing.assert_array_equal(a[0]["tokens"], b[0]["tokens"])  # sequence outputs trimmed to each row
        assert a[0]["tokens"].shape[0] == len(f[0].input_ids)


def test_token_budget_and_length_bucketing() -> None:
    async def go() -> FakeBackend:
        backend = FakeBackend(delay=0.01)
        batcher = make(backend, max_batch_size=64, max_batch_tokens=200, max_wait_s=0.02)
        await batcher.start()
        deadline = time.perf_counter() + 10
        lengths = [10] * 10 + [100] * 2 + [10] * 10
        await asyncio.gather(*(batcher.submit([feat(n, i)], deadline) for i, n in enumerate(lengths)))
        await batcher.close()
        return backend

    backend = run(go())
    for rows, width in backend.calls:
        assert rows * width <= 200 or rows == 1
    # the two long rows never pad the 20 short ones
    assert all(width == 10 for rows, width in backend.calls if rows > 2)


@pytest.mark.parametrize(("window", "first_batch"), [(None, (4, 10)), (4, (4, 50))])
def test_batch_window_cuts_batches_from_the_oldest_features(window: int | None, first_batch: tuple[int, int]) -> None:
    """Queued behind a running call: lengths 10, 50, then six more 10s. The whole queue gives a batch of four 10s
    (the 50 waits); a window of the 4 oldest takes the 50 with its elders, padded to 50."""

    async def go() -> list[tuple[int, int]]:
        backend = FakeBackend(delay=0.05)
        batcher = make(backend, max_batch_size=4, max_wait_s=0, window=window, call_overhead_tokens=10_000)
        await batcher.start()
        deadline = time.perf_counter() + 10
        blocker = asyncio.create_task(batcher.submit([feat(7, 99)], deadline))
        await asyncio.sleep(0.01)  # the blocker's call is running: the rest queue up
        lengths = [10, 50, 10, 10, 10, 10, 10, 10]
        await asyncio.gather(blocker, *(batcher.submit([feat(n, i)], deadline) for i, n in enumerate(lengths)))
        await batcher.close()
        return backend.calls

    calls = run(go())
    assert calls[0] == (1, 7) and calls[1] == first_batch, calls
    assert sum(rows for rows, _ in calls) == 9


def test_batch_window_smaller_than_a_batch_is_refused() -> None:
    with pytest.raises(ValueError, match="window must be at least max_batch_size"):
        BatchConfig(max_batch_size=8, window=4)
    from service.settings import ServiceSettings

    with pytest.raises(ValueError, match=r"batch_window \(4\) must be at least max_batch_size \(8\)"):
        ServiceSettings(batch_window=4)


def test_full_queue_rejects_at_once() -> None:
    async def go() -> tuple[int, int, float]:
        backend = FakeBackend(delay=0.05)
        batcher = make(backend, max_batch_size=4, max_queue=8, max_wait_s=0)
        await batcher.start()
        deadline = time.perf_counter() + 10
        tasks = [asyncio.create_task(batcher.submit([feat(4, i)], deadline)) for i in range(40)]
        start = time.perf_counter()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        rejected = [r for r in results if isinstance(r, Overloaded)]
        fast = time.perf_counter() - start
        await batcher.close()
        return len(rejected), sum(not isinstance(r, Exception) for r in results), fast

    rejected, ok, _ = run(go())
    assert rejected >= 20 and ok >= 8 and rejected + ok == 40


def test_request_bigger_than_the_queue_is_invalid() -> None:
    async def go() -> None:
        batcher = make(FakeBackend(), max_queue=4)
        await batcher.start()
        with pytest.raises(InvalidInput, match="more than this model's queue"):
            await batcher.submit([feat(3)] * 5, time.perf_counter() + 1)
        await batcher.close()

    run(go())


def test_expired_requests_are_dropped_before_compute() -> None:
    async def go() -> FakeBackend:
        backend = FakeBackend(delay=0.2)
        batcher = make(backend, max_batch_size=1, max_wait_s=0)
        await batcher.start()
        now = time.perf_counter()
        first = asyncio.create_task(batcher.submit([Feat([7] * 3, [0] * 3)], now + 5))
        await asyncio.sleep(0.01)  # the first batch is now running for 200 ms
        with pytest.raises(DeadlineExceeded, match="deadline"):
            await batcher.submit([Feat([9] * 3, [0] * 3)], time.perf_counter() + 0.05)
        await first
        await asyncio.sleep(0.3)
        await batcher.close()
        return backend

    backend = run(go())
    assert backend.seen_ids == [7]  # the expired request never reached the backend


def test_cancelled_caller_is_dropped_before_compute() -> None:
    async def go() -> FakeBackend:
        backend = FakeBackend(delay=0.1)
        batcher = make(backend, max_batch_size=1, max_wait_s=0)
        await batcher.start()
        first = asyncio.create_task(batcher.submit([Feat([7] * 3, [0] * 3)], time.perf_counter() + 5))
        await asyncio.sleep(0.01)
        gone = asyncio.create_task(batcher.submit([Feat([9] * 3, [0] * 3)], time.perf_counter() + 5))
        await asyncio.sleep(0.01)
        gone.cancel()
        await first
        await asyncio.sleep(0.15)
        await batcher.close()
        return backend

    assert run(go()).seen_ids == [7]


def test_backend_failure_fails_only_its_batch() -> None:
    async def go() -> list:
        backend = FakeBackend(delay=0.01, fail_when=666)
        batcher = make(backend, max_batch_size=2, max_wait_s=0.01)
        await batcher.start()
        deadline = time.perf_counter() + 10
        poisoned = Feat([666, 5], [0, 0])
        jobs = [[feat(3, 1)], [poisoned], [feat(3, 2)], [feat(3, 3)], [feat(3, 4)]]
        results = await asyncio.gather(*(batcher.submit(j, deadline) for j in jobs), return_exceptions=True)
        after = await batcher.submit([feat(3, 5)], time.perf_counter() + 10)  # still serving
        await batcher.close()
        return [*results, after]

    results = run(go())
    failed = [r for r in results if isinstance(r, Exception)]
    assert all(isinstance(r, BackendError) and "boom" in str(r) for r in failed)
    assert 1 <= len(failed) <= 2  # the poisoned request and at most its batch-mate
    assert isinstance(results[1], BackendError)
    assert not isinstance(results[-1], Exception)


@pytest.mark.parametrize(
    "bad",
    [
        lambda o: {"logits": o["logits"][:-1], "tokens": o["tokens"]},  # one row missing
        lambda o: {"tokens": o["tokens"]},  # an output missing
        lambda o: {"logits": o["logits"], "tokens": o["tokens"][:, :1]},  # sequence too short
    ],
)
def test_outputs_must_match_inputs_one_to_one(bad) -> None:  # type: ignore[no-untyped-def]
    async def go() -> None:
        fake = FakeBackend()

        async def broken(arrays):  # type: ignore[no-untyped-def]
            return bad(await fake(arrays))

        batcher = make(broken, max_batch_size=4, max_wait_s=0.005)
        await batcher.start()
        deadline = time.perf_counter() + 5
        results = await asyncio.gather(
            *(batcher.submit([feat(4, i), feat(6, i)], deadline) for i in range(3)), return_exceptions=True
        )
        assert all(isinstance(r, BackendError) for r in results)
        await batcher.close()

    run(go())


def test_passthrough_sends_each_request_as_one_call() -> None:
    async def go() -> FakeBackend:
        backend = FakeBackend(delay=0.01)
        batcher = make(backend, passthrough=True, max_queue=100)
        await batcher.start()
        deadline = time.perf_counter() + 5
        results = await asyncio.gather(*(batcher.submit([feat(3, i), feat(5, i)], deadline) for i in range(10)))
        assert all(len(r.outputs) == 2 for r in results)
        await batcher.close()
        return backend

    backend = run(go())
    assert sorted(backend.calls) == [(2, 5)] * 10


def test_batch_config_is_validated() -> None:
    with pytest.raises(ValueError, match="max_batch_size"):
        BatchConfig(max_batch_size=0)
    with pytest.raises(ValueError, match="max_wait_s"):
        BatchConfig(max_wait_s=-1)


def test_padding_limit_keeps_batches_tight() -> None:
    async def go() -> FakeBackend:
        backend = FakeBackend(delay=0.01)
        batcher = make(backend, max_batch_size=64, max_wait_s=0.02, max_padding=0.25)
        await batcher.start()
        deadline = time.perf_counter() + 10
        lengths = [10, 11, 12, 40, 41, 42, 10, 11, 40]
        await asyncio.gather(*(batcher.submit([feat(n, i)], deadline) for i, n in enumerate(lengths)))
        await batcher.close()
        return backend

    backend = run(go())
    assert sorted(backend.calls) == [(4, 42), (5, 12)]  # short and long rows never share a batch


def test_width_is_rounded_up_to_the_backends_multiple_within_the_graph_length() -> None:
    """Rows of 5..24 tokens padded to multiples of 16, rows near the graph's 40 tokens to 40 (not 48); every
    request's outputs equal those of an unpadded call, trimmed to its own tokens."""
    lengths = [5, 16, 17, 24, 33, 39, 40]

    async def go(multiple: int) -> tuple[list, FakeBackend]:
        backend = FakeBackend()
        batcher = make(backend, max_batch_size=1, max_wait_s=0, width_multiple=multiple, max_width=40)
        await batcher.start()
        deadline = time.perf_counter() + 10
        results = [await batcher.submit([feat(n, i)], deadline) for i, n in enumerate(lengths)]
        await batcher.close()
        return [r.outputs[0] for r in results], backend

    rounded, rounded_backend = run(go(16))
    exact, exact_backend = run(go(1))
    assert [width for _, width in rounded_backend.calls] == [16, 16, 32, 32, 40, 40, 40]
    assert [width for _, width in exact_backend.calls] == lengths
    for a, b, n in zip(rounded, exact, lengths, strict=True):
        np.testing.assert_array_equal(a["logits"], b["logits"])
        np.testing.assert_array_equal(a["tokens"], b["tokens"])
        assert a["tokens"].shape[0] == n


def test_rounded_width_counts_against_the_token_budget_but_not_the_padding_limit() -> None:
    """Four rows of 17 tokens under a budget of 80 tokens: unrounded they fit one call (4 x 17 = 68), rounded to 32
    only two do (3 x 32 = 96); the padding limit of 0 still lets equal rows share a call (rounding is not their
    padding)."""

    async def go(**config: object) -> FakeBackend:
        backend = FakeBackend(delay=0.02)
        batcher = make(backend, **{"max_batch_size": 8, "max_wait_s": 0.01, "width_multiple": 16, **config})
        await batcher.start()
        deadline = time.perf_counter() + 10
        await asyncio.gather(*(batcher.submit([feat(17, i)], deadline) for i in range(4)))
        await batcher.close()
        return backend

    assert sorted(run(go(max_batch_tokens=80)).calls) == [(2, 32), (2, 32)]
    assert run(go(max_batch_tokens=80, width_multiple=1)).calls == [(4, 17)]
    assert run(go(max_padding=0.0)).calls == [(4, 32)]


def test_width_multiple_must_be_positive() -> None:
    with pytest.raises(ValueError, match="width_multiple"):
        BatchConfig(width_multiple=0)


def test_requests_queued_at_close_and_after_it_get_not_ready() -> None:
    """A stop finishes the running batch; what still waits, and what comes after, hear 'shutting down'
    (NotReady: HTTP 503 / gRPC UNAVAILABLE), not an internal error."""

    async def scenario() -> tuple[list[object], Exception]:
        batcher = make(FakeBackend(delay=0.2), max_batch_size=1, max_concurrency=1, max_wait_s=0)
        await batcher.start()
        deadline = time.perf_counter() + 10
        tasks = [asyncio.create_task(batcher.submit([feat(4, seed=i)], deadline)) for i in range(3)]
        await asyncio.sleep(0.05)  # the first runs, the other two wait
        await batcher.close()
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        try:
            await batcher.submit([feat(4)], deadline)
        except Exception as error:
            return outcomes, error
        raise AssertionError("a closed batcher took a request")

    outcomes, after = run(scenario())
    assert not isinstance(outcomes[0], Exception)
    assert all(isinstance(o, NotReady) and "shut" in str(o) for o in outcomes[1:]), outcomes
    assert isinstance(after, NotReady)
    assert http_status(after) == 503 and grpc_status(after) == grpc.StatusCode.UNAVAILABLE


def test_a_batch_with_nothing_beside_it_goes_to_run_alone() -> None:
    """run_alone gets a batch only when no other batch runs and nothing waits: one request at a time always; in a
    burst, the first batch (cut while the others had not arrived yet) at most, and none while the queue is full."""

    async def go() -> tuple[int, int, int, int]:
        streams, lone = FakeBackend(delay=0.01), FakeBackend(delay=0.01)
        batcher = Batcher(
            "m", streams, BatchConfig(max_batch_size=4, max_wait_s=0, max_concurrency=2),
            output_names=("logits", "tokens"), sequence_outputs=("tokens",), run_alone=lone,
        )  # fmt: skip
        await batcher.start()
        try:
            deadline = time.perf_counter() + 10
            for i in range(3):  # one after the other: each alone
                await batcher.submit([feat(6 + i, seed=i)], deadline)
            sequential = (len(lone.calls), len(streams.calls))
            burst = [batcher.submit([feat(5 + i % 7, seed=i)], deadline) for i in range(24)]
            results = await asyncio.gather(*burst)
            assert all(r.outputs for r in results)
            return (*sequential, len(lone.calls) - sequential[0], len(streams.calls) - sequential[1])
        finally:
            await batcher.close()

    alone_sequential, streams_sequential, alone_burst, streams_burst = run(go())
    assert (alone_sequential, streams_sequential) == (3, 0)
    assert alone_burst <= 1 and streams_burst >= 5  # 24 features in batches of 4: at least 5 beside others


# ---- failure paths: every caller answered at once, a model that fails for good says so ----------------------
def test_an_exception_in_padding_fails_only_its_batch_at_once_and_the_loop_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Padding that raises on the batch holding id 666: its callers get Internal (500 / INTERNAL, with the id its
    traceback is logged with) at once, not at their deadline; the batch after it is served."""
    import service.engine.batcher

    real_pad = service.engine.batcher.pad_rows

    def pad_rows(ids, *args):  # type: ignore[no-untyped-def]
        if any(666 in row for row in ids):
            raise RuntimeError("padding bug")
        return real_pad(ids, *args)

    monkeypatch.setattr(service.engine.batcher, "pad_rows", pad_rows)

    async def go() -> tuple[list[object], float, object]:
        batcher = make(FakeBackend(), max_batch_size=4, max_wait_s=0.01)
        await batcher.start()
        try:
            deadline = time.perf_counter() + 5
            start = time.perf_counter()
            jobs = [[Feat([666, 5], [0, 0])], [feat(3, 1)]]
            failed = await asyncio.gather(*(batcher.submit(j, deadline) for j in jobs), return_exceptions=True)
            elapsed = time.perf_counter() - start
            after = await batcher.submit([feat(3, 2)], time.perf_counter() + 5)
            return failed, elapsed, after
        finally:
            await batcher.close()

    failed, elapsed, after = run(go())
    assert elapsed < 4.0, elapsed  # answered, not left to the 5 s deadline
    assert all(isinstance(error, Internal) for error in failed), failed
    error = failed[0]
    assert isinstance(error, Internal) and error.code == "internal" and error.error_id in error.message
    assert http_status(error) == 500 and grpc_status(error) == grpc.StatusCode.INTERNAL
    assert not isinstance(after, Exception) and len(after.outputs) == 1


def test_a_killed_batch_loop_answers_its_waiters_at_once_and_fails_the_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """The loop task dies (its batch cutting raises): every waiting caller gets ModelFailed (503 / UNAVAILABLE)
    at once (not at their deadline), the failure hook hears it once, and later requests are refused before any work."""

    def broken_cut(self: Batcher, *_: object) -> list:  # type: ignore[type-arg]
        raise RuntimeError("loop killed by the test")

    monkeypatch.setattr(Batcher, "_take_batch", broken_cut)
    heard: list[tuple[str, str]] = []

    async def go() -> tuple[list[object], float, Batcher]:
        batcher = Batcher(
            "m", FakeBackend(), BatchConfig(max_batch_size=4, max_wait_s=0.01), output_names=("logits", "tokens"),
            on_failure=lambda model, reason: heard.append((model, reason)),
        )  # fmt: skip
        await batcher.start()
        try:
            deadline = time.perf_counter() + 5
            start = time.perf_counter()
            outcomes = await asyncio.gather(
                *(batcher.submit([feat(3, i)], deadline) for i in range(3)), return_exceptions=True
            )
            return outcomes, time.perf_counter() - start, batcher
        finally:
            await batcher.close()

    outcomes, elapsed, batcher = run(go())
    assert elapsed < 4.0, elapsed  # answered, not left to the 5 s deadline
    assert all(isinstance(o, ModelFailed) for o in outcomes), outcomes
    assert http_status(outcomes[0]) == 503 and grpc_status(outcomes[0]) == grpc.StatusCode.UNAVAILABLE  # type: ignore[arg-type]
    assert len(heard) == 1 and heard[0][0] == "m" and "loop killed by the test" in heard[0][1]
    assert batcher.failure == heard[0][1]
    with pytest.raises(ModelFailed):
        batcher.reserve(1)


def test_a_backend_that_reports_itself_broken_fails_the_model_at_once() -> None:
    class Broken(FakeBackend):
        async def __call__(self, arrays):  # type: ignore[no-untyped-def]
            await super().__call__(arrays)
            raise BackendBroken("the runtime is gone")

    heard: list[str] = []

    async def go() -> tuple[object, object]:
        batcher = Batcher(
            "m", Broken(delay=0.05), BatchConfig(max_batch_size=1, max_wait_s=0), output_names=("logits",),
            on_failure=lambda model, reason: heard.append(reason),
        )  # fmt: skip
        await batcher.start()
        try:
            deadline = time.perf_counter() + 5
            outcomes = await asyncio.gather(
                *(batcher.submit([feat(3, i)], deadline) for i in range(3)), return_exceptions=True
            )
            try:
                await batcher.submit([feat(3)], deadline)
            except ModelFailed as error:
                return outcomes, error
            raise AssertionError("a failed model took a request")
        finally:
            await batcher.close()

    outcomes, later = run(go())
    assert isinstance(outcomes[0], BackendBroken)  # the batch that ran hears the backend's own 503
    assert all(isinstance(o, ModelFailed) for o in outcomes[1:]), outcomes  # the waiting ones: failed at once
    assert heard == ["the backend reports itself broken: the runtime is gone"]
    assert isinstance(later, ModelFailed)


def test_consecutive_failed_batches_fail_the_model_and_busy_answers_do_not_count() -> None:
    """With a limit of 3: two failures, a success, two failures, two Overloaded answers and two from a backend
    that is away (BackendUnavailable) leave it serving; the third failure in a row fails it."""
    script = ["fail", "fail", "ok", "fail", "fail", "busy", "busy", "away", "away", "fail", "ok"]

    class Scripted(FakeBackend):
        async def __call__(self, arrays):  # type: ignore[no-untyped-def]
            step = script[len(self.calls)]
            out = await super().__call__(arrays)
            if step == "fail":
                raise RuntimeError("bad batch")
            if step == "busy":
                raise Overloaded("busy")
            if step == "away":
                raise BackendUnavailable("triton does not answer")
            return out

    heard: list[str] = []

    async def go() -> list[object]:
        batcher = Batcher(
            "m", Scripted(), BatchConfig(max_batch_size=1, max_wait_s=0, max_consecutive_failures=3),
            output_names=("logits",), on_failure=lambda model, reason: heard.append(reason),
        )  # fmt: skip
        await batcher.start()
        outcomes: list[object] = []
        try:
            for i in range(len(script)):
                try:
                    outcomes.append(await batcher.submit([feat(3, i)], time.perf_counter() + 5))
                except Exception as error:
                    outcomes.append(error)
            return outcomes
        finally:
            await batcher.close()

    outcomes = run(go())
    kinds = [type(o).__name__ for o in outcomes]
    failing, busy, away = ["BackendError"] * 2, ["Overloaded"] * 2, ["BackendUnavailable"] * 2
    assert kinds == [*failing, "BatchResult", *failing, *busy, *away, "BackendError", "ModelFailed"], kinds
    assert len(heard) == 1 and heard[0].startswith("3 batches in a row failed") and "bad batch" in heard[0]


def test_delivered_rows_are_views_of_the_batch_outputs() -> None:
    """Each request's rows are slices of the arrays the backend returned (no copy on the event loop), still
    trimmed to the row's own tokens and one per input."""
    returned: list[dict[str, np.ndarray]] = []

    async def keep(arrays):  # type: ignore[no-untyped-def]
        outputs = await FakeBackend()(arrays)
        returned.append(outputs)
        return outputs

    async def go() -> list:
        batcher = make(keep, max_batch_size=8, max_wait_s=0.01)
        await batcher.start()
        try:
            deadline = time.perf_counter() + 5
            return await asyncio.gather(*(batcher.submit([feat(3 + i, i)], deadline) for i in range(4)))
        finally:
            await batcher.close()

    results = run(go())
    assert len(returned) == 1
    for i, result in enumerate(results):
        (row,) = result.outputs
        assert np.shares_memory(row["logits"], returned[0]["logits"])
        assert np.shares_memory(row["tokens"], returned[0]["tokens"]) and row["tokens"].shape[0] == 3 + i


def test_cheapest_run_cuts_where_padding_costs_more_than_a_call() -> None:
    """Around the anchor the batch is the run of sorted lengths with the least (overhead + padded) per real token."""
    batcher = make(FakeBackend(), max_batch_size=8, call_overhead_tokens=16)
    lengths = [10, 10, 10, 11, 12, 40, 41, 42]
    # the 10s batch together; padding them to 40 costs more than a call of the 40s of their own
    assert batcher._cheapest_run(lengths, 0, 16384) == (0, 4)
    assert batcher._cheapest_run(lengths, 6, 16384) == (5, 7)
    # a call that costs nothing: each row alone pads nothing
    free = make(FakeBackend(), max_batch_size=8, call_overhead_tokens=0)
    assert free._cheapest_run([10, 20, 30], 1, 16384) == (1, 1)
    # a call that costs more than any padding: the batch fills, within the token budget
    dear = make(FakeBackend(), max_batch_size=8, call_overhead_tokens=10_000)
    assert dear._cheapest_run(lengths, 0, 16384) == (0, 7)
    assert dear._cheapest_run(lengths, 0, 8 * 12) == (0, 4)  # 5 rows x 12 <= 96 < 6 x 40
    with pytest.raises(ValueError, match="call_overhead_tokens"):
        BatchConfig(call_overhead_tokens=-1)


def test_extra_outputs_are_fetched_only_for_the_batches_that_ask_for_them() -> None:
    """A request asking for an output beyond the model's usual ones gets it, cut to each input's tokens, from the
    batch it shares with a request that did not ask (which gets the usual ones only); a batch without such a
    request does not ask the backend for it."""
    asked: list[tuple[str, ...]] = []

    async def backend(arrays: dict[str, np.ndarray], extra_outputs: tuple[str, ...] = ()) -> dict[str, np.ndarray]:
        asked.append(tuple(extra_outputs))
        ids = arrays["input_ids"].astype(np.float64)
        outputs = {"logits": ids.sum(axis=1, keepdims=True)}
        if "states" in extra_outputs:
            outputs["states"] = ids[:, :, None] * np.ones((1, 1, 3))
        return outputs

    async def go() -> tuple[object, object, object]:
        config = BatchConfig(max_batch_size=8, max_wait_s=0.02, call_overhead_tokens=10_000)
        batcher = Batcher("m", backend, config, output_names=("logits",), sequence_outputs=("states",))
        await batcher.start()
        deadline = time.perf_counter() + 10
        plain, extra = await asyncio.gather(
            batcher.submit([feat(5)], deadline),
            batcher.submit([feat(3, 1), feat(7, 2)], deadline, extra_outputs=("states",)),
        )
        later = await batcher.submit([feat(4, 3)], deadline)
        await batcher.close()
        return plain, extra, later

    plain, extra, later = run(go())
    assert asked == [("states",), ()]  # one batch of both requests, then one of the later request alone
    assert [set(out) for out in plain.outputs + later.outputs] == [{"logits"}, {"logits"}]  # type: ignore[attr-defined]
    states = [out["states"] for out in extra.outputs]  # type: ignore[attr-defined]
    assert [s.shape for s in states] == [(3, 3), (7, 3)]  # each input's own tokens, not the batch's padded width
    np.testing.assert_array_equal(states[1][:, 0], feat(7, 2).input_ids)
