"""`InferenceService`: the one engine both front doors call (REST and gRPC never talk to backends directly).

Per loaded model: a bundle (manifest + tokenizer), a task pipeline (`service.engine.pipelines`), a backend (ONNX
Runtime or Triton) and a batcher. A call validates the request (limits, options), counts the model rows it
needs and judges them against the model's queue (`service.engine.admission`), builds the features, submits them to
the model's batcher with a deadline, and post-processes the output rows; large requests are tokenized and
post-processed on a bounded pool of threads off the event loop. It returns the results and where the time
went (`Timings`, sent back as headers / trailing metadata). The door that bounds the requests in progress of
both front doors (`self.door`) lives here too, so that REST and gRPC share it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from bert_model.tasks.features import Feature, padded_width
from bert_model.tasks.ner import AGGREGATION_STRATEGIES
from bert_model.tokenization import pad_rows
from bundles.serving import ServingBundle, find_bundles, open_bundle
from service.backends.base import Backend
from service.backends.variant_timing import VariantChoice
from service.engine.admission import BoundedExecutor, Door, QueueReservations
from service.engine.batcher import BatchConfig, Batcher, LongBatchGate
from service.engine.call_cost import PROBE_WIDTH, WIDTH_PROBE_ROWS, measure_overhead_tokens, measure_width_multiple
from service.engine.inputs import ClassifyInput, EmbedInput, FillMaskInput, NERInput, QAInput, TaskInput
from service.engine.pipelines import FillMaskPipeline, Pipeline, make_pipeline
from service.engine.small_requests import SmallRequests
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
        return {name.decode(): value.decode() for name, value in self.raw_headers()}

    def raw_headers(self) -> list[tuple[bytes, bytes]]:
        """`headers()` as (name, value) bytes, formatted straight to bytes (an HTTP response head's form)."""
        return [
            (b"x-tokenize-time-ms", b"%.3f" % self.tokenize_ms),
            (b"x-queue-time-ms", b"%.3f" % self.queue_ms),
            (b"x-inference-time-ms", b"%.3f" % self.inference_ms),
            (b"x-postprocess-time-ms", b"%.3f" % self.postprocess_ms),
            (b"x-total-time-ms", b"%.3f" % self.total_ms),
            (b"x-backend-calls", b"%d" % self.batches),
        ]


@dataclass
class Outcome:
    """Results (one per input, in order), the model that produced them, and the timings."""

    model: str
    results: list[Any]
    timings: Timings

    def headers(self) -> dict[str, str]:
        """The response headers (HTTP) / trailing metadata (gRPC): the model and the timings."""
        return {"x-model": self.model, **self.timings.headers()}

    def raw_headers(self) -> list[tuple[bytes, bytes]]:
        """`headers()` as an HTTP response head's (name, value) bytes."""
        return [(b"x-model", self.model.encode("latin-1")), *self.timings.raw_headers()]


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
            "labels": list(manifest.labels),
            "variant": self.backend.variant,
            "variant_choice": self.variant_choice,
            "max_seq_length": self.pipeline.max_seq_length,  # the windows served (<= the graph's)
            "backend": self.backend.kind,
            "is_default": self.is_default,
            "function_to_apply": self.pipeline.score_function,
        }


@dataclass
class ServiceState:
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


