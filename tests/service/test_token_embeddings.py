"""Every token's vector through the real server: text-embeddings-inference's `POST /embed_all` and gRPC
`Embedder.EmbedAll` over a tiny random encoder exported by `bertserve export`, equal to `transformers`' last hidden
state of the same model folder, batched as alone, the same over both front doors; a bundle exported before token
states were an output still embeds, and its token embeddings are refused with how to re-export it; bad input gets a
clear 4xx. What the served schema says of it, and the per-request bound on an answer's size, are checked in
process. A slow check serves the default MiniLM bundle (`make bundles`) against sentence-transformers' token
embeddings of the same model."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest

from service.engine.inputs import EmbedAllInput
from service.errors import InvalidInput
from service.grpc_api.stubs import bert_pb2 as pb
from service.grpc_api.stubs import bert_pb2_grpc as pb_grpc
from tests.service.server import REPO, ServerProcess, serving
from tests.service.tiny_bundles import EARLIER_EMBED_NAME, EXPORTED_EMBED_NAME, MAX_SEQ_LENGTH

pytestmark = pytest.mark.integration

TEXTS = ["A man is playing a guitar.", "The new movie is awesome", "Ein kurzer Satz.", "word " * 100]
"""Texts of several lengths; the last is cut to the model's 64 tokens."""
HIDDEN = 32
PARITY = 1e-4
"""Largest |difference| allowed between a served token vector and transformers' (cpu-fp32)."""


