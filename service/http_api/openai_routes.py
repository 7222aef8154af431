"""OpenAI's API shapes: `POST /v1/embeddings` (https://platform.openai.com/docs/api-reference/embeddings) and the
model list `GET /v1/models` / `GET /v1/models/{id}` (https://platform.openai.com/docs/api-reference/models), so that
the official `openai` client's `embeddings.create`, `models.list` and `models.retrieve` work unchanged.

Errors are the service's (`{"error": {code, message}}`); our fuller description of each model (task, labels,
variant, windows) is `GET /models`.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any, Literal

import numpy as np
from fastapi import FastAPI, Request
from pydantic import BaseModel, Field

from service.engine.engine import Engine
from service.engine.inputs import EmbedInput
from service.errors import UnknownModel
from service.http_api.encoder_schemas import OpenAIEmbeddingsRequest, OpenAIEmbeddingsResponse
from service.http_api.rendering import task_response

OWNER = "bertserve"


class OpenAIModel(BaseModel):
    id: str = Field(..., examples=["minilm"])
    object: Literal["model"] = "model"
    created: int = Field(..., description="When the server loaded it (Unix seconds).")
    owned_by: str = OWNER


class OpenAIModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[OpenAIModel]


def add_openai_routes(
    app: FastAPI, responses: dict[int | str, dict[str, Any]], timeout: Callable[[Request], float | None]
) -> None:
    common: dict[str, Any] = {"responses": responses, "tags": ["openai"]}

    @app.post("/v1/embeddings", response_model=OpenAIEmbeddingsResponse, **common)
    async def openai_embeddings(body: OpenAIEmbeddingsRequest, request: Request) -> Any:
        """Embed texts (OpenAI's embeddings API): vectors as floats or base64 float32, with token usage."""
        texts = [body.input] if isinstance(body.input, str) else list(body.input)
        task_input = EmbedInput(texts=texts, dimensions=body.dimensions, truncate=body.truncate)
        outcome = await _engine(request).submit(task_input, model=body.model, timeout_s=timeout(request), field="input")
        tokens = sum(result["tokens"] for result in outcome.results)
        encode = _base64 if body.encoding_format == "base64" else _floats
        content = {
            "object": "list",
            "data": [
                {"object": "embedding", "embedding": encode(result["embedding"]), "index": index}
                for index, result in enumerate(outcome.results)
            ],
            "model": outcome.model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }
        return task_response(content, outcome)

    @app.get("/v1/models", response_model=OpenAIModelList, **common)
    async def openai_models(request: Request) -> Any:
        """The loaded models in OpenAI's list shape (`GET /models` describes them fully)."""
        return {"object": "list", "data": [_openai_model(_engine(request), name) for name in _engine(request).models]}

    @app.get("/v1/models/{model_id}", response_model=OpenAIModel, **common)
    async def openai_model(model_id: str, request: Request) -> Any:
        """One loaded model in OpenAI's shape; 422 `unknown_model` naming the loaded ones otherwise."""
        engine = _engine(request)
        if model_id not in engine.models:
            raise UnknownModel(f"unknown model {model_id!r}; loaded: {', '.join(engine.models) or 'none'}")
        return _openai_model(engine, model_id)


def _openai_model(engine: Engine, name: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": int(engine.state.loaded_at), "owned_by": OWNER}


def _engine(request: Request) -> Engine:
    engine: Engine = request.app.state.engine
    return engine


def _floats(vector: np.ndarray) -> np.ndarray:
    return vector


def _base64(vector: np.ndarray) -> str:
    """OpenAI's base64 encoding: the vector's little-endian float32 bytes."""
    return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")
