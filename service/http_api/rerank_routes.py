"""Reranking routes in the two shapes their clients use: `POST /rerank` (text-embeddings-inference's: `query`, `texts`,
`raw_scores`, `return_text`, `truncate` → `[{index, score, text?}]`, best first) and `POST /v1/rerank` (Cohere's and
Jina's: `model`, `query`, `documents`, `top_n`, `return_documents` → `{results: [{index, relevance_score,
document?}]}`). Both submit one `RerankInput` to the engine, whose passages are rows batched with other requests'
rows; admission counts them, and `max_rerank_documents` bounds them per request.
References: https://huggingface.github.io/text-embeddings-inference/ (rerank), https://docs.cohere.com/reference/rerank,
https://jina.ai/reranker/
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import FastAPI, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from service.engine.engine import Engine
from service.engine.inputs import RerankInput
from service.http_api.rendering import task_response
from service.http_api.schemas import AT_LEAST_ONE, INTEGRAL, TRUNCATE_FIELD, Text, TruncationDirection, _model_field

Timeout = Callable[[Request], float | None]
RERANK_MODEL_EXAMPLE = "minilm-rerank"


class TeiRerankRequest(BaseModel):
    """Rank passages for a query (text-embeddings-inference's `/rerank` body)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [{"query": "What is Deep Learning?", "texts": ["Deep Learning is ...", "Paris is ..."]}]
        },
    )
    query: Text = Field(..., description="The query.")
    texts: Annotated[list[Text], AT_LEAST_ONE] = Field(..., description="The passages to rank.")
    raw_scores: StrictBool = Field(False, description="The raw logits instead of the model's sigmoid scores.")
    return_text: StrictBool = Field(False, description="Send each passage's text back with its rank.")
    truncate: StrictBool | None = TRUNCATE_FIELD
    truncation_direction: TruncationDirection | None = Field(
        None, description="right only (a cut keeps the passage's start)."
    )
    model: StrictStr | None = _model_field(RERANK_MODEL_EXAMPLE)


class Rank(BaseModel):
    index: int = Field(..., description="The passage's position in `texts`.", examples=[0])
    score: float = Field(..., examples=[0.98])
    text: str | None = Field(None, description="The passage, with return_text.")


class Document(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: Text


class CohereRerankRequest(BaseModel):
    """Rank documents for a query (Cohere's and Jina's rerank body)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "model": RERANK_MODEL_EXAMPLE,
                    "query": "What is the capital of the United States?",
                    "documents": [
                        "Carson City is the capital of Nevada.",
                        "Washington, D.C. is the capital of the US.",
                    ],
                    "top_n": 1,
                }
            ]
        },
    )
    query: Text
    documents: Annotated[list[Text | Document], AT_LEAST_ONE] = Field(..., description="Texts, or {text} objects.")
    model: StrictStr | None = _model_field(RERANK_MODEL_EXAMPLE)
    top_n: Annotated[StrictInt, Field(ge=1), INTEGRAL] | None = Field(
        None, description="Only the best top_n (omitted = all)."
    )
    return_documents: StrictBool = Field(False, description="Send each document back with its rank.")
    max_chunks_per_doc: Annotated[StrictInt, INTEGRAL] | None = Field(
        None, description="Accepted for compatibility; a document is one chunk."
    )
    truncate: StrictBool | None = TRUNCATE_FIELD


class CohereResult(BaseModel):
    index: int
    relevance_score: float
    document: Document | None = None


class CohereRerankResponse(BaseModel):
    model: str
    results: list[CohereResult]
    usage: dict[str, int] = Field(default_factory=dict, description="`total_tokens`: tokens read, every pair's.")


def add_rerank_routes(app: FastAPI, responses: dict[int | str, dict[str, Any]], timeout: Timeout) -> None:
    common: dict[str, Any] = {"responses": responses, "tags": ["rerank"]}

    @app.post("/rerank", response_model=list[Rank], **common)
    async def rerank(body: TeiRerankRequest, request: Request) -> Any:
        """Rank passages for a query with a cross-encoder: `[{index, score, text?}]`, best first."""
        return await tei_rerank(_engine(request), body, timeout(request))

    @app.post("/v1/rerank", response_model=CohereRerankResponse, **common)
    async def cohere_rerank(body: CohereRerankRequest, request: Request) -> Any:
        """Rank documents for a query (Cohere's and Jina's shape): `{results: [{index, relevance_score}]}`."""
        texts = [item if isinstance(item, str) else item.text for item in body.documents]
        task_input = RerankInput(query=body.query, texts=texts, top_n=body.top_n, truncate=body.truncate)
        outcome = await _engine(request).submit(
            task_input, model=body.model, timeout_s=timeout(request), field="documents"
        )
        ranking = outcome.results[0]
        results = [
            {"index": r["index"], "relevance_score": r["score"]}
            | ({"document": {"text": texts[r["index"]]}} if body.return_documents else {})
            for r in ranking["ranks"]
        ]
        usage = {"total_tokens": ranking["tokens"]}
        return task_response({"model": outcome.model, "results": results, "usage": usage}, outcome)


async def tei_rerank(engine: Engine, body: TeiRerankRequest, timeout_s: float | None) -> Response:
    """TEI's rerank answer to `body` (`/rerank`, and `POST /` with TEI's rerank body): the named or default rerank
    model's ranking, `[{index, score, text?}]`, best first."""
    texts = list(body.texts)
    task_input = RerankInput(query=body.query, texts=texts, raw_scores=body.raw_scores, truncate=body.truncate)
    outcome = await engine.submit(task_input, model=body.model, timeout_s=timeout_s, field="texts")
    ranks = outcome.results[0]["ranks"]
    if body.return_text:
        ranks = [{**rank, "text": body.texts[rank["index"]]} for rank in ranks]
    return task_response(ranks, outcome)


def _engine(request: Request) -> Engine:
    engine: Engine = request.app.state.engine
    return engine