class InferenceService:
    """Loaded models, their batchers, and one entry point per task."""

    def __init__(self, settings: ServiceSettings, metrics: ServiceMetrics | None = None) -> None:
        self.settings = settings
        self.metrics = metrics or ServiceMetrics()
        self.tracer = Tracer(settings.otlp_endpoint)
        self.models: dict[str, LoadedModel] = {}
        self.defaults: dict[str, str] = {}
        self.state = ServiceState()
        self.failure_hooks: list[Callable[[str], None]] = []
        """Called on the event loop, once, when the server fails for good (`fail`), with the reason."""
        self.door = Door(settings.max_in_progress, self.metrics, receiving_limit=settings.max_receiving)
        """Requests receiving and at work over both front doors (the REST middleware and the gRPC interceptor)."""
        self.executor = BoundedExecutor(settings.tokenize_threads, settings.tokenize_queue)
        self.small_requests = SmallRequests()
        """Builds and post-processes small requests off the event loop, those that come together in one round."""
        self.reservations = QueueReservations(self.metrics)
        self.long_gate = (
            LongBatchGate(settings.priority_width, settings.max_batch_size, settings.priority_batch_tokens)
            if settings.priority_width is not None
            else None
        )
        """Short requests before long batches, over every model of this process (shared by their batchers)."""

    # ---- lifecycle --------------------------------------------------------------------------------
    async def load(self, before_ready: Callable[[], Awaitable[None]] | None = None) -> None:
        """Open every bundle and check it against the settings before any backend starts, then start backends and
        batchers and warm up; then await `before_ready` (the app opens its gRPC port there) and report ready.
        Raises on the first problem (ValueError naming what to change)."""
        self.small_requests.bind(asyncio.get_running_loop())
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
        # loop for some 70 ms every few thousand requests to walk the server's own state.
        gc.collect()
        gc.freeze()
        if before_ready is not None:
            await before_ready()
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
        await self._run(model, model.pipeline.warmup_input(), timeout_s=None, route="warmup")
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
                model.backend.infer, feed, config.width_multiple, probe_rows
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
        for model in self.models.values():
            await model.batcher.close()
            try:
                await model.backend.close()
            except Exception:  # one backend that fails to close must not keep the others open
                log.exception("closing the backend of model %s failed", model.name)
        self.executor.close()
        await asyncio.to_thread(self.small_requests.close)
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

    # ---- the tasks --------------------------------------------------------------------------------
    # `field` (classify, ner, embed, fill_mask): the caller's name for the texts, which input errors name: the REST
    # bodies' `inputs` (OpenAI's `input`), the gRPC messages' `texts` (Classify's `inputs`).
    async def classify(
        self, request: ClassifyInput, model: str | None = None, timeout_s: float | None = None, field: str = "inputs"
    ) -> Outcome:
        self._check_texts(request.texts, field)
        if request.pairs is not None:
            self._check_texts(request.pairs, "text_pair")
        if request.top_k is not None and request.top_k < 1:
            raise InvalidInput(f"top_k must be at least 1 (or null for all labels), got {request.top_k}")
        return await self._run(self.model_for("classify", model), request, timeout_s, route="classify")

    async def qa(self, request: QAInput, model: str | None = None, timeout_s: float | None = None) -> Outcome:
        self._check_texts(request.questions, "question")
        self._check_texts(request.contexts, "context", count=False)
        if not 1 <= request.top_k <= 20:
            raise InvalidInput(f"top_k must be between 1 and 20, got {request.top_k}")
        if request.max_answer_len is not None and not 1 <= request.max_answer_len <= 512:
            raise InvalidInput(f"max_answer_len must be between 1 and 512 tokens, got {request.max_answer_len}")
        if request.doc_stride is not None and request.doc_stride < 0:
            raise InvalidInput(f"doc_stride must be >= 0, got {request.doc_stride}")
        return await self._run(self.model_for("qa", model), request, timeout_s, route="qa")

    async def ner(
        self, request: NERInput, model: str | None = None, timeout_s: float | None = None, field: str = "inputs"
    ) -> Outcome:
        self._check_texts(request.texts, field)
        if request.aggregation_strategy not in AGGREGATION_STRATEGIES:
            raise InvalidInput(
                f"aggregation_strategy must be one of {', '.join(AGGREGATION_STRATEGIES)}, "
                f"got {request.aggregation_strategy!r}"
            )
        return await self._run(self.model_for("ner", model), request, timeout_s, route="ner")

    async def embed(
        self, request: EmbedInput, model: str | None = None, timeout_s: float | None = None, field: str = "inputs"
    ) -> Outcome:
        self._check_texts(request.texts, field)
        if request.dimensions is not None and request.dimensions < 1:
            raise InvalidInput(f"dimensions must be at least 1, got {request.dimensions}")
        return await self._run(self.model_for("embed", model), request, timeout_s, route="embed")

    async def fill_mask(
        self, request: FillMaskInput, model: str | None = None, timeout_s: float | None = None, field: str = "inputs"
    ) -> Outcome:
        self._check_texts(request.texts, field)
        if not 1 <= request.top_k <= FILL_MASK_MAX_TOP_K:
            raise InvalidInput(f"top_k must be between 1 and {FILL_MASK_MAX_TOP_K}, got {request.top_k}")
        if request.targets is not None:
            _check_targets(request.targets)
        return await self._run(self.model_for("fill-mask", model), request, timeout_s, route="fill-mask")

    def _check_texts(self, texts: list[str], name: str, *, count: bool = True) -> None:
        limit = self.settings.max_inputs_per_request
        if not texts:
            raise InvalidInput(f"{name}: give at least one input")
        if count and len(texts) > limit:
            raise InvalidInput(f"{name}: {len(texts)} inputs in one request, more than the limit of {limit}; split it")
        for index, text in enumerate(texts):
            if not isinstance(text, str):
                raise InvalidInput(f"{name}[{index}] must be a string, got {type(text).__name__}")
            if not text.strip():
                raise InvalidInput(f"{name}[{index}] is empty: send non-blank text")
            if len(text) > self.settings.max_text_chars:
                raise InvalidInput(
                    f"{name}[{index}] has {len(text)} characters, more than the limit of "
                    f"{self.settings.max_text_chars}; shorten it"
                )
            if not text.isascii():  # after the length check: this encodes the whole text
                _check_unicode(text, f"{name}[{index}]")

    # ---- the common path --------------------------------------------------------------------------
    async def _run(self, model: LoadedModel, request: TaskInput, timeout_s: float | None, route: str) -> Outcome:
        if request.truncate is None:
            request = dataclasses.replace(request, truncate=self.settings.truncate)
        budget = (
            self.settings.request_timeout_s if timeout_s is None else min(timeout_s, self.settings.request_timeout_s)
        )
        deadline = time.perf_counter() + budget
        timings = Timings()
        start = time.perf_counter()
        # every input becomes at least one sequence: shed load before spending CPU on tokenization
        self.reservations.check(model.batcher, model.pipeline.count(request))
        size = _characters(request, model.pipeline)
        with self.tracer.span(f"bertserve.{route}", model=model.name):
            with self.tracer.span("tokenize"):
                features = await self._features(model, request, size)
            tokenized = time.perf_counter()
            result = await model.batcher.submit(features, deadline)
            batched = time.perf_counter()
            self.tracer.record("queue", tokenized, tokenized + result.queue_s, model=model.name)
            self.tracer.record("infer", batched - result.inference_s, batched, model=model.name, batches=result.batches)
            with self.tracer.span("postprocess"):
                postprocess, outputs = model.pipeline.postprocess, result.outputs
                if size < INLINE_CHARACTERS:
                    results = await self.small_requests.postprocess(model.pipeline, request, features, outputs)
                else:
                    results = await self._off_loop(model, size, postprocess, request, features, outputs, bounded=False)
        end = time.perf_counter()
        timings.tokenize_ms = (tokenized - start) * 1000
        timings.queue_ms = result.queue_s * 1000
        timings.inference_ms = result.inference_s * 1000
        timings.postprocess_ms = (end - batched) * 1000
        timings.total_ms = (end - start) * 1000
        timings.batches = result.batches
        return Outcome(model=model.name, results=results, timings=timings)

    async def _features(self, model: LoadedModel, request: TaskInput, size: int) -> list[Feature]:
        """Count the request's model rows (QA, NER: each input tokenized once, its windows counted), judge them
        against the model's queue and hold their place there, then build them: a small request's with the other
        small requests of the moment (`service.engine.small_requests`), a large one's on the bounded executor. The place
        is given back just before the caller queues the features, with no await in between."""
        plan = await self._off_loop(model, size, model.pipeline.plan, request)
        too_large = plan.too_large(model.batcher.config.max_queue)
        if too_large is not None:
            raise InvalidInput(too_large)
        with self.reservations.reserve(model.batcher, plan.sequences):
            if size < INLINE_CHARACTERS:
                return await self.small_requests.build(model.pipeline, plan)
            return await self._off_loop(model, size, model.pipeline.build, plan)

    async def _off_loop(
        self, model: LoadedModel, size: int, function: Callable[..., T], *args: Any, bounded: bool = True
    ) -> T:
        """`function(*args)` on the event loop for a small request (a thread hand-off costs more than the work),
        else on the bounded executor; a full executor refuses the request (Overloaded)."""
        if size < INLINE_CHARACTERS:
            return function(*args)
        try:
            return await self.executor.run(function, *args, bounded=bounded)
        except Overloaded:
            self.metrics.rejected(model.name, "tokenizer_busy")
            raise


