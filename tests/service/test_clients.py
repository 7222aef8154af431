"""The clients users already have, unchanged, against a real server (tiny models of every task): Hugging Face's
`InferenceClient`, OpenAI's client, TEI's routes, Triton's `tritonclient` (HTTP and gRPC, the Open Inference
Protocol), gRPC health checking (Check, Watch through a drain, client-side health checking with round_robin) and
server reflection v1. Each answer is compared with the service's own route for the same input."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2

from service.grpc_api.stubs import bert_pb2 as pb
from service.grpc_api.stubs import bert_pb2_grpc as pb_grpc
from tests.service.server import ServerProcess, serving

pytestmark = pytest.mark.integration

CONTEXT = "My name is Wolfgang and I live in Berlin, where the river Spree flows."


@pytest.fixture(scope="module")
def every_task(
    tiny_bundles: dict[str, Path],
    encoder_bundles: dict[str, Path],
    rerank_bundle: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[ServerProcess]:
    log = tmp_path_factory.mktemp("clients") / "server.log"
    with serving([*tiny_bundles.values(), *encoder_bundles.values(), rerank_bundle], log) as server:
        yield server


@pytest.fixture(scope="module")
def rest(every_task: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=every_task.url, timeout=30) as client:
        yield client


# ---- Hugging Face's InferenceClient ------------------------------------------------------------------------
def test_inference_client_runs_every_task_as_the_service_does(every_task: ServerProcess, rest: httpx.Client) -> None:
    from huggingface_hub import InferenceClient

    def client(name: str) -> InferenceClient:
        return InferenceClient(model=f"{every_task.url}/models/{name}")

    labels = client("tiny-classify").text_classification("a gripping film")
    ours = rest.post("/classify", json={"inputs": "a gripping film", "top_k": None}).json()
    assert [(x.label, round(x.score, 6)) for x in labels] == [(x["label"], round(x["score"], 6)) for x in ours]
    answer = client("tiny-qa").question_answering(question="Where do I live?", context=CONTEXT)
    assert answer.answer == rest.post("/qa", json={"question": "Where do I live?", "context": CONTEXT}).json()["answer"]
    assert answer.answer == CONTEXT[answer.start : answer.end]
    entities = client("tiny-ner").token_classification("Ada Lovelace worked in London.")
    ours = rest.post("/ner", json={"inputs": "Ada Lovelace worked in London."}).json()
    assert [(e.entity_group, e.start, e.end) for e in entities] == [
        (e["entity_group"], e["start"], e["end"]) for e in ours
    ]
    vector = client("tiny-embed").feature_extraction("What is deep learning?")
    ours = rest.post("/embed", json={"inputs": "What is deep learning?"}).json()
    assert vector.shape == (1, len(ours[0])) and np.allclose(vector[0], ours[0], atol=1e-6)
    similarity = client("tiny-embed").sentence_similarity("a cat sits", ["a cat sits", "stocks fell"])
    assert len(similarity) == 2 and abs(similarity[0] - 1.0) < 1e-5 and similarity[1] < similarity[0]
    fills = client("tiny-fill-mask").fill_mask("Paris is the [MASK] of France.")
    ours = rest.post("/fill-mask", json={"inputs": "Paris is the [MASK] of France."}).json()
    assert [f.token for f in fills] == [f["token"] for f in ours]


def test_inference_api_shape_refuses_unknown_parameters_by_name(rest: httpx.Client) -> None:
    answer = rest.post("/models/tiny-classify", json={"inputs": "x", "parameters": {"top_k": 1, "colour": "red"}})
    assert answer.status_code == 422
    message = answer.json()["error"]["message"]
    assert "colour" in message and "top_k" in message
    assert rest.post("/models/nope", json={"inputs": "x"}).status_code == 422
    several = rest.post("/", json={"inputs": "x", "parameters": {}})
    assert several.status_code == 422 and "/models/" in several.json()["error"]["message"]
    qa = rest.post("/", json={"inputs": {"question": "Where?", "context": CONTEXT}, "parameters": {}})
    assert qa.status_code == 200 and qa.json()["answer"]  # the body's shape names the task
    # text-embeddings-inference's rerank body names the task too: the default rerank model answers as /rerank
    body = {"query": "Where do I live?", "texts": [CONTEXT, "Stocks fell."], "return_text": True}
    ranked = rest.post("/", json=body)
    assert ranked.status_code == 200 and ranked.headers["x-model"] == "tiny-rerank"
    assert ranked.json() == rest.post("/rerank", json=body).json()
    assert {rank["text"] for rank in ranked.json()} == set(body["texts"])
    mixed = rest.post("/", json={"query": "q", "texts": ["t"], "parameters": {}})  # neither body: names the fields
    assert mixed.status_code == 422 and "parameters" in mixed.json()["error"]["message"]


# ---- OpenAI's client ---------------------------------------------------------------------------------------
def test_openai_client_lists_retrieves_and_embeds(every_task: ServerProcess, rest: httpx.Client) -> None:
    import openai

    client = openai.OpenAI(base_url=f"{every_task.url}/v1", api_key="unused")
    names = [model.id for model in client.models.list()]
    assert sorted(names) == sorted(model["name"] for model in rest.get("/models").json()["models"])
    assert client.models.retrieve("tiny-embed").id == "tiny-embed"
    with pytest.raises(openai.UnprocessableEntityError):
        client.models.retrieve("nope")
    data = client.embeddings.create(input=["hello there"], model="tiny-embed").data
    assert np.allclose(data[0].embedding, rest.post("/embed", json={"inputs": ["hello there"]}).json()[0], atol=1e-6)


# ---- text-embeddings-inference's routes --------------------------------------------------------------------
def test_tei_routes_answer_in_teis_shapes(rest: httpx.Client) -> None:
    single = rest.post("/predict", json={"inputs": "a gripping film"}).json()
    assert {x["label"] for x in single} == {"negative", "positive"} and single[0]["score"] >= single[1]["score"]
    assert abs(sum(x["score"] for x in single) - 1) < 1e-5
    pair = rest.post("/predict", json={"inputs": ["a man plays", "someone plays music"]}).json()
    assert len(pair) == 2 and isinstance(pair[0], dict)
    batch = rest.post("/predict", json={"inputs": [["a gripping film"], ["a", "b"]], "raw_scores": True}).json()
    assert len(batch) == 2 and all(len(scores) == 2 for scores in batch)
    assert batch[0] == rest.post("/predict", json={"inputs": [["a gripping film"]], "raw_scores": True}).json()[0]
    tokens = rest.post("/tokenize", json={"inputs": "hello world"}).json()[0]
    assert tokens[0]["special"] and tokens[0]["start"] is None and tokens[1]["text"] == "hello"
    assert (tokens[1]["start"], tokens[1]["stop"]) == (0, 5)
    ids = [token["id"] for token in tokens]
    assert rest.post("/decode", json={"ids": ids}).json() == ["hello world"]
    assert rest.post("/decode", json={"ids": [ids, ids[1:2]]}).json() == ["hello world", "hello"]
    info = rest.get("/info").json()
    assert info["model_id"] == "tiny-embed" and info["model_type"] == {"embedding": {"pooling": "mean"}}
    assert rest.get("/health").status_code == 200
    assert rest.post("/decode", json={"ids": [10**9]}).status_code == 422


# ---- Triton's clients: the Open Inference Protocol over REST and gRPC --------------------------------------
@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_tritonclient_reads_metadata_and_infers_classify_and_qa(
    every_task: ServerProcess, rest: httpx.Client, transport: str
) -> None:
    import tritonclient.grpc as tgrpc
    import tritonclient.http as thttp

    module = thttp if transport == "http" else tgrpc
    url = every_task.url.removeprefix("http://") if transport == "http" else every_task.grpc_target
    client = module.InferenceServerClient(url)
    try:
        assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("tiny-classify")
        metadata = client.get_model_metadata("tiny-qa")
        inputs = metadata["inputs"] if transport == "http" else [{"name": i.name} for i in metadata.inputs]
        assert [i["name"] for i in inputs] == ["question", "context"]
        texts = ["a gripping film", "a tedious mess"]
        text = module.InferInput("text", [2], "BYTES")
        text.set_data_from_numpy(np.array([t.encode() for t in texts], dtype=object))
        result = client.infer("tiny-classify", [text])
        ours = rest.post("/classify", json={"inputs": texts}).json()
        assert [label.decode() for label in result.as_numpy("label")] == [x[0]["label"] for x in ours]
        assert np.allclose(result.as_numpy("score"), [x[0]["score"] for x in ours], atol=1e-6)
        question = module.InferInput("question", [1], "BYTES")
        question.set_data_from_numpy(np.array([b"Where do I live?"], dtype=object))
        context = module.InferInput("context", [1], "BYTES")
        context.set_data_from_numpy(np.array([CONTEXT.encode()], dtype=object))
        answer = client.infer("tiny-qa", [question, context])
        ours = rest.post("/qa", json={"question": "Where do I live?", "context": CONTEXT}).json()
        assert answer.as_numpy("answer")[0].decode() == ours["answer"]
        assert (int(answer.as_numpy("start")[0]), int(answer.as_numpy("end")[0])) == (ours["start"], ours["end"])
        with pytest.raises(Exception) as caught:
            client.infer("nope", [text])
        assert "unknown model 'nope'" in str(caught.value)  # the error message reaches the client's exception
    finally:
        client.close()


def test_v2_errors_carry_a_string_and_json_requests_work(rest: httpx.Client) -> None:
    body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["a gripping film"]}]}
    answer = rest.post("/v2/models/tiny-classify/infer", json=body)
    assert answer.status_code == 200, answer.text
    outputs = {o["name"]: o for o in answer.json()["outputs"]}
    assert outputs["label"]["data"][0] == rest.post("/classify", json={"inputs": "a gripping film"}).json()[0]["label"]
    wrong = rest.post(
        "/v2/models/tiny-classify/infer",
        json={"inputs": [{"name": "txt", "datatype": "BYTES", "shape": [1], "data": ["x"]}]},
    )
    assert wrong.status_code == 422 and isinstance(wrong.json()["error"], str) and "txt" in wrong.json()["error"]
    assert rest.get("/v2").json()["name"] == "bertserve"


# ---- gRPC: health watching, client-side health checking, reflection v1 -------------------------------------
def test_reflection_v1_lists_the_services(every_task: ServerProcess) -> None:
    with grpc.insecure_channel(every_task.grpc_target) as channel:
        call = channel.stream_stream(
            "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
            request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
            response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
        )
        answers = list(call(iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=10))
    names = {service.name for service in answers[0].list_services_response.service}
    assert {"bert.v1.Classifier", "inference.GRPCInferenceService", "grpc.reflection.v1.ServerReflection"} <= names


def test_watch_streams_serving_then_not_serving_on_drain(tiny_bundles: dict[str, Path], tmp_path: Path) -> None:
    env = {"BERTSERVE_DRAIN_S": "2"}
    server = ServerProcess([tiny_bundles["classify"]], tmp_path / "server.log", env)
    server.wait_ready()
    seen: list[int] = []
    with grpc.insecure_channel(server.grpc_target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        assert stub.Check(health_pb2.HealthCheckRequest(), timeout=10).status == health_pb2.HealthCheckResponse.SERVING
        stream = stub.Watch(health_pb2.HealthCheckRequest(), timeout=30)

        def watch() -> None:
            try:
                for update in stream:
                    seen.append(update.status)
                    if update.status == health_pb2.HealthCheckResponse.NOT_SERVING:
                        return
            except grpc.RpcError:
                pass

        watcher = threading.Thread(target=watch)
        watcher.start()
        time.sleep(0.5)
        server.process.send_signal(15)
        watcher.join(timeout=20)
        stream.cancel()
    assert server.terminate() == 0
    assert seen[:1] == [health_pb2.HealthCheckResponse.SERVING]
    assert health_pb2.HealthCheckResponse.NOT_SERVING in seen, seen


def test_round_robin_with_health_checking_leaves_a_draining_server(
    tiny_bundles: dict[str, Path], tmp_path: Path
) -> None:
    """A channel over two servers with round_robin and client-side health checking: once one drains (NOT_SERVING,
    then refusing new work after 1 s), every call goes to the other, and none fails; without the health watch, the
    calls the channel still sent to the stopping server would fail."""
    env = {"BERTSERVE_DRAIN_S": "1"}
    first = ServerProcess([tiny_bundles["classify"]], tmp_path / "a.log", env)
    second = ServerProcess([tiny_bundles["classify"]], tmp_path / "b.log", env)
    try:
        first.wait_ready()
        second.wait_ready()
        config = {"loadBalancingConfig": [{"round_robin": {}}], "healthCheckConfig": {"serviceName": ""}}
        target = f"ipv4:{first.grpc_target},{second.grpc_target}"
        options = [("grpc.service_config", json.dumps(config)), ("grpc.enable_retries", 0)]
        request = pb.ClassifyRequest(inputs=[pb.TextInput(text="hello")])
        failures = 0
        with grpc.insecure_channel(target, options=options) as channel:
            stub = pb_grpc.ClassifierStub(channel)
            for _ in range(20):
                stub.Classify(request, timeout=10)
            first.process.send_signal(15)
            calls, stop = 0, time.monotonic() + 4.0  # through the drain, the refusal of new work and the exit
            while time.monotonic() < stop:
                calls += 1
                try:
                    stub.Classify(request, timeout=10)
                except grpc.RpcError:
                    failures += 1
        assert failures == 0 and calls > 50, (failures, calls)
        assert first.process.wait(30) == 0
    finally:
        first.terminate()
        second.terminate()
