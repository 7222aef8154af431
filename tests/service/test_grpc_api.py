"""gRPC front door against a real server with the generated bert.v1 stubs: every RPC, equality with REST,
health, reflection, deadlines, errors, and malformed messages."""

from __future__ import annotations

import os

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from service.grpc_api.stubs import bert_pb2 as pb
from service.grpc_api.stubs import bert_pb2_grpc as pb_grpc
from tests.service.test_http_api import LONG_CONTEXT

pytestmark = pytest.mark.integration


def test_classify_matches_rest(channel: grpc.Channel, http: httpx.Client) -> None:
    texts = ["loved it", "a tedious, overlong mess of a film", "fine"]
    response, call = pb_grpc.ClassifierStub(channel).Classify.with_call(
        pb.ClassifyRequest(inputs=[pb.TextInput(text=t) for t in texts], top_k=0)
    )
    assert response.model == "tiny-classify"
    grpc_results = [[{"label": s.label, "score": s.score} for s in r.labels] for r in response.results]
    assert grpc_results == http.post("/classify", json={"inputs": texts, "top_k": None}).json()
    metadata = dict(call.trailing_metadata())
    assert float(metadata["x-queue-time-ms"]) >= 0 and float(metadata["x-inference-time-ms"]) > 0
    pairs = pb.ClassifyRequest(inputs=[pb.TextInput(text="a", text_pair="b")])
    pair_result = pb_grpc.ClassifierStub(channel).Classify(pairs).results[0].labels[0]
    rest_pair = http.post("/classify", json={"inputs": {"text": "a", "text_pair": "b"}}).json()[0]
    assert {"label": pair_result.label, "score": pair_result.score} == rest_pair


def test_extract_matches_rest_and_offsets_slice(channel: grpc.Channel, http: httpx.Client) -> None:
    inputs = [("Which river?", LONG_CONTEXT), ("Who wrote it?", "The report was written by Ada in 1843.")]
    request = pb.ExtractRequest(
        inputs=[pb.QAInput(question=q, context=c) for q, c in inputs], top_k=3, max_answer_len=8
    )
    response = pb_grpc.QAStub(channel).Extract(request)
    grpc_results = [
        [{"answer": a.answer, "score": a.score, "start": a.start, "end": a.end} for a in r.answers]
        for r in response.results
    ]
    body = {"inputs": [{"question": q, "context": c} for q, c in inputs], "top_k": 3, "max_answer_len": 8}
    assert grpc_results == http.post("/qa", json=body).json()
    for (_, context), answers in zip(inputs, grpc_results, strict=True):
        for answer in answers:
            assert context[answer["start"] : answer["end"]] == answer["answer"]


@pytest.mark.parametrize(
    ("enum", "name"),
    [
        (pb.AGGREGATION_STRATEGY_UNSPECIFIED, "simple"),
        (pb.AGGREGATION_STRATEGY_NONE, "none"),
        (pb.AGGREGATION_STRATEGY_FIRST, "first"),
        (pb.AGGREGATION_STRATEGY_AVERAGE, "average"),
        (pb.AGGREGATION_STRATEGY_MAX, "max"),
    ],
)
def test_recognize_matches_rest(channel: grpc.Channel, http: httpx.Client, enum: int, name: str) -> None:
    texts = ["Ada Lovelace worked with Charles Babbage in London.", "EU rejects German call."]
    response = pb_grpc.NERStub(channel).Recognize(pb.RecognizeRequest(texts=texts, aggregation_strategy=enum))
    grpc_results = [
        [
            {"entity_group": e.entity_group, "score": e.score, "word": e.word, "start": e.start, "end": e.end}
            for e in r.entities
        ]
        for r in response.results
    ]
    assert grpc_results == http.post("/ner", json={"inputs": texts, "aggregation_strategy": name}).json()


FUNCTIONS = {pb.SCORE_FUNCTION_SOFTMAX: "softmax", pb.SCORE_FUNCTION_SIGMOID: "sigmoid", pb.SCORE_FUNCTION_NONE: "none"}


def test_models_list(channel: grpc.Channel, http: httpx.Client) -> None:
    response = pb_grpc.ModelsStub(channel).List(pb.ListModelsRequest())
    listed = [
        {
            "name": m.name,
            "task": m.task,
            "family": m.family,
            "labels": list(m.labels),
            "variant": m.variant,
            "max_seq_length": m.max_seq_length,
            "backend": m.backend,
            "is_default": m.is_default,
            "variant_choice": {
                "auto": m.variant_choice.auto,
                "timings_ms": {name: dict(shapes.ms) for name, shapes in m.variant_choice.timings_ms.items()},
                "skipped": dict(m.variant_choice.skipped),
                "rounds": m.variant_choice.rounds,
                "seconds": m.variant_choice.seconds,
            },
            "function_to_apply": FUNCTIONS.get(m.function_to_apply),
        }
        for m in response.models
    ]
    assert listed == http.get("/models").json()["models"]


