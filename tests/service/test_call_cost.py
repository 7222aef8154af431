"""A backend call's fixed cost in tokens, measured at warm-up (`service.engine.call_cost`)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import numpy as np
import pytest

from service.engine.call_cost import (
    MAX_OVERHEAD_TOKENS,
    MIN_OVERHEAD_TOKENS,
    measure_overhead_tokens,
    measure_width_multiple,
    overhead_tokens,
)


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


def _fake_backend(clock: _Clock, seconds: Callable[[int], float]) -> Callable[..., Awaitable[dict[str, np.ndarray]]]:
    async def infer(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        clock.now += seconds(inputs["input_ids"].shape[1])
        return {}

    return infer


def _rows_backend(
    clock: _Clock, seconds: Callable[[int], float], shapes: list[tuple[int, ...]]
) -> Callable[..., Awaitable[dict[str, np.ndarray]]]:
    """A backend whose call on inputs of shape (rows, width) moves `clock` on by `seconds(rows x width)`."""

    async def infer(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        shapes.append(inputs["input_ids"].shape)
        clock.now += seconds(inputs["input_ids"].size)
        return {}

    return infer


def _probe_feed(rows: int) -> dict[str, np.ndarray]:
    return {"input_ids": np.ones((rows, 32), dtype=np.int64)}


def test_measured_on_a_backend_whose_calls_cost_fixed_plus_per_token() -> None:
    """A backend of 20 ms per call plus 1 ms per padded token: 20 tokens of fixed cost."""
    clock, shapes = _Clock(), list[tuple[int, ...]]()
    infer = _rows_backend(clock, lambda tokens: 0.020 + 1e-3 * tokens, shapes)
    assert asyncio.run(measure_overhead_tokens(infer, _probe_feed, 4, 32, clock=clock)) == 20
    assert set(shapes) == {(1, 32), (4, 32)}
    assert asyncio.run(measure_overhead_tokens(infer, _probe_feed, 1, 32, clock=clock)) == 0  # no batches


def test_an_estimate_under_the_floor_is_measured_again_and_kept_at_least_the_floor() -> None:
    """A backend of 5 ms per call + 0.1 ms per token (50 tokens of fixed cost) whose many-row calls are slowed by
    20 ms in the first probe (another process on the cores) seems to have none; the second probe finds its real
    cost. A backend that truly has none is kept at the floor."""
    clock, shapes = _Clock(), list[tuple[int, ...]]()

    def disturbed_at_first(tokens: int) -> float:
        slowed = len(shapes) <= 10 and tokens > 32
        return 0.005 + 1e-4 * tokens + (0.020 if slowed else 0.0)

    infer = _rows_backend(clock, disturbed_at_first, shapes)
    assert asyncio.run(measure_overhead_tokens(infer, _probe_feed, 4, 32, clock=clock)) == 50
    assert len(shapes) == 20  # measured twice
    no_fixed_cost = _rows_backend(clock, lambda tokens: 2e-4 * tokens, [])
    assert asyncio.run(measure_overhead_tokens(no_fixed_cost, _probe_feed, 4, 32, clock=clock)) == MIN_OVERHEAD_TOKENS


def _feed(rows: int, tokens: int, width: int) -> dict[str, np.ndarray]:
    ids = np.zeros((rows, width), dtype=np.int64)
    ids[:, :tokens] = 1
    return {"input_ids": ids}


@pytest.mark.parametrize(
    ("seconds", "expected"),
    [
        # every padded column costs: pad to the longest row
        (lambda width: 1e-3 * width, 1),
        # widths that are multiples of 16 run at 0.6 of the cost per column: rounding up pays
        (lambda width: 1e-3 * width * (0.6 if width % 16 == 0 else 1.0), 16),
        # a constant cost: rounding up is free, keep the multiple
        (lambda width: 5e-3, 16),
    ],
)
def test_the_width_multiple_is_kept_where_rounded_batches_run_no_slower(
    seconds: Callable[[int], float], expected: int
) -> None:
    clock = _Clock()
    multiple, ratio = asyncio.run(measure_width_multiple(_fake_backend(clock, seconds), _feed, 16, clock=clock))
    assert multiple == expected, ratio
    assert (ratio <= 1.0) == (expected == 16)


def test_the_probes_pad_real_rows_up_to_the_multiple() -> None:
    clock = _Clock()
    shapes: list[tuple[int, int, int]] = []

    async def infer(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        ids = inputs["input_ids"]
        shapes.append((ids.shape[0], int(ids[0].sum()), ids.shape[1]))
        clock.now += 1e-3
        return {}

    asyncio.run(measure_width_multiple(infer, _feed, 16, rows=4, widths=(20, 32), clock=clock))
    assert set(shapes) == {(4, 20, 20), (4, 20, 32)}  # 32 is a multiple already: not probed
    assert asyncio.run(measure_width_multiple(infer, _feed, 1, clock=clock)) == (1, 1.0)  # nothing to choose
