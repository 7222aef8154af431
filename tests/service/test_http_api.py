"""REST front door against a real server (subprocess, free port, httpx): shapes, offsets, errors, headers."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.service.server import ServerProcess, serving
from tests.service.tiny_bundles import CLASSIFY_LABELS, MAX_SEQ_LENGTH

pytestmark = pytest.mark.integration

LONG_CONTEXT = " ".join(
    f"Sentence number {i} talks about the city of Paris and the river Seine in France." for i in range(40)
)


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> httpx.Client:
    with httpx.Client(base_url=server.url, timeout=30.0) as http:
        yield http


def _error(response: httpx.Response, status: int, code: str | None = None) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and body["error"]["message"]
    if code is not None:
        assert body["error"]["code"] == code
    return str(body["error"]["message"])


# ---- classify -----------------------------------------------------------------------------------------
def test_classify_single_text_is_a_list_of_label_scores(client: httpx.Client) -> None:
    response = client.post("/classify", json={"inputs": "a gripping, beautifully acted film", "top_k": 2})
    assert response.status_code == 200
    result = response.json()
    assert [item["label"] for item in result] == sorted(
        CLASSIFY_LABELS, key=lambda label: -next(r["score"] for r in result if r["label"] == label)
    )
    assert result[0]["score"] >= result[1]["score"]
    assert sum(item["score"] for item in result) == pytest.approx(1.0, abs=1e-5)
    for header in ("x-queue-time-ms", "x-inference-time-ms", "x-total-time-ms", "x-tokenize-time-ms"):
        assert float(response.headers[header]) >= 0
    assert response.headers["x-model"] == "tiny-classify"


def test_classify_list_and_pairs(client: httpx.Client) -> None:
    texts = client.post("/classify", json={"inputs": ["loved it", "a tedious mess", "fine"]}).json()
    assert len(texts) == 3 and all(len(item) == 1 for item in texts)
    pair = {"text": "A man plays a guitar.", "text_pair": "Someone makes music."}
    pairs = client.post("/classify", json={"inputs": [pair, pair], "top_k": None}).json()
    assert len(pairs) == 2 and all(len(item) == len(CLASSIFY_LABELS) for item in pairs)
    assert pairs[0] == pairs[1]
    single_pair = client.post("/classify", json={"inputs": pair, "top_k": None}).json()
    assert single_pair == pairs[0]


def test_classify_batch_equals_one_by_one(client: httpx.Client) -> None:
    texts = ["short", "a much longer sentence that has quite a few more tokens in it", "medium length text"]
    together = client.post("/classify", json={"inputs": texts, "top_k": None}).json()
    alone = [client.post("/classify", json={"inputs": text, "top_k": None}).json() for text in texts]
    for a, b in zip(together, alone, strict=True):
        assert [x["label"] for x in a] == [x["label"] for x in b]
        for x, y in zip(a, b, strict=True):
            assert x["score"] == pytest.approx(y["score"], abs=1e-5)


def test_classify_over_long_input_truncates_or_rejects(client: httpx.Client) -> None:
    long_text = "word " * (MAX_SEQ_LENGTH * 3)
    assert client.post("/classify", json={"inputs": long_text}).status_code == 200
    message = _error(client.post("/classify", json={"inputs": long_text, "truncate": False}), 422, "input_too_long")
    assert str(MAX_SEQ_LENGTH) in message and "truncat" in message


# ---- qa -----------------------------------------------------------------------------------------------
def test_qa_single_answer_offsets_slice_the_context(client: httpx.Client) -> None:
    context = "My name is Wolfgang and I live in Berlin."
    response = client.post("/qa", json={"question": "Where do I live?", "context": context})
    assert response.status_code == 200
    answer = response.json()
    assert set(answer) == {"answer", "score", "start", "end"}
    assert context[answer["start"] : answer["end"]] == answer["answer"] and answer["answer"]
    assert 0 < answer["score"] <= 1


def test_qa_list_top_k_and_long_context_windows(client: httpx.Client) -> None:
    inputs = [
        {"question": "Which river?", "context": LONG_CONTEXT},
        {"question": "Who wrote it?", "context": "The report was written by Ada in 1843."},
    ]
    response = client.post("/qa", json={"inputs": inputs, "top_k": 3, "max_answer_len": 8})
    assert response.status_code == 200
    results = response.json()
    assert len(results) == 2
    for item, answers in zip(inputs, results, strict=True):
        assert 1 <= len(answers) <= 3
        scores = [a["score"] for a in answers]
        assert scores == sorted(scores, reverse=True)
        for answer in answers:
            assert item["context"][answer["start"] : answer["end"]] == answer["answer"]
    # the long context needed several windows, so several backend rows were used
    assert int(response.headers["x-backend-calls"]) >= 1
    assert any(a["start"] > 1000 for a in results[0]) or len(LONG_CONTEXT) > 1000
    message = _error(
        client.post("/qa", json={"question": "Which river?", "context": LONG_CONTEXT, "truncate": False}),
        422,
        "input_too_long",
    )
    assert message.startswith("context[0] does not fit in one window")


def test_ner_text_over_one_window_is_refused_without_truncation(client: httpx.Client) -> None:
    long_text = "Ada Lovelace worked with Charles Babbage in London. " * 6
    response = client.post("/ner", json={"inputs": ["Ada Lovelace", long_text], "truncate": False})
    message = _error(response, 422, "input_too_long")
    assert message.startswith(f"input 1 does not fit in one window of {MAX_SEQ_LENGTH} tokens")


def test_qa_answers_can_come_from_late_windows(client: httpx.Client) -> None:
    # spans are decoded in every window: with many candidates some lie far into the long context
    answers = client.post(
        "/qa", json={"question": "Which river?", "context": LONG_CONTEXT, "top_k": 20, "max_answer_len": 4}
    ).json()
    assert max(a["end"] for a in answers) > len(LONG_CONTEXT) // 2


def test_qa_over_long_question_is_cut_or_rejected(client: httpx.Client) -> None:
    # the tiny QA bundle has no task_settings: questions get at most (64 - 3) // 2 = 30 tokens of a window
    body = {"question": "which of the many rivers " * 10 + "is it?", "context": "The river is the Seine."}
    assert client.post("/qa", json=body).status_code == 200
    message = _error(client.post("/qa", json={**body, "truncate": False}), 422, "input_too_long")
    assert "question[0]" in message and "30 tokens" in message and "truncate" in message


def test_qa_context_without_tokens_gets_the_empty_answer(client: httpx.Client) -> None:
    # a control character is no token: no span to read, so the answer is the empty answer (gRPC's too)
    inputs = [{"question": "Where?", "context": "\x03"}, {"question": "Where?", "context": "In Paris."}]
    response = client.post("/qa", json={"inputs": inputs})
    assert response.status_code == 200, response.text
    first, second = response.json()
    assert first == {"answer": "", "score": 0.0, "start": 0, "end": 0} and second["answer"]
    assert client.post("/qa", json=inputs[0]).json() == first
    assert client.post("/qa", json={**inputs[0], "top_k": 2}).json() == [first]


def test_qa_impossible_answer_and_stride(client: httpx.Client) -> None:
    body = {"question": "What?", "context": LONG_CONTEXT, "handle_impossible_answer": True, "doc_stride": 4}
    answer = client.post("/qa", json=body).json()
    assert answer["answer"] == LONG_CONTEXT[answer["start"] : answer["end"]]
    _error(client.post("/qa", json={**body, "doc_stride": 500}), 422)


# ---- ner ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("strategy", ["none", "simple", "first", "average", "max"])
def test_ner_entities_slice_the_text(client: httpx.Client, strategy: str) -> None:
    text = "Ada Lovelace worked with Charles Babbage in London. " * 6  # longer than one window
    response = client.post("/ner", json={"inputs": text, "aggregation_strategy": strategy})
    assert response.status_code == 200
    entities = response.json()
    assert isinstance(entities, list)
    for entity in entities:
        assert set(entity) == {"entity_group", "score", "word", "start", "end"}
        assert text[entity["start"] : entity["end"]] == entity["word"]
        assert 0 <= entity["score"] <= 1
    starts = [e["start"] for e in entities]
    assert starts == sorted(starts)


def test_ner_list_shape(client: httpx.Client) -> None:
    result = client.post("/ner", json={"inputs": ["EU rejects German call.", "Peter Blackburn"]}).json()
    assert isinstance(result, list) and len(result) == 2 and all(isinstance(r, list) for r in result)


# ---- models, health, metrics, docs --------------------------------------------------------------------
def test_models_health_metrics(client: httpx.Client) -> None:
    models = client.get("/models").json()["models"]
    assert {m["name"]: m["task"] for m in models} == {"tiny-classify": "classify", "tiny-qa": "qa", "tiny-ner": "ner"}
    for model in models:
        assert model["variant"] == "cpu-fp32" and model["max_seq_length"] == MAX_SEQ_LENGTH and model["is_default"]
    assert client.get("/health/live").json() == {"status": "live", "detail": None}
    assert client.get("/health/ready").status_code == 200
    client.post("/classify", json={"inputs": ""})  # one 422 to count
    metrics = client.get("/metrics").text
    for name in (
        'bertserve_requests_total{route="/classify",status="200",transport="http"}',
        'bertserve_requests_total{route="/classify",status="422",transport="http"}',
        "bertserve_request_seconds_bucket",
        "bertserve_queue_seconds_bucket",
        "bertserve_inference_seconds_bucket",
        "bertserve_batch_size_bucket",
        "bertserve_batch_tokens_bucket",
        "bertserve_queue_depth",
        "bertserve_ready 1.0",
    ):
        assert name in metrics, name

    def alone_batches() -> float:
        prefix = 'bertserve_alone_batches_total{model="tiny-classify"} '
        return float(
            next(line for line in client.get("/metrics").text.splitlines() if line.startswith(prefix))[len(prefix) :]
        )

    before = alone_batches()
    for _ in range(3):  # one request at a time: each batch has nothing beside it
        assert client.post("/classify", json={"inputs": "a fine film"}).status_code == 200
    assert alone_batches() == before + 3


def test_openapi_documents_routes_with_examples(client: httpx.Client) -> None:
    spec = client.get("/openapi.json").json()
    for path in ("/classify", "/qa", "/ner", "/models", "/health/live", "/health/ready", "/metrics"):
        assert path in spec["paths"]
    schemas = spec["components"]["schemas"]
    for name in ("ClassifyRequest", "QARequest", "NERRequest"):
        assert schemas[name]["examples"]
    assert "429" in spec["paths"]["/classify"]["post"]["responses"]
    # what the server enforces, stated: its loaded models, its limits, QA's two forms
    for name, model in (("ClassifyRequest", "tiny-classify"), ("QARequest", "tiny-qa"), ("NERRequest", "tiny-ner")):
        field = schemas[name]["properties"]["model"]
        assert field["anyOf"][0]["enum"] == [model, ""] and field["examples"] == [model]
    ner_list = schemas["NERRequest"]["properties"]["inputs"]["anyOf"][1]
    assert (ner_list["minItems"], ner_list["maxItems"], ner_list["items"]["maxLength"]) == (1, 64, 100_000)
    assert schemas["QARequest"]["properties"]["doc_stride"]["anyOf"][0]["maximum"] == MAX_SEQ_LENGTH - 30 - 3 - 1
    assert [form["required"] for form in schemas["QARequest"]["oneOf"]] == [["question", "context"], ["inputs"]]


def test_openapi_before_loading_gives_each_route_its_default_model_as_example() -> None:
    from service.http_api import create_app

    schemas = create_app().openapi()["components"]["schemas"]
    examples = {
        name: schemas[name]["properties"]["model"]["examples"]
        for name in ("ClassifyRequest", "QARequest", "NERRequest")
    }
    assert examples == {
        "ClassifyRequest": ["minilm-sst2"],
        "QARequest": ["minilm-squad"],
        "NERRequest": ["minilm-conll03"],
    }


def test_the_service_middleware_wraps_fastapis_stack() -> None:
    """The metrics middleware and the door sit around FastAPI's own middleware: a route's unexpected error is the
    app's 500 `internal`, with the request id, and counted as a 500 of its route."""
    from starlette.testclient import TestClient

    from service.http_api import create_app

    app = create_app()

    async def boom() -> None:
        raise RuntimeError("a bug")

    app.add_api_route("/boom", boom, methods=["GET"])
    response = TestClient(app, raise_server_exceptions=False).get("/boom", headers={"x-request-id": "abc"})
    assert response.status_code == 500 and response.json()["error"]["code"] == "internal"
    assert response.headers["x-request-id"] == "abc"
    assert 'bertserve_requests_total{route="/boom",status="500",transport="http"} 1.0' in (
        app.state.metrics.exposition().decode()
    )


