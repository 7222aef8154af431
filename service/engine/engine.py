"""The engine both front doors call (REST and gRPC never talk to backends directly): `Engine.submit(task_input)`.

A request walks one path. Its input is checked (`TaskInput.check`); its model rows are planned (QA and NER tokenize
here to count their windows); it is admitted to its model's queue once, by the queue's one capacity rule
(`Batcher.reserve`: 429 when full, 422 when it could never fit); its features are built into the place it holds,
queued with its deadline, batched with other requests' rows, and post-processed into one result per input. A small
request does all of this on the event loop, where a hand-off to a thread would cost more than the work; a large one
tokenizes and post-processes on the bounded executor. The answer comes back with where its time went (`Timings`,
sent as headers / trailing metadata).

The door that bounds requests in progress over both front doors (`self.door`, `service.engine.admission`) lives
here too, so that REST and gRPC share it. `service.serve` loads the engine, then opens the front doors over it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from bert_model.tasks.features import padded_width
from bert_model.tokenization import pad_rows
from bundles.serving import ServingBundle, find_bundles, open_bundle
from service.backends.base import Backend
from service.backends.variant_timing import VariantChoice
from service.engine.admission import BoundedExecutor, Door
from service.engine.batcher import BatchConfig, Batcher, LongBatchGate
from service.engine.call_cost import (
    PROBE_WIDTH,
    WIDTH_PROBE_ROWS,
    measure_overhead_tokens,
    measure_width_multiple,
)
from service.engine.inputs import Limits, TaskInput
from service.engine.pipelines import Pipeline, make_pipeline
from service.errors import BackendUnavailable, InvalidInput, NotReady, Overloaded, ServiceError, UnknownModel
from service.operations.metrics import ServiceMetrics
from service.operations.tracing import Tracer
from service.settings import ServiceSettings

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass
class Timings:
    """Where one request's time went, in milliseconds."""

    tokenize_ms: float = 0.0
    queue_ms: float = 0.0
    inference_ms: float = 0.0
    postprocess_ms: float = 0.0
    total_ms: float = 0.0
    batches: int = 0

    def headers(self) -> dict[str, str]:
        """The timing headers (HTTP) / trailing metadata (gRPC) of a response."""
        return {
            "x-tokenize-time-ms": f"{self.tokenize_ms:.3f}",
            "x-queue-time-ms": f"{self.queue_ms:.3f}",
            "x-inference-time-ms": f"{self.inference_ms:.3f}",
            "x-postprocess-time-ms": f"{self.postprocess_ms:.3f}",
            "x-total-time-ms": f"{self.total_ms:.3f}",
            "x-backend-calls": str(self.batches),
        }


@dataclass
class Outcome:
    """Results (one per input, in order), the model that produced them, and the timings."""

    model: str
    results: list[Any]
    timings: Timings

    def headers(self) -> dict[str, str]:
        """The response headers (HTTP) / trailing metadata (gRPC): the model and the timings."""
        return {"x-model": self.model, **self.timings.headers()}


RESPONSE_HEADERS = tuple(Outcome(model="", results=[], timings=Timings()).headers())
"""The names of the headers every task response carries (CORS exposes them to browsers)."""


@dataclass
class LoadedModel:
    bundle: ServingBundle
    pipeline: Pipeline
    backend: Backend
    batcher: Batcher
    is_default: bool = False
    variant_choice: dict[str, Any] = field(default_factory=lambda: {"auto": False})
    """How the variant was chosen (`service.backends.variant_timing.VariantChoice.describe()`)."""
    name: str = field(init=False)
    """The bundle's name (an attribute: every request reads it, for spans and its `x-model` header)."""

    def __post_init__(self) -> None:
        self.name = self.bundle.name

    def describe(self) -> dict[str, Any]:
        manifest = self.bundle.manifest
        return {
            "name": manifest.name,
            "task": manifest.task,
            # bundles exported before the family was recorded are all BERT-architecture (MiniLM included)
            "family": str(manifest.source.get("model_type", "bert")),
            "labels": list(manifest.labels),
            "variant": self.backend.variant,
            "variant_choice": self.variant_choice,
            "max_seq_length": self.pipeline.max_seq_length,  # the windows served (<= the graph's)
            "backend": self.backend.kind,
            "is_default": self.is_default,
            "function_to_apply": self.pipeline.score_function,
        }