def test_health_and_reflection(channel: grpc.Channel) -> None:
    health = health_pb2_grpc.HealthStub(channel)
    for service in ("", "bert.v1.Classifier", "bert.v1.QA", "bert.v1.NER"):
        assert (
            health.Check(health_pb2.HealthCheckRequest(service=service)).status
            == health_pb2.HealthCheckResponse.SERVING
        )
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    responses = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
    names = {s.name for r in responses for s in r.list_services_response.service}
    assert {"bert.v1.Classifier", "bert.v1.QA", "bert.v1.NER", "bert.v1.Models", "grpc.health.v1.Health"} <= names


@pytest.mark.parametrize(
    ("call", "needle"),
    [
        (lambda ch: pb_grpc.ClassifierStub(ch).Classify(pb.ClassifyRequest()), "at least one"),
        (
            lambda ch: pb_grpc.ClassifierStub(ch).Classify(pb.ClassifyRequest(inputs=[pb.TextInput(text=" ")])),
            "inputs[0] is empty",
        ),
        (
            lambda ch: pb_grpc.ClassifierStub(ch).Classify(pb.ClassifyRequest(inputs=[pb.TextInput(text="x")] * 65)),
            "limit of 64",
        ),
        (
            lambda ch: pb_grpc.ClassifierStub(ch).Classify(
                pb.ClassifyRequest(inputs=[pb.TextInput(text="x")], model="nope")
            ),
            "unknown model",
        ),
        (
            lambda ch: pb_grpc.ClassifierStub(ch).Classify(
                pb.ClassifyRequest(inputs=[pb.TextInput(text="word " * 500)], truncate=False)
            ),
            "truncat",
        ),
        (
            lambda ch: pb_grpc.QAStub(ch).Extract(
                pb.ExtractRequest(inputs=[pb.QAInput(question="q", context="c")], top_k=100)
            ),
            "top_k",
        ),
        (
            lambda ch: pb_grpc.QAStub(ch).Extract(
                pb.ExtractRequest(inputs=[pb.QAInput(question="which river? " * 20, context="c")], truncate=False)
            ),
            "more than this model's limit of 30 tokens",
        ),
        (
            lambda ch: pb_grpc.NERStub(ch).Recognize(pb.RecognizeRequest(texts=["x"], aggregation_strategy=42)),
            "aggregation",
        ),
        (lambda ch: pb_grpc.NERStub(ch).Recognize(pb.RecognizeRequest(texts=["x", " "])), "texts[1] is empty"),
    ],
)
def test_bad_input_is_invalid_argument(channel: grpc.Channel, call, needle: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.RpcError) as caught:
        call(channel)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert needle in caught.value.details()


def test_deadline_is_honoured(channel: grpc.Channel) -> None:
    stub = pb_grpc.QAStub(channel)
    request = pb.ExtractRequest(inputs=[pb.QAInput(question="Which river?", context=LONG_CONTEXT)] * 32)
    with pytest.raises(grpc.RpcError) as caught:
        stub.Extract(request, timeout=0.001)
    assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert stub.Extract(request, timeout=30).results  # and the server is fine


def test_random_and_malformed_messages_never_crash(channel: grpc.Channel) -> None:
    rng = __import__("random").Random(0)
    methods = ["/bert.v1.Classifier/Classify", "/bert.v1.QA/Extract", "/bert.v1.NER/Recognize", "/bert.v1.Models/List"]
    codes = set()
    payloads = [os.urandom(n) for n in (1, 7, 64, 512)] + [
        bytes(rng.randrange(256) for _ in range(rng.randrange(1, 300))) for _ in range(40)
    ]
    payloads += [
        b"\x0a\x03\xff\xfe\xfd",
        b"\x0a\x80\x80\x80\x80\x10",
        b"\x12\x02\x08",
    ]  # bad UTF-8, bad length, truncated
    for index, payload in enumerate(payloads):
        raw = channel.unary_unary(methods[index % len(methods)], request_serializer=None, response_deserializer=None)
        try:
            raw(payload, timeout=10)
            codes.add(grpc.StatusCode.OK)
        except grpc.RpcError as error:
            codes.add(error.code())
    assert codes <= {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT}, codes
    assert pb_grpc.ModelsStub(channel).List(pb.ListModelsRequest()).models


def test_oversized_message_is_refused(channel: grpc.Channel) -> None:
    stub = pb_grpc.ClassifierStub(channel)
    huge = pb.ClassifyRequest(inputs=[pb.TextInput(text="word " * 100_000)] * 5)  # ~2.5 MB > the 2 MB limit
    with pytest.raises(grpc.RpcError) as caught:
        stub.Classify(huge, timeout=30)
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert stub.Classify(pb.ClassifyRequest(inputs=[pb.TextInput(text="fine")]), timeout=30).results
