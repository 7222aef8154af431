"""Hugging Face's Inference API shape: `POST /models/{name}` takes `{"inputs": ..., "parameters": {...}}` and answers
in the shapes `huggingface_hub.InferenceClient` parses, per the named model's task:

- classify (text-classification): a text, `{text, text_pair}` or a list; top_k, function_to_apply;
  `[[{label, score}]]`, one list per input, every label unless top_k says otherwise;
- qa (question-answering): `{question, context}` or a list; top_k, doc_stride, max_answer_len,
  handle_impossible_answer; `{answer, score, start, end}` (a list with top_k > 1 or several inputs);
- ner (token-classification): a text or a list; aggregation_strategy, ignore_labels; the entities
  `[{entity_group, score, word, start, end}]` per input;
- embed (feature-extraction): a text or a list, options at the body's root as the client sends them (normalize,
  truncate, truncation_direction, dimensions); `[[floats]]`, one vector per input;
- embed (sentence-similarity): `{source_sentence, sentences}`; `[cosine]`, one per sentence;
- fill-mask: a text or a list; top_k, targets; `[{score, token, token_str, sequence}]` per mask.

`POST /` answers the same way when the request can only mean one served model: the only one loaded, or the one
default model whose task the body's shape names (`{question, context}`: QA; `{source_sentence, sentences}`: the
embedding model). A parameter a task does not take is refused with a 422 that names it and the ones it takes.
`POST /` is also text-embeddings-inference's root, which answers with the served model's route: its `/embed` and
`/predict` bodies are this shape's feature-extraction and text-classification ones (`inputs` and root options), and
its `/rerank` body (`{query, texts, ...}`, no `inputs`) is answered as `/rerank` answers it, by the rerank model it
names or the default one.
Errors are the service's (`{"error": {code, message}}`); admission, the API key and the limits are those of every
route (the door sees every request before this module does).
Reference: https://huggingface.co/docs/inference-providers/tasks
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, Any

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Discriminator, Field, JsonValue, StrictBool, StrictInt, StrictStr, Tag

from service.engine.engine import Engine, LoadedModel, Outcome
from service.engine.inputs import ClassifyInput, EmbedInput, FillMaskInput, NERInput, QAInput
from service.errors import InvalidInput, UnknownModel
from service.http_api.rendering import task_response
from service.http_api.rerank_routes import TeiRerankRequest, tei_rerank
from service.http_api.schemas import INTEGRAL, TruncationDirection

Timeout = Callable[[Request], float | None]


class HFRequest(BaseModel):
    """The Inference API's body: `inputs` and the task's `parameters`; the feature-extraction options that
    `InferenceClient` sends at the root are taken there too."""

    model_config = ConfigDict(extra="forbid")
    inputs: StrictStr | list[JsonValue] | dict[str, JsonValue] = Field(
        ..., description="The task's input: a text, a list, or an object (see the route's description)."
    )
    parameters: dict[str, JsonValue] = Field(default_factory=dict, description="The task's options.")
    normalize: StrictBool | None = None
    truncate: StrictBool | None = None
    truncation_direction: TruncationDirection | None = None
    prompt_name: None = None
    dimensions: Annotated[StrictInt, Field(ge=1), INTEGRAL] | None = None
    encoding_format: StrictStr | None = None


def _root_shape(body: Any) -> str:
    """Which body `POST /` was sent: TEI's rerank body has a `query` and no `inputs`; any other is the Inference
    API's, so that a malformed body's errors name the fields of one shape, not of both."""
    if isinstance(body, dict):
        return "tei-rerank" if "query" in body and "inputs" not in body else "inference-api"
    return "tei-rerank" if isinstance(body, TeiRerankRequest) else "inference-api"


RootRequest = Annotated[
    Annotated[HFRequest, Tag("inference-api")] | Annotated[TeiRerankRequest, Tag("tei-rerank")],
    Discriminator(_root_shape),
]
"""`POST /`'s body: the Inference API's, or text-embeddings-inference's rerank body (no field in common)."""

ROOT_OPTIONS = ("normalize", "truncate", "truncation_direction", "prompt_name", "dimensions", "encoding_format")
TASK_PARAMETERS: dict[str, tuple[str, ...]] = {
    "classify": ("top_k", "function_to_apply", "truncate"),
    "qa": ("top_k", "doc_stride", "max_answer_len", "handle_impossible_answer", "truncate"),
    "ner": ("aggregation_strategy", "ignore_labels", "truncate"),
    "embed": ("normalize", "truncate", "truncation_direction", "dimensions", "encoding_format", "prompt_name"),
    "fill-mask": ("top_k", "targets", "truncate"),
}
"""The parameters each task takes (the rest are refused by name)."""


