"""Dynamic batching: features of many requests (from both front doors) share one backend call.

One `Batcher` per loaded model. A request hands in its features (token sequences: one per text, or one per window
of a long QA context) and awaits one output row per feature. A batch closes when it holds `max_batch_size`
features, when its padded size (rows x padded width) would pass `max_batch_tokens`, or when its oldest feature has
waited `max_wait_s`. Batches are cut around the first feature in fair order (start-time fair queueing over
features: the oldest, except that a request which comes behind a long request's features goes before the rest of
them) from the length-sorted queue (or its `window` first features), so padding stays small and nobody starves;
no row is padded to more than `max_stretch` x the batch's shortest row (+ `stretch_tokens`), so a short request
never waits on the compute of much longer rows. A `LongBatchGate` shared by a process's batchers holds batches of
long rows to one at a time (and off the all-cores copy) while short requests come. The padded width is the longest
row rounded up to the backend's `width_multiple` (OpenVINO's kernels on some CPUs run widths that are multiples of
16 faster than the widths just below them; the engine keeps the multiple where it measures so), never past the
graph's longest input. The queue is
bounded: a request that does not fit is rejected at once (`Overloaded`). Requests whose deadline passed (or whose
caller went away) are dropped before compute. A failure anywhere on a batch's path (padding, the backend, the output
checks, delivery) fails only the requests of that batch, at once, and outputs are checked to have one row per input
row; a model whose batch loop dies, whose backend reports itself broken, or whose batches keep failing has failed for
good (see `Batcher`). With `passthrough` (the backend batches itself, e.g. Triton's dynamic batcher) every request
goes straight to the backend as its own call, with the same checks and bounds.
A request may ask for outputs beyond the model's usual ones (`extra_outputs`: an embedding model's token states);
a batch fetches them only when one of its requests does.

References: Triton dynamic batcher (max_queue_delay, preferred sizes), text-embeddings-inference's token
budget batching (max_batch_tokens), Clipper (NSDI'17) adaptive batching, start-time fair queueing (Goyal et al.,
SIGCOMM'96).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Protocol

import numpy as np

from bert_model.tasks.features import padded_width
from bert_model.tokenization import pad_rows
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
    ServiceError,
)

log = logging.getLogger(__name__)


class RunBatch(Protocol):
    """`run(inputs)` -> the outputs every batch has; `run(inputs, extra_outputs)` -> those and the extra ones
    (`Backend.infer`): the batcher passes `extra_outputs` only to a batch whose requests ask for some."""

    def __call__(
        self, inputs: dict[str, np.ndarray], extra_outputs: Sequence[str] = (), /
    ) -> Awaitable[dict[str, np.ndarray]]: ...


OnFailure = Callable[[str, str], None]
"""Called once when a model fails for good, with the model's name and the reason."""
LOAD_ERRORS = (Overloaded, DeadlineExceeded, NotReady, BackendUnavailable)
"""Failures that say the backend is busy (its queue, its timeout) or away (a remote Triton that does not answer),
not that this process is failing: never counted, since restarting the process would bring neither back."""


class Encoded(Protocol):
    """What the batcher needs of a feature: its token ids and segment ids (same length)."""

    @property
    def input_ids(self) -> Sequence[int]: ...

    @property
    def token_type_ids(self) -> Sequence[int]: ...


class BatchObserver(Protocol):
    """Receives batching figures (implemented by `service.operations.metrics`)."""

    def batch_done(
        self, model: str, rows: int, tokens: int, padded_tokens: int, seconds: float, alone: bool = False
    ) -> None: ...

    def queued(self, model: str, seconds: float) -> None: ...

    def rejected(self, model: str, reason: str) -> None: ...


