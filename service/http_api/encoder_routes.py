"""REST routes of the encoder tasks: `POST /embed` and `POST /embed_all` (text-embeddings-inference's bodies and
answers: sentence vectors, every token's vector) and `POST /fill-mask` (Hugging Face's fill-mask pipeline); bodies in
`service.http_api.encoder_schemas`. OpenAI's `/v1/embeddings` is in
`service.http_api.openai_routes`.

Like the task routes, each builds a task input, submits it to the one engine (batcher, limits, errors,
metrics), and sends the timing headers; their errors are the service's (`{"error": {code, message}}`), not
the error bodies of TEI or OpenAI.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request

from service.engine.engine import Engine, Outcome
from service.engine.inputs import EmbedAllInput, EmbedInput, FillMaskInput
from service.http_api.encoder_schemas import (
    EmbedAllRequest,
    EmbedRequest,
    FillMaskRequest,
    FillMaskResult,
)
from service.http_api.rendering import arrays_response, task_response


def add_encoder_routes(
    app: FastAPI, responses: dict[int | str, dict[str, Any]], timeout: Callable[[Request], float | None]
) -> None:
    """Add the routes, with the task routes' error `responses` and `timeout`."""
    common: dict[str, Any] = {"responses": responses, "tags": ["encoder"]}

    @app.post("/embed", response_model=list[list[float]], **common)
    async def embed(body: EmbedRequest, request: Request) -> Any:
        """Embed texts (text-embeddings-inference's /embed): one vector per input, also for a single text."""
        outcome = await _embed(request, body.inputs, body.normalize, body.dimensions, body.truncate, body.model)
        return task_response([result["embedding"] for result in outcome.results], outcome)

    @app.post("/embed_all", response_model=list[list[list[float]]], **common)
    async def embed_all(body: EmbedAllRequest, request: Request) -> Any:
        """Every token's vector (special tokens included), per input, also for one text (TEI's /embed_all)."""
        engine = _engine(request)
        texts = [body.inputs] if isinstance(body.inputs, str) else list(body.inputs)
        task_input = EmbedAllInput(texts=texts, truncate=body.truncate)
        outcome = await engine.submit(task_input, model=body.model, timeout_s=timeout(request))
        return await arrays_response(engine, [result["token_embeddings"] for result in outcome.results], outcome)

    @app.post(
        "/fill-mask",
        # one text: its fills (one mask) or a list of them (several); a list of texts: one of those per text
        response_model=list[FillMaskResult] | list[list[FillMaskResult] | list[list[FillMaskResult]]],
        **common,
    )
    async def fill_mask(body: FillMaskRequest, request: Request) -> Any:
        """Fill the mask tokens: `[{score, token, token_str, sequence}]` per mask (a list of lists for several)."""
        single = isinstance(body.inputs, str)
        targets = [body.targets] if isinstance(body.targets, str) else body.targets
        task_input = FillMaskInput(
            texts=[body.inputs] if isinstance(body.inputs, str) else list(body.inputs),
            top_k=body.top_k,
            targets=None if targets is None else list(targets),
            truncate=body.truncate,
        )
        outcome = await _engine(request).submit(task_input, model=body.model, timeout_s=timeout(request))
        shaped = [masks[0] if len(masks) == 1 else masks for masks in outcome.results]
        return task_response(shaped[0] if single else shaped, outcome)

    async def _embed(
        request: Request,
        inputs: str | list[str],
        normalize: bool | None,
        dimensions: int | None,
        truncate: bool | None,
        model: str | None,
        field: str = "inputs",
    ) -> Outcome:
        task_input = EmbedInput(
            texts=[inputs] if isinstance(inputs, str) else list(inputs),
            normalize=normalize,
            dimensions=dimensions,
            truncate=truncate,
        )
        return await _engine(request).submit(task_input, model=model, timeout_s=timeout(request), field=field)


def _engine(request: Request) -> Engine:
    engine: Engine = request.app.state.engine
    return engine