def add_hf_routes(app: FastAPI, responses: dict[int | str, dict[str, Any]], timeout: Timeout) -> None:
    common: dict[str, Any] = {"responses": responses, "tags": ["huggingface"]}

    @app.post("/models/{name}", **common)
    async def hf_model(name: str, body: HFRequest, request: Request) -> Any:
        """Run the named model the way Hugging Face's Inference API does (`huggingface_hub.InferenceClient`)."""
        engine = _engine(request)
        model = engine.models.get(name)
        if model is None:
            raise UnknownModel(f"unknown model {name!r}; loaded: {', '.join(engine.models) or 'none'}")
        return await run_hf(engine, model, body, timeout(request))

    @app.post("/", **common)
    async def hf_root(body: RootRequest, request: Request) -> Any:
        """The Inference API shape without a model name, for the one model the request can mean; TEI's rerank body
        for the rerank model (as `/rerank`)."""
        engine = _engine(request)
        if isinstance(body, TeiRerankRequest):
            return await tei_rerank(engine, body, timeout(request))
        return await run_hf(engine, only_model(engine, body.inputs), body, timeout(request))


def only_model(engine: Engine, inputs: Any) -> LoadedModel:
    """The model a request without a model name means: the only one loaded, or the default of the task whose
    input shape `inputs` has; else a 422 naming the routes that say which."""
    if len(engine.models) == 1:
        return next(iter(engine.models.values()))
    task = _task_of_shape(inputs)
    if task is not None and task in engine.defaults:
        return engine.models[engine.defaults[task]]
    names = ", ".join(f"{name} ({model.bundle.task})" for name, model in engine.models.items())
    raise InvalidInput(
        f"this server serves several models ({names}): name one, POST /models/<name>, or use the task's route"
    )


def _task_of_shape(inputs: Any) -> str | None:
    first = inputs[0] if isinstance(inputs, list) and inputs else inputs
    if isinstance(first, dict) and {"question", "context"} <= set(first):
        return "qa"
    if isinstance(inputs, dict) and "source_sentence" in inputs:
        return "embed"
    return None


async def run_hf(engine: Engine, model: LoadedModel, body: HFRequest, timeout_s: float | None) -> Response:
    task = model.bundle.task
    parameters = {**{k: getattr(body, k) for k in ROOT_OPTIONS if getattr(body, k) is not None}, **body.parameters}
    if task == "embed" and isinstance(body.inputs, dict):
        return await _similarity(engine, model, body.inputs, parameters, timeout_s)
    if task == "rerank":
        raise InvalidInput(
            f"model {model.name!r} ranks passages: send text-embeddings-inference's rerank body {{query, texts}} "
            "(to POST / or /rerank)"
        )
    if task not in HANDLERS:
        raise InvalidInput(f"model {model.name!r} serves {task}, which this API shape does not cover")
    _check_parameters(task, parameters)
    return await HANDLERS[task](engine, model, body.inputs, parameters, timeout_s)


def _check_parameters(task: str, parameters: dict[str, Any]) -> None:
    unknown = sorted(set(parameters) - set(TASK_PARAMETERS[task]))
    if unknown:
        raise InvalidInput(
            f"parameters: {', '.join(unknown)} not taken by {task} models here; "
            f"the parameters they take: {', '.join(TASK_PARAMETERS[task])}"
        )


def _texts(inputs: Any, what: str = "a text or a list of texts") -> tuple[list[str], bool]:
    """(texts, whether a single one was sent)."""
    if isinstance(inputs, str):
        return [inputs], True
    if isinstance(inputs, list) and all(isinstance(item, str) for item in inputs):
        return list(inputs), False
    raise InvalidInput(f"inputs: send {what}")