FILL_MASK_MAX_TOP_K = 100
"""Most fills per mask one request may ask for (each is a decoded sequence in the response)."""
FILL_MASK_MAX_TARGETS = 1000
"""Most `targets` in one fill-mask request (each is looked up, or tokenized, to find its vocabulary id)."""
FILL_MASK_MAX_TARGET_CHARS = 100
"""Longest fill-mask target in characters: a target is one vocabulary token (the longest of a BERT vocabulary has
about 20), so a longer one is refused before it is tokenized."""


def _check_unicode(text: str, where: str) -> None:
    """A JSON string may escape a lone surrogate (`"\\ud800"`), which is no character and which no tokenizer
    takes: refuse it here, saying where it is."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise InvalidInput(
            f"{where} is not valid Unicode text: character {error.start} is a lone surrogate "
            f"({text[error.start]!r}); send UTF-8 text"
        ) from None


def _check_targets(targets: list[str]) -> None:
    if len(targets) > FILL_MASK_MAX_TARGETS:
        raise InvalidInput(
            f"targets: {len(targets)} targets in one request, more than the limit of {FILL_MASK_MAX_TARGETS}; "
            "give fewer (each is one vocabulary token), or leave targets out to score the whole vocabulary"
        )
    for index, target in enumerate(targets):
        if isinstance(target, str) and len(target) > FILL_MASK_MAX_TARGET_CHARS:
            raise InvalidInput(
                f"targets[{index}] has {len(target)} characters, more than the limit of {FILL_MASK_MAX_TARGET_CHARS}; "
                "a target is one vocabulary token"
            )


INLINE_CHARACTERS = 2000
"""Requests with fewer characters are small: they are planned on the event loop, and built and post-processed in
rounds with the other small requests of the moment on one thread (`service.engine.small_requests`), where a
hand-off to a pool per request would cost more than the work; bigger ones go to the bounded executor so the loop
stays free."""


def _characters(request: TaskInput, pipeline: Pipeline) -> int:
    """The size of a request's tokenization and post-processing, in characters: what it sends, and for fill-mask
    also what its answer will hold (each fill is its text decoded again), so that a request that asks for many
    fills of a short text is post-processed off the event loop."""
    if isinstance(request, ClassifyInput):
        return sum(map(len, request.texts)) + sum(map(len, request.pairs or []))
    if isinstance(request, QAInput):
        return sum(map(len, request.questions)) + sum(map(len, request.contexts))
    if isinstance(request, FillMaskInput) and isinstance(pipeline, FillMaskPipeline):
        fills = min(request.top_k, len(request.targets) if request.targets is not None else request.top_k)
        sent = sum(map(len, request.texts)) + sum(map(len, request.targets or []))
        mask = pipeline.mask_token
        return sent + sum(len(text) * fills * max(text.count(mask), 1) for text in request.texts)
    return sum(map(len, request.texts))


__all__ = ["RESPONSE_HEADERS", "InferenceService", "LoadedModel", "Outcome", "ServiceError", "Timings"]
