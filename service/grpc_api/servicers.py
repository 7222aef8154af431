"""bert.v1 servicers: translate protobuf <-> the engine's inputs and results, errors -> status codes.

Same semantics as REST: defaults, limits and messages come from the task inputs and the engine (an unset optional
field is left to the input type's default); every error ends the call through `abort`, the one
place that applies `service.errors.grpc_status`. The caller's deadline caps the request's timeout, so work for
a request that has already expired is dropped before compute.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn

import grpc
import numpy as np

from bert_model.tasks.defaults import AGGREGATION_STRATEGIES
from service.engine.engine import Engine, Outcome
from service.engine.inputs import (
    ClassifyInput,
    EmbedAllInput,
    EmbedInput,
    FillMaskInput,
    NERInput,
    QAInput,
    RerankInput,
)
from service.error_messages import clip_message
from service.errors import Internal, InvalidInput, ServiceError, grpc_status
from service.grpc_api.stubs import bert_pb2 as pb
from service.grpc_api.stubs import bert_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

AGGREGATION = {
    pb.AGGREGATION_STRATEGY_UNSPECIFIED: NERInput.aggregation_strategy,
    **{pb.AggregationStrategy.Value(f"AGGREGATION_STRATEGY_{name.upper()}"): name for name in AGGREGATION_STRATEGIES},
}
"""AggregationStrategy -> the task input's `aggregation_strategy` (unspecified: the default), one per strategy of
`bert_model.tasks.defaults.AGGREGATION_STRATEGIES`."""
SCORE_FUNCTIONS = {
    pb.SCORE_FUNCTION_SOFTMAX: "softmax",
    pb.SCORE_FUNCTION_SIGMOID: "sigmoid",
    pb.SCORE_FUNCTION_NONE: "none",
}
"""ScoreFunction -> the task input's `function_to_apply` (unspecified: the model's own)."""
SCORE_FUNCTION_VALUES = {name: value for value, name in SCORE_FUNCTIONS.items()}
"""A model's `function_to_apply` -> its ScoreFunction (Models.List)."""


MAX_DETAILS_BYTES = 2048
"""Most bytes a status message takes on the wire (grpc-message is percent-encoded: 3 bytes per byte outside
printable ASCII). Messages quote what the caller sent (a model name, a fill-mask target); uncapped, a long value
outgrows the caller's metadata limit (8 KiB by default), and the caller gets RESOURCE_EXHAUSTED 'received metadata
size exceeds ...' instead of the error that says what to change."""


async def abort(context: grpc.aio.ServicerContext, error: ServiceError) -> NoReturn:
    """End the call with the status of `service.errors.GRPC_STATUS` and the error's message (`status_details`).

    A call that grpc's core has already ended with a status of its own (a compressed-flag message without
    grpc-encoding, seen by the handler as a request stream without a message) cannot take a second one: it ends
    as cancelled, which grpc does not log as a servicer's failure."""
    try:
        await context.abort(grpc_status(error), status_details(error.message))
    except grpc.aio.AbortError:
        raise
    except Exception as failure:  # grpc's ExecuteBatchError: the status could not be sent
        log.debug("the call had ended before its status was sent: %s", error.message)
        raise asyncio.CancelledError("the call had already ended") from failure
    raise AssertionError("unreachable: abort raises")


def status_details(message: str, limit: int = MAX_DETAILS_BYTES) -> str:
    """`message` unchanged when it fits in `limit` wire bytes, else cut in its middle (`clip_message`)."""
    return clip_message(message, limit)


def _given(request: Any, *names: str) -> dict[str, Any]:
    """The optional fields the caller set; the others keep the task input's defaults."""
    return {name: getattr(request, name) for name in names if request.HasField(name)}


async def run_call(
    engine: Engine, context: grpc.aio.ServicerContext, route: str, run: Callable[[float | None], Awaitable[Any]]
) -> Any:
    """`run(the caller's time remaining)`, its trailing metadata set, observed in the metrics; every error ends the
    call through `abort` (a bug as INTERNAL with the id of its log line, never UNKNOWN with a traceback)."""
    start = time.perf_counter()
    status = "OK"
    try:
        return await run(context.time_remaining())
    except ServiceError as error:
        status = grpc_status(error).name
        await abort(context, error)
    except (asyncio.CancelledError, grpc.aio.AbortError):
        status = "CANCELLED"
        raise
    except Exception:  # a bug must not leak as UNKNOWN with a traceback
        internal = Internal(f"internal error in {route}")
        log.exception("unexpected error in %s", route, extra={"error_id": internal.error_id})
        status = grpc_status(internal).name
        await abort(context, internal)
    finally:
        engine.metrics.observe_request("grpc", route, status, time.perf_counter() - start)


