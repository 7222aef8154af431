"""A backend call's fixed cost in tokens, measured at warm-up (`service.call_cost`)."""

from __future__ import annotations

import asyncio

import numpy as np

from service.call_cost import MAX_OVERHEAD_TOKENS, measure_overhead_tokens, overhead_tokens


def test_overhead_tokens_from_two_timings() -> None:
    # 1 row of 32: 6 ms; 8 rows of 32: 34 ms -> 0.125 ms a token, 2 ms fixed = 16 tokens
    assert overhead_tokens(0.006, 0.034, 8, 32) == 16
    assert overhead_tokens(0.004, 0.032, 8, 32) == 0  # no fixed cost at all
    assert overhead_tokens(0.010, 0.009, 8, 32) == MAX_OVERHEAD_TOKENS  # more rows took no longer
    assert overhead_tokens(1.0, 1.0 + 1e-6, 8, 32) == MAX_OVERHEAD_TOKENS  # capped


def test_measured_on_a_backend_whose_calls_cost_fixed_plus_per_token() -> None:
    """A backend that sleeps 20 ms per call plus 1 ms per padded token: 20 tokens of fixed cost (a timer's
    overshoot adds a little)."""
    shapes: list[tuple[int, ...]] = []

    async def infer(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        shapes.append(inputs["input_ids"].shape)
        await asyncio.sleep(0.020 + 1e-3 * inputs["input_ids"].size)
        return {}

    def feed(rows: int) -> dict[str, np.ndarray]:
        return {"input_ids": np.ones((rows, 32), dtype=np.int64)}

    tokens = asyncio.run(measure_overhead_tokens(infer, feed, 4, 32))
    assert 17 <= tokens <= 30, tokens
    assert set(shapes) == {(1, 32), (4, 32)}
    assert asyncio.run(measure_overhead_tokens(infer, feed, 1, 32)) == 0  # no batches: nothing to weigh