def _typed(parameters: dict[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    value = parameters.get(name)
    if value is not None and (not isinstance(value, kind) or (isinstance(value, bool) and kind is int)):
        raise InvalidInput(f"parameters.{name}: expected {getattr(kind, '__name__', kind)}, got {value!r}")
    return value


async def _classify(engine: Engine, model: LoadedModel, inputs: Any, parameters: dict, timeout_s: float | None) -> Any:
    items = inputs if isinstance(inputs, list) else [inputs]
    pairs = [_pair(item) for item in items]
    task_input = ClassifyInput.from_items(
        pairs,
        top_k=_typed(parameters, "top_k", int),
        function_to_apply=_typed(parameters, "function_to_apply", str),
        truncate=_typed(parameters, "truncate", bool),
    )
    outcome = await engine.submit(task_input, model=model.name, timeout_s=timeout_s)
    return task_response(outcome.results, outcome)


def _pair(item: Any) -> tuple[str, str | None]:
    if isinstance(item, str):
        return item, None
    if isinstance(item, dict) and set(item) <= {"text", "text_pair"} and isinstance(item.get("text"), str):
        pair = item.get("text_pair")
        if pair is None or isinstance(pair, str):
            return item["text"], pair
    raise InvalidInput("inputs: send a text, {text, text_pair}, or a list of them")


async def _qa(engine: Engine, model: LoadedModel, inputs: Any, parameters: dict, timeout_s: float | None) -> Any:
    items = inputs if isinstance(inputs, list) else [inputs]
    if not all(isinstance(i, dict) and set(i) == {"question", "context"} for i in items):
        raise InvalidInput("inputs: send {question, context} (two strings), or a list of them")
    top_k = _typed(parameters, "top_k", int)
    task_input = QAInput(
        questions=[i["question"] for i in items],
        contexts=[i["context"] for i in items],
        top_k=1 if top_k is None else top_k,
        max_answer_len=_typed(parameters, "max_answer_len", int),
        handle_impossible_answer=bool(_typed(parameters, "handle_impossible_answer", bool)),
        doc_stride=_typed(parameters, "doc_stride", int),
        truncate=_typed(parameters, "truncate", bool),
    )
    outcome = await engine.submit(task_input, model=model.name, timeout_s=timeout_s)
    shaped = [answers[0] if task_input.top_k == 1 else answers for answers in outcome.results]
    return task_response(shaped[0] if not isinstance(inputs, list) else shaped, outcome)


async def _ner(engine: Engine, model: LoadedModel, inputs: Any, parameters: dict, timeout_s: float | None) -> Any:
    texts, single = _texts(inputs)
    strategy = _typed(parameters, "aggregation_strategy", str)
    ignore = _typed(parameters, "ignore_labels", list)
    task_input = NERInput(
        texts=texts,
        aggregation_strategy=strategy or NERInput.aggregation_strategy,
        truncate=_typed(parameters, "truncate", bool),
        ignore_labels=ignore,
    )
    outcome = await engine.submit(task_input, model=model.name, timeout_s=timeout_s)
    return task_response(outcome.results[0] if single else outcome.results, outcome)


async def _embed(engine: Engine, model: LoadedModel, inputs: Any, parameters: dict, timeout_s: float | None) -> Any:
    texts, _ = _texts(inputs)
    _check_embed_options(parameters)
    task_input = EmbedInput(
        texts=texts,
        normalize=_typed(parameters, "normalize", bool),
        dimensions=_typed(parameters, "dimensions", int),
        truncate=_typed(parameters, "truncate", bool),
    )
    outcome = await engine.submit(task_input, model=model.name, timeout_s=timeout_s)
    return task_response([result["embedding"] for result in outcome.results], outcome)


def _check_embed_options(parameters: dict[str, Any]) -> None:
    direction = _typed(parameters, "truncation_direction", str)
    if direction is not None and direction.lower() != "right":
        raise InvalidInput(f"truncation_direction: only right (a cut keeps the text's start), got {direction!r}")
    encoding = _typed(parameters, "encoding_format", str)
    if encoding is not None and encoding != "float":
        raise InvalidInput(f"encoding_format: only float here (OpenAI's /v1/embeddings sends base64), got {encoding!r}")
    if parameters.get("prompt_name") is not None:
        raise InvalidInput("prompt_name: no prompts are configured on this server; leave it out")


async def _similarity(
    engine: Engine, model: LoadedModel, inputs: dict[str, Any], parameters: dict, timeout_s: float | None
) -> Any:
    """Sentence similarity: the cosine of the source sentence's embedding with each sentence's."""
    source, sentences = inputs.get("source_sentence"), inputs.get("sentences")
    if set(inputs) != {"source_sentence", "sentences"} or not isinstance(source, str):
        raise InvalidInput("inputs: send {source_sentence: text, sentences: [texts]}")
    texts, _ = _texts(sentences, "a list of texts as sentences")
    if parameters:
        raise InvalidInput(f"parameters: sentence similarity takes none, got {', '.join(sorted(parameters))}")
    task_input = EmbedInput(texts=[source, *texts], normalize=True)
    outcome: Outcome = await engine.submit(task_input, model=model.name, timeout_s=timeout_s)
    vectors = np.stack([np.asarray(result["embedding"], dtype=np.float32) for result in outcome.results])
    return task_response((vectors[1:] @ vectors[0]).astype(np.float32), outcome)


async def _fill_mask(engine: Engine, model: LoadedModel, inputs: Any, parameters: dict, timeout_s: float | None) -> Any:
    texts, single = _texts(inputs)
    targets = parameters.get("targets")
    if isinstance(targets, str):
        targets = [targets]
    if targets is not None and not (isinstance(targets, list) and all(isinstance(t, str) for t in targets)):
        raise InvalidInput("parameters.targets: a token or a list of tokens")
    top_k = _typed(parameters, "top_k", int)
    task_input = FillMaskInput(
        texts=texts,
        top_k=FillMaskInput.top_k if top_k is None else top_k,
        targets=targets,
        truncate=_typed(parameters, "truncate", bool),
    )
    outcome = await engine.submit(task_input, model=model.name, timeout_s=timeout_s)
    shaped = [masks[0] if len(masks) == 1 else masks for masks in outcome.results]
    return task_response(shaped[0] if single else shaped, outcome)


Handler = Callable[[Engine, LoadedModel, Any, dict, float | None], Awaitable[Response]]
HANDLERS: dict[str, Handler] = {
    "classify": _classify,
    "qa": _qa,
    "ner": _ner,
    "embed": _embed,
    "fill-mask": _fill_mask,
}


def _engine(request: Request) -> Engine:
    engine: Engine = request.app.state.engine
    return engine
