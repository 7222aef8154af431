"""The encoder routes against a real server over tiny embed and fill-mask bundles, with real clients: TEI's
/embed body over httpx, the official `openai` client on /v1/embeddings (float and base64), the bert.v1 stubs
(Embedder.Embed, FillMask.Fill) equal to REST, bad input of every kind, and the server still serving after."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bert_model.tasks.embeddings import l2_normalize
from bert_model.tokenization import BertTokenizer
from service.grpc_api.stubs import bert_pb2 as pb
from service.grpc_api.stubs import bert_pb2_grpc as pb_grpc
from tests.service.server import ServerProcess, serving

pytestmark = pytest.mark.integration

TEXTS = ["A man is playing a guitar.", "The new movie is awesome", "Ein kurzer Satz."]
HIDDEN = 32


@pytest.fixture(scope="module")
def server(
    encoder_bundles: dict[str, Path], tiny_bundles: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """A real server with the embed and fill-mask bundles, and a classifier (a model of another task)."""
    log = tmp_path_factory.mktemp("encoder-server") / "server.log"
    models = [encoder_bundles["embed"], encoder_bundles["fill-mask"], tiny_bundles["classify"]]
    with serving(models, log, {"BERTSERVE_MAX_INPUTS_PER_REQUEST": "8"}) as process:
        yield process


def _reference(bundle: Path, texts: list[str], *, normalize: bool = True) -> np.ndarray:
    """Embeddings computed here, one text per ONNX Runtime call: tokenizer -> graph (its mean-pooled vector) -> L2
    normalization in numpy."""
    import onnxruntime as ort

    tokenizer = BertTokenizer.from_pretrained(bundle / "tokenizer")
    session = ort.InferenceSession(str(bundle / "cpu-fp32.onnx"), providers=["CPUExecutionProvider"])
    vectors = []
    for text in texts:
        (pooled,) = session.run(["pooled_embedding"], tokenizer([text]))
        vectors.append(pooled[0])
    return l2_normalize(np.stack(vectors)) if normalize else np.stack(vectors)


# ---- embeddings ---------------------------------------------------------------------------------------
def test_embed_takes_tei_documented_body(http: httpx.Client, encoder_bundles: dict[str, Path]) -> None:
    body = {
        "inputs": "What is Deep Learning?",
        "prompt_name": None,
        "normalize": True,
        "truncate": False,
        "truncation_direction": "right",
    }
    response = http.post("/embed", json=body)
    assert response.status_code == 200, response.text
    vectors = response.json()
    assert len(vectors) == 1 and len(vectors[0]) == HIDDEN  # a list of vectors, also for one text
    np.testing.assert_allclose(np.linalg.norm(vectors[0]), 1.0, rtol=1e-5)
    np.testing.assert_allclose(vectors[0], _reference(encoder_bundles["embed"], [body["inputs"]])[0], atol=1e-5)
    for header in ("x-queue-time-ms", "x-inference-time-ms", "x-total-time-ms"):
        assert float(response.headers[header]) >= 0
    assert response.headers["x-model"] == "tiny-embed"


def test_embed_batch_equals_reference_one_by_one(http: httpx.Client, encoder_bundles: dict[str, Path]) -> None:
    batched = http.post("/embed", json={"inputs": TEXTS}).json()
    np.testing.assert_allclose(batched, _reference(encoder_bundles["embed"], TEXTS), atol=1e-5)
    raw = http.post("/embed", json={"inputs": TEXTS, "normalize": False}).json()
    np.testing.assert_allclose(raw, _reference(encoder_bundles["embed"], TEXTS, normalize=False), atol=1e-4)
    assert not np.allclose(np.linalg.norm(raw, axis=1), 1.0)


def test_openai_client_float_and_base64(server: ServerProcess, http: httpx.Client) -> None:
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    tei = np.asarray(http.post("/embed", json={"inputs": TEXTS}).json(), dtype=np.float32)
    floats = client.embeddings.create(input=TEXTS, model="tiny-embed", encoding_format="float")
    base64 = client.embeddings.create(input=TEXTS, model="tiny-embed")  # the client asks for base64 by default
    for reply in (floats, base64):
        assert reply.object == "list" and reply.model == "tiny-embed"
        assert [item.index for item in reply.data] == [0, 1, 2]
        assert all(item.object == "embedding" for item in reply.data)
        np.testing.assert_array_equal(np.asarray([item.embedding for item in reply.data], dtype=np.float32), tei)
    tokenizer = BertTokenizer.from_pretrained("minilm")
    tokens = sum(len(tokenizer.encode(text).ids) for text in TEXTS)
    assert floats.usage.prompt_tokens == floats.usage.total_tokens == tokens
    single = client.embeddings.create(input="one text", model="tiny-embed", dimensions=8)
    assert len(single.data) == 1 and len(single.data[0].embedding) == 8
    np.testing.assert_allclose(np.linalg.norm(single.data[0].embedding), 1.0, rtol=1e-5)


def test_openai_base64_is_little_endian_float32(http: httpx.Client) -> None:
    import base64

    body = http.post("/v1/embeddings", json={"input": "one text", "encoding_format": "base64"}).json()
    decoded = np.frombuffer(base64.b64decode(body["data"][0]["embedding"]), dtype="<f4")
    floats = http.post("/v1/embeddings", json={"input": "one text"}).json()["data"][0]["embedding"]
    np.testing.assert_array_equal(decoded, np.asarray(floats, dtype=np.float32))
    assert body["usage"] == {"prompt_tokens": 4, "total_tokens": 4}  # [CLS] one text [SEP]


def test_grpc_embed_equals_rest(channel: grpc.Channel, http: httpx.Client) -> None:
    response, call = pb_grpc.EmbedderStub(channel).Embed.with_call(pb.EmbedRequest(texts=TEXTS))
    assert response.model == "tiny-embed"
    rest = np.asarray(http.post("/embed", json={"inputs": TEXTS}).json(), dtype=np.float32)
    np.testing.assert_array_equal(np.asarray([list(e.values) for e in response.embeddings], dtype=np.float32), rest)
    tokenizer = BertTokenizer.from_pretrained("minilm")
    assert [e.tokens for e in response.embeddings] == [len(tokenizer.encode(text).ids) for text in TEXTS]
    assert float(dict(call.trailing_metadata())["x-inference-time-ms"]) > 0
    cut = pb_grpc.EmbedderStub(channel).Embed(pb.EmbedRequest(texts=TEXTS[:1], dimensions=4, normalize=False))
    rest_cut = http.post("/embed", json={"inputs": TEXTS[:1], "dimensions": 4, "normalize": False}).json()
    np.testing.assert_array_equal(np.asarray(cut.embeddings[0].values, dtype=np.float32), np.float32(rest_cut[0]))


# ---- fill-mask ----------------------------------------------------------------------------------------
def test_fill_mask_shapes(http: httpx.Client) -> None:
    one = http.post("/fill-mask", json={"inputs": "Paris is the [MASK] of France."})
    assert one.status_code == 200, one.text
    fills = one.json()
    assert len(fills) == 5 and set(fills[0]) == {"score", "token", "token_str", "sequence"}
    assert [f["score"] for f in fills] == sorted((f["score"] for f in fills), reverse=True)
    assert fills[0]["sequence"].startswith("paris is the") and "[CLS]" not in fills[0]["sequence"]
    two = http.post("/fill-mask", json={"inputs": "The [MASK] sat on the [MASK].", "top_k": 2}).json()
    assert len(two) == 2 and all(len(fills) == 2 for fills in two)  # one list per mask
    assert two[0][0]["sequence"].startswith("[CLS] the") and "[MASK]" in two[0][0]["sequence"]
    listed = http.post("/fill-mask", json={"inputs": ["a [MASK] b", "[MASK] c [MASK]"], "top_k": 1}).json()
    assert len(listed) == 2 and isinstance(listed[0][0], dict) and isinstance(listed[1][0], list)


def test_fill_mask_scores_are_over_the_whole_vocabulary_in_any_batch(http: httpx.Client) -> None:
    """Texts of one, two and three masks in one request (one batch: rows of fewer masks get filler rows) answer as
    each alone; a target's score is its softmax over the whole vocabulary (the same as in the top-100 list)."""
    texts = ["I feel [MASK].", "The [MASK] sat on the [MASK].", "[MASK] and [MASK] or [MASK] then."]
    together = http.post("/fill-mask", json={"inputs": texts, "top_k": 100}).json()

    def per_mask(result: list) -> list[list[dict]]:
        return result if isinstance(result[0], list) else [result]  # one mask: one list of fills

    for text, fills in zip(texts, together, strict=True):
        alone = per_mask(http.post("/fill-mask", json={"inputs": text, "top_k": 100}).json())
        assert len(per_mask(fills)) == len(alone) == text.count("[MASK]")
        for mask, reference in zip(per_mask(fills), alone, strict=True):
            assert len(mask) == 100 and sum(fill["score"] for fill in mask) <= 1.0 + 1e-6
            assert [f["token"] for f in mask[:20]] == [f["token"] for f in reference[:20]]
            assert [f["sequence"] for f in mask[:20]] == [f["sequence"] for f in reference[:20]]
            np.testing.assert_allclose([f["score"] for f in mask], [f["score"] for f in reference], rtol=1e-4)
    top = {fill["token_str"]: fill["score"] for fill in together[0]}
    chosen = [token for token in top if not token.startswith("[")][10:13]
    scored = http.post("/fill-mask", json={"inputs": texts[0], "targets": chosen}).json()
    assert {fill["token_str"]: fill["score"] for fill in scored} == pytest.approx({t: top[t] for t in chosen})


