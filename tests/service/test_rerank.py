"""Reranking through the real server (a tiny random cross-encoder): TEI's `/rerank`, Cohere's and Jina's `/v1/rerank`,
gRPC `Reranker.Rerank` and the Open Inference Protocol rank alike; every score equals the one each passage gets in a
request of its own (batching is invisible); bad requests get clear 4xx / INVALID_ARGUMENT."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest

from service.grpc_api.stubs import bert_pb2 as pb
from service.grpc_api.stubs import bert_pb2_grpc as pb_grpc
from tests.service.server import ServerProcess, serving

pytestmark = pytest.mark.integration

QUERY = "Where did the committee meet?"
PASSAGES = [
    "The committee met in the old town hall.",
    "Paris is the capital of France.",
    "The river crossing was discussed at length.",
    "Stock prices fell on Monday.",
    "The town hall was built in 1820 and restored in 1990.",
]


@pytest.fixture(scope="module")
def reranker(rerank_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    log = tmp_path_factory.mktemp("rerank") / "server.log"
    with serving([rerank_bundle], log, None, "--max-rerank-documents", "16") as server:
        yield server


def test_the_three_shapes_rank_alike_and_batching_is_invisible(reranker: ServerProcess) -> None:
    with httpx.Client(base_url=reranker.url, timeout=30) as client:
        tei = client.post("/rerank", json={"query": QUERY, "texts": PASSAGES, "return_text": True}).json()
        assert sorted(rank["index"] for rank in tei) == list(range(len(PASSAGES)))
        assert [rank["score"] for rank in tei] == sorted((rank["score"] for rank in tei), reverse=True)
        assert all(rank["text"] == PASSAGES[rank["index"]] for rank in tei)
        alone = {
            i: client.post("/rerank", json={"query": QUERY, "texts": [text]}).json()[0]["score"]
            for i, text in enumerate(PASSAGES)
        }
        assert all(abs(rank["score"] - alone[rank["index"]]) < 1e-6 for rank in tei)
        cohere = client.post("/v1/rerank", json={"query": QUERY, "documents": PASSAGES, "top_n": 2}).json()
        assert [r["index"] for r in cohere["results"]] == [r["index"] for r in tei[:2]]
        assert cohere["model"] == "tiny-rerank" and cohere["usage"]["total_tokens"] > len(PASSAGES) * 5
        raw = client.post("/rerank", json={"query": QUERY, "texts": PASSAGES, "raw_scores": True}).json()
        assert [r["index"] for r in raw] == [r["index"] for r in tei]  # a sigmoid keeps the order
        sigmoid = {r["index"]: 1 / (1 + math.exp(-r["score"])) for r in raw}  # the scores are the logits' sigmoid
        assert all(abs(sigmoid[r["index"]] - r["score"]) < 1e-6 for r in tei)
        v2 = client.post(
            "/v2/models/tiny-rerank/infer",
            json={
                "inputs": [
                    {"name": "query", "datatype": "BYTES", "shape": [1], "data": [QUERY]},
                    {"name": "text", "datatype": "BYTES", "shape": [len(PASSAGES)], "data": PASSAGES},
                ]
            },
        ).json()
        scores = v2["outputs"][0]["data"]
        assert all(abs(scores[r["index"]] - r["score"]) < 1e-6 for r in tei)
    with grpc.insecure_channel(reranker.grpc_target) as channel:
        reply = pb_grpc.RerankerStub(channel).Rerank(pb.RerankRequest(query=QUERY, texts=PASSAGES), timeout=10)
    assert [rank.index for rank in reply.ranks] == [rank["index"] for rank in tei]


def test_teis_root_takes_the_rerank_body_of_its_only_model(reranker: ServerProcess) -> None:
    """text-embeddings-inference answers `POST /` by its model's kind: a reranker's body there answers as `/rerank`
    does; an Inference API body for this model says which body to send."""
    with httpx.Client(base_url=reranker.url, timeout=30) as client:
        body = {"query": QUERY, "texts": PASSAGES, "return_text": True, "raw_scores": True}
        root = client.post("/", json=body)
        assert root.status_code == 200, root.text
        assert root.json() == client.post("/rerank", json=body).json()
        assert root.headers["x-model"] == "tiny-rerank"
        refused = client.post("/", json={"query": QUERY, "texts": []})
        assert refused.status_code == 422 and "texts" in refused.json()["error"]["message"]
        other = client.post("/", json={"inputs": QUERY, "parameters": {}})
        assert other.status_code == 422 and "{query, texts}" in other.json()["error"]["message"]


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"query": QUERY, "texts": []}, "texts"),
        ({"query": " ", "texts": ["a"]}, "query[0] is empty"),
        ({"query": QUERY, "texts": ["a"] * 10_000}, "10000 passages"),
        ({"query": QUERY, "texts": ["word " * 400], "truncate": False}, "truncate"),
    ],
)
def test_bad_rerank_requests_are_refused_clearly(reranker: ServerProcess, body: dict, needle: str) -> None:
    answer = httpx.post(reranker.url + "/rerank", json=body, timeout=30)
    assert answer.status_code == 422 and needle in answer.json()["error"]["message"], answer.text
    with grpc.insecure_channel(reranker.grpc_target) as channel, pytest.raises(grpc.RpcError) as caught:
        request = pb.RerankRequest(query=body["query"], texts=body["texts"])
        if "truncate" in body:
            request.truncate = body["truncate"]
        pb_grpc.RerankerStub(channel).Rerank(request, timeout=30)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
