"""Locust users for the bertserve front doors, driven by a config file the runner writes.

`RestUser` (FastHttpUser) calls POST /classify, /qa, /ner, /embed, /v1/embeddings, /rerank, /v1/rerank; `GrpcUser` calls
Classifier.Classify, QA.Extract, NER.Recognize, Embedder.Embed through the generated bert.v1 stubs and reports
every call through locust's request event, like HTTP calls are. Each user picks its next call from the weighted
mix with its own seeded generator and sends one input drawn from the payloads. A request-event listener turns
every call (both protocols) into a `Sample` with the server's queue and inference times (headers / trailing
metadata); the samples are written when the test stops, and a progress file is refreshed every second for the
runner's progress line.
`ProfileShape` follows the profile's stages. Run by `bertserve loadtest`; by hand:
`locust -f loadtests/locustfile.py --headless --bertserve-config run/config.json --host http://127.0.0.1:8000`.
In locust's distributed mode (`bertserve loadtest --workers N`: one `--master`, N `--worker` processes) the
requests run on the workers: each writes its own samples and progress files, named by the worker index in
`BERTSERVE_LOADTEST_WORKER` (`worker_path`); the master runs the load shape and writes locust's CSVs.
Reference: https://docs.locust.io/en/stable/testing-other-systems.html (gRPC with gevent, request events).
"""

from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path
from typing import Any

import gevent
import grpc
import grpc.experimental.gevent as grpc_gevent
from locust import FastHttpUser, LoadTestShape, User, constant, events, task
from locust.runners import MasterRunner

from loadtests.endpoints import ENDPOINTS, Endpoint
from loadtests.payloads import Payloads
from loadtests.samples import (
    WORKER_ENV,
    Sample,
    grpc_outcome,
    rest_outcome,
    server_times,
    worker_path,
    write_samples,
)
from proto.stubs import load_stubs

grpc_gevent.init_gevent()  # before any channel: lets grpc cooperate with gevent's monkey-patched sockets
pb, pb_grpc = load_stubs()

CONFIG: dict[str, Any] = {}
PAYLOADS = Payloads()
SAMPLES: list[Sample] = []
COUNTS = {outcome: 0 for outcome in ("ok", "rejected", "timeout", "error")}
_CLOCK = {"start": time.perf_counter(), "written": False}
PROGRESS_WINDOW_S = 5.0
WORKER = os.environ.get(WORKER_ENV, "")
"""This process's worker index in distributed mode; empty for a single process (and the master)."""


def _own_path(key: str) -> Path:
    return worker_path(CONFIG[key], WORKER) if WORKER else Path(CONFIG[key])


@events.init_command_line_parser.add_listener
def _add_arguments(parser: Any) -> None:
    parser.add_argument("--bertserve-config", default=os.environ.get("BERTSERVE_LOADTEST_CONFIG", ""))


@events.init.add_listener
def _configure(environment: Any, **_: Any) -> None:
    path = getattr(environment.parsed_options, "bertserve_config", "") if environment.parsed_options else ""
    if not path:
        return
    CONFIG.update(json.loads(Path(path).read_text()))
    loaded = Payloads.from_json(Path(CONFIG["payloads_path"]).read_text())
    PAYLOADS.classify, PAYLOADS.qa, PAYLOADS.ner = loaded.classify, loaded.qa, loaded.ner
    RestUser.network_timeout = RestUser.connection_timeout = float(CONFIG["client_timeout_s"])
    for user_class in (RestUser, GrpcUser):  # users split between protocols as the mix weights say
        user_class.weight = max(
            1, sum(w for n, w in CONFIG["mix"].items() if ENDPOINTS[n].protocol == user_class.protocol)
        )


def _sends_requests(environment: Any) -> bool:
    """False on the master of a distributed run: its workers send the requests (and record them)."""
    return not isinstance(environment.runner, MasterRunner)


@events.test_start.add_listener
def _start(environment: Any, **_: Any) -> None:
    _CLOCK["start"] = time.perf_counter()
    if not _sends_requests(environment):
        _CLOCK["written"] = True
    elif CONFIG.get("progress_path"):
        gevent.spawn(_progress_loop, environment)


@events.test_stop.add_listener
def _stop(**_: Any) -> None:
    _write_samples()


@events.quitting.add_listener
def _quitting(**_: Any) -> None:
    _write_samples()


def _write_samples() -> None:
    if _CLOCK["written"] or not CONFIG.get("samples_path"):
        return
    _CLOCK["written"] = True
    write_samples(_own_path("samples_path"), SAMPLES)