# ---- bad input: always 4xx with a useful message, and the server keeps serving -------------------------
@pytest.mark.parametrize(
    ("path", "body", "status", "needle"),
    [
        ("/classify", {"inputs": ""}, 422, "empty"),
        ("/classify", {"inputs": ["ok", "   "]}, 422, "inputs[1] is empty"),
        ("/classify", {"inputs": 42}, 422, "inputs"),
        ("/classify", {"inputs": "x", "top_k": "two"}, 422, "top_k"),
        ("/classify", {"inputs": "x", "top_k": 0}, 422, "top_k"),
        ("/classify", {"inputs": "x", "colour": "red"}, 422, "colour"),
        ("/classify", {"inputs": ["x"] * 65}, 422, "limit of 64"),
        ("/classify", {"inputs": ["a", {"text": "b", "text_pair": "c"}]}, 422, "mix"),
        ("/classify", {"inputs": "x", "model": "nope"}, 422, "unknown model 'nope'"),
        ("/classify", {"inputs": "x", "model": "tiny-qa"}, 422, "is a qa model"),
        ("/classify", {}, 422, "inputs"),
        ("/classify", [], 422, "body"),
        ("/qa", {"question": "q"}, 422, "together"),
        ("/qa", {"question": "", "context": "c"}, 422, "empty"),
        ("/qa", {"inputs": []}, 422, "at least one"),
        ("/qa", {"question": "q", "context": "c", "top_k": 1000}, 422, "top_k"),
        ("/ner", {"inputs": "x", "aggregation_strategy": "mean"}, 422, "aggregation_strategy"),
        ("/ner", {"inputs": ["x", None]}, 422, "inputs"),
        ("/ner", {"inputs": "x" * 100_001}, 422, "100000"),
    ],
)
def test_bad_input_is_a_4xx_that_says_what_to_change(
    client: httpx.Client, path: str, body: object, status: int, needle: str
) -> None:
    message = _error(client.post(path, json=body), status)
    assert needle in message, message


