"""No value a caller sends grows the server's state: two rounds of requests with all-new values of every numeric
option (doc_stride, top_k, max_answer_len, dimensions, x-request-timeout-ms), every enum option, unknown model
names, unknown paths and methods, random request ids and gRPC metadata, over REST and gRPC, through the real
server (engine, REST and gRPC in this process). After the second round the metric label sets, the service's dicts,
the tokenizer copies and the process's memory are what they were after the first."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from tritonclient.grpc import service_pb2 as v2

from bert_model.tokenization import MAX_TRUNCATING_COPIES
from service.grpc_api.stubs import bert_pb2 as pb
from service.grpc_api.stubs import bert_pb2_grpc as pb_grpc
from service.serve import Server
from service.settings import ServiceSettings
from tests.service.in_process import running

pytestmark = pytest.mark.integration

CONTEXT = "The mill stood by the river for two hundred years before the flood of 1910 took its wheel. " * 4
QA_STRIDES = 31  # the tiny QA model's windows leave 31 context tokens: strides 0..30
EMBED_SIZE = 32
AGGREGATIONS = ["none", "simple", "first", "average", "max"]


@pytest.fixture(scope="module")
def served(tiny_bundles: dict[str, Path], encoder_bundles: dict[str, Path]) -> Iterator[tuple[httpx.Client, Server]]:
    models = [str(path) for path in (*tiny_bundles.values(), *encoder_bundles.values())]
    settings = ServiceSettings(
        models=models, host="127.0.0.1", http_port=0, grpc_port=0, warmup_rounds=1, log_level="error", drain_s=0
    )
    with running(settings) as server, httpx.Client(base_url=f"http://127.0.0.1:{server.http_port}") as client:
        yield client, server


def _rest(client: httpx.Client, value: int) -> set[int]:
    """One request per task and option with `value` in every numeric field; the statuses seen."""
    headers = {"x-request-timeout-ms": f"{20_000 + value}.5", "x-request-id": f"id-{value}-{os.urandom(4).hex()}"}
    bodies = [
        (
            "/qa",
            {
                "question": "What took the wheel?",
                "context": CONTEXT,
                "doc_stride": value % QA_STRIDES,
                "top_k": 1 + value % 20,
                "max_answer_len": 1 + value % 512,
                "truncate": True,
            },
        ),
        ("/qa", {"question": "Where?", "context": CONTEXT, "doc_stride": 10_000 + value}),  # too large: 422
        ("/classify", {"inputs": ["a moving film", "dull"], "top_k": 1 + value, "truncate": value % 2 == 0}),
        (
            "/ner",
            {"inputs": "Ada Lovelace met Charles Babbage in London.", "aggregation_strategy": AGGREGATIONS[value % 5]},
        ),
        (
            "/embed",
            {"inputs": ["one text", "another"], "dimensions": 1 + value % EMBED_SIZE, "normalize": value % 2 == 0},
        ),
        ("/v1/embeddings", {"input": "a text", "dimensions": 1 + value % EMBED_SIZE}),
        ("/embed", {"inputs": "x", "dimensions": EMBED_SIZE + 1 + value}),  # over the embedding size: 422
        ("/embed_all", {"inputs": ["one text", f"another {value}"], "truncate": value % 2 == 0}),
        ("/embed_all", {"inputs": "x", "model": f"tiny-embed-{value}"}),  # unknown: 422
        ("/fill-mask", {"inputs": "The mill stood by the [MASK].", "top_k": 1 + value % 100}),
        ("/classify", {"inputs": "text", "model": f"no-such-model-{value}"}),
        ("/qa", {"question": "q", "context": "c", "model": f"tiny-qa-{value}"}),
        # the shapes of other APIs, with new values of their options and names
        ("/models/tiny-classify", {"inputs": "a text", "parameters": {"top_k": 1 + value % 2, f"p{value}": 1}}),
        (f"/models/tiny-missing-{value}", {"inputs": "a text", "parameters": {}}),
        ("/models/tiny-ner", {"inputs": "Ada in London", "parameters": {"ignore_labels": [f"L{value}"]}}),
        ("/predict", {"inputs": [["a", f"b {value}"]], "raw_scores": value % 2 == 0}),
        ("/tokenize", {"inputs": f"token {value}", "add_special_tokens": value % 2 == 0}),
        ("/decode", {"ids": [101, 1000 + value, 102]}),
        (f"/v2/models/tiny-classify/versions/{value}/infer", {"inputs": []}),
        (
            "/v2/models/tiny-qa/infer",
            {
                "id": f"request-{value}",
                "inputs": [
                    {"name": "question", "datatype": "BYTES", "shape": [1], "data": [f"q {value}"]},
                    {"name": "context", "datatype": "BYTES", "shape": [1], "data": [CONTEXT]},
                ],
            },
        ),
    ]
    statuses = {client.post(path, json=body, headers=headers).status_code for path, body in bodies}
    statuses.add(client.post(f"/no/such/path/{value}", json={}, headers=headers).status_code)
    statuses.add(client.get(f"/x{value}/models", headers=headers).status_code)
    statuses.add(client.get(f"/health/x{value}").status_code)
    statuses.add(client.get(f"/v1/models/missing-{value}").status_code)
    statuses.add(client.get(f"/v2/models/missing-{value}").status_code)
    return statuses


def _grpc(channel: grpc.Channel, value: int) -> set[grpc.StatusCode]:
    metadata = ((f"x-junk-{value}", os.urandom(8).hex()), ("x-request-id", f"g-{value}"))
    calls = [
        (
            pb_grpc.QAStub(channel).Extract,
            pb.ExtractRequest(
                inputs=[pb.QAInput(question="What took the wheel?", context=CONTEXT)],
                doc_stride=value % QA_STRIDES,
                top_k=1 + value % 20,
                max_answer_len=1 + value % 512,
            ),
        ),
        (pb_grpc.ClassifierStub(channel).Classify, pb.ClassifyRequest(inputs=[pb.TextInput(text="fine")], top_k=value)),
        (
            pb_grpc.NERStub(channel).Recognize,
            pb.RecognizeRequest(texts=["Ada in London"], aggregation_strategy=value % 6),
        ),
        (pb_grpc.EmbedderStub(channel).Embed, pb.EmbedRequest(texts=["a text"], dimensions=1 + value % EMBED_SIZE)),
        (pb_grpc.EmbedderStub(channel).EmbedAll, pb.EmbedAllRequest(texts=[f"a text {value}"], truncate=True)),
        (pb_grpc.FillMaskStub(channel).Fill, pb.FillRequest(texts=["The [MASK] mill."], top_k=1 + value % 100)),
        (
            pb_grpc.ClassifierStub(channel).Classify,
            pb.ClassifyRequest(inputs=[pb.TextInput(text="x")], model=f"missing-{value}"),
        ),
    ]
    codes = set()
    for call, request in calls:
        try:
            call(request, metadata=metadata, timeout=20)
            codes.add(grpc.StatusCode.OK)
        except grpc.RpcError as error:
            codes.add(error.code())
    v2_call = channel.unary_unary(
        "/inference.GRPCInferenceService/ModelInfer",
        request_serializer=v2.ModelInferRequest.SerializeToString,
        response_deserializer=v2.ModelInferResponse.FromString,
    )
    request = v2.ModelInferRequest(model_name="tiny-classify", id=f"call-{value}", model_version=str(value % 3))
    request.inputs.add(name="text", datatype="BYTES", shape=[1]).contents.bytes_contents.append(b"fine")
    try:
        v2_call(request, metadata=metadata, timeout=20)
        codes.add(grpc.StatusCode.OK)
    except grpc.RpcError as error:
        codes.add(error.code())
    try:
        channel.unary_unary(f"/bert.v1.Nothing/Method{value}")(b"", timeout=5)
    except grpc.RpcError as error:
        codes.add(error.code())
    return codes


def _state(server: Server) -> dict[str, Any]:
    service = server.engine
    deadline = time.monotonic() + 2
    while (service.door.in_progress or service.executor.jobs) and time.monotonic() < deadline:
        time.sleep(0.01)  # a gRPC call leaves the door when its task ends, just after the caller has its answer
    families = {
        metric.name: sorted({tuple(sorted(sample.labels.items())) for sample in metric.samples})
        for metric in service.metrics.registry.collect()
    }
    return {
        "metric_label_sets": families,
        "models": sorted(service.models),
        "defaults": dict(service.defaults),
        "reserved": {name: model.batcher._reserved for name, model in service.models.items()},
        "in_progress": service.door.in_progress,
        "executor_jobs": service.executor.jobs,
        "copies_within_bound": all(
            model.bundle.tokenizer.truncating_copies <= MAX_TRUNCATING_COPIES for model in service.models.values()
        ),
    }


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def test_new_request_values_leave_the_server_state_as_it_was(served: tuple[httpx.Client, Server]) -> None:
    if not Path("/proc/self/status").exists():
        pytest.skip("needs /proc to read the process's memory")
    client, server = served
    assert server.grpc is not None and server.rest is not None
    app = server.rest.config.app
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc.port}") as channel:
        seen: list[set[Any]] = []
        for values in (range(0, QA_STRIDES, 2), range(1, QA_STRIDES, 2)):  # the second round: all-new values
            statuses: set[Any] = set()
            for value in values:
                statuses |= _rest(client, value) | _grpc(channel, value)
            seen.append(statuses)
            if len(seen) == 1:
                first, rss_first = _state(server), _rss_mb()
        second, rss_second = _state(server), _rss_mb()
    assert seen[0] == seen[1]  # the same kinds of answer in both rounds, so the same label values
    assert {200, 404, 422} <= seen[0] and grpc.StatusCode.OK in seen[0], seen[0]
    assert second == first
    assert first["copies_within_bound"] and first["in_progress"] == 0 and first["executor_jobs"] == 0
    routes = {dict(labels)["route"] for labels in first["metric_label_sets"]["bertserve_requests"]}
    services = [*pb.DESCRIPTOR.services_by_name.values(), *v2.DESCRIPTOR.services_by_name.values()]
    methods = {f"/{s.full_name}/{m.name}" for s in services for m in s.methods}
    paths = set(app.openapi()["paths"]) | {getattr(route, "path", None) for route in app.routes}
    assert routes <= paths | methods | {"unmatched"}, routes  # route templates, never what a caller sent
    assert rss_second - rss_first < 40, (rss_first, rss_second)