def test_fill_mask_targets(http: httpx.Client) -> None:
    fills = http.post("/fill-mask", json={"inputs": "I feel [MASK].", "targets": ["happy", "Sad", "happy"]}).json()
    assert sorted(f["token_str"] for f in fills) == ["happy", "sad"]
    one = http.post("/fill-mask", json={"inputs": "I feel [MASK].", "targets": "happy"}).json()
    assert [f["token_str"] for f in one] == ["happy"]


def test_grpc_fill_equals_rest(channel: grpc.Channel, http: httpx.Client) -> None:
    texts = ["Paris is the [MASK] of France.", "The [MASK] sat on the [MASK]."]
    response = pb_grpc.FillMaskStub(channel).Fill(pb.FillRequest(texts=texts, top_k=3, targets=[]))
    grpc_results = [
        [
            [{"score": f.score, "token": f.token, "token_str": f.token_str, "sequence": f.sequence} for f in m.fills]
            for m in result.masks
        ]
        for result in response.results
    ]
    rest = http.post("/fill-mask", json={"inputs": texts, "top_k": 3}).json()
    assert grpc_results == [[rest[0]], rest[1]]


# ---- models, health -----------------------------------------------------------------------------------
def test_models_and_health_list_the_encoder_tasks(http: httpx.Client, channel: grpc.Channel) -> None:
    rest = {m["name"]: m["task"] for m in http.get("/models").json()["models"]}
    assert rest == {"tiny-embed": "embed", "tiny-fill-mask": "fill-mask", "tiny-classify": "classify"}
    listed = pb_grpc.ModelsStub(channel).List(pb.ListModelsRequest())
    assert {m.name: m.task for m in listed.models} == rest
    health = health_pb2_grpc.HealthStub(channel)
    for name in ("bert.v1.Embedder", "bert.v1.FillMask"):
        status = health.Check(health_pb2.HealthCheckRequest(service=name)).status
        assert status == health_pb2.HealthCheckResponse.SERVING


