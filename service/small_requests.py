"""Small requests built and post-processed off the event loop on one thread, in rounds: every small request that
came meanwhile built in one tokenizer call, and every small answer post-processed in the same round.

A small request (a sentence to classify, a short text to embed) costs the tokenizer some 50 microseconds alone,
with the GIL held, plus the Python around it, and its post-processing (a softmax and top-k for a classification)
some 40 more: done on the event loop, the two were a third of the loop's time under a `/classify` load. Handed to
a pool one by one, each would pay a hand-off that costs more than the work. Here the event loop only queues the
job and awaits a future; the `bs-tokenize-sm` thread takes every job queued since its last round, builds features
with one `Pipeline.build_many` per model (one `encode_batch`, which encodes in Rust without the GIL, for
classification), runs the post-processing calls, and answers the whole round with one `call_soon_threadsafe`.
Under load the rounds grow with the load, so the per-request cost falls as it rises.

Nothing here is bounded on its own: every job queued is one of a request the door (`service.admission.Door`) has
admitted and counts until it ends, so the door's bound on requests at work bounds this queue too.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from service.pipelines import Pipeline, Plan
from service.worker_threads import TOKENIZE, name_this_thread

T = TypeVar("T")

THREAD_NAME = f"{TOKENIZE}-sm"
"""The kernel name of the thread (counted as tokenization by `bertserve.benchmarks.thread_cpu`)."""


@dataclass
class _Build:
    """A request's features: `pipeline.build(plan)`, with the other builds of its pipeline in the round."""

    future: asyncio.Future[Any]
    pipeline: Pipeline
    plan: Plan


@dataclass
class _Call:
    """`function(*args)`: a small request's post-processing."""

    future: asyncio.Future[Any]
    function: Callable[..., Any]
    args: tuple[Any, ...]


_Job = _Build | _Call


class SmallRequests:
    """`await small.build(pipeline, plan)`: `pipeline.build(plan)`, and `await small.call(function, *args)`:
    `function(*args)`, on the thread, in a round with the other jobs queued meanwhile. `close()` ends the thread
    once its queue is empty."""

    def __init__(self) -> None:
        self._jobs: list[_Job] = []
        self._wake = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None
        self.rounds = 0
        """Rounds run so far (each one tokenizer call per model)."""

    async def build(self, pipeline: Pipeline, plan: Plan) -> list[Any]:
        result: list[Any] = await self._queue(_Build(asyncio.get_running_loop().create_future(), pipeline, plan))
        return result

    async def call(self, function: Callable[..., T], *args: Any) -> T:
        """`function(*args)` on the thread, in its next round (a small request's post-processing)."""
        result: T = await self._queue(_Call(asyncio.get_running_loop().create_future(), function, args))
        return result

    async def _queue(self, job: _Job) -> Any:
        with self._wake:
            if self._closed:
                raise RuntimeError("the small-request thread is closed")
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name=THREAD_NAME, daemon=True)
                self._thread.start()
            self._jobs.append(job)
            self._wake.notify()
        return await job.future

    def close(self) -> None:
        with self._wake:
            self._closed = True
            self._wake.notify()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def _work(self) -> None:
        name_this_thread(THREAD_NAME)
        while True:
            with self._wake:
                while not self._jobs and not self._closed:
                    self._wake.wait()
                if not self._jobs:
                    return
                jobs, self._jobs = self._jobs, []
            outcomes = _run_round(jobs)
            self.rounds += 1
            by_loop: dict[asyncio.AbstractEventLoop, list[int]] = {}
            for index, job in enumerate(jobs):
                by_loop.setdefault(job.future.get_loop(), []).append(index)
            for loop, indices in by_loop.items():  # one loop in a server
                with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits for these any more
                    loop.call_soon_threadsafe(
                        _answer, [jobs[index] for index in indices], [outcomes[index] for index in indices]
                    )


def _run_round(jobs: Sequence[_Job]) -> list[Any]:
    """Each job's outcome (features, a call's result) or the exception it raised; one `build_many` per pipeline."""
    outcomes: list[Any] = [None] * len(jobs)
    builds: dict[int, list[tuple[int, _Build]]] = {}
    for index, job in enumerate(jobs):
        if isinstance(job, _Build):
            builds.setdefault(id(job.pipeline), []).append((index, job))
            continue
        try:
            outcomes[index] = job.function(*job.args)
        except Exception as error:
            outcomes[index] = error
    for group in builds.values():
        try:
            built = group[0][1].pipeline.build_many([job.plan for _, job in group])
        except Exception as error:  # a bug of build_many's own: every request of the group fails with it
            built = [error] * len(group)
        for (index, _), outcome in zip(group, built, strict=True):
            outcomes[index] = outcome
    return outcomes


def _answer(jobs: Sequence[_Job], outcomes: Sequence[Any]) -> None:
    for job, outcome in zip(jobs, outcomes, strict=True):
        if job.future.done():  # its caller went away
            continue
        if isinstance(outcome, BaseException):
            job.future.set_exception(outcome)
        else:
            job.future.set_result(outcome)