def test_a_message_quoting_a_long_value_is_cut_in_its_middle(client: httpx.Client) -> None:
    """An error quotes what the caller sent; a value of 100,000 characters comes back cut, not whole, with the
    message's start and its end (the models that exist) kept."""
    response = client.post("/classify", json={"inputs": "x", "model": "m" * 100_000})
    message = _error(response, 422)
    assert len(response.content) < 5000, len(response.content)
    assert message.startswith("unknown model 'mmm") and "characters cut" in message, message[:200]
    assert "; loaded: tiny-classify (classify)" in message[-300:], message[-300:]
    assert client.post("/classify", json={"inputs": "still serving"}).status_code == 200


@pytest.mark.parametrize(
    ("path", "body", "needle"),
    [
        ("/classify", b'{"inputs": ["ok", "a \\ud800 b"]}', "surrogate"),
        ("/qa", b'{"question": "q", "context": "\\udfff"}', "surrogate"),
        ("/embed", b'{"inputs": "\\udc80\\ud800"}', "surrogate"),
    ],
)
def test_a_lone_surrogate_is_invalid_json_that_says_where(
    client: httpx.Client, path: str, body: bytes, needle: str
) -> None:
    """JSON may escape a lone surrogate, which is no character (RFC 8259 section 8.2; I-JSON forbids it): refused
    as not valid JSON, naming the problem and its byte, not as a tokenizer's type error."""
    message = _error(client.post(path, content=body, headers={"content-type": "application/json"}), 400, "invalid_json")
    assert needle in message and "at byte" in message, message
    assert client.post("/classify", json={"inputs": "still serving"}).status_code == 200