@events.request.add_listener
def _record(
    request_type: str,
    name: str,
    response_time: float,
    response: Any = None,
    exception: BaseException | None = None,
    **_: Any,
) -> None:
    if request_type == "grpc":
        code = getattr(response, "code", "UNKNOWN")
        outcome, status, metadata = grpc_outcome(code), code, getattr(response, "metadata", None)
    else:
        status_code = int(getattr(response, "status_code", 0) or 0)
        outcome, status, metadata = rest_outcome(status_code, exception), str(status_code), response.headers
    queue_ms, inference_ms = server_times(metadata) if outcome == "ok" else (float("nan"), float("nan"))
    t_end = time.perf_counter() - _CLOCK["start"]
    SAMPLES.append(Sample(t_end, name, float(response_time), outcome, status, queue_ms, inference_ms))
    COUNTS[outcome] += 1


def _progress_loop(environment: Any) -> None:
    path = _own_path("progress_path")
    while True:
        gevent.sleep(1.0)
        now = time.perf_counter() - _CLOCK["start"]
        recent = []
        for sample in reversed(SAMPLES):
            if sample.t_end < now - PROGRESS_WINDOW_S:
                break
            recent.append(sample)
        ok_latencies = sorted(s.latency_ms for s in recent if s.outcome == "ok")
        progress = {
            "t": round(now, 1),
            "users": environment.runner.user_count if environment.runner else 0,
            "counts": dict(COUNTS),
            "ok_rps": sum(1 for s in recent if s.outcome == "ok") / min(PROGRESS_WINDOW_S, max(now, 1e-3)),
            "p50_ms": _pick(ok_latencies, 0.50),
            "p99_ms": _pick(ok_latencies, 0.99),
        }
        scratch = path.with_suffix(".tmp")
        scratch.write_text(json.dumps(progress))
        scratch.replace(path)


def _pick(ordered: list[float], q: float) -> float | None:
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else None


# ---- users ----------------------------------------------------------------------------------------------
class _MixUser(User):
    """Picks the next endpoint of its protocol from the mix, with its own seeded generator."""

    abstract = True
    protocol = ""
    wait_time = constant(0)

    def on_start(self) -> None:
        self.rng = random.Random(f"{CONFIG.get('seed', 0)}-{WORKER}-{self.protocol}-{id(self)}")
        mix = {name: w for name, w in CONFIG.get("mix", {}).items() if ENDPOINTS[name].protocol == self.protocol}
        self.endpoints = [ENDPOINTS[name] for name in mix]
        self.weights = list(mix.values())

    @task
    def call(self) -> None:
        endpoint = self.rng.choices(self.endpoints, self.weights)[0]
        if self.send(endpoint) and CONFIG.get("reject_backoff_s"):
            gevent.sleep(float(CONFIG["reject_backoff_s"]))

    def payload(self, task_name: str) -> Any:
        if task_name == "rerank":
            return rerank_payload(self.rng, PAYLOADS.qa)
        return self.rng.choice(getattr(PAYLOADS, PAYLOAD_OF_TASK.get(task_name, task_name)))

    def send(self, endpoint: Endpoint) -> bool:
        """Send one call; True when the server rejected it (429 / RESOURCE_EXHAUSTED)."""
        raise NotImplementedError


PAYLOAD_OF_TASK = {"embed": "classify"}
"""Tasks that send another task's payloads: embeddings are computed for the classification sentences."""
RERANK_DOCUMENTS = 20
"""Passages per rerank call: a question's own paragraph and others of the QA payloads, shuffled."""


def rerank_payload(rng: random.Random, pairs: list[tuple[str, str]]) -> tuple[str, list[str]]:
    """A question and `RERANK_DOCUMENTS` passages: its own context among other contexts of the QA payloads."""
    question, context = rng.choice(pairs)
    others = list(dict.fromkeys(c for _, c in pairs if c != context))
    documents = [context, *rng.sample(others, min(len(others), RERANK_DOCUMENTS - 1))]
    rng.shuffle(documents)
    return question, documents


def rest_body(task_name: str, payload: Any, path: str = "") -> dict[str, Any]:
    if task_name == "qa":
        question, context = payload
        return {"question": question, "context": context}
    if task_name == "rerank":
        query, documents = payload
        return {"query": query, "documents" if path == "/v1/rerank" else "texts": documents}
    if path == "/v1/embeddings":
        return {"input": payload}
    return {"inputs": payload}