@dataclass
class EngineState:
    ready: bool = False
    """Requests are taken: every model is loaded and warmed up, and the server is not stopping."""
    draining: bool = False
    """A stop signal arrived: readiness reports 503 and responses close their connections, requests still run."""
    shutting_down: bool = False
    load_error: str | None = None
    failure: str | None = None
    """Why the server has failed for good (loading failed, or a model's batch loop or backend died): liveness and
    readiness report 503 from then on, and `bertserve serve` exits non-zero after draining."""
    started: float = field(default_factory=time.monotonic)
    loaded_at: float = 0.0
    """When the models were ready (Unix seconds): the `created` of OpenAI's model list."""


class Engine:
    """Loaded models, their batchers, the door, and the one entry point of requests (`submit`)."""

    def __init__(self, settings: ServiceSettings, metrics: ServiceMetrics | None = None) -> None:
        self.settings = settings
        self.metrics = metrics or ServiceMetrics()
        self.tracer = Tracer(settings.otlp_endpoint)
        self.models: dict[str, LoadedModel] = {}
        self.defaults: dict[str, str] = {}
        self.state = EngineState()
        self.limits = Limits(
            max_inputs=settings.max_inputs_per_request,
            max_text_chars=settings.max_text_chars,
            max_documents=settings.max_rerank_documents,
        )
        self.failure_hooks: list[Callable[[str], None]] = []
        """Called on the event loop, once, when the server fails for good (`fail`), with the reason."""
        self.door = Door(settings.max_in_progress, self.metrics, receiving_limit=settings.max_receiving)
        """Requests receiving and at work over both front doors (the REST middleware and the gRPC interceptor)."""
        self.executor = BoundedExecutor(settings.tokenize_threads, settings.tokenize_queue)
        self.long_gate = (
            LongBatchGate(settings.priority_width, settings.max_batch_size, settings.priority_batch_tokens)
            if settings.priority_width is not None
            else None
        )
        """Short requests before long batches, over every model of this process (shared by their batchers)."""

    # ---- lifecycle --------------------------------------------------------------------------------
    async def load(self) -> None:
        """Open every bundle and check it against the settings before any backend starts, then start backends and
        batchers and warm up. Raises on the first problem (ValueError naming what to change); the caller reports
        ready (`state.ready`) once its front doors are open."""
        bundles: dict[str, ServingBundle] = {}
        for path in find_bundles(self.settings.models, self.settings.bundles_dir):
            bundle = await asyncio.to_thread(open_bundle, path)
            if bundle.name in bundles:
                raise ValueError(f"two bundles are named {bundle.name!r} ({path} and {bundles[bundle.name].path})")
            self._check_variant(bundle)
            bundles[bundle.name] = bundle
        for bundle in bundles.values():
            model = await self._start_model(bundle)
            if bundle.task not in self.defaults:
                self.defaults[bundle.task] = bundle.name
                model.is_default = True
            self.models[bundle.name] = model
            log.info("model ready", extra={"model": bundle.name, "task": bundle.task, "variant": model.backend.variant})
        for model in self.models.values():
            for _ in range(self.settings.warmup_rounds):
                await self._warm_up(model)
            if self.settings.warmup_rounds:
                await self._measure_call_cost(model)
        # What loading left alive (modules, tokenizers, runtimes: some 100,000 objects) moves out of the collector's
        # reach: a full collection then walks only what requests allocated since, instead of stopping the event
        # loop to walk the server's own state.
        gc.collect()
        gc.freeze()

    def set_ready(self) -> None:
        """Requests are taken from now on (the front doors are open)."""
        self.state.loaded_at = time.time()
        self.state.ready = True
        self.metrics.ready.set(1)

    def _check_variant(self, bundle: ServingBundle) -> None:
        """A forced variant (`--variant NAME`) must be one of every served bundle's variants."""
        variant = self.settings.variant
        if self.settings.backend != "ort" or variant in (None, "auto") or variant in bundle.manifest.variants:
            return
        raise ValueError(
            f"--variant {variant!r}: bundle {bundle.name!r} has no such variant; its variants are "
            f"{', '.join(sorted(bundle.manifest.variants))} (or auto, or leave it unset for the hardware's default)"
        )

    def fail(self, reason: str) -> None:
        """The server has failed for good: unready and unlive from now on; tell the failure hooks (once)."""
        if self.state.failure is not None:
            return
        self.state.failure = reason
        self.metrics.ready.set(0)
        log.error("the server has failed: %s", reason)
        for hook in self.failure_hooks:
            hook(reason)

    def _model_failed(self, model: str, reason: str) -> None:
        self.fail(f"model {model!r}: {reason}")

    async def _start_model(self, bundle: ServingBundle) -> LoadedModel:
        pipeline = make_pipeline(bundle)  # checks the manifest before a backend holds sessions or threads
        backend, choice = await self._start_chosen_backend(bundle, pipeline.max_seq_length)
        try:
            model = await self._start_batcher(bundle, pipeline, backend)
        except BaseException:
            await backend.close()
            raise
        model.variant_choice = choice
        return model

    async def _start_chosen_backend(self, bundle: ServingBundle, serving_length: int) -> tuple[Backend, dict[str, Any]]:
        """The started backend and how its variant was chosen: `--variant auto` on a CPU times the candidates
        (part of loading, so readiness waits for it); otherwise the variant `variant_choice` picks here."""
        settings = self.settings
        if settings.backend == "ort" and settings.variant == "auto":
            from bundles.variant_choice import times_cpu_variants
            from service.backends.ort_backend import start_fastest_cpu_variant

            if times_cpu_variants(settings.device):
                timed, choice = await start_fastest_cpu_variant(
                    bundle.path,
                    bundle.manifest,
                    bundle.tokenizer,
                    serving_length,
                    max_batch_size=settings.effective_max_batch_size,
                    max_batch_tokens=settings.max_batch_tokens,
                    budget_s=settings.variant_budget_s,
                    **self._ort_options(),
                )
                return timed, choice.describe()
        backend = self._make_backend(bundle)
        await self._start_backend(backend, bundle.name)
        return backend, VariantChoice(backend.variant, auto=False).describe()

    async def _start_batcher(self, bundle: ServingBundle, pipeline: Pipeline, backend: Backend) -> LoadedModel:
        settings = self.settings
        config = BatchConfig(
            max_batch_size=settings.effective_max_batch_size,
            max_batch_tokens=max(
                min(settings.max_batch_tokens, pipeline.max_batch_tokens or settings.max_batch_tokens),
                bundle.manifest.max_seq_length,
            ),
            max_wait_s=settings.max_wait_ms / 1000 if settings.batching else 0.0,
            max_padding=settings.max_padding,
            window=settings.batch_window or 2 * settings.effective_max_batch_size,
            max_queue=settings.max_queue,
            max_concurrency=settings.max_concurrent_batches or backend.concurrency,
            passthrough=backend.batches_itself,
            pad_id=bundle.tokenizer.pad_id,
            width_multiple=settings.pad_multiple or backend.width_multiple,
            max_width=bundle.manifest.max_seq_length,
            max_consecutive_failures=settings.max_consecutive_failures,
        )
        batcher = Batcher(
            bundle.name,
            backend.infer,
            config,
            output_names=bundle.manifest.output_names,
            sequence_outputs=pipeline.sequence_outputs,
            observer=self.metrics,
            run_alone=backend.infer_alone,
            on_failure=self._model_failed,
            gate=self.long_gate,
            short_requests=pipeline.short_requests,
        )
        self.metrics.watch_queue_depth(bundle.name, lambda: batcher.queue_depth)
        await batcher.start()
        return LoadedModel(bundle=bundle, pipeline=pipeline, backend=backend, batcher=batcher)

    async def _start_backend(self, backend: Backend, name: str) -> None:
        """Start a backend, retrying while it is unavailable (Triton still loading) for `backend_wait_s`."""
        deadline = time.monotonic() + self.settings.backend_wait_s
        delay = 0.5
        while True:
            try:
                await backend.start()
                return
            except BackendUnavailable as error:
                if time.monotonic() + delay > deadline:
                    raise
                log.warning("backend not available yet, retrying", extra={"model": name, "error": error.message})
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    def _make_backend(self, bundle: ServingBundle) -> Backend:
        settings = self.settings
        if settings.backend == "triton":
            from service.backends.triton_backend import TritonBackend

            return TritonBackend(
                bundle.manifest,
                url=settings.triton_url,
                model_name=settings.triton_model_prefix + bundle.name,
                batches_itself=settings.triton_batching,
            )
        from service.backends.ort_backend import OrtBackend

        return OrtBackend(
            bundle.path,
            bundle.manifest,
            device=settings.device,
            variant=None if settings.variant == "auto" else settings.variant,  # checked by `_check_variant`
            batched=settings.effective_max_batch_size > 1,
            **self._ort_options(),
        )

    def _ort_options(self) -> dict[str, Any]:
        """OrtBackend's thread settings."""
        settings = self.settings
        return {
            "intra_op_threads": settings.ort_intra_op_threads,
            "inter_op_threads": settings.ort_inter_op_threads,
            "workers": settings.inference_threads,
            "spinning": settings.ort_spinning,
            "openvino_streams": settings.openvino_streams,
            "openvino_lone_latency": settings.openvino_lone_latency,
        }

    async def _warm_up(self, model: LoadedModel) -> None:
        """A request through the whole path, then one batch of the largest shape the batcher forms (the most rows of
        the longest window), so that the runtime's memory (ONNX Runtime's arena, OpenVINO's buffers) is at its
        working size before the first request: it grows with the largest batch seen, bounded by the settings, and
        would otherwise grow under the first long requests."""
        start = time.perf_counter()
        await self._run(model, model.pipeline.warmup_input(), timeout_s=None)
        config = model.batcher.config
        width = padded_width(model.pipeline.max_seq_length, config.width_multiple, config.max_width)
        rows = max(1, min(config.max_batch_size, config.max_batch_tokens // width))
        deadline = time.perf_counter() + max(self.settings.request_timeout_s, 60.0)
        await model.batcher.submit(model.pipeline.filler_batch(rows), deadline)
        log.info("warmed up", extra={"model": model.name, "ms": round((time.perf_counter() - start) * 1000, 1)})

    async def _measure_call_cost(self, model: LoadedModel) -> None:
        """The backend's fixed cost per call in tokens (`service.engine.call_cost`), which the batcher weighs against
        padding, and whether rounding widths up to the backend's preferred multiple pays on this CPU (unless
        `pad_multiple` is set); kept at their defaults where the backend batches itself or batches hold one row."""
        config = model.batcher.config
        if config.passthrough or config.max_batch_size < 2:
            return
        width = min(PROBE_WIDTH, model.pipeline.max_seq_length)
        pipeline, pad_id = model.pipeline, model.bundle.tokenizer.pad_id

        def feed(rows: int, tokens: int, padded_to: int) -> dict[str, np.ndarray]:
            features = pipeline.filler_batch(rows, tokens)
            return pad_rows([f.input_ids for f in features], [f.token_type_ids for f in features], padded_to, pad_id)

        rows = min(config.max_batch_size, max(2, config.max_batch_tokens // width))
        config.call_overhead_tokens = await measure_overhead_tokens(
            model.backend.infer, lambda n: feed(n, width, width), rows, width
        )
        ratio = None
        if self.settings.pad_multiple is None and config.width_multiple > 1:
            probe_rows = min(config.max_batch_size, WIDTH_PROBE_ROWS)
            config.width_multiple, ratio = await measure_width_multiple(
                model.backend.infer, feed, config.width_multiple, probe_rows, max_width=model.pipeline.max_seq_length
            )
        log.info(
            "call cost",
            extra={
                "model": model.name,
                "overhead_tokens": config.call_overhead_tokens,
                "width_multiple": config.width_multiple,
                "rounded_width_time_ratio": None if ratio is None else round(ratio, 3),
            },
        )

    async def close(self) -> None:
        """Stop batchers (finishing running batches) and release backends; nothing here blocks the event loop
        (the tracer's last export runs in a thread)."""
        self.state.ready = False
        self.state.shutting_down = True
        self.metrics.ready.set(0)
        # every model answers its waiting requests at once, then lets its running batches finish
        await asyncio.gather(*(model.batcher.close() for model in self.models.values()))
        for model in self.models.values():
            try:
                await model.backend.close()
            except Exception:  # one backend that fails to close must not keep the others open
                log.exception("closing the backend of model %s failed", model.name)
        self.executor.close()
        await asyncio.to_thread(self.tracer.shutdown)
        gc.unfreeze()  # what `load` froze goes back to the collector, so the state released here can be freed

    # ---- lookup -----------------------------------------------------------------------------------
    def model_for(self, task: str, name: str | None) -> LoadedModel:
        """The named model (or the task's default); raises UnknownModel / InvalidInput saying what exists."""
        if not self.state.ready:
            raise NotReady("the server is shutting down" if self.state.shutting_down else "models are still loading")
        if not name:
            default = self.defaults.get(task)
            if default is None:
                raise UnknownModel(f"no {task} model is loaded; loaded: {self._listing()}")
            return self.models[default]
        model = self.models.get(name)
        if model is None:
            raise UnknownModel(f"unknown model {name!r}; loaded: {self._listing()}")
        if model.bundle.task != task:
            raise InvalidInput(f"model {name!r} is a {model.bundle.task} model, not {task}; loaded: {self._listing()}")
        return model

    def _listing(self) -> str:
        return ", ".join(f"{name} ({model.bundle.task})" for name, model in self.models.items()) or "none"

    def list_models(self) -> list[dict[str, Any]]:
        return [model.describe() for model in self.models.values()]

    # ---- requests ---------------------------------------------------------------------------------
    async def submit(
        self, request: TaskInput, model: str | None = None, timeout_s: float | None = None, field: str = "inputs"
    ) -> Outcome:
        """Run `request` on the named model (or its task's default): one result per input, in order.

        `timeout_s` (the caller's deadline) is capped by the server's `request_timeout_s`. `field` is the caller's
        name for the texts, which input errors name: the REST bodies' `inputs` (OpenAI's `input`), the gRPC
        messages' `texts`. Raises the domain errors of `service.errors`.
        """
        request.check(self.limits, field)  # before the model is looked up: a bad input is the caller's to fix
        return await self._run(self.model_for(request.task, model), request, timeout_s)

    async def _run(self, model: LoadedModel, request: TaskInput, timeout_s: float | None) -> Outcome:
        if request.truncate is None:
            request = dataclasses.replace(request, truncate=self.settings.truncate)
        budget = (
            self.settings.request_timeout_s if timeout_s is None else min(timeout_s, self.settings.request_timeout_s)
        )
        deadline = time.perf_counter() + budget
        small = model.pipeline.size(request) < INLINE_CHARACTERS
        pipeline = model.pipeline
        start = time.perf_counter()
        with self.tracer.span(f"bertserve.{request.task}", model=model.name):
            with self.tracer.span("tokenize"):
                plan = await self._work(model, small, pipeline.plan, request)
                with model.batcher.reserve(plan.sequences, plan.too_large) as place:
                    features = await self._work(model, small, pipeline.build, plan)
            tokenized = time.perf_counter()
            result = await model.batcher.submit(features, deadline, place, pipeline.extra_outputs(request))
            batched = time.perf_counter()
            self.tracer.record("queue", tokenized, tokenized + result.queue_s, model=model.name)
            self.tracer.record("infer", batched - result.inference_s, batched, model=model.name, batches=result.batches)
            with self.tracer.span("postprocess"):
                postprocess = pipeline.postprocess
                results = await self._work(model, small, postprocess, request, features, result.outputs, bounded=False)
        end = time.perf_counter()
        timings = Timings(
            tokenize_ms=(tokenized - start) * 1000,
            queue_ms=result.queue_s * 1000,
            inference_ms=result.inference_s * 1000,
            postprocess_ms=(end - batched) * 1000,
            total_ms=(end - start) * 1000,
            batches=result.batches,
        )
        return Outcome(model=model.name, results=results, timings=timings)

    async def off_loop(self, characters: int, function: Callable[..., T], *args: Any, bounded: bool = True) -> T:
        """`function(*args)` for a front door's own work of `characters` characters (`/tokenize`'s tokenizer, the
        rendering of a large answer): on the event loop when small, else on the bounded executor (Overloaded when it
        is full; `bounded=False` for the rendering of an answer whose work is done, as `_work` does)."""
        if characters < INLINE_CHARACTERS:
            return function(*args)
        return await self.executor.run(function, *args, bounded=bounded)

    async def _work(
        self, model: LoadedModel, small: bool, function: Callable[..., T], *args: Any, bounded: bool = True
    ) -> T:
        """`function(*args)` on the event loop for a small request, else on the bounded executor; a full executor
        refuses the request (Overloaded). `bounded=False` is for a request's later steps, whose refusal would throw
        away work that is done."""
        if small:
            return function(*args)
        try:
            return await self.executor.run(function, *args, bounded=bounded)
        except Overloaded:
            self.metrics.rejected(model.name, "tokenizer_busy")
            raise


INLINE_CHARACTERS = 2000
"""Requests with fewer characters (`Pipeline.size`) are small: tokenized and post-processed on the event loop,
where a hand-off to a thread would cost more than the work; bigger ones go to the bounded executor, so that the
loop stays free."""


__all__ = ["RESPONSE_HEADERS", "Engine", "EngineState", "LoadedModel", "Outcome", "ServiceError", "Timings"]
