"""Admission: what bounds the work a process takes on before any of it is done.

- `Door`: one bound on the requests in progress in this process, REST and gRPC together, counted from a request's
  arrival (its headers), before its body is read, parsed or tokenized. A request beyond it is refused at once
  (429 / RESOURCE_EXHAUSTED with Retry-After); health, metrics and the playground page stay outside the bound.
  Both front doors run on one event loop, so the count is a plain integer touched only from that loop.
- `BoundedExecutor`: the worker threads that tokenize and post-process large requests, with a bounded queue: a job
  beyond it is refused at once (`Overloaded`) instead of waiting in the unbounded queue of `asyncio.to_thread`.
- `QueueReservations`: a request's model rows are judged against its model's batcher queue as soon as they are
  counted (before the features are built) and hold their place until they are queued, so that requests being
  tokenized at the same time are never accepted for more rows than the queue holds.

Reference: text-embeddings-inference's router takes an admission permit before it tokenizes.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, TypeVar

from service.batcher import Batcher
from service.errors import InvalidInput, Overloaded
from service.metrics import ServiceMetrics

T = TypeVar("T")


class Door:
    """Counts the requests in progress of both front doors; `enter` refuses one beyond `limit`."""

    def __init__(self, limit: int, metrics: ServiceMetrics) -> None:
        if limit < 1:
            raise ValueError(f"the door's limit must be at least 1, got {limit}")
        self.limit = limit
        self._metrics = metrics
        self._in_progress = 0
        metrics.in_progress.set_function(lambda: self._in_progress)

    @property
    def in_progress(self) -> int:
        return self._in_progress

    def enter(self, transport: str) -> bool:
        """Count a request that just arrived over `transport` (http, grpc); False (and counted as a rejection) when
        `limit` requests are in progress already. Every True must be followed by exactly one `leave()`."""
        if self._in_progress >= self.limit:
            self._metrics.door_rejections.labels(transport).inc()
            return False
        self._in_progress += 1
        return True

    def leave(self) -> None:
        """A request counted by `enter` ended (answered, failed or abandoned)."""
        assert self._in_progress > 0, "leave() without enter()"
        self._in_progress -= 1

    def refusal(self) -> Overloaded:
        """The error a refused request ends with."""
        return Overloaded(
            f"the server is at capacity ({self.limit} requests in progress, the max_in_progress setting); retry later"
        )


class BoundedExecutor:
    """A thread pool whose queue is bounded: `run` refuses a job with Overloaded when `threads + queue` are there."""

    def __init__(self, threads: int, queue: int, name: str = "tokenize") -> None:
        if threads < 1 or queue < 0:
            raise ValueError(f"need at least 1 thread and a queue >= 0, got {threads} threads, queue {queue}")
        self.capacity = threads + queue
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix=name)
        self._lock = threading.Lock()
        self._jobs = 0

    @property
    def jobs(self) -> int:
        """Jobs running or waiting for a thread."""
        return self._jobs

    async def run(self, function: Callable[..., T], *args: Any, bounded: bool = True) -> T:
        """`function(*args)` on a worker thread (in the caller's context, as `asyncio.to_thread` runs it).

        `bounded=False` is for the later steps of a request that already holds a job's place in the door's count
        (post-processing): refusing those would throw away work that is done.
        """
        with self._lock:
            if bounded and self._jobs >= self.capacity:
                raise Overloaded(f"the server is busy tokenizing ({self._jobs} large requests ahead); retry later")
            self._jobs += 1
        try:
            future = self._pool.submit(contextvars.copy_context().run, function, *args)
        except BaseException:
            self._finished(None)
            raise
        future.add_done_callback(self._finished)
        # A caller that goes away cancels the job if it has not started (wrap_future passes the cancellation on).
        return await asyncio.wrap_future(future)

    def _finished(self, _: Future[Any] | None) -> None:
        with self._lock:
            self._jobs -= 1

    def close(self) -> None:
        """Stop the threads once their running jobs end, dropping the queued ones; never blocks."""
        self._pool.shutdown(wait=False, cancel_futures=True)


class QueueReservations:
    """Model rows counted but not queued yet, per model (keyed by the loaded models' names only)."""

    def __init__(self, metrics: ServiceMetrics) -> None:
        self._metrics = metrics
        self._held: dict[str, int] = {}

    def held(self, model: str) -> int:
        return self._held.get(model, 0)

    def check(self, queue: Batcher, sequences: int) -> None:
        """Raise Overloaded if `sequences` more rows would not fit beside the queued and reserved ones, and
        InvalidInput if they would not fit even into an empty queue."""
        if sequences > queue.config.max_queue:
            raise InvalidInput(
                f"the request needs {sequences} sequences, more than this model's queue holds "
                f"({queue.config.max_queue}); send fewer or shorter inputs"
            )
        waiting = queue.queue_depth + self.held(queue.model)
        if waiting + sequences > queue.config.max_queue:
            self._metrics.rejected(queue.model, "queue_full")
            raise Overloaded(f"model {queue.model!r} is at capacity ({waiting} sequences queued); retry later")

    @contextmanager
    def reserve(self, queue: Batcher, sequences: int) -> Iterator[None]:
        """Check, then hold `sequences` rows of the queue until the block ends (the rows are queued right after)."""
        self.check(queue, sequences)
        self._held[queue.model] = self.held(queue.model) + sequences
        try:
            yield
        finally:
            self._held[queue.model] -= sequences


__all__ = ["BoundedExecutor", "Door", "QueueReservations"]
