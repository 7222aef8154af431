"""`--variant auto`: time a bundle's guarded CPU variants on the model's own shapes at start, serve the fastest.

Which variant is fastest depends on the CPU (AMX tiles make OpenVINO's int8 and bf16 graphs close; without VNNI
ONNX Runtime's int8 leads), and the orders of `bundles.variant_choice` are per CPU family, measured on a
few machines: timing serves what is fastest on this one.

Candidates: `variant_choice.timing_candidates`, the bundle's CPU variants that passed their accuracy guard at export
and that this process can run, in this CPU family's order. Each is loaded as it would serve (same threads), warmed
up once per shape, then timed in interleaved rounds (every candidate takes a turn of `CALLS_PER_TURN` timed calls
per shape, the candidates' order rotating each round) until the per-model budget (loading included) is spent, with
at least `MIN_ROUNDS` rounds and at most `MAX_ROUNDS`; from then on, after each round a candidate more than
`DROP_FACTOR` times slower than the best so far stops racing (it is closed; its figures stay in the report), so
clearly slower graphs do not spend the budget.
A candidate's time at a shape is the lower quartile of its calls: interference from other processes only ever
adds time, so the lower quartile stays at the true speed while up to three calls in four are slowed (a median
tolerates one in two, and the minimum rewards a lucky call). A candidate is scored by the mean over the shapes
of its time relative to the best at that shape (batch 1 and the batcher's batch weigh the same); the lowest
score is served, ties going to the earlier candidate in that order. A candidate that fails to load or
run is skipped with a warning. The other candidates are closed; the chosen one is the backend that serves.

Shapes: batch 1 and the batcher's full batch (`max_batch_size`, within `max_batch_tokens`) at the model's
serving length: the window length for qa and ner (what long inputs are cut into), and for sentence tasks
(classify, embed, fill-mask) the graph's length capped at 128 tokens, since their batches are padded only to
their longest text.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

log = logging.getLogger(__name__)

MIN_ROUNDS = 2
MAX_ROUNDS = 30
CALLS_PER_TURN = 3
DROP_FACTOR = 1.5
"""After each round, candidates more than 1.5x slower than the best so far (mean relative time) stop racing."""
SENTENCE_LENGTH = 128
"""Timing length of the sentence tasks (classify, embed, fill-mask): their texts are mostly shorter."""
WINDOWED_TASKS = ("qa", "ner")
FILLER_TEXT = "the quick brown fox jumps over the lazy dog while a gripping , beautifully acted film plays in berlin "


class TimedBackend(Protocol):
    """What the timing needs of a backend (`OrtBackend` is one)."""

    variant: str

    async def start(self) -> None: ...

    async def time_call(self, inputs: dict[str, np.ndarray]) -> float:
        """Seconds one forward of `inputs` takes."""
        ...

    async def close(self) -> None: ...


@dataclass(frozen=True)
class Shape:
    batch: int
    seq_len: int

    @property
    def label(self) -> str:
        return f"b{self.batch}x{self.seq_len}"


@dataclass
class VariantChoice:
    """How the served variant was chosen; `describe()` is what /models and Models.List report."""

    variant: str
    auto: bool
    timings_ms: dict[str, dict[str, float]] = field(default_factory=dict)
    """Candidate -> shape label (`b1x128`) -> milliseconds per call (the lower quartile of its timed calls)."""
    skipped: dict[str, str] = field(default_factory=dict)
    """Variant -> why it was not a candidate or was dropped (unguarded, refused, not runnable, failed to load)."""
    rounds: int = 0
    seconds: float = 0.0
    """Wall time of loading and timing the candidates."""

    def describe(self) -> dict[str, Any]:
        return {
            "auto": self.auto,
            "timings_ms": {name: dict(shapes) for name, shapes in self.timings_ms.items()},
            "skipped": dict(self.skipped),
            "rounds": self.rounds,
            "seconds": round(self.seconds, 3),
        }


def timing_shapes(task: str, serving_length: int, max_batch_size: int, max_batch_tokens: int) -> list[Shape]:
    """Batch 1 and the batcher's full batch at the model's serving length (see the module docstring)."""
    length = serving_length if task in WINDOWED_TASKS else min(serving_length, SENTENCE_LENGTH)
    batch = max(1, min(max_batch_size, max_batch_tokens // length))
    return [Shape(1, length)] + ([Shape(batch, length)] if batch > 1 else [])


def timing_feed(shape: Shape, cls_id: int, sep_id: int, filler_ids: Sequence[int]) -> dict[str, np.ndarray]:
    """`shape.batch` rows of `[CLS] text... [SEP]`, exactly `shape.seq_len` real tokens (no padding)."""
    body = np.resize(np.asarray(filler_ids, dtype=np.int64), shape.seq_len - 2)
    row = np.concatenate([[cls_id], body, [sep_id]]).astype(np.int64)
    input_ids = np.tile(row, (shape.batch, 1))
    return {
        "input_ids": input_ids,
        "attention_mask": np.ones_like(input_ids),
        "token_type_ids": np.zeros_like(input_ids),
    }


def pick_fastest(timings: dict[str, dict[str, float]], order: Sequence[str]) -> str:
    """The candidate with the lowest mean relative time over the shapes; ties go to the earlier in `order`."""
    names = [name for name in order if name in timings]
    if not names:
        raise ValueError("no timed candidate to pick from")
    shapes = list(timings[names[0]])
    best = {shape: min(timings[name][shape] for name in names) for shape in shapes}

    def score(name: str) -> float:
        return statistics.fmean(timings[name][shape] / best[shape] for shape in shapes) if shapes else 0.0

    return min(names, key=lambda name: (score(name), names.index(name)))


async def choose_fastest(
    names: Sequence[str],
    make_backend: Callable[[str], TimedBackend],
    feeds: dict[str, dict[str, np.ndarray]],
    budget_s: float,
    *,
    skipped: dict[str, str] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[TimedBackend, VariantChoice]:
    """Load every candidate, time them on `feeds` (shape label -> inputs) and return the fastest, started.

    Raises ValueError naming every candidate's failure when none loads.
    """
    started = clock()
    skipped = dict(skipped or {})
    loaded = await _load_all(names, make_backend, feeds, skipped)
    if not loaded:
        raise ValueError(f"no CPU variant could be served: {skipped or 'the bundle has no guarded CPU variant'}")
    samples: dict[str, dict[str, list[float]]] = {backend.variant: {label: [] for label in feeds} for backend in loaded}
    racing, rounds = list(loaded), 0
    while len(racing) > 1 and rounds < MAX_ROUNDS and (rounds < MIN_ROUNDS or clock() - started < budget_s):
        for backend in _rotated(racing, rounds):
            if not await _time_round(backend, feeds, samples[backend.variant], skipped):
                racing.remove(backend)
                loaded.remove(backend)
                del samples[backend.variant]
                await _close_quietly(backend)
        rounds += 1
        if rounds >= MIN_ROUNDS:  # a single round's three calls can all be slowed by another process
            racing = await _drop_slow(racing, samples)
    if not loaded:
        raise ValueError(f"no CPU variant could be served: {skipped}")
    timings = {  # none when a single candidate was left: nothing to compare
        name: {label: 1000 * lower_quartile(values) for label, values in shapes.items()}
        for name, shapes in samples.items()
        if rounds
    }
    winner = pick_fastest({name: timings[name] for name in _names(racing)}, _names(racing)) if timings else None
    chosen = next(backend for backend in loaded if backend.variant == (winner or loaded[0].variant))
    for backend in racing:
        if backend is not chosen:
            await _close_quietly(backend)
    return chosen, VariantChoice(chosen.variant, True, timings, skipped, rounds, clock() - started)


def _names(backends: Sequence[TimedBackend]) -> list[str]:
    return [backend.variant for backend in backends]


async def _drop_slow(racing: list[TimedBackend], samples: dict[str, dict[str, list[float]]]) -> list[TimedBackend]:
    """The candidates still worth timing: those within `DROP_FACTOR` of the best score so far (the others are
    closed, their timings kept for the report), so clearly slower graphs do not eat the budget."""
    if len(racing) < 2:
        return racing
    timings = {b.variant: {k: lower_quartile(v) for k, v in samples[b.variant].items()} for b in racing}
    best = {label: min(t[label] for t in timings.values()) for label in next(iter(timings.values()))}
    kept = []
    for backend in racing:
        score = statistics.fmean(timings[backend.variant][label] / best[label] for label in best)
        if score <= DROP_FACTOR:
            kept.append(backend)
        else:
            await _close_quietly(backend)
    return kept


async def _load_all(
    names: Sequence[str],
    make_backend: Callable[[str], TimedBackend],
    feeds: dict[str, dict[str, np.ndarray]],
    skipped: dict[str, str],
) -> list[TimedBackend]:
    """The candidates that start and run each feed once (the warm-up call); the others go into `skipped`."""
    loaded: list[TimedBackend] = []
    for name in names:
        try:
            backend = make_backend(name)
        except Exception as error:  # a runtime refusing the graph raises its own exception types
            _skip(skipped, name, "failed to load", error)
            continue
        try:
            await backend.start()
            for feed in feeds.values():
                await backend.time_call(feed)
        except Exception as error:
            _skip(skipped, name, "failed to load", error)
            await _close_quietly(backend)
            continue
        loaded.append(backend)
    return loaded


async def _time_round(
    backend: TimedBackend, feeds: dict[str, dict[str, np.ndarray]], samples: dict[str, list[float]], skipped: dict
) -> bool:
    """One timed call per shape into `samples`; False (and a `skipped` entry) when the backend fails."""
    try:
        for label, feed in feeds.items():
            for _ in range(CALLS_PER_TURN):
                samples[label].append(await backend.time_call(feed))
    except Exception as error:
        _skip(skipped, backend.variant, "failed while timed", error)
        return False
    return True


def lower_quartile(values: Sequence[float]) -> float:
    """The 25th percentile (linear interpolation between the closest ranks)."""
    return float(np.percentile(np.asarray(values, dtype=np.float64), 25))


def _rotated(backends: list[TimedBackend], round_index: int) -> list[TimedBackend]:
    """The candidates starting from a different one each round, so no one always runs right after another."""
    shift = round_index % len(backends)
    return backends[shift:] + backends[:shift]


def _skip(skipped: dict[str, str], name: str, what: str, error: BaseException) -> None:
    skipped[name] = f"{what}: {type(error).__name__}: {error}"
    log.warning("variant skipped", extra={"variant": name, "reason": skipped[name]})


async def _close_quietly(backend: TimedBackend) -> None:
    try:
        await backend.close()
    except Exception as error:  # closing a half-loaded session must not stop the server from starting
        log.warning("closing a timed variant failed", extra={"variant": backend.variant, "error": str(error)})