def test_openapi_names_the_loaded_encoder_models(http: httpx.Client) -> None:
    schemas = http.get("/openapi.json").json()["components"]["schemas"]
    for name, model in (
        ("EmbedRequest", "tiny-embed"),
        ("OpenAIEmbeddingsRequest", "tiny-embed"),
        ("FillMaskRequest", "tiny-fill-mask"),
    ):
        (named,) = [option for option in schemas[name]["properties"]["model"]["anyOf"] if "enum" in option]
        assert model in named["enum"] and "tiny-classify" not in named["enum"]
    paths = http.get("/openapi.json").json()["paths"]
    assert {"/embed", "/v1/embeddings", "/fill-mask", "/classify"} <= set(paths)
    assert "/qa" not in paths and "/ner" not in paths  # no model of those tasks is loaded here


# ---- bad input ----------------------------------------------------------------------------------------
BAD_REST = [
    ("/embed", {"inputs": []}, "at least one"),
    ("/embed", {"inputs": ""}, "empty"),
    ("/embed", {"inputs": ["ok", 3]}, "inputs"),
    ("/embed", {"inputs": ["x"] * 9}, "more than the limit of 8"),
    ("/embed", {"inputs": "word " * 200, "truncate": False}, "tokens"),
    ("/embed", {"inputs": "x", "truncation_direction": "left"}, "truncation_direction"),
    ("/embed", {"inputs": "x", "dimensions": 33}, "at most 32"),
    ("/embed", {"inputs": "x", "model": "tiny-classify"}, "is a classify model"),
    ("/v1/embeddings", {"input": []}, "at least one"),
    ("/v1/embeddings", {"input": "  "}, "empty"),
    ("/v1/embeddings", {"input": ["ok", "  "]}, "input[1] is empty"),  # the field OpenAI's body names
    ("/v1/embeddings", {"input": [1, 2, 3]}, "token-id arrays"),
    ("/v1/embeddings", {"input": "x", "encoding_format": "int8"}, "encoding_format"),
    ("/v1/embeddings", {"input": "x", "model": "text-embedding-3-small"}, "unknown model"),
    ("/v1/embeddings", {"input": "x", "dimensions": 0}, "dimensions"),
    ("/fill-mask", {"inputs": "no mask here"}, "has no mask token: put [MASK]"),
    ("/fill-mask", {"inputs": ["a [MASK]", "none"]}, "input 1 has no mask token"),
    ("/fill-mask", {"inputs": "a [MASK]", "targets": ["unbelievably"]}, "is not one token"),
    ("/fill-mask", {"inputs": "a [MASK]", "top_k": 0}, "top_k"),
    ("/fill-mask", {"inputs": "word " * 80 + "[MASK]"}, "falls after the first 64 tokens"),
]


