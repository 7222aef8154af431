"""A backend call's fixed cost in tokens, measured at warm-up (`service.engine.call_cost`) and used by the batcher."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import numpy as np
import pytest

from service.engine.batcher import BatchConfig
from service.engine.call_cost import (
    MAX_OVERHEAD_TOKENS,
    MIN_OVERHEAD_TOKENS,
    PROBE_WIDTH,
    WIDTH_PROBES,
    measure_overhead_tokens,
    measure_width_multiple,
    overhead_tokens,
)
from service.engine.engine import Engine
from service.settings import ServiceSettings


def test_overhead_tokens_from_two_timings() -> None:
    # 1 row of 32: 6 ms; 8 rows of 32: 34 ms -> 0.125 ms a token, 2 ms fixed = 16 tokens
    assert overhead_tokens(0.006, 0.034, 8, 32) == 16
    assert overhead_tokens(0.004, 0.032, 8, 32) == 0  # no fixed cost at all
    assert overhead_tokens(0.010, 0.009, 8, 32) == MAX_OVERHEAD_TOKENS  # more rows took no longer
    assert overhead_tokens(1.0, 1.0 + 1e-6, 8, 32) == MAX_OVERHEAD_TOKENS  # capped


class _Clock:
    """A clock that a fake backend moves on by the time its call would take."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _backend(
    clock: _Clock, seconds: Callable[[int], float], shapes: list[tuple[int, ...]]
) -> Callable[[dict[str, np.ndarray]], Awaitable[dict[str, np.ndarray]]]:
    """A backend whose call on inputs of shape (rows, width) moves `clock` on by `seconds(rows x width)`."""

    async def infer(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        shapes.append(inputs["input_ids"].shape)
        clock.now += seconds(inputs["input_ids"].size)
        return {}

    return infer


def _feed(rows: int) -> dict[str, np.ndarray]:
    return {"input_ids": np.ones((rows, 32), dtype=np.int64)}


def test_measured_on_a_backend_whose_calls_cost_fixed_plus_per_token() -> None:
    """A backend of 20 ms per call plus 1 ms per padded token: 20 tokens of fixed cost."""
    clock, shapes = _Clock(), list[tuple[int, ...]]()
    infer = _backend(clock, lambda tokens: 0.020 + 1e-3 * tokens, shapes)
    assert asyncio.run(measure_overhead_tokens(infer, _feed, 4, 32, clock=clock)) == 20
    assert set(shapes) == {(1, 32), (4, 32)}
    assert asyncio.run(measure_overhead_tokens(infer, _feed, 1, 32, clock=clock)) == 0  # no batches


def test_an_estimate_under_the_floor_is_measured_again_and_kept_at_least_the_floor() -> None:
    """A backend of 5 ms per call + 0.1 ms per token (50 tokens of fixed cost) whose many-row calls are slowed by
    20 ms in the first probe (another process on the cores) seems to have none; the second probe finds its real
    cost. A backend that truly has none is kept at the floor."""
    clock, shapes = _Clock(), list[tuple[int, ...]]()

    def disturbed_at_first(tokens: int) -> float:
        slowed = len(shapes) <= 10 and tokens > 32
        return 0.005 + 1e-4 * tokens + (0.020 if slowed else 0.0)

    infer = _backend(clock, disturbed_at_first, shapes)
    assert asyncio.run(measure_overhead_tokens(infer, _feed, 4, 32, clock=clock)) == 50
    assert len(shapes) == 20  # measured twice
    no_fixed_cost = _backend(clock, lambda tokens: 2e-4 * tokens, [])
    assert asyncio.run(measure_overhead_tokens(no_fixed_cost, _feed, 4, 32, clock=clock)) == MIN_OVERHEAD_TOKENS


def test_the_engine_gives_each_batcher_the_cost_measured_on_its_backend(
    tiny_bundles: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """At warm-up the engine times the served backend on rows of the probe width and hands the estimate to the
    model's batcher; a server that does not batch keeps the default."""
    shapes: set[tuple[int, ...]] = set()
    start_batcher = Engine._start_batcher

    async def recording(self: Engine, bundle, pipeline, backend):  # type: ignore[no-untyped-def]
        infer = backend.infer

        async def recorded(inputs: dict[str, np.ndarray], *extra: object) -> dict[str, np.ndarray]:
            shapes.add(inputs["input_ids"].shape)
            return await infer(inputs, *extra)

        backend.infer = recorded
        return await start_batcher(self, bundle, pipeline, backend)

    monkeypatch.setattr(Engine, "_start_batcher", recording)

    async def measured(batching: bool) -> tuple[int, set[tuple[int, ...]]]:
        settings = ServiceSettings(models=[str(tiny_bundles["classify"])], batching=batching, warmup_rounds=1)
        engine = Engine(settings)
        await engine.load()
        try:
            (model,) = engine.models.values()
            return model.batcher.config.call_overhead_tokens, shapes
        finally:
            await engine.close()

    tokens, shapes = asyncio.run(measured(True))
    assert MIN_OVERHEAD_TOKENS <= tokens <= MAX_OVERHEAD_TOKENS
    assert (1, PROBE_WIDTH) in shapes and any(rows > 1 and width == PROBE_WIDTH for rows, width in shapes), shapes
    unbatched, _ = asyncio.run(measured(False))
    assert unbatched == BatchConfig().call_overhead_tokens  # the default: no batches to cut


def _width_feed(rows: int, tokens: int, width: int) -> dict[str, np.ndarray]:
    ids = np.zeros((rows, width), dtype=np.int64)
    ids[:, :tokens] = 1
    return {"input_ids": ids}


@pytest.mark.parametrize(
    ("seconds_per_width", "kept"),
    [
        (lambda width: 1e-3 * width, 1),  # every padded column costs: pad to the longest row
        (lambda width: 1e-3 * width * (0.6 if width % 16 == 0 else 1.0), 16),  # multiples of 16 run faster
        (lambda width: 5e-3, 16),  # the width does not matter: rounding costs nothing
    ],
)
def test_the_width_multiple_is_kept_where_rounded_batches_run_no_slower(
    seconds_per_width: Callable[[int], float], kept: int
) -> None:
    clock, shapes = _Clock(), list[tuple[int, ...]]()

    async def infer(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        shapes.append(inputs["input_ids"].shape)
        clock.now += seconds_per_width(inputs["input_ids"].shape[1])
        return {}

    multiple, ratio = asyncio.run(measure_width_multiple(infer, _width_feed, 16, clock=clock))
    assert multiple == kept
    assert (ratio > 1.0) == (kept == 1)
    assert {width for _, width in shapes} == {*WIDTH_PROBES, 32, 48, 64}  # each probe width and its rounding
    assert asyncio.run(measure_width_multiple(infer, _width_feed, 1, clock=clock)) == (1, 1.0)  # nothing to choose


@pytest.mark.parametrize(
    ("slow_widths", "pad_multiple", "kept"), [("rounded", None, 1), ("own", None, 16), ("rounded", 16, 16)]
)
def test_the_engine_keeps_a_backends_width_multiple_only_where_it_pays(
    tiny_bundles: dict[str, Path],
    monkeypatch: pytest.MonkeyPatch,
    slow_widths: str,
    pad_multiple: int | None,
    kept: int,
) -> None:
    """A backend that prefers widths of 16 (as OpenVINO's does on CPUs with VNNI or AMX) keeps them where its
    rounded batches run no slower at warm-up; a `pad_multiple` setting is kept as it is, unmeasured."""
    start_batcher = Engine._start_batcher

    async def preferring_16(self: Engine, bundle, pipeline, backend):  # type: ignore[no-untyped-def]
        infer = backend.infer

        async def timed(inputs: dict[str, np.ndarray], *extra: object) -> dict[str, np.ndarray]:
            width = inputs["input_ids"].shape[1]
            if (width % 16 == 0) == (slow_widths == "rounded") and width < PROBE_WIDTH * 2 + 1:
                await asyncio.sleep(0.02)
            return await infer(inputs, *extra)

        backend.infer = timed
        backend.width_multiple = 16
        return await start_batcher(self, bundle, pipeline, backend)

    monkeypatch.setattr(Engine, "_start_batcher", preferring_16)

    async def multiple() -> int:
        settings = ServiceSettings(models=[str(tiny_bundles["classify"])], warmup_rounds=1, pad_multiple=pad_multiple)
        engine = Engine(settings)
        await engine.load()
        try:
            (model,) = engine.models.values()
            return model.batcher.config.width_multiple
        finally:
            await engine.close()

    assert asyncio.run(multiple()) == kept


def test_the_width_probe_stays_within_the_served_length(
    tiny_bundles: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model served at 40 tokens is probed at width 20 against 32 only: 36 and 52 would round up past it."""
    widths: set[int] = set()
    start_batcher = Engine._start_batcher

    async def short_preferring_16(self: Engine, bundle, pipeline, backend):  # type: ignore[no-untyped-def]
        infer = backend.infer

        async def recorded(inputs: dict[str, np.ndarray], *extra: object) -> dict[str, np.ndarray]:
            widths.add(inputs["input_ids"].shape[1])
            return await infer(inputs, *extra)

        backend.infer = recorded
        backend.width_multiple = 16
        pipeline.max_seq_length = 40
        return await start_batcher(self, bundle, pipeline, backend)

    monkeypatch.setattr(Engine, "_start_batcher", short_preferring_16)

    async def load() -> None:
        engine = Engine(ServiceSettings(models=[str(tiny_bundles["classify"])], warmup_rounds=1))
        await engine.load()
        await engine.close()

    asyncio.run(load())
    assert {20, 32} <= widths and max(widths) <= 40, widths
