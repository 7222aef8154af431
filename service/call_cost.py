"""What one backend call costs beyond its tokens, measured on the running backend at warm-up.

A call of `rows` x `width` padded tokens takes about `fixed + per_token x rows x width`. The batcher cuts a batch
where padding one more row would cost more than a call of its own (`BatchConfig.call_overhead_tokens`), so it needs
`fixed / per_token`: the call's fixed cost in tokens' worth of compute. It differs by runtime (ONNX Runtime, OpenVINO,
a remote Triton), by graph and by CPU, so it is measured on the variant being served: one row and `rows` rows of the
same width, timed alternately, medians taken (other processes on the machine make single timings noisy).
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Awaitable, Callable

import numpy as np

log = logging.getLogger(__name__)

Infer = Callable[[dict[str, np.ndarray]], Awaitable[dict[str, np.ndarray]]]

PROBE_WIDTH = 32
"""Width of the probe calls: a short sentence's, where a call's fixed cost weighs most."""
PROBE_ROUNDS = 5
MAX_OVERHEAD_TOKENS = 256
"""Upper bound of the estimate (a timing disturbed by another process must not stop batching)."""


def overhead_tokens(one: float, many: float, rows: int, width: int) -> int:
    """The fixed cost of a call in tokens, from the seconds of a call of 1 row and of `rows` rows of `width`."""
    per_token = (many - one) / ((rows - 1) * width)
    if per_token <= 0:  # more rows did not take longer: the fixed cost dominates
        return MAX_OVERHEAD_TOKENS
    fixed = one - per_token * width
    return int(min(MAX_OVERHEAD_TOKENS, max(0.0, round(fixed / per_token))))


async def measure_overhead_tokens(
    infer: Infer, feed: Callable[[int], dict[str, np.ndarray]], rows: int, width: int
) -> int:
    """`overhead_tokens` of the backend behind `infer`, timing calls of 1 and of `rows` rows of `width` tokens
    (`feed(n)`: the inputs of a call of n such rows)."""
    if rows < 2:
        return 0
    single, batch = feed(1), feed(rows)
    ones: list[float] = []
    manys: list[float] = []
    for _ in range(PROBE_ROUNDS):
        for inputs, times in ((single, ones), (batch, manys)):
            start = time.perf_counter()
            await infer(inputs)
            times.append(time.perf_counter() - start)
    return overhead_tokens(statistics.median(ones), statistics.median(manys), rows, width)