def rest_shape_problem(task_name: str, body: Any) -> str | None:
    """Why a 200 body is not the answer shape the task promises (None when it is)."""
    if task_name == "qa":
        ok = isinstance(body, dict) and "answer" in body
    elif task_name == "rerank":  # TEI: [{index, score}]; Cohere: {"results": [{index, relevance_score}]}
        ranks = body.get("results") if isinstance(body, dict) else body
        ok = isinstance(ranks, list) and bool(ranks) and "index" in ranks[0]
    elif task_name == "embed":  # TEI: [[float, ...]]; OpenAI: {"data": [{"embedding": [...]}]}
        vectors = body.get("data") if isinstance(body, dict) else body
        ok = isinstance(vectors, list) and len(vectors) == 1
    else:
        ok = isinstance(body, list) and (task_name == "ner" or (bool(body) and "label" in body[0]))
    return None if ok else f"unexpected {task_name} answer shape: {str(body)[:120]}"


class RestUser(FastHttpUser, _MixUser):
    abstract = False
    protocol = "rest"
    wait_time = constant(0)

    def send(self, endpoint: Endpoint) -> bool:
        body = rest_body(endpoint.task, self.payload(endpoint.task), endpoint.name)
        with self.client.post(endpoint.name, json=body, name=endpoint.name, catch_response=True) as response:
            if response.status_code == 200:
                try:
                    problem = rest_shape_problem(endpoint.task, response.json())
                except ValueError:
                    problem = "the 200 body is not JSON"
                if problem:
                    response.failure(problem)
        return bool(response.status_code == 429)


class GrpcResult:
    """What the request listener needs of a finished RPC."""

    def __init__(self, code: str, metadata: Any) -> None:
        self.code = code
        self.metadata = tuple(metadata or ())


class GrpcCallError(Exception):
    """A failed RPC, named by its status code (groups failures in locust's tables)."""


def grpc_request(task_name: str, payload: Any) -> Any:
    if task_name == "classify":
        return pb.ClassifyRequest(inputs=[pb.TextInput(text=payload)])
    if task_name == "qa":
        question, context = payload
        return pb.ExtractRequest(inputs=[pb.QAInput(question=question, context=context)])
    if task_name == "embed":
        return pb.EmbedRequest(texts=[payload])
    if task_name == "rerank":
        query, documents = payload
        return pb.RerankRequest(query=query, texts=documents)
    return pb.RecognizeRequest(texts=[payload])


def grpc_result_count(response: Any) -> int:
    """Results in a bert.v1 response for one input: `embeddings` of an EmbedResponse, one ranking of a
    RerankResponse, `results` of the others."""
    if hasattr(response, "ranks"):
        return 1 if response.ranks else 0
    return len(response.embeddings if hasattr(response, "embeddings") else response.results)


class GrpcUser(_MixUser):
    abstract = False
    protocol = "grpc"

    def on_start(self) -> None:
        super().on_start()
        self.channel = grpc.insecure_channel(CONFIG["grpc_target"])
        self.methods = {
            "Classifier.Classify": pb_grpc.ClassifierStub(self.channel).Classify,
            "QA.Extract": pb_grpc.QAStub(self.channel).Extract,
            "NER.Recognize": pb_grpc.NERStub(self.channel).Recognize,
            "Embedder.Embed": pb_grpc.EmbedderStub(self.channel).Embed,
            "Reranker.Rerank": pb_grpc.RerankerStub(self.channel).Rerank,
        }

    def on_stop(self) -> None:
        self.channel.close()

    def send(self, endpoint: Endpoint) -> bool:
        request = grpc_request(endpoint.task, self.payload(endpoint.task))
        timeout = float(CONFIG["client_timeout_s"])
        start = time.perf_counter()
        exception: Exception | None = None
        length = 0
        try:
            response, call = self.methods[endpoint.name].with_call(request, timeout=timeout)
            result = GrpcResult("OK", call.trailing_metadata())
            length = response.ByteSize()
            if grpc_result_count(response) != 1:
                exception = GrpcCallError(f"{grpc_result_count(response)} results for 1 input")
        except grpc.RpcError as error:
            code = error.code().name if error.code() is not None else "UNKNOWN"
            result = GrpcResult(code, error.trailing_metadata())
            exception = GrpcCallError(f"{code}: {(error.details() or '')[:160]}")
        elapsed_ms = (time.perf_counter() - start) * 1000.0
        if exception is not None and result.code == "OK":
            result.code = "INVALID_RESPONSE"
        events.request.fire(
            request_type="grpc",
            name=endpoint.name,
            response_time=elapsed_ms,
            response_length=length,
            response=result,
            context={},
            exception=exception,
        )
        return result.code == "RESOURCE_EXHAUSTED"


class ProfileShape(LoadTestShape):
    """Follows the profile's stages: (end second, users, spawn rate); stops after the last one."""

    def tick(self) -> tuple[int, float] | None:
        elapsed = self.get_run_time()
        for end_s, users, spawn_rate in CONFIG.get("stages", []):
            if elapsed < end_s:
                return int(users), float(spawn_rate)
        return None
