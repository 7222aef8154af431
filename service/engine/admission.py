"""Admission: what bounds the work a process takes on before any of it is done.

- `Door`: two bounds per process, REST and gRPC together. A request is counted from its arrival (its headers)
  among the requests *receiving* (`receiving_limit`: their body or gRPC message still arriving; cheap: each holds
  at most max_body_bytes, for at most the body timeout, and no worker), and once its body is complete, before it
  is parsed or tokenized, among the requests *in progress* (`limit`: the work). A request beyond either bound is
  refused at once (429 / RESOURCE_EXHAUSTED with Retry-After), so clients that send their bodies slowly cannot
  fill the work bound; health, metrics and the playground page stay outside both. Both front doors run on one
  event loop, so the counts are plain integers touched only from that loop.
- `BoundedExecutor`: the worker threads that tokenize and post-process large requests, with a bounded queue: a job
  beyond it is refused at once (`Overloaded`) instead of waiting in the unbounded queue of `asyncio.to_thread`.
- `bearer_matches`: the API key, checked by both front doors before a request's body is read.
A request's model rows are then admitted once, by its model's queue (`service.engine.batcher.Batcher.reserve`).

Reference: text-embeddings-inference's router takes an admission permit before it tokenizes.
"""

from __future__ import annotations

import asyncio
import contextvars
import secrets
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

from service.errors import Overloaded
from service.operations.metrics import ServiceMetrics
from service.operations.threads import BULK_NICE, TOKENIZE, thread_setup

T = TypeVar("T")


class Door:
    """The door's two bounds, shared by both front doors: requests still receiving their body (or gRPC message)
    and requests at work. `arrive` counts a request at its arrival under `receiving_limit`; its `Ticket.admit`, once
    the body is complete (before it is parsed), moves it under `limit`. Either refuses when full."""

    def __init__(self, limit: int, metrics: ServiceMetrics, receiving_limit: int | None = None) -> None:
        receiving_limit = limit if receiving_limit is None else receiving_limit
        if limit < 1 or receiving_limit < 1:
            raise ValueError(f"the door's limits must be at least 1, got {limit} and receiving {receiving_limit}")
        self.limit = limit
        self.receiving_limit = receiving_limit
        self._metrics = metrics
        self._in_progress = 0
        self._receiving = 0
        metrics.in_progress.set_function(lambda: self._in_progress)
        metrics.receiving.set_function(lambda: self._receiving)

    @property
    def in_progress(self) -> int:
        """Requests at work: body complete, not answered yet."""
        return self._in_progress

    @property
    def receiving(self) -> int:
        """Requests counted at their arrival whose body (gRPC: message) is not complete yet."""
        return self._receiving

    def arrive(self, transport: str) -> Ticket | None:
        """Count a request that just arrived over `transport` (http, grpc) as receiving; None (and counted as a
        rejection) when `receiving_limit` requests are receiving already. Close every ticket once."""
        if self._receiving >= self.receiving_limit:
            self._metrics.door_rejections.labels(transport, "receiving").inc()
            return None
        self._receiving += 1
        return Ticket(self, transport)

    def refusal(self, bound: str = "in_progress") -> Overloaded:
        """The error a request refused by `bound` (receiving, in_progress) ends with."""
        if bound == "receiving":
            return Overloaded(
                f"the server is at capacity ({self.receiving_limit} requests receiving their body, the max_receiving "
                "setting); retry later"
            )
        return Overloaded(
            f"the server is at capacity ({self.limit} requests in progress, the max_in_progress setting); retry later"
        )


class Ticket:
    """One request's place at the door: receiving, then (after `admit`) at work, until `close`."""

    __slots__ = ("_door", "_stage", "transport")

    def __init__(self, door: Door, transport: str) -> None:
        self._door = door
        self.transport = transport
        self._stage = "receiving"

    @property
    def stage(self) -> str:
        """receiving, in_progress, or closed."""
        return self._stage

    def admit(self) -> bool:
        """The body is complete: give back the receiving place and take a place at work; False (counted as a
        rejection, the ticket closed) when `limit` requests are at work already."""
        assert self._stage == "receiving", f"admit() of a ticket {self._stage}"
        door = self._door
        door._receiving -= 1
        if door._in_progress >= door.limit:
            self._stage = "closed"
            door._metrics.door_rejections.labels(self.transport, "in_progress").inc()
            return False
        door._in_progress += 1
        self._stage = "in_progress"
        return True

    def close(self) -> None:
        """The request ended (answered, failed, refused or abandoned): give back its place; idempotent."""
        if self._stage == "receiving":
            self._door._receiving -= 1
        elif self._stage == "in_progress":
            self._door._in_progress -= 1
        self._stage = "closed"


class BoundedExecutor:
    """A thread pool whose queue is bounded: `run` refuses a job with Overloaded when `threads + queue` are there."""

    def __init__(self, threads: int, queue: int, name: str = TOKENIZE) -> None:
        if threads < 1 or queue < 0:
            raise ValueError(f"need at least 1 thread and a queue >= 0, got {threads} threads, queue {queue}")
        self.capacity = threads + queue
        self._pool = ThreadPoolExecutor(
            max_workers=threads, thread_name_prefix=name, initializer=thread_setup(name, BULK_NICE)
        )
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


def bearer_matches(header: bytes | str | None, key: bytes) -> bool:
    """Whether an `Authorization` header (HTTP) or metadata value (gRPC) carries `Bearer <key>`. The scheme is
    case-insensitive (RFC 9110 section 11.1) on both front doors, and the key is compared in constant time."""
    if header is None:
        return False
    value = header.encode("latin-1", "replace") if isinstance(header, str) else header
    scheme, _, credentials = value.strip().partition(b" ")
    return scheme.lower() == b"bearer" and secrets.compare_digest(credentials.strip(), key)


__all__ = ["BoundedExecutor", "Door", "Ticket", "bearer_matches"]
