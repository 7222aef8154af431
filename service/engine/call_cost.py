"""What one backend call costs beyond its tokens, and whether rounding its width up pays, measured on the served
variant at warm-up.

A call of `rows` x `width` padded tokens takes about `fixed + per_token x rows x width`. The batcher cuts a batch
where padding one more row would cost more than a call of its own (`BatchConfig.call_overhead_tokens`), so it needs
`fixed / per_token`: the call's fixed cost in tokens' worth of compute. That ratio depends on the CPU (wide integer
units shrink the cost per token, not the hand-off to the runtime's threads), on the runtime and on the graph, so it is
timed on the running backend: calls of one row and of `rows` rows of the same width, alternately, medians taken
(other processes on the machine make single timings noisy).

OpenVINO's kernels may run a width that is a multiple of their block (16) faster than the widths just below it, so
padding a batch up to that multiple can cost less than its longest row. Whether it does depends on the CPU and the
graph (it pays on Intel's AMX, and costs on AMD's Zen 5 with the same static int8 graph), so `measure_width_multiple`
times batches at widths between two multiples against the same batches rounded up, and keeps the multiple only where
the rounded ones are no slower; else each batch is padded to its longest row.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence

import numpy as np

from bert_model.tasks.features import padded_width

log = logging.getLogger(__name__)

Infer = Callable[[dict[str, np.ndarray]], Awaitable[dict[str, np.ndarray]]]

PROBE_WIDTH = 32
"""Width of the probe calls: a short sentence's, where a call's fixed cost weighs most."""
PROBE_ROUNDS = 5
MAX_OVERHEAD_TOKENS = 256
"""Upper bound of the estimate (a timing disturbed by another process must not stop batching)."""
MIN_OVERHEAD_TOKENS = 4
"""Lower bound of the estimate. Every call has a fixed cost (the hand-off to the runtime's threads, the output
arrays), but a one-row probe slowed by another process makes the estimate 0, and with 0 the cut never pads a row,
so batches would hold only rows of one length. An estimate below this is measured once more, and the larger of the
two kept, at least this."""


def overhead_tokens(one: float, many: float, rows: int, width: int) -> int:
    """The fixed cost of a call in tokens, from the seconds of a call of 1 row and of `rows` rows of `width`."""
    per_token = (many - one) / ((rows - 1) * width)
    if per_token <= 0:  # more rows did not take longer: the fixed cost dominates
        return MAX_OVERHEAD_TOKENS
    fixed = one - per_token * width
    return int(min(MAX_OVERHEAD_TOKENS, max(0.0, round(fixed / per_token))))


async def measure_overhead_tokens(
    infer: Infer,
    feed: Callable[[int], dict[str, np.ndarray]],
    rows: int,
    width: int,
    clock: Callable[[], float] = time.perf_counter,
) -> int:
    """`overhead_tokens` of the backend behind `infer`, from calls of 1 and of `rows` rows of `width` tokens
    (`feed(n)`: the inputs of a call of n such rows); 0 when `rows` < 2 (no batches to cut)."""
    if rows < 2:
        return 0
    one_row, many_rows = feed(1), feed(rows)
    tokens = overhead_tokens(*await _alternate_medians(infer, one_row, many_rows, clock), rows, width)
    if tokens < MIN_OVERHEAD_TOKENS:
        again = overhead_tokens(*await _alternate_medians(infer, one_row, many_rows, clock), rows, width)
        log.info(
            "a call's fixed cost measured %d, then %d tokens; at least %d kept", tokens, again, MIN_OVERHEAD_TOKENS
        )
        tokens = max(tokens, again, MIN_OVERHEAD_TOKENS)
    return tokens


async def _alternate_medians(
    infer: Infer, first: dict[str, np.ndarray], second: dict[str, np.ndarray], clock: Callable[[], float]
) -> tuple[float, float]:
    """The median seconds of a call on `first` and on `second`, timed alternately `PROBE_ROUNDS` times each, so that
    a slow spell of the machine falls on both."""
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(PROBE_ROUNDS):
        for inputs, taken in zip((first, second), times, strict=True):
            start = clock()
            await infer(inputs)
            taken.append(clock() - start)
    return statistics.median(times[0]), statistics.median(times[1])


WIDTH_PROBES = (20, 36, 52)
"""Widths timed against the multiple above them: short sentences' widths, a quarter into each gap between multiples
of 16 up to 64."""
WIDTH_PROBE_ROWS = 8


async def measure_width_multiple(
    infer: Infer,
    feed: Callable[[int, int, int], dict[str, np.ndarray]],
    multiple: int,
    rows: int = WIDTH_PROBE_ROWS,
    widths: Sequence[int] = WIDTH_PROBES,
    clock: Callable[[], float] = time.perf_counter,
    max_width: int | None = None,
) -> tuple[int, float]:
    """`multiple` if batches rounded up to it run no slower than the same batches at their own width on the backend
    behind `infer`, else 1; with the median ratio of (rounded / own width) call times. `feed(rows, tokens, width)`:
    the inputs of a call of `rows` rows of `tokens` tokens padded to `width`. Widths whose rounding would pass
    `max_width` (the longest rows the graph is served) are not probed."""
    if multiple <= 1:
        return 1, 1.0
    ratios: list[float] = []
    for width in widths:
        rounded = padded_width(width, multiple)
        if rounded == width or (max_width is not None and rounded > max_width):
            continue
        own, up = await _alternate_medians(infer, feed(rows, width, width), feed(rows, width, rounded), clock)
        ratios.append(up / own)
    ratio = statistics.median(ratios) if ratios else 1.0
    return (multiple if ratio <= 1.0 else 1), ratio