@pytest.fixture(scope="module")
def server(
    exported_embed: tuple[Path, Path],
    earlier_embed_bundle: Path,
    tiny_bundles: dict[str, Path],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[ServerProcess]:
    """The exported encoder (the default embedding model), its copy as an earlier build wrote it, a classifier."""
    log = tmp_path_factory.mktemp("token-embeddings") / "server.log"
    with serving([exported_embed[1], earlier_embed_bundle, tiny_bundles["classify"]], log) as process:
        yield process


def transformers_states(folder: Path, texts: list[str], max_length: int) -> list[np.ndarray]:
    """Each text's last hidden state by `transformers`' AutoModel and AutoTokenizer of `folder`, one text a call."""
    import torch
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.AutoModel.from_pretrained(folder).eval()
    states = []
    for text in texts:
        encoded = tokenizer(text, truncation=True, max_length=max_length, return_tensors="pt")
        ids = encoded["input_ids"][0]
        assert (ids != tokenizer.unk_token_id).any(), f"the reference reads {text!r} as unknown tokens only"
        assert ids[0] == tokenizer.cls_token_id and ids[-1] == tokenizer.sep_token_id
        with torch.inference_mode():
            states.append(model(**encoded).last_hidden_state[0].numpy())
    return states


def max_diff(served: list[Any], expected: list[np.ndarray]) -> float:
    """Largest |difference| over every token of every input; shapes must agree (the same tokens, specials included)."""
    worst = 0.0
    for vectors, reference in zip(served, expected, strict=True):
        array = np.asarray(vectors, dtype=np.float32)
        assert array.shape == reference.shape, (array.shape, reference.shape)
        worst = max(worst, float(np.abs(array.astype(np.float64) - reference).max()))
    return worst


# ---- REST /embed_all --------------------------------------------------------------------------------------
def test_embed_all_equals_transformers_last_hidden_state(http: httpx.Client, exported_embed: tuple[Path, Path]) -> None:
    answer = http.post("/embed_all", json={"inputs": TEXTS, "truncate": True})
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-model"] == EXPORTED_EMBED_NAME and float(answer.headers["x-inference-time-ms"]) > 0
    served = answer.json()
    expected = transformers_states(exported_embed[0], TEXTS, MAX_SEQ_LENGTH)
    assert [len(vectors) for vectors in served] == [len(state) for state in expected]
    assert len(served[-1]) == MAX_SEQ_LENGTH  # cut to the model's length, [SEP] last
    worst = max_diff(served, expected)
    print(f"max |diff| of the served token vectors vs transformers: {worst:.3g}")
    assert worst <= PARITY


def test_one_text_is_a_list_of_one_and_batching_is_invisible(http: httpx.Client) -> None:
    batched = http.post("/embed_all", json={"inputs": TEXTS}).json()
    alone = [http.post("/embed_all", json={"inputs": text}).json() for text in TEXTS]
    assert all(len(one) == 1 and len(one[0][0]) == HIDDEN for one in alone)  # [[[floats]]] also for one text
    assert max_diff(batched, [np.asarray(one[0], dtype=np.float64) for one in alone]) <= 1e-5
    # not normalized, not pooled: the token states themselves
    assert not np.allclose(np.linalg.norm(np.asarray(batched[0]), axis=1), 1.0)


def test_grpc_embed_all_equals_rest(channel: grpc.Channel, http: httpx.Client) -> None:
    response, call = pb_grpc.EmbedderStub(channel).EmbedAll.with_call(pb.EmbedAllRequest(texts=TEXTS), timeout=30)
    rest = http.post("/embed_all", json={"inputs": TEXTS}).json()
    assert response.model == EXPORTED_EMBED_NAME and len(response.results) == len(TEXTS)
    for result, vectors in zip(response.results, rest, strict=True):
        assert (result.tokens, result.dimensions) == (len(vectors), HIDDEN)
        got = np.asarray(result.values, dtype=np.float32).reshape(result.tokens, result.dimensions)
        np.testing.assert_array_equal(got, np.asarray(vectors, dtype=np.float32))
    assert float(dict(call.trailing_metadata())["x-inference-time-ms"]) > 0


# ---- a bundle exported before token embeddings ------------------------------------------------------------
def test_an_earlier_bundle_embeds_and_refuses_token_embeddings_saying_to_re_export(
    http: httpx.Client, channel: grpc.Channel
) -> None:
    answer = http.post("/embed_all", json={"inputs": "a text", "model": EARLIER_EMBED_NAME})
    assert answer.status_code == 422, answer.text
    message = answer.json()["error"]["message"]
    assert "re-export" in message and "bertserve export" in message and EARLIER_EMBED_NAME in message
    with pytest.raises(grpc.RpcError) as error:
        request = pb.EmbedAllRequest(texts=["a text"], model=EARLIER_EMBED_NAME)
        pb_grpc.EmbedderStub(channel).EmbedAll(request, timeout=10)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "re-export" in (error.value.details() or "")
    vectors = http.post("/embed", json={"inputs": "a text", "model": EARLIER_EMBED_NAME})
    assert vectors.status_code == 200 and len(vectors.json()[0]) == HIDDEN  # its sentence vectors still serve


def test_the_served_schema_names_the_models_with_token_embeddings(http: httpx.Client) -> None:
    spec = http.get("/openapi.json").json()
    assert "/embed_all" in spec["paths"]
    field = spec["components"]["schemas"]["EmbedAllRequest"]["properties"]["model"]
    (named,) = [option for option in field["anyOf"] if "enum" in option]
    assert named["enum"] == [EXPORTED_EMBED_NAME, ""]  # not the earlier bundle, nor the classifier


# ---- bad input ----------------------------------------------------------------------------------------
BAD_REST = [
    ({"inputs": []}, "at least one"),
    ({"inputs": " "}, "empty"),
    ({"inputs": "word " * 100, "truncate": False}, "tokens"),
    ({"inputs": "x", "truncation_direction": "left"}, "truncation_direction"),
    ({"inputs": "x", "prompt_name": "query"}, "prompt_name"),
    ({"inputs": "x", "normalize": True}, "normalize"),  # TEI's /embed_all takes no normalize
    ({"inputs": "x", "model": "tiny-classify"}, "is a classify model"),
]


@pytest.mark.parametrize(("body", "message"), BAD_REST, ids=[m for _, m in BAD_REST])
def test_bad_input_is_422_with_a_message(http: httpx.Client, body: dict, message: str) -> None:
    response = http.post("/embed_all", json=body)
    assert response.status_code == 422, response.text
    assert message in response.json()["error"]["message"]


def test_bad_grpc_input_is_invalid_argument(channel: grpc.Channel, server: ServerProcess) -> None:
    for request, message in (
        (pb.EmbedAllRequest(texts=[]), "at least one"),
        (pb.EmbedAllRequest(texts=["word " * 100], truncate=False), "tokens"),
        (pb.EmbedAllRequest(texts=["x"], model="tiny-classify"), "is a classify model"),
    ):
        with pytest.raises(grpc.RpcError) as error:
            pb_grpc.EmbedderStub(channel).EmbedAll(request, timeout=10)
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT and message in (error.value.details() or "")
    assert server.process.poll() is None and "Traceback" not in server.logs()


# ---- in process: the schema, the bound on an answer --------------------------------------------------------
def _schema_with(models: list[dict[str, Any]], token_embedding_models: list[str]) -> dict[str, Any]:
    from service.http_api.app import create_app
    from service.http_api.openapi import ServedModels, with_models

    served = ServedModels(models, [], [30522], [HIDDEN], [], token_embedding_models)
    return with_models(create_app().openapi(), served)


def _entry(name: str, task: str, default: bool = True) -> dict[str, Any]:
    return {"name": name, "task": task, "is_default": default}


def test_the_schema_leaves_embed_all_out_when_the_default_model_lacks_token_embeddings() -> None:
    earlier, exported = _entry("earlier", "embed"), _entry("exported", "embed", default=False)
    assert "/embed_all" not in _schema_with([earlier, exported], ["exported"])["paths"]
    assert "/embed_all" in _schema_with([earlier, exported], ["earlier", "exported"])["paths"]


def test_the_root_body_is_teis_rerank_body_only_beside_a_rerank_model() -> None:
    def root_body(models: list[dict[str, Any]]) -> dict[str, Any]:
        schema = _schema_with(models, [])
        return schema["paths"]["/"]["post"]["requestBody"]["content"]["application/json"]["schema"]

    assert root_body([_entry("e", "embed")]) == {"$ref": "#/components/schemas/HFRequest"}
    both = root_body([_entry("e", "embed"), _entry("r", "rerank")])
    assert [choice["$ref"].rpartition("/")[2] for choice in both["oneOf"]] == ["HFRequest", "TeiRerankRequest"]


def test_an_answer_over_the_bound_is_refused_before_the_model_runs(
    exported_embed: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from bundles.serving import open_bundle
    from service.engine import pipelines

    pipeline = pipelines.EmbedPipeline(open_bundle(exported_embed[1]))
    pipeline.vector_size = HIDDEN  # read off the warm-up's answer in a server
    monkeypatch.setattr(pipelines, "EMBED_ALL_MAX_VALUES", 12 * HIDDEN)
    assert len(pipeline.features(EmbedAllInput(texts=["a short text", "and another"]))) == 2  # 5 + 4 tokens
    with pytest.raises(InvalidInput, match=r"would hold 16 token vectors of 32 floats \(512 floats\), more than"):
        pipeline.features(EmbedAllInput(texts=["a short text", "and another", "a third text at last"]))


def test_large_answers_render_item_by_item_as_one_json_list() -> None:
    import orjson

    from service.http_api.rendering import JSON_OPTIONS, json_list_bytes

    arrays = [np.random.default_rng(i).standard_normal((n, HIDDEN)).astype(np.float32) for i, n in enumerate((3, 9))]
    assert json_list_bytes(arrays) == orjson.dumps(arrays, option=JSON_OPTIONS)
    parsed = orjson.loads(json_list_bytes(arrays))
    assert [np.asarray(item, dtype=np.float32).tolist() for item in parsed] == [a.tolist() for a in arrays]


# ---- the default MiniLM bundle against sentence-transformers ----------------------------------------------
MINILM_BUNDLE = REPO / "artifacts" / "bundles" / "minilm"


@pytest.mark.slow
def test_minilm_token_embeddings_equal_sentence_transformers(tmp_path: Path) -> None:
    """The default embedding bundle (`make bundles`), served on its cpu-fp32 variant, against sentence-transformers'
    `encode(..., output_value="token_embeddings")` of the model it was exported from."""
    sentence_transformers = pytest.importorskip("sentence_transformers")
    from bundles.spec import BundleManifest

    if not (MINILM_BUNDLE / "manifest.json").is_file():
        pytest.skip(f"{MINILM_BUNDLE} is not built (make bundles)")
    manifest = BundleManifest.read(MINILM_BUNDLE)
    if "token_embeddings" not in manifest.on_request_outputs:
        pytest.skip(f"{MINILM_BUNDLE} was exported before token embeddings (make bundles)")
    texts = [*TEXTS[:3], "The quick brown fox jumps over the lazy dog. " * 30]  # the last one cut
    with serving([MINILM_BUNDLE], tmp_path / "server.log", None, "--variant", "cpu-fp32") as server:
        answer = httpx.post(f"{server.url}/embed_all", json={"inputs": texts, "truncate": True}, timeout=60)
    assert answer.status_code == 200, answer.text
    oracle = sentence_transformers.SentenceTransformer(manifest.source["model"], device="cpu")
    oracle.max_seq_length = manifest.max_seq_length
    expected = oracle.encode(texts, output_value="token_embeddings", convert_to_numpy=False)
    worst = max_diff(answer.json(), [state.numpy().astype(np.float64) for state in expected])
    print(f"max |diff| of MiniLM's served token vectors vs sentence-transformers: {worst:.3g}")
    assert worst <= PARITY