@dataclass
class BatchConfig:
    """How one model's batcher closes batches and bounds its queue."""

    max_batch_size: int = 32
    """Most features in one backend call (1 = no batching)."""
    max_batch_tokens: int = 16384
    """Budget of one call in padded tokens (rows x longest row); a single longer feature still runs alone."""
    max_wait_s: float = 0.002
    """Longest the oldest waiting feature waits for a batch to fill."""
    max_padding: float | None = None
    """Padding allowed in a batch, as a fraction of its real tokens (None = pad freely)."""
    window: int | None = None
    """A batch is cut from the `window` first features in fair order only (None = the whole queue): bounds how
    often a feature of an unusual length can be passed over for neighbours in length that came after it."""
    max_stretch: float | None = 2.0
    """A batch's padded width is at most `max_stretch` x its shortest row + `stretch_tokens` (None = no limit): a
    short row is never padded into (and made to wait on the compute of) a batch of much longer rows."""
    stretch_tokens: int = 64
    call_overhead_tokens: int = 16
    """The fixed cost of one backend call, in padded tokens' worth of compute: a batch is cut where padding one
    more row would cost more than a call of its own (see `Batcher._take_batch`). The engine measures it on the
    served variant at warm-up (`service.engine.call_cost`): it differs by CPU."""
    max_queue: int = 512
    """Most features waiting (or, in passthrough, in flight); beyond it requests are rejected at once."""
    max_concurrency: int = 1
    """Backend calls in flight at once; with 1, requests pile up while a batch runs and then batch together."""
    passthrough: bool = False
    """Send each request as its own call at once (the backend batches)."""
    pad_id: int = 0
    width_multiple: int = 1
    """A batch is padded to its longest row rounded up to a multiple of this (1 = the longest row): the backend's
    preference (`Backend.width_multiple`), kept by the engine where rounded batches run no slower at warm-up."""
    max_width: int | None = None
    """The graph's longest input: rounding up never pads past it (None = no cap)."""
    max_consecutive_failures: int = 0
    """Failed batches in a row (backend errors, bugs on the batch path; busy answers not counted) after which the
    model has failed for good (0 = never)."""

    def __post_init__(self) -> None:
        for name in ("max_batch_size", "max_batch_tokens", "max_queue", "max_concurrency", "width_multiple"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.call_overhead_tokens < 0:
            raise ValueError(f"call_overhead_tokens must be >= 0, got {self.call_overhead_tokens}")
        if self.max_consecutive_failures < 0:
            raise ValueError(f"max_consecutive_failures must be >= 0, got {self.max_consecutive_failures}")
        if self.max_wait_s < 0:
            raise ValueError(f"max_wait_s must be >= 0, got {self.max_wait_s}")
        if self.max_padding is not None and self.max_padding < 0:
            raise ValueError(f"max_padding must be >= 0, got {self.max_padding}")
        if self.max_stretch is not None and self.max_stretch < 1:
            raise ValueError(f"max_stretch must be >= 1, got {self.max_stretch}")
        if self.window is not None and self.window < self.max_batch_size:
            raise ValueError(f"window must be at least max_batch_size ({self.max_batch_size}), got {self.window}")


@dataclass
class BatchResult:
    """One request's outputs (one dict per feature, in order) and where its time went."""

    outputs: list[dict[str, np.ndarray]]
    queue_s: float
    """From submission to the start of its first backend call."""
    inference_s: float
    """Time in backend calls that carried its features (summed over calls)."""
    batches: int
    """How many backend calls carried its features."""


@dataclass(eq=False)
class _Request:
    features: Sequence[Encoded]
    future: asyncio.Future[BatchResult]
    deadline: float
    submitted: float
    outputs: list[dict[str, np.ndarray] | None] = field(default_factory=list)
    remaining: int = 0
    first_start: float | None = None
    inference_s: float = 0.0
    batches: int = 0
    short: bool = True
    """Interactive work (`LongBatchGate.is_short`): its rows go before long batches."""
    extra_outputs: tuple[str, ...] = ()
    """Outputs it needs beyond the batcher's `output_names`: fetched for the batches that carry its rows."""

    @property
    def dead(self) -> bool:
        return self.future.done()


@dataclass(eq=False)
class _Item:
    request: _Request
    index: int
    length: int
    arrival: int
    submitted: float
    tag: int = 0
    """Fair order (start-time fair queueing, one unit per feature): a request's features are tagged from the
    virtual time at its submission up, so a request that comes while a long one is queued goes before the rest of
    it, and the features of concurrent requests take turns. The virtual time moves on with every batch (to the
    largest tag it served, and at least by one), so a feature waits a bounded number of batches however many
    requests keep arriving."""


_TURN = attrgetter("tag", "arrival")
"""An item's place in fair order (`_Item.tag`, then arrival). attrgetter keys: no Python call per item."""
_LENGTH = attrgetter("length")
_LENGTH_ORDER = attrgetter("length", "arrival")


class LongBatchGate:
    """Priority of short requests over batches of long rows, over every model of the process (one object shared by
    their batchers; all on the event loop).

    A request of at most `short_rows` token sequences, each at most `short_width` long (a few sentences), is short;
    any other is bulk work (long texts, QA / NER windows of a long document, many inputs at once), and a batch that
    holds a row of bulk work is long. While short requests come (one is in progress, or one ended less than `hold_s`
    ago), at most `long_slots` long batches run at once in the process, each of at most `long_tokens` padded tokens
    (one row at least), and none of them on all cores (`run_alone`): on a small CPU two batches of 8 x 512 tokens
    take both cores for over a second, and a sentence queued behind them, on the same model or beside it, would wait
    as long; a batch of one 512-token row takes about a tenth of that. Without short requests long batches run as
    the models' concurrency and token budgets allow.
    """

    def __init__(
        self, short_width: int, short_rows: int = 8, long_tokens: int = 512, long_slots: int = 1, hold_s: float = 1.0
    ) -> None:
        if min(short_width, short_rows, long_tokens, long_slots) < 1 or hold_s < 0:
            raise ValueError(
                "need short_width, short_rows, long_tokens and long_slots >= 1 and hold_s >= 0, got "
                f"{short_width}, {short_rows}, {long_tokens}, {long_slots}, {hold_s}"
            )
        self.short_width = short_width
        self.short_rows = short_rows
        self.long_tokens = long_tokens
        self.long_slots = long_slots
        self.hold_s = hold_s
        self._short = 0
        self._long = 0
        self._held_until = 0.0  # time.monotonic() until which the last short request still counts
        self._timer: asyncio.TimerHandle | None = None
        self._waiters: set[asyncio.Event] = set()
        self._held: list[asyncio.Event] = []  # batchers holding a long batch back, in the order they were held

    @property
    def short_in_progress(self) -> int:
        return self._short

    @property
    def long_running(self) -> int:
        return self._long

    def is_short(self, rows: int, width: int) -> bool:
        """Whether a request of `rows` token sequences, the longest `width` tokens, is short."""
        return rows <= self.short_rows and width <= self.short_width

    def register(self, wakeup: asyncio.Event) -> None:
        """`wakeup` is set whenever a held-back long batch may be able to start."""
        self._waiters.add(wakeup)

    def unregister(self, wakeup: asyncio.Event) -> None:
        self._waiters.discard(wakeup)
        self.leave(wakeup)

    def short_request(self, done: asyncio.Future[BatchResult]) -> None:
        """A short request was queued; it counts until `done` is."""
        self._short += 1
        done.add_done_callback(self._short_ended)

    @property
    def short_coming(self) -> bool:
        """A short request is in progress or ended less than `hold_s` ago."""
        return self._short > 0 or time.monotonic() < self._held_until

    def may_start(self, long: bool, batcher: asyncio.Event) -> bool:
        """Whether `batcher` (its wakeup event) may start a batch (`long` or not) now. Held-back long batches start
        in the order they were held (`hold`), so that one model's stream of long batches cannot keep another's out."""
        if not long or not self.short_coming:
            return True
        return self._long < self.long_slots and (not self._held or self._held[0] is batcher)

    def hold(self, batcher: asyncio.Event) -> None:
        """`batcher` has a long batch held back: it is woken when that batch may be able to start."""
        if batcher not in self._held:
            self._held.append(batcher)

    def leave(self, batcher: asyncio.Event) -> None:
        """`batcher` holds no long batch back any more (it started one, or has none to start)."""
        if batcher in self._held:
            first = self._held[0] is batcher
            self._held.remove(batcher)
            if first:
                self._notify()

    def may_use_all_cores(self, long: bool) -> bool:
        return not long or not self.short_coming

    def long_started(self) -> None:
        self._long += 1

    def long_ended(self) -> None:
        self._long -= 1
        self._notify()

    def _short_ended(self, _: object) -> None:
        self._short -= 1
        if self._short > 0:
            return
        self._held_until = time.monotonic() + self.hold_s
        if self._timer is not None:
            self._timer.cancel()
        # held-back long batches may start once the hold is over
        self._timer = asyncio.get_running_loop().call_later(self.hold_s, self._notify)

    def _notify(self) -> None:
        for wakeup in self._waiters:
            wakeup.set()


def _extra_outputs(batch: list[_Item]) -> tuple[str, ...]:
    """The outputs beyond `output_names` that the requests of `batch` ask for, each once, in the order asked."""
    extra: dict[str, None] = {}
    for item in batch:
        if item.request.extra_outputs:
            extra.update(dict.fromkeys(item.request.extra_outputs))
    return tuple(extra)


def _is_long(batch: list[_Item]) -> bool:
    """A batch that holds a row of bulk work (`LongBatchGate`)."""
    return not all(item.request.short for item in batch)


class Reservation:
    """Rows of a model's queue held for one request between its admission (`Batcher.reserve`) and the moment its
    features are queued; released once, by `Batcher.submit` or when the request ends before (a context manager)."""

    __slots__ = ("_batcher", "rows")

    def __init__(self, batcher: Batcher, rows: int) -> None:
        self._batcher: Batcher | None = batcher
        self.rows = rows

    def release(self) -> None:
        if self._batcher is not None:
            self._batcher._release(self.rows)
            self._batcher = None

    def __enter__(self) -> Reservation:
        return self

    def __exit__(self, *_: object) -> None:
        self.release()


class Batcher:
    """Per-model request queue and batch loop; `submit()` is safe to call from any coroutine on the loop.

    The model fails for good (`failure` is set, every waiting request and every later one gets ModelFailed, 503 /
    UNAVAILABLE, and `on_failure` is called once) when the batch loop task ends with an exception, when the backend
    raises BackendBroken (it reports that it can never serve again), or after `max_consecutive_failures` failed
    batches in a row. A single failed batch fails only its own requests and the loop goes on.
    """

    def __init__(
        self,
        model: str,
        run_batch: RunBatch,
        config: BatchConfig,
        *,
        output_names: Sequence[str],
        sequence_outputs: Sequence[str] = (),
        observer: BatchObserver | None = None,
        run_alone: RunBatch | None = None,
        on_failure: OnFailure | None = None,
        gate: LongBatchGate | None = None,
        short_requests: bool = True,
    ) -> None:
        """`run_alone` (optional) runs a batch that nothing else competes with: no other batch running, nothing
        left waiting when it was cut (a backend may give it all its cores); `run_batch` runs every other one.
        `on_failure` hears once that the model has failed for good. `gate` (shared by the models of a process)
        holds long batches back while short requests are in progress; with `short_requests` False none of this
        model's requests is short, however few its tokens (a task whose every request is bulk work)."""
        self.model = model
        self.config = config
        self.output_names = tuple(output_names)
        self.sequence_outputs = frozenset(sequence_outputs)
        self._run_batch = run_batch
        self._run_alone = run_alone
        self._observer = observer
        self._pending: list[_Item] = []
        self._arrivals = 0
        self._virtual = 0  # fair order's virtual time: the tag new requests start from (`_Item.tag`)
        self._after_long = False  # the last batch cut held bulk work (`_gated_batch`)
        self._in_flight = 0
        self._reserved = 0  # rows admitted by `reserve` and not queued yet
        self._wakeup: asyncio.Event | None = None
        self._event_loop: asyncio.AbstractEventLoop | None = None
        """The loop `start` ran on, which the batch loop and every request's future belong to."""
        self._slots: asyncio.Semaphore | None = None
        self._loop_task: asyncio.Task[None] | None = None
        self._batch_tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        self._on_failure = on_failure
        self._gate = None if config.passthrough else gate
        self._short_requests = short_requests
        self._failures = 0  # failed batches in a row
        self.failure: str | None = None
        """Why the model has failed for good (None while it serves)."""
        self.backend_calls = 0
        """Backend calls made so far (the batching proof counts these)."""
        self.alone_calls = 0
        """Of those, the ones that went to `run_alone`."""

    # ---- lifecycle --------------------------------------------------------------------------------
    async def start(self) -> None:
        # the loop's own handle: asyncio.get_running_loop() is a getpid() system call per call on Python 3.11
        self._event_loop = asyncio.get_running_loop()
        self._wakeup = asyncio.Event()
        if self._gate is not None:
            self._gate.register(self._wakeup)
        self._slots = asyncio.Semaphore(self.config.max_concurrency)
        if not self.config.passthrough:
            self._loop_task = asyncio.create_task(self._loop(), name=f"batcher-{self.model}")
            self._loop_task.add_done_callback(self._loop_ended)

    async def close(self) -> None:
        """Stop taking requests, answer what still waits (NotReady: 503 / UNAVAILABLE, retry elsewhere) at once,
        then let the running batches finish and answer theirs."""
        self._closed = True
        if self._wakeup is not None:
            self._wakeup.set()
            if self._gate is not None:
                self._gate.unregister(self._wakeup)
        if self._loop_task is not None:
            self._loop_task.cancel()
            await asyncio.gather(self._loop_task, return_exceptions=True)
        waiting, self._pending = self._pending, []
        for item in waiting:
            if not item.request.dead:
                item.request.future.set_exception(NotReady("the server is shutting down; retry"))
        if self._batch_tasks:
            await asyncio.gather(*self._batch_tasks, return_exceptions=True)

    def _loop_ended(self, task: asyncio.Task[None]) -> None:
        if task.cancelled() or (self._closed and task.exception() is None):
            return
        error = task.exception()
        log.error("the batch loop of model %s ended", self.model, exc_info=error)
        self._die(f"the batch loop ended: {error!r}" if error is not None else "the batch loop returned")

    def _count_failure(self, error: ServiceError) -> None:
        if isinstance(error, BackendBroken):
            self._die(f"the backend reports itself broken: {error.message}")
            return
        if isinstance(error, LOAD_ERRORS):
            return
        self._failures += 1
        limit = self.config.max_consecutive_failures
        if limit and self._failures >= limit:
            self._die(f"{self._failures} batches in a row failed, the last with {error.code}: {error.message}")

    def _die(self, reason: str) -> None:
        """The model has failed for good: answer everything waiting at once and tell `on_failure`."""
        if self.failure is not None:
            return
        self.failure = reason
        log.error("model failed for good", extra={"model": self.model, "reason": reason})
        waiting, self._pending = self._pending, []
        for item in waiting:
            if not item.request.dead:
                item.request.future.set_exception(self._failed_error())
        if self._on_failure is not None:
            try:
                self._on_failure(self.model, reason)
            except Exception:
                log.exception("the failure hook of model %s failed", self.model)

    def _failed_error(self) -> ModelFailed:
        return ModelFailed(f"model {self.model!r} has failed and this server is restarting; retry")

    @property
    def queue_depth(self) -> int:
        """Features waiting for a batch (passthrough: features in flight)."""
        return len(self._pending) if not self.config.passthrough else self._in_flight

    # ---- admission and submission ----------------------------------------------------------------
    def reserve(self, rows: int, too_large: Callable[[int], str | None] | None = None) -> Reservation:
        """Admit a request of `rows` model rows to this model's queue: its one capacity rule. The rows hold their
        place (beside the queued ones) until `submit` queues the request's features in it, or the reservation is
        released. Raises InvalidInput when the request could never fit (`too_large(max_queue)` says how to split
        it), Overloaded when the queue is full now, ModelFailed / NotReady when the model takes no requests."""
        if self.failure is not None:
            raise self._failed_error()
        if self._closed or self._wakeup is None:
            raise NotReady("the server is shutting down (or not started): this model takes no requests")
        limit = self.config.max_queue
        if rows > limit:
            message = too_large(limit) if too_large is not None else None
            raise InvalidInput(
                message
                or f"the request needs {rows} sequences, more than this model's queue holds ({limit}); send fewer "
                "or shorter inputs"
            )
        waiting = self.queue_depth + self._reserved
        if waiting + rows > limit:
            self._notify_rejected("queue_full")
            raise Overloaded(f"model {self.model!r} is at capacity ({waiting} sequences queued); retry later")
        self._reserved += rows
        return Reservation(self, rows)

    def _release(self, rows: int) -> None:
        self._reserved -= rows

    async def submit(
        self,
        features: Sequence[Encoded],
        deadline: float,
        reservation: Reservation | None = None,
        extra_outputs: tuple[str, ...] = (),
    ) -> BatchResult:
        """Queue `features` in the place `reservation` holds (without one, reserve it now) and wait for their
        outputs, `output_names` and the `extra_outputs` asked for (fetched only for the batches carrying its rows);
        raises Overloaded / DeadlineExceeded / BackendError.

        `deadline` is in `time.perf_counter()` seconds (uvloop's loop clock has only millisecond steps).
        """
        if reservation is None:
            reservation = self.reserve(len(features))
        reservation.release()  # the features take its place, with no await in between
        if self.failure is not None:
            raise self._failed_error()
        if not features:
            raise InvalidInput("nothing to run: the request produced no token sequences")
        loop = self._event_loop
        assert loop is not None
        now = time.perf_counter()
        request = _Request(
            features=features,
            future=loop.create_future(),
            deadline=deadline,
            submitted=now,
            outputs=[None] * len(features),
            remaining=len(features),
            extra_outputs=extra_outputs,
        )
        if self.config.passthrough:
            return await self._passthrough(request)
        if self._gate is not None:
            request.short = self._short_requests and self._gate.is_short(
                len(features), max(len(f.input_ids) for f in features)
            )
        self._enqueue(request)
        if self._gate is not None and request.short:
            self._gate.short_request(request.future)
        return await self._await(request)

    async def _await(self, request: _Request) -> BatchResult:
        # At the deadline a timer cancels the request's future (one timer handle: no Timeout context, no shield).
        # A cancelled future whose awaiting task was not itself cancelled is a deadline, passed in the queue or
        # in the call; a cancelled task is a caller that went away, and awaiting the future directly cancels it
        # with the task, so its features are dropped before compute.
        timer = request.future.get_loop().call_later(request.deadline - time.perf_counter(), self._expire, request)
        try:
            return await request.future
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise
            self._notify_rejected("deadline")
            raise DeadlineExceeded(self._deadline_message(request, time.perf_counter())) from None
        finally:
            timer.cancel()

    def _deadline_message(self, request: _Request, now: float) -> str:
        waited_ms = (now - request.submitted) * 1000
        return (
            f"deadline exceeded after {waited_ms:.0f} ms (queue depth {self.queue_depth}); "
            "allow a longer timeout or send less work"
        )

    def _expire(self, request: _Request) -> None:
        if not request.future.done():
            request.future.cancel()

    def _enqueue(self, request: _Request) -> None:
        for index, feature in enumerate(request.features):
            self._arrivals += 1
            item = _Item(
                request, index, len(feature.input_ids), self._arrivals, request.submitted, self._virtual + index
            )
            self._pending.append(item)
        assert self._wakeup is not None
        self._wakeup.set()

    async def _passthrough(self, request: _Request) -> BatchResult:
        items = [
            _Item(request, index, len(feature.input_ids), 0, request.submitted)
            for index, feature in enumerate(request.features)
        ]
        self._in_flight += len(items)
        try:
            async with asyncio.timeout(request.deadline - time.perf_counter()):
                await self._execute(items)
                return await request.future
        except TimeoutError:
            self._notify_rejected("deadline")
            raise DeadlineExceeded(self._deadline_message(request, time.perf_counter())) from None
        finally:
            self._in_flight -= len(items)

    # ---- the batch loop ---------------------------------------------------------------------------
    async def _loop(self) -> None:
        assert self._slots is not None
        while not self._closed:
            await self._slots.acquire()
            batch = await self._next_batch()
            if not batch:
                self._slots.release()
                continue
            long = _is_long(batch)
            alone = self._run_alone is not None and not self._batch_tasks and not self._pending
            alone = alone and (self._gate is None or self._gate.may_use_all_cores(long))
            task = asyncio.create_task(self._execute(batch, alone))
            self._batch_tasks.add(task)
            task.add_done_callback(self._batch_finished)
            if self._gate is not None and long:
                self._gate.long_started()
                task.add_done_callback(lambda _: self._long_ended())

    def _long_ended(self) -> None:
        assert self._gate is not None
        self._gate.long_ended()

    def _batch_finished(self, task: asyncio.Task[None]) -> None:
        self._batch_tasks.discard(task)
        assert self._slots is not None
        self._slots.release()
        if not task.cancelled() and task.exception() is not None:  # its requests were answered before it raised
            log.error("a batch of model %s ended with an error", self.model, exc_info=task.exception())

    async def _next_batch(self) -> list[_Item]:
        assert self._wakeup is not None
        while not self._closed:
            self._drop_dead(time.perf_counter())
            if not self._pending:
                if self._gate is not None:
                    self._gate.leave(self._wakeup)
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            wait = self._pending[0].submitted + self.config.max_wait_s - time.perf_counter()
            if wait <= 0 or self._full():
                batch = self._gated_batch()
                if batch:
                    return self._remove_batch(batch)
                # a long batch held back for short requests: cut again when one arrives or the gate opens
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            self._wakeup.clear()
            try:
                async with asyncio.timeout(wait):
                    await self._wakeup.wait()
            except TimeoutError:
                pass
        return []

    def _gated_batch(self) -> list[_Item]:
        """The next batch, or [] when it is a long one the gate holds back and no short request's rows wait (they
        go ahead of a held long batch).

        While short requests come, a long batch is followed by the short requests' rows that wait, whatever their
        turn in fair order: the rows of bulk work that the gate held back keep their early tags while short batches
        move the virtual time on, and would otherwise run back to back once the gate opens, with every short
        request behind them. So a short request waits on one long batch at most."""
        gate = self._gate
        if gate is None:
            return self._take_batch()
        priority = gate if gate.short_coming else None
        if priority is not None and self._after_long and any(item.request.short for item in self._pending):
            self._after_long = False
            return self._take_batch(priority, short_only=True)
        batch = self._take_batch(priority)
        long = _is_long(batch)
        assert self._wakeup is not None
        if gate.may_start(long, self._wakeup):
            gate.leave(self._wakeup)
            self._after_long = long
            return batch
        gate.hold(self._wakeup)
        if any(item.request.short for item in self._pending):
            self._after_long = False
            return self._take_batch(priority, short_only=True)
        return []

    def _full(self) -> bool:
        if len(self._pending) >= self.config.max_batch_size:
            return True
        longest = max(map(_LENGTH, self._pending))
        return len(self._pending) * self._width(longest) >= self.config.max_batch_tokens

    def _drop_dead(self, now: float) -> None:
        """Remove features of requests that expired or were abandoned, before any compute is spent."""
        for item in self._pending:  # a plain loop: this runs before every batch, on the event loop
            request = item.request
            if request.deadline <= now or request.future.done():
                break
        else:
            return
        keep: list[_Item] = []
        for item in self._pending:
            if item.request.deadline <= now:
                self._expire(item.request)
            if not item.request.dead:
                keep.append(item)
        self._pending = keep

    def _take_batch(self, priority: LongBatchGate | None = None, short_only: bool = False) -> list[_Item]:
        """Choose a batch (`_remove_batch` takes it out of the queue) from the length-sorted queue (or its `window`
        first features in fair order) around the first feature in fair order (`_Item.tag`: the oldest, but a request
        that came behind a long one's features goes before the rest of them).

        The batch is the run of neighbours in length around that feature that costs least per real token: a call
        costs `call_overhead_tokens` plus its padded tokens (rows x padded width), so similar lengths batch fully
        and a run whose padding would cost more than another call is cut short. It stays within the row limit, the
        token budget, the stretch limit and the optional padding limit (padded tokens <= (1 + max_padding) x real
        tokens); the first feature is taken whatever its width. With `priority` (short requests are coming): a batch
        around a short request's feature holds short requests' features only, and one around bulk work at most
        `priority.long_tokens` padded tokens, so that short requests wait on little compute. `short_only`: the batch
        is cut from short requests' features only (some must wait).
        """
        budget = self.config.max_batch_tokens
        candidates = self._pending
        if short_only:
            candidates = [item for item in candidates if item.request.short]
        if self.config.window is not None and len(candidates) > self.config.window:
            candidates = sorted(candidates, key=_TURN)[: self.config.window]
        first = min(candidates, key=_TURN)
        if priority is not None and first.request.short:
            candidates = [item for item in candidates if item.request.short]
        elif priority is not None:
            budget = min(budget, priority.long_tokens)
        ordered = sorted(candidates, key=_LENGTH_ORDER)
        low, high = self._cheapest_run([item.length for item in ordered], ordered.index(first), budget)
        return ordered[low : high + 1]

    def _cheapest_run(self, lengths: list[int], anchor: int, budget: int) -> tuple[int, int]:
        """The inclusive range [low, high] of the sorted `lengths` around `anchor` with the least cost per real
        token (ties: more rows) among those within the limits; (anchor, anchor) when no other is."""
        rows_limit = self.config.max_batch_size
        overhead = self.config.call_overhead_tokens
        first, last = max(0, anchor - rows_limit + 1), min(len(lengths), anchor + rows_limit)
        widths = [0] * first + [self._width(length) for length in lengths[first:last]]
        best, best_cost = (anchor, anchor), float("inf")
        for low in range(first, anchor + 1):
            real = sum(lengths[low:anchor])
            for high in range(anchor, min(len(lengths), low + rows_limit)):
                real += lengths[high]
                rows = high - low + 1
                if rows > 1 and not self._fits(rows, widths[high], lengths[high], real, lengths[low], budget):
                    break  # a longer run only adds rows and width
                cost = (overhead + rows * widths[high]) / real
                if cost < best_cost - 1e-12 or (abs(cost - best_cost) <= 1e-12 and rows > best[1] - best[0] + 1):
                    best, best_cost = (low, high), cost
        return best

    def _remove_batch(self, batch: list[_Item]) -> list[_Item]:
        """Remove a cut batch from the queue; the virtual time moves on (`_Item.tag`)."""
        self._virtual = max(self._virtual + 1, max(item.tag for item in batch))
        taken = {id(item) for item in batch}
        self._pending = [item for item in self._pending if id(item) not in taken]
        return batch

    def _fits(self, rows: int, width: int, longest: int, real: int, shortest: int, budget: int) -> bool:
        """Whether `rows` rows, padded to `width` (`_width(longest)`), `real` tokens, the shortest `shortest`
        tokens, are within the batch limits."""
        if rows * width > budget:
            return False
        stretch = self.config.max_stretch
        if stretch is not None and width > stretch * shortest + self.config.stretch_tokens:
            return False
        # the padding limit judges the rows' lengths against each other; rounding the width up is the backend's
        # choice and is paid by a batch of one as well
        return self.config.max_padding is None or rows * longest <= (1 + self.config.max_padding) * real

    # ---- running a batch --------------------------------------------------------------------------
    async def _execute(self, batch: list[_Item], alone: bool = False) -> None:
        """Run one batch and answer its requests. Whatever raises on the way (padding, the backend, the output
        checks, the observer, delivery) fails exactly this batch's requests at once, is logged, and the next
        batch runs; `_count_failure` decides whether the model has failed for good."""
        batch = [item for item in batch if not item.request.future.done()]
        if not batch:
            return
        try:
            failure = await self._run_and_deliver(batch, alone)
        except Exception:  # a bug of our own on the batch path: Internal, with the id of its log line
            failure = Internal(f"internal error on this request's batch of model {self.model!r}")
            extra = {"model": self.model, "rows": len(batch), "error_id": failure.error_id}
            log.exception("the batcher failed on a batch", extra=extra)
        if failure is None:
            self._failures = 0
            return
        self._fail(batch, failure)
        self._count_failure(failure)

    async def _run_and_deliver(self, batch: list[_Item], alone: bool) -> ServiceError | None:
        """Pad, run, check and deliver one batch; returns the backend's failure (None when delivered)."""
        start = time.perf_counter()
        for item in batch:
            request = item.request
            if request.first_start is None:
                request.first_start = start
                if self._observer is not None:
                    self._observer.queued(self.model, start - request.submitted)
        arrays = self._pad(batch)
        extra = _extra_outputs(batch)
        self.backend_calls += 1
        run = self._run_batch
        if alone and self._run_alone is not None:
            run = self._run_alone
            self.alone_calls += 1
        try:
            outputs = await (run(arrays, extra) if extra else run(arrays))
            self._check_outputs(outputs, arrays, self.output_names + extra)
        except ServiceError as error:
            if isinstance(error, BackendError):  # with the runtime's own exception it was raised from
                log.error("backend failed on a batch of %d for model %s", len(batch), self.model, exc_info=error)
            return error
        except Exception as error:  # a backend bug must fail its batch, never the server
            log.exception("backend failed on a batch of %d for model %s", len(batch), self.model)
            return BackendError(f"the backend failed on this request's batch: {error}")
        elapsed = time.perf_counter() - start
        if self._observer is not None:
            tokens = sum(item.length for item in batch)  # the real tokens: the rows' lengths
            padded = int(arrays["input_ids"].size)
            self._observer.batch_done(self.model, len(batch), tokens, padded, elapsed, alone=run is self._run_alone)
        self._deliver(batch, outputs, elapsed)
        return None

    def _width(self, longest: int) -> int:
        return padded_width(longest, self.config.width_multiple, self.config.max_width)

    def _pad(self, batch: list[_Item]) -> dict[str, np.ndarray]:
        features = [item.request.features[item.index] for item in batch]
        width = self._width(max(item.length for item in batch))
        return pad_rows(
            [f.input_ids for f in features], [f.token_type_ids for f in features], width, self.config.pad_id
        )

    def _check_outputs(
        self, outputs: dict[str, np.ndarray], arrays: dict[str, np.ndarray], names: Sequence[str]
    ) -> None:
        rows, width = arrays["input_ids"].shape
        for name in names:
            if name not in outputs:
                raise BackendError(f"the backend returned no {name!r} output (got {sorted(outputs)})")
            shape = np.shape(outputs[name])
            if not shape or shape[0] != rows:
                raise BackendError(f"output {name!r} has shape {shape} for a batch of {rows} inputs")
            if name in self.sequence_outputs and (len(shape) < 2 or shape[1] != width):
                raise BackendError(f"output {name!r} has shape {shape} for inputs of length {width}")

    def _deliver(self, batch: list[_Item], outputs: dict[str, np.ndarray], elapsed: float) -> None:
        touched: dict[int, _Request] = {}
        for row, item in enumerate(batch):
            request = item.request
            if request.future.done():  # its caller went away
                continue
            # views into the batch's arrays (each backend call returns new ones): no copy on the event loop
            request.outputs[item.index] = {
                name: outputs[name][row, : item.length] if name in self.sequence_outputs else outputs[name][row]
                for name in (self.output_names + request.extra_outputs if request.extra_outputs else self.output_names)
            }
            request.remaining -= 1
            touched[id(request)] = request
        for request in touched.values():
            request.inference_s += elapsed
            request.batches += 1
            if request.remaining == 0 and not request.future.done():
                assert request.first_start is not None
                request.future.set_result(
                    BatchResult(
                        outputs=[out for out in request.outputs if out is not None],
                        queue_s=request.first_start - request.submitted,
                        inference_s=request.inference_s,
                        batches=request.batches,
                    )
                )

    def _fail(self, batch: list[_Item], error: ServiceError) -> None:
        for item in batch:
            if not item.request.dead:
                item.request.future.set_exception(error)
        # other features of a failed request may still wait in the queue: drop them
        self._drop_dead(time.perf_counter())

    # ---- observation ------------------------------------------------------------------------------
    def _notify_rejected(self, reason: str) -> None:
        if self._observer is not None:
            self._observer.rejected(self.model, reason)