@pytest.mark.parametrize(("path", "body", "message"), BAD_REST, ids=[f"{p}-{m}" for p, _, m in BAD_REST])
def test_bad_rest_input_is_4xx_with_a_message(http: httpx.Client, path: str, body: dict, message: str) -> None:
    response = http.post(path, json=body)
    assert response.status_code == 422, response.text
    assert message in response.json()["error"]["message"]


BAD_GRPC = [
    ("Embed", pb.EmbedRequest(texts=[]), "at least one"),
    ("Embed", pb.EmbedRequest(texts=["ok", ""]), "texts[1] is empty"),  # the message's own field name
    ("Embed", pb.EmbedRequest(texts=["word " * 200], truncate=False), "tokens"),
    ("Embed", pb.EmbedRequest(texts=["x"], dimensions=64), "at most 32"),
    ("Fill", pb.FillRequest(texts=["no mask"]), "has no mask token"),
    ("Fill", pb.FillRequest(texts=["a [MASK]"], targets=["unbelievably"]), "is not one token"),
    ("Fill", pb.FillRequest(texts=["a [MASK]"], top_k=1000), "top_k"),
]


@pytest.mark.parametrize(("method", "request_message", "message"), BAD_GRPC, ids=[m for _, _, m in BAD_GRPC])
def test_bad_grpc_input_is_invalid_argument(
    channel: grpc.Channel, method: str, request_message: object, message: str
) -> None:
    stub = pb_grpc.EmbedderStub(channel) if method == "Embed" else pb_grpc.FillMaskStub(channel)
    with pytest.raises(grpc.RpcError) as error:
        getattr(stub, method)(request_message, timeout=10)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in (error.value.details() or "")


def test_still_serving_after_bad_input(server: ServerProcess, http: httpx.Client) -> None:
    assert http.get("/health/ready").status_code == 200
    assert http.post("/embed", json={"inputs": "still here"}).status_code == 200
    assert server.process.poll() is None
