"""text-embeddings-inference's HTTP API (https://huggingface.github.io/text-embeddings-inference/), for teams that move
from it: `POST /embed` (in `service.http_api.encoder_routes`), `POST /predict`, `POST /tokenize`, `POST /decode`,
`GET /info` and `GET /health`, with TEI's request and response shapes.

TEI serves one model; this server may serve several, so each route uses the default model of the task it names
(`/predict`: classify; `/embed`: embed; `/tokenize`, `/decode`, `/info`: the default embedding model, else the
first loaded one), and takes an optional `model` (our addition) to name another. Errors are the service's
(`{"error": {code, message}}`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from service.engine.engine import Engine, LoadedModel, Outcome
from service.engine.inputs import ClassifyInput, check_texts
from service.errors import InvalidInput, UnknownModel
from service.http_api.rendering import json_bytes, task_response
from service.http_api.schemas import AT_LEAST_ONE, INTEGRAL, ONE_OR_TWO, Text, TruncationDirection

Timeout = Callable[[Request], float | None]
MAX_DECODE_IDS = 100_000
"""Most token ids one /decode request may send, over all its sequences."""
VERSION = "1.0.0"
TokenId = Annotated[StrictInt, Field(ge=0), INTEGRAL]


class _TeiBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: StrictStr | None = Field(None, description="A loaded model (our addition; omitted = the route's default).")


class PredictRequest(_TeiBody):
    inputs: (
        Text | Annotated[list[Text], ONE_OR_TWO] | Annotated[list[Annotated[list[Text], ONE_OR_TWO]], AT_LEAST_ONE]
    ) = Field(
        ..., description="A text, a pair [text, text], or a batch of [text] and [text, text].", examples=["I like you."]
    )
    truncate: StrictBool | None = None
    truncation_direction: TruncationDirection | None = Field(
        None, description="right only (a cut keeps the text's start)."
    )
    raw_scores: StrictBool = Field(False, description="The raw logits instead of probabilities.")


class Prediction(BaseModel):
    score: float = Field(..., examples=[0.99])
    label: str = Field(..., examples=["positive"])


class TokenizeRequest(_TeiBody):
    inputs: Text | Annotated[list[Text], AT_LEAST_ONE] = Field(..., examples=["test"])
    add_special_tokens: StrictBool = True


class SimpleToken(BaseModel):
    id: int = Field(..., examples=[3231])
    text: str = Field(..., examples=["test"])
    special: bool = Field(..., examples=[False])
    start: int | None = Field(..., examples=[0])
    stop: int | None = Field(..., examples=[4])


class DecodeRequest(_TeiBody):
    ids: list[TokenId] | list[list[TokenId]] = Field(
        ...,
        description="One sequence of token ids (`[]`: the empty text), or a list of sequences.",
        examples=[[101, 3231, 102]],
    )
    skip_special_tokens: StrictBool = True


def add_tei_routes(app: FastAPI, responses: dict[int | str, dict[str, Any]], timeout: Timeout) -> None:
    common: dict[str, Any] = {"responses": responses, "tags": ["text-embeddings-inference"]}

    @app.post("/predict", response_model=list[Prediction] | list[list[Prediction]], **common)
    async def predict(body: PredictRequest, request: Request) -> Any:
        """Classify a text, a pair, or a batch of both: every label, best first (TEI's `/predict`)."""
        items, single = _predict_inputs(body.inputs)
        raw = body.raw_scores
        results, outcome = await _predict(_engine(request), items, body.model, body.truncate, raw, timeout(request))
        return task_response(results[0] if single else results, outcome)

    @app.post("/tokenize", response_model=list[list[SimpleToken]], **common)
    async def tokenize(body: TokenizeRequest, request: Request) -> Any:
        """The tokens of each text: id, text, whether special, character span (TEI's `/tokenize`)."""
        engine = _engine(request)
        texts = [body.inputs] if isinstance(body.inputs, str) else list(body.inputs)
        check_texts(texts, "inputs", engine.limits)
        model = _model(engine, body.model)
        tokens = await engine.off_loop(sum(map(len, texts)), _tokens, model, texts, body.add_special_tokens)
        return Response(json_bytes(tokens), media_type="application/json")

    @app.post("/decode", response_model=list[str], **common)
    async def decode(body: DecodeRequest, request: Request) -> Any:
        """The text of each sequence of token ids (TEI's `/decode`)."""
        engine = _engine(request)
        # `[]` is one empty sequence, as TEI reads it
        one = not body.ids or isinstance(body.ids[0], int)
        sequences: list[list[int]] = [body.ids] if one else body.ids  # type: ignore[list-item,assignment]
        _check_ids(sequences, engine.limits.max_inputs)
        model = _model(engine, body.model)
        vocabulary = model.bundle.tokenizer.vocab_size
        if any(i >= vocabulary for ids in sequences for i in ids):
            raise InvalidInput(f"ids: token ids must be below the vocabulary size ({vocabulary})")
        tokenizer = model.bundle.tokenizer
        texts = [tokenizer.decode(ids, skip_special_tokens=body.skip_special_tokens) for ids in sequences]
        return Response(json_bytes(texts), media_type="application/json")

    @app.get("/info", **common)
    async def info(request: Request) -> Any:
        """What is served, in TEI's `/info` shape (of the default embedding model, else the first loaded one)."""
        engine = _engine(request)
        return _info(engine, _model(engine, None))

    @app.get(
        "/health",
        tags=["health"],
        response_class=Response,
        responses={200: {"description": "Ready."}, 503: {"description": "Not ready."}},
    )
    async def health(request: Request) -> Response:
        """TEI's health: 200 when the server takes requests, 503 otherwise (also `/health/ready`)."""
        state = _engine(request).state
        ok = state.ready and not state.draining and state.failure is None
        return Response(status_code=200 if ok else 503)


async def _predict(
    engine: Engine,
    items: list[tuple[str, str | None]],
    model: str | None,
    truncate: bool | None,
    raw_scores: bool,
    timeout_s: float | None,
) -> tuple[list[Any], Outcome]:
    """Every label of every item, best first; a TEI batch may mix single texts and pairs: each kind is one request
    to the engine (the outcome returned is the last one's, for the timing headers)."""
    results: list[Any] = [None] * len(items)
    outcome: Outcome | None = None
    for paired in (False, True):
        indices = [i for i, (_, pair) in enumerate(items) if (pair is not None) == paired]
        if not indices:
            continue
        task_input = ClassifyInput.from_items(
            [items[i] for i in indices], top_k=None, truncate=truncate, function_to_apply="none" if raw_scores else None
        )
        outcome = await engine.submit(task_input, model=model, timeout_s=timeout_s)
        for index, scores in zip(indices, outcome.results, strict=True):
            results[index] = [{"score": s["score"], "label": s["label"]} for s in scores]
    assert outcome is not None  # at least one item
    return results, outcome


def _predict_inputs(inputs: Any) -> tuple[list[tuple[str, str | None]], bool]:
    """TEI's `/predict` inputs as (text, pair) items, and whether one sequence was sent."""
    if isinstance(inputs, str):
        return [(inputs, None)], True
    if not inputs:
        raise InvalidInput("inputs: send a text, a pair [text, text], or a batch of [text] and [text, text]")
    if inputs and all(isinstance(item, str) for item in inputs):
        if len(inputs) > 2:
            raise InvalidInput("inputs: a pair is two texts; send a batch as [[text], [text, text], ...]")
        return [(inputs[0], inputs[1] if len(inputs) == 2 else None)], True
    items = []
    for index, item in enumerate(inputs):
        if not isinstance(item, list) or not 1 <= len(item) <= 2:
            raise InvalidInput(f"inputs[{index}]: a batch item is [text] or [text, text]")
        items.append((item[0], item[1] if len(item) == 2 else None))
    return items, False


def _tokens(model: LoadedModel, texts: list[str], special: bool) -> list[list[dict[str, Any]]]:
    """Each text's tokens as TEI lists them: special tokens carry no character span."""
    encodings = model.bundle.tokenizer.backend.encode_batch(texts, add_special_tokens=special)
    return [
        [
            {
                "id": token_id,
                "text": token,
                "special": bool(is_special),
                "start": None if is_special else start,
                "stop": None if is_special else stop,
            }
            for token_id, token, (start, stop), is_special in zip(
                encoding.ids, encoding.tokens, encoding.offsets, encoding.special_tokens_mask, strict=True
            )
        ]
        for encoding in encodings
    ]


def _check_ids(sequences: list[list[int]], max_sequences: int) -> None:
    if len(sequences) > max_sequences:
        raise InvalidInput(f"ids: {len(sequences)} sequences, more than the limit of {max_sequences}; split it")
    if sum(map(len, sequences)) > MAX_DECODE_IDS:
        raise InvalidInput(f"ids: more than {MAX_DECODE_IDS} token ids in one request; split it")


def _model(engine: Engine, name: str | None) -> LoadedModel:
    """The named model, or the default embedding model, or the first loaded one."""
    if name:
        if name not in engine.models:
            raise UnknownModel(f"unknown model {name!r}; loaded: {', '.join(engine.models) or 'none'}")
        return engine.models[name]
    default = engine.defaults.get("embed")
    if default is not None:
        return engine.models[default]
    if not engine.models:
        raise UnknownModel("no model is loaded")
    return next(iter(engine.models.values()))


def _info(engine: Engine, model: LoadedModel) -> JSONResponse:
    manifest, settings = model.bundle.manifest, engine.settings
    labels = list(manifest.labels)
    if model.bundle.task == "embed":
        model_type: dict[str, Any] = {"embedding": {"pooling": manifest.task_settings.get("pooling", "mean")}}
    else:
        model_type = {
            "classifier": {
                "id2label": {str(i): label for i, label in enumerate(labels)},
                "label2id": {label: i for i, label in enumerate(labels)},
            }
        }
    body = {
        "model_id": model.name,
        "model_sha": None,
        "model_dtype": _precision(model),
        "model_type": model_type,
        "max_concurrent_requests": settings.max_in_progress,
        "max_input_length": model.pipeline.max_seq_length,
        "max_batch_tokens": settings.max_batch_tokens,
        "max_batch_requests": settings.effective_max_batch_size,
        "max_client_batch_size": settings.max_inputs_per_request,
        "auto_truncate": settings.truncate,
        "tokenization_workers": settings.tokenize_threads,
        "version": VERSION,
        "sha": None,
        "docker_label": None,
        "models": sorted(engine.models),
    }
    return JSONResponse(body)


def _precision(model: LoadedModel) -> str:
    spec = model.bundle.manifest.variants.get(model.backend.variant)
    return spec.precision if spec is not None else "unknown"


def _engine(request: Request) -> Engine:
    engine: Engine = request.app.state.engine
    return engine