def test_malformed_json_and_wrong_content(client: httpx.Client) -> None:
    message = _error(
        client.post("/classify", content=b'{"inputs": "x",', headers={"content-type": "application/json"}), 400
    )
    assert "JSON" in message
    _error(client.post("/classify", content=b"\xff\xfe\x00", headers={"content-type": "application/json"}), 400)
    assert client.post("/classify", content=b"inputs=x").status_code in (400, 422)
    _error(client.get("/nowhere"), 404)
    _error(client.get("/classify"), 405)


def test_oversized_body_is_413(client: httpx.Client) -> None:
    big = json.dumps({"inputs": ["word " * 1000] * 500})  # ~2.5 MB > the 2 MB default
    message = _error(client.post("/classify", content=big, headers={"content-type": "application/json"}), 413)
    assert "bytes" in message

    def chunks():  # no Content-Length: counted while streaming
        for _ in range(300):
            yield b" " * 10_000

    response = client.post("/classify", content=chunks(), headers={"content-type": "application/json"})
    assert response.status_code == 413
    assert client.post("/classify", json={"inputs": "still serving"}).status_code == 200


# The request body limit (413) is the one rule JSON Schema cannot state for every route: a body over
# `max_body_bytes` is refused whether or not it is valid. The other rules the server checks are in the served
# schema, but for the bodies whose meaning depends on the model: Hugging Face's shape (`POST /`,
# `POST /models/{name}`) takes the named model's task's inputs and parameters, and a v2 inference request names
# the model's tensors; those operations may refuse a schema-valid body with the 4xx and message of their own, as
# may fill-mask for `targets` that are not single entries of the model's vocabulary.
SCHEMATHESIS_CONFIG = """
[checks.positive_data_acceptance]
expected-statuses = ["2xx", "3xx", "401", "403", "404", "409", "413", "429", "5xx"]

[checks.negative_data_rejection]
expected-statuses = ["400", "401", "403", "404", "405", "406", "409", "413", "415", "422", "428", "429", "5xx"]

[[operations]]
include-name = ["POST /", "POST /models/{name}", "POST /fill-mask"]
checks.positive_data_acceptance.expected-statuses = ["2xx", "401", "404", "413", "422", "429", "5xx"]

[[operations]]
include-path-regex = "^/v2/models/.*/infer$"
checks.positive_data_acceptance.expected-statuses = ["2xx", "400", "401", "404", "413", "422", "429", "5xx"]
"""