class _Base:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    async def _call(
        self, context: grpc.aio.ServicerContext, route: str, run: Callable[[float | None], Awaitable[Outcome]]
    ) -> Outcome:
        async def answered(timeout: float | None) -> Outcome:
            outcome = await run(timeout)
            context.set_trailing_metadata(tuple(outcome.headers().items()))
            return outcome

        outcome: Outcome = await run_call(self.engine, context, route, answered)
        return outcome


class ClassifierServicer(_Base, pb_grpc.ClassifierServicer):
    async def Classify(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def run(timeout: float | None) -> Outcome:
            options = _given(request, "top_k", "truncate")
            if options.get("top_k") == 0:
                options["top_k"] = None  # 0 = all labels
            if request.function_to_apply != pb.SCORE_FUNCTION_UNSPECIFIED:
                if request.function_to_apply not in SCORE_FUNCTIONS:
                    raise InvalidInput(f"unknown function_to_apply value {request.function_to_apply}")
                options["function_to_apply"] = SCORE_FUNCTIONS[request.function_to_apply]
            task_input = ClassifyInput.from_items(
                [(item.text, item.text_pair if item.HasField("text_pair") else None) for item in request.inputs],
                **options,
            )
            return await self.engine.submit(task_input, model=request.model or None, timeout_s=timeout)

        outcome = await self._call(context, "/bert.v1.Classifier/Classify", run)
        return pb.ClassifyResponse(
            model=outcome.model,
            results=[
                pb.Classification(labels=[pb.LabelScore(label=s["label"], score=s["score"]) for s in scores])
                for scores in outcome.results
            ],
        )


class QAServicer(_Base, pb_grpc.QAServicer):
    async def Extract(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def run(timeout: float | None) -> Outcome:
            task_input = QAInput(
                questions=[item.question for item in request.inputs],
                contexts=[item.context for item in request.inputs],
                handle_impossible_answer=request.handle_impossible_answer,
                **_given(request, "top_k", "max_answer_len", "doc_stride", "truncate"),
            )
            return await self.engine.submit(task_input, model=request.model or None, timeout_s=timeout)

        outcome = await self._call(context, "/bert.v1.QA/Extract", run)
        return pb.ExtractResponse(
            model=outcome.model,
            results=[pb.Answers(answers=[pb.Answer(**answer) for answer in answers]) for answers in outcome.results],
        )


class NERServicer(_Base, pb_grpc.NERServicer):
    async def Recognize(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def run(timeout: float | None) -> Outcome:
            strategy = AGGREGATION.get(request.aggregation_strategy)
            if strategy is None:
                raise InvalidInput(f"unknown aggregation_strategy value {request.aggregation_strategy}")
            task_input = NERInput(
                texts=list(request.texts), aggregation_strategy=strategy, **_given(request, "truncate")
            )
            return await self.engine.submit(task_input, model=request.model or None, timeout_s=timeout, field="texts")

        outcome = await self._call(context, "/bert.v1.NER/Recognize", run)
        return pb.RecognizeResponse(
            model=outcome.model,
            results=[pb.Entities(entities=[_entity(e) for e in entities]) for entities in outcome.results],
        )


def _entity(entity: dict[str, Any]) -> Any:
    return pb.Entity(
        entity_group=entity["entity_group"],
        score=entity["score"],
        word=entity["word"],
        start=entity["start"],
        end=entity["end"],
    )


class EmbedderServicer(_Base, pb_grpc.EmbedderServicer):
    async def Embed(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def run(timeout: float | None) -> Outcome:
            options = _given(request, "normalize", "dimensions", "truncate")
            if options.get("dimensions") == 0:
                del options["dimensions"]  # 0 = the whole vector
            task_input = EmbedInput(texts=list(request.texts), **options)
            return await self.engine.submit(task_input, model=request.model or None, timeout_s=timeout, field="texts")

        outcome = await self._call(context, "/bert.v1.Embedder/Embed", run)
        return pb.EmbedResponse(
            model=outcome.model,
            embeddings=[pb.Embedding(values=r["embedding"], tokens=r["tokens"]) for r in outcome.results],
        )

    async def EmbedAll(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def run(timeout: float | None) -> Outcome:
            task_input = EmbedAllInput(texts=list(request.texts), **_given(request, "truncate"))
            return await self.engine.submit(task_input, model=request.model or None, timeout_s=timeout, field="texts")

        outcome = await self._call(context, "/bert.v1.Embedder/EmbedAll", run)
        results = [_token_embeddings(result["token_embeddings"]) for result in outcome.results]
        return pb.EmbedAllResponse(model=outcome.model, results=results)


_PACKED_VALUES_TAG = bytes([1 << 3 | 2])
"""The key of TokenEmbeddings' field 1 (`values`) packed: field number 1, wire type 2 (length-delimited)."""


def _token_embeddings(array: np.ndarray) -> Any:
    """A (tokens, dimensions) float array as a TokenEmbeddings message, parsed from its wire form: packed `values`
    are the little-endian float32 bytes, so the message costs a copy of the array, where filling the repeated field
    from it would make a Python float of every element, on the event loop."""
    data = np.ascontiguousarray(array, dtype="<f4").tobytes()
    message = pb.TokenEmbeddings.FromString(_PACKED_VALUES_TAG + _varint(len(data)) + data)
    message.tokens, message.dimensions = array.shape
    return message


def _varint(value: int) -> bytes:
    """`value` (>= 0) as a protobuf base-128 varint."""
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


class FillMaskServicer(_Base, pb_grpc.FillMaskServicer):
    async def Fill(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def run(timeout: float | None) -> Outcome:
            task_input = FillMaskInput(
                texts=list(request.texts),
                targets=list(request.targets) or None,
                **_given(request, "top_k", "truncate"),
            )
            return await self.engine.submit(task_input, model=request.model or None, timeout_s=timeout, field="texts")

        outcome = await self._call(context, "/bert.v1.FillMask/Fill", run)
        return pb.FillResponse(
            model=outcome.model,
            results=[
                pb.FilledText(masks=[pb.MaskFills(fills=[pb.TokenFill(**fill) for fill in fills]) for fills in masks])
                for masks in outcome.results
            ],
        )


class RerankerServicer(_Base, pb_grpc.RerankerServicer):
    async def Rerank(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def run(timeout: float | None) -> Outcome:
            task_input = RerankInput(
                query=request.query,
                texts=list(request.texts),
                raw_scores=request.raw_scores,
                top_n=request.top_n or None,
                truncate=request.truncate if request.HasField("truncate") else None,
            )
            return await self.engine.submit(task_input, model=request.model or None, timeout_s=timeout, field="texts")

        outcome = await self._call(context, "/bert.v1.Reranker/Rerank", run)
        texts = request.texts
        ranks = [
            pb.Rank(index=r["index"], score=r["score"], **({"text": texts[r["index"]]} if request.return_text else {}))
            for r in outcome.results[0]["ranks"]
        ]
        return pb.RerankResponse(model=outcome.model, ranks=ranks)


class ModelsServicer(_Base, pb_grpc.ModelsServicer):
    async def List(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return pb.ListModelsResponse(models=[_model_info(info) for info in self.engine.list_models()])


def _model_info(info: dict[str, Any]) -> Any:
    """A `describe()` dict as ModelInfo (the variant choice's nested maps become messages)."""
    choice = info["variant_choice"]
    timings = {name: pb.ShapeTimings(ms=shapes) for name, shapes in choice.get("timings_ms", {}).items()}
    return pb.ModelInfo(
        **{key: value for key, value in info.items() if key not in ("variant_choice", "function_to_apply")},
        function_to_apply=SCORE_FUNCTION_VALUES.get(info["function_to_apply"], pb.SCORE_FUNCTION_UNSPECIFIED),
        variant_choice=pb.VariantChoice(
            auto=choice["auto"],
            timings_ms=timings,
            skipped=choice.get("skipped", {}),
            rounds=choice.get("rounds", 0),
            seconds=choice.get("seconds", 0.0),
        ),
    )
