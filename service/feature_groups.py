"""The features of small requests, built off the event loop on one thread, every request that came meanwhile in
one tokenizer call.

A small request (a sentence to classify, a short text to embed) costs the tokenizer some 50 microseconds alone,
with the GIL held, plus the Python around it: done on the event loop, that was a fifth of the loop's time under a
`/classify` load. Handed to a thread one by one, each would pay a hand-off that costs more than the encoding. Here
the event loop only queues the request and awaits a future; the `bs-tokenize-sm` thread takes every request
queued since its last round, builds their features with one `Pipeline.build_many` per model (one
`encode_batch`, which encodes in Rust without the GIL, for classification), and answers the whole round with one
`call_soon_threadsafe`. Under load the rounds grow with the load, so the per-request cost falls as it rises.

Nothing here is bounded on its own: every request queued is one the door (`service.admission.Door`) has admitted
and counts until it ends, so the door's bound on requests at work bounds this queue too.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from service.pipelines import Pipeline, Plan
from service.worker_threads import TOKENIZE, name_this_thread

THREAD_NAME = f"{TOKENIZE}-sm"
"""The kernel name of the thread (counted as tokenization by `bertserve.benchmarks.thread_cpu`)."""


@dataclass
class _Job:
    pipeline: Pipeline
    plan: Plan
    future: asyncio.Future[Any]


class FeatureGroups:
    """`await groups.build(pipeline, plan)`: `pipeline.build(plan)`, on the group thread, in a round with the other
    requests queued meanwhile. `close()` ends the thread once its queue is empty."""

    def __init__(self) -> None:
        self._jobs: list[_Job] = []
        self._wake = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None
        self.rounds = 0
        """Rounds run so far (each one tokenizer call per model)."""

    async def build(self, pipeline: Pipeline, plan: Plan) -> list[Any]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        with self._wake:
            if self._closed:
                raise RuntimeError("the feature groups are closed")
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name=THREAD_NAME, daemon=True)
                self._thread.start()
            self._jobs.append(_Job(pipeline, plan, future))
            self._wake.notify()
        result: list[Any] = await future
        return result

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
            outcomes = _build_round(jobs)
            self.rounds += 1
            by_loop: dict[asyncio.AbstractEventLoop, list[int]] = {}
            for index, job in enumerate(jobs):
                by_loop.setdefault(job.future.get_loop(), []).append(index)
            for loop, indices in by_loop.items():  # one loop in a server
                with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits for these any more
                    loop.call_soon_threadsafe(
                        _answer, [jobs[index] for index in indices], [outcomes[index] for index in indices]
                    )


def _build_round(jobs: Sequence[_Job]) -> list[Any]:
    """Each job's features, or the exception its input raised; one `build_many` per pipeline."""
    outcomes: list[Any] = [None] * len(jobs)
    by_pipeline: dict[int, list[int]] = {}
    for index, job in enumerate(jobs):
        by_pipeline.setdefault(id(job.pipeline), []).append(index)
    for indices in by_pipeline.values():
        pipeline = jobs[indices[0]].pipeline
        try:
            built = pipeline.build_many([jobs[index].plan for index in indices])
        except Exception as error:  # a bug of build_many's own: every request of the group fails with it
            built = [error] * len(indices)
        for index, outcome in zip(indices, built, strict=True):
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