@pytest.fixture(scope="module")
def every_task_server(
    tiny_bundles: dict[str, Path],
    encoder_bundles: dict[str, Path],
    rerank_bundle: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[ServerProcess]:
    """A real server with a model of every task, so that every route is in its schema."""
    log = tmp_path_factory.mktemp("every-task-server") / "server.log"
    with serving([*tiny_bundles.values(), *encoder_bundles.values(), rerank_bundle], log) as process:
        yield process


def test_openapi_fuzzing_finds_no_server_error(every_task_server: ServerProcess, tmp_path: Path) -> None:
    """schemathesis with every check: examples, coverage and random fuzzing of every operation of a server with a
    model of every task; no 5xx, responses match the schema, schema-valid requests are accepted and schema-invalid
    ones refused. One worker: two would parse Python sources in parallel (hypothesis describing its strategies),
    which CPython 3.11's parser does not take from two threads at once."""
    import shutil
    import subprocess
    import sys

    server = every_task_server

    binary = shutil.which("schemathesis") or str(Path(sys.executable).with_name("schemathesis"))
    config = tmp_path / "schemathesis.toml"
    config.write_text(SCHEMATHESIS_CONFIG)
    result = subprocess.run(
        [
            binary, "--config-file", str(config), "run", f"{server.url}/openapi.json", "--checks", "all",
            "--max-examples", "100", "--seed", "7", "--no-color", "--workers", "1", "--request-timeout", "30",
        ],
        capture_output=True, text=True, timeout=480, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-4000:]
    assert " passed" in result.stdout and "failures" not in result.stdout.lower(), result.stdout[-4000:]
    print(result.stdout[-1500:])
    assert server.process.poll() is None and "Traceback" not in server.logs()


def test_request_id_and_caller_deadline(client: httpx.Client) -> None:
    response = client.post("/classify", json={"inputs": "hi"}, headers={"x-request-id": "abc-123"})
    assert response.headers["x-request-id"] == "abc-123"
    generated = [client.post("/classify", json={"inputs": "hi"}).headers["x-request-id"] for _ in range(3)]
    assert all(len(value) == 32 and int(value, 16) >= 0 for value in generated) and len(set(generated)) == 3
    body = {"inputs": [{"question": "Which river?", "context": LONG_CONTEXT}] * 32}
    late = client.post("/qa", json=body, headers={"x-request-timeout-ms": "0.01"})
    assert late.status_code == 504 and late.json()["error"]["code"] == "deadline_exceeded"
    _error(client.post("/classify", json={"inputs": "x"}, headers={"x-request-timeout-ms": "soon"}), 422)
    assert client.post("/qa", json=body, headers={"x-request-timeout-ms": "30000"}).status_code == 200


def test_bench_clients_drive_the_real_server(server: ServerProcess) -> None:
    # bertserve.benchmarks.service's aiohttp clients: sequential calls carry the backend's own time; the closed loop
    # keeps `concurrency` requests in flight and counts each answer once, by status
    import asyncio

    from bertserve.benchmarks.service import _closed_loop, _sequential

    texts = ["a gripping film", "dull", "an utterly forgettable and overlong second act"]
    total, backend = asyncio.run(_sequential(server.url, texts, requests=5))
    assert len(total) == len(backend) == 5
    assert all(0 < b < t for t, b in zip(total, backend, strict=True))
    result = asyncio.run(_closed_loop(server.url, texts, concurrency=4, duration=1.0))
    assert result["requests"] >= 4 and result["statuses"] == {"200": result["requests"]}
    assert result["p50_ms"] <= result["p99_ms"]
