"""Small requests built and post-processed off the event loop on one thread, in rounds: every small request that
came meanwhile built in one tokenizer call, and every small answer post-processed in the same round.

A small request (a sentence to classify, a short text to embed) costs the tokenizer some 50 microseconds alone,
with the GIL held, plus the Python around it, and its post-processing (a softmax and top-k for a classification)
some 40 more: done on the event loop, the two were a third of the loop's time under a `/classify` load. Handed to
a pool one by one, each would pay a hand-off that costs more than the work. Here the event loop only queues the
job and awaits a future; the `bs-tokenize-sm` thread takes every job queued since its last round, builds features
with one `Pipeline.build_many` per model (one `encode_batch`, which encodes in Rust without the GIL, for
classification), post-processes with one `Pipeline.postprocess_many` per model (one softmax and top-k over every
answer's logits, for classification), and answers the whole round with one `call_soon_threadsafe`.
Under load the rounds grow with the load, so the per-request cost falls as it rises.

Nothing here is bounded on its own: every job queued is one of a request the door (`service.engine.admission.Door`) has
admitted and counts until it ends, so the door's bound on requests at work bounds this queue too.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bert_model.tasks.features import Feature
from service.engine.pipelines import Pipeline, Plan, PostprocessItem
from service.operations.threads import TOKENIZE, name_this_thread

THREAD_NAME = f"{TOKENIZE}-sm"
"""The kernel name of the thread (counted as tokenization by `bertserve.benchmarks.thread_cpu`)."""


@dataclass
class _Build:
    """A request's features: `pipeline.build(plan)`, with the other builds of its pipeline in the round."""

    future: asyncio.Future[Any]
    pipeline: Pipeline
    plan: Plan


@dataclass
class _Post:
    """A request's answers: `pipeline.postprocess(request, features, outputs)`, with the other post-processing of
    its pipeline in the round."""

    future: asyncio.Future[Any]
    pipeline: Pipeline
    item: PostprocessItem


_Job = _Build | _Post


class SmallRequests:
    """`await small.build(pipeline, plan)`: `pipeline.build(plan)`, and `await small.postprocess(pipeline, request,
    features, outputs)`: `pipeline.postprocess(request, features, outputs)`, on the thread, in a round with the other
    jobs queued meanwhile. `close()` ends the thread once its queue is empty."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        """Jobs for the thread, then None once closed. A SimpleQueue: put and get are C calls, and a get blocks
        without the GIL (a `threading.Condition` is Python code on both sides, and a new lock per wait)."""
        self._lock = threading.Lock()
        """Held to start the thread, to queue a job and to close: no job is queued behind the None."""
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.rounds = 0
        """Rounds run so far (each one tokenizer call per model)."""

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """Answer on `loop` from now on (the server's: asyncio.get_running_loop() per request is a getpid() system
        call on Python 3.11); unbound, each call answers on the loop it runs on."""
        self._loop = loop

    async def build(self, pipeline: Pipeline, plan: Plan) -> list[Any]:
        result: list[Any] = await self._queue(_Build(self._new_future(), pipeline, plan))
        return result

    async def postprocess(
        self, pipeline: Pipeline, request: Any, features: Sequence[Feature], outputs: list[dict[str, Any]]
    ) -> list[Any]:
        """A small request's answers, on the thread, in its next round."""
        item = (request, features, outputs)
        result: list[Any] = await self._queue(_Post(self._new_future(), pipeline, item))
        return result

    def _new_future(self) -> asyncio.Future[Any]:
        return (self._loop or asyncio.get_running_loop()).create_future()

    async def _queue(self, job: _Job) -> Any:
        with self._lock:
            if self._closed:
                raise RuntimeError("the small-request thread is closed")
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name=THREAD_NAME, daemon=True)
                self._thread.start()
            self._jobs.put(job)
        return await job.future

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self._jobs.put(None)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def _work(self) -> None:
        name_this_thread(THREAD_NAME)
        closing = False
        while not closing:
            jobs = [self._jobs.get()]
            while not self._jobs.empty():  # this thread is the only taker: what empty() denies, get takes at once
                jobs.append(self._jobs.get())
            if jobs[-1] is None:  # closed: nothing is queued behind it
                jobs.pop()
                closing = True
            if jobs:
                self._run(jobs)  # type: ignore[arg-type]

    def _run(self, jobs: list[_Job]) -> None:
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
    """Each job's outcome (features, answers) or the exception it raised; one `build_many` and one
    `postprocess_many` per pipeline."""
    outcomes: list[Any] = [None] * len(jobs)
    groups: dict[tuple[bool, int], list[int]] = {}
    for index, job in enumerate(jobs):
        groups.setdefault((isinstance(job, _Build), id(job.pipeline)), []).append(index)
    for (building, _), indices in groups.items():
        pipeline = jobs[indices[0]].pipeline
        try:
            if building:
                done = pipeline.build_many([jobs[index].plan for index in indices])  # type: ignore[union-attr]
            else:
                done = pipeline.postprocess_many([jobs[index].item for index in indices])  # type: ignore[union-attr]
        except Exception as error:  # a bug of the pipeline's own: every request of the group fails with it
            done = [error] * len(indices)
        for index, outcome in zip(indices, done, strict=True):
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
