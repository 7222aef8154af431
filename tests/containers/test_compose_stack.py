"""The real stack on a real Docker engine: build, `docker compose up --wait`, real requests, stop, down.

Run by `make compose-test` (and so by CI); not part of `make test`. The engine comes from
`../shared/tools/docker/up` (or $BERTSERVE_DOCKER_UP); when it cannot be started (no root, no such tool) the
module is skipped with the reason. Timings of each step are printed (`-s` shows them) and written to
$COMPOSE_TEST_TIMINGS when set.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import httpx
import pytest

from tests.service.server import REPO, free_port

pytestmark = pytest.mark.containers

DOCKER_TOOLS = Path(os.environ.get("BERTSERVE_DOCKER_TOOLS", REPO.parent / "shared" / "tools" / "docker"))
PROJECT = "bertserve-compose-test"
STOP_GRACE_S = 35  # docker-compose.yml: stop_grace_period


@dataclass
class Stack:
    env: dict[str, str]
    http: str
    grpc_target: str
    results: Path
    timings: dict[str, float] = field(default_factory=dict)

    def compose(self, *args: str, timeout: float = 1800, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            ["docker", "compose", "-p", PROJECT, *args],
            cwd=REPO,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and result.returncode != 0:
            raise AssertionError(
                f"docker compose {' '.join(args)} exited {result.returncode}:\n{result.stderr[-4000:]}"
            )
        return result

    def timed(
        self, name: str, *args: str, timeout: float = 1800, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        start = time.monotonic()
        result = self.compose(*args, timeout=timeout, check=check)
        self.timings[name] = round(time.monotonic() - start, 1)
        print(f"[compose-test] {name}: {self.timings[name]} s")
        return result

    def container(self, service: str) -> str:
        return self.compose("ps", "-a", "-q", service).stdout.strip()


def _engine() -> None:
    up = DOCKER_TOOLS / "up"
    if not up.is_file():
        pytest.skip(f"no Docker engine tool at {up}")
    result = subprocess.run([str(up)], capture_output=True, text=True, timeout=1200)
    if result.returncode != 0:
        pytest.skip(f"the Docker engine could not be started ({up} exited {result.returncode}): {result.stderr[-500:]}")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    _engine()
    http_port, grpc_port = free_port(), free_port()
    results = tmp_path_factory.mktemp("loadtest-results")
    results.chmod(0o777)
    env = {
        **os.environ,
        "BERTSERVE_HTTP_PORT": str(http_port),
        "BERTSERVE_GRPC_PORT": str(grpc_port),
        "LOADTEST_PROFILE": "smoke",
        "LOADTEST_RESULTS": str(results),
    }
    env.pop("BERTSERVE_MODELS", None)
    stack = Stack(env, f"http://127.0.0.1:{http_port}", f"127.0.0.1:{grpc_port}", results)
    try:
        stack.timed("build", "--profile", "loadtest", "build")
        stack.timed("up_to_healthy", "up", "-d", "--wait", "api", timeout=300)
        yield stack
    finally:
        stack.compose("--profile", "loadtest", "down", "--remove-orphans", check=False, timeout=120)
        if os.environ.get("COMPOSE_TEST_TIMINGS"):
            Path(os.environ["COMPOSE_TEST_TIMINGS"]).write_text(json.dumps(stack.timings, indent=2) + "\n")
        print(f"[compose-test] timings {stack.timings}")
        if os.environ.get("COMPOSE_TEST_KEEP_ENGINE") != "1":
            subprocess.run([str(DOCKER_TOOLS / "down")], capture_output=True, text=True, timeout=300)


def test_rest_answers(stack: Stack) -> None:
    with httpx.Client(base_url=stack.http, timeout=30) as client:
        classify = client.post("/classify", json={"inputs": ["a gentle, funny and moving film", "dull, far too long"]})
        assert classify.status_code == 200, classify.text
        (good,), (bad,) = classify.json()
        assert (good["label"], bad["label"]) == ("positive", "negative"), classify.json()
        assert 0.5 < good["score"] <= 1.0 and 0.5 < bad["score"] <= 1.0

        context = "The Eiffel Tower was completed in 1889 and stands in Paris, on the Champ de Mars."
        qa = client.post("/qa", json={"question": "When was the Eiffel Tower completed?", "context": context})
        assert qa.status_code == 200, qa.text
        answer = qa.json()
        assert context[answer["start"] : answer["end"]] == answer["answer"] and "1889" in answer["answer"]

        text = "Angela Merkel met Emmanuel Macron in Berlin on Monday."
        ner = client.post("/ner", json={"inputs": text})
        assert ner.status_code == 200, ner.text
        entities = ner.json()
        assert {(e["word"], e["entity_group"]) for e in entities} >= {("Berlin", "LOC"), ("Angela Merkel", "PER")}
        assert all(text[e["start"] : e["end"]] == e["word"] for e in entities)

        texts = ["How tall is the Eiffel Tower?", "The tower is 330 metres tall.", "Bananas are yellow."]
        embed = client.post("/embed", json={"inputs": texts})
        assert embed.status_code == 200, embed.text
        vectors = embed.json()
        assert len(vectors) == 3 and all(len(v) == 384 for v in vectors)
        assert all(abs(sum(x * x for x in v) - 1) < 1e-3 for v in vectors)  # normalized by default

        def cosine(a: list[float], b: list[float]) -> float:
            return sum(x * y for x, y in zip(a, b, strict=True))

        assert cosine(vectors[0], vectors[1]) > cosine(vectors[0], vectors[2])
        openai_style = client.post("/v1/embeddings", json={"input": texts[0], "model": "minilm"})
        assert openai_style.status_code == 200, openai_style.text
        assert cosine(openai_style.json()["data"][0]["embedding"], vectors[0]) > 0.9999

        models = client.get("/models").json()["models"]
        assert {m["name"]: m["task"] for m in models} == {
            "minilm-sst2": "classify",
            "minilm-squad": "qa",
            "minilm-conll03": "ner",
            "minilm": "embed",
        }, models
        page = client.get("/")  # the playground, served from the image's own static files
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        metrics = client.get("/metrics")
        assert metrics.status_code == 200 and "bertserve_requests_total" in metrics.text


def test_api_runs_as_non_root_without_torch_onnx_or_a_compiler(stack: Stack) -> None:
    probe = (
        "import importlib.util as u, os, shutil; "
        "print(os.getuid(), [m for m in ('torch', 'onnx') if u.find_spec(m)], shutil.which('cc'), shutil.which('gcc'))"
    )
    result = stack.compose("exec", "-T", "api", "python", "-c", probe)
    assert result.stdout.split() == ["10001", "[]", "None", "None"], result.stdout


def test_grpc_answers_with_the_generated_stubs(stack: Stack) -> None:
    from service.grpc_api.stubs import bert_pb2 as pb
    from service.grpc_api.stubs import bert_pb2_grpc as pb_grpc

    context = "The Eiffel Tower was completed in 1889 and stands in Paris, on the Champ de Mars."
    with grpc.insecure_channel(stack.grpc_target) as channel:
        request = pb.ExtractRequest(inputs=[pb.QAInput(question="When was it completed?", context=context)])
        response = pb_grpc.QAStub(channel).Extract(request, timeout=30)
    span = response.results[0].answers[0]
    assert context[span.start : span.end] == span.answer and "1889" in span.answer


def test_locust_smoke_profile_from_its_image(stack: Stack) -> None:
    result = stack.timed("locust_smoke", "--profile", "loadtest", "run", "--rm", "locust", timeout=600, check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summaries = list(stack.results.glob("*-smoke/summary.json"))
    assert len(summaries) == 1, list(stack.results.iterdir())
    summary = json.loads(summaries[0].read_text())
    assert all(check["passed"] for check in summary["checks"]), summary["checks"]
    (target,) = summary["targets"].values()
    endpoints = target["summary"]["endpoints"]
    assert set(endpoints) == {"/classify", "/qa", "/ner", "QA.Extract", "all"}, endpoints.keys()
    assert all(e["requests"] > 0 and e["ok"] == e["requests"] for e in endpoints.values()), endpoints


def test_stop_drains_and_exits_0_then_restarts_warm(stack: Stack) -> None:
    container = stack.container("api")
    stop = stack.timed("stop", "stop", "api", timeout=120)
    assert stack.timings["stop"] < STOP_GRACE_S, stop.stderr
    state = subprocess.run(
        ["docker", "inspect", "-f", "{{.State.ExitCode}} {{.RestartCount}}", container],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert state == ["0", "0"], state
    logs = stack.compose("logs", "--no-color", "api").stdout
    assert "stop signal received: draining" in logs and "drain over" in logs and '"stopped"' in logs, logs[-3000:]
    stack.timed("warm_restart_to_healthy", "up", "-d", "--wait", "api", timeout=300)
    assert httpx.get(stack.http + "/health/ready", timeout=10).status_code == 200
    stack.timed("down", "down", timeout=120)


def test_a_server_that_cannot_start_says_why_and_stops_restarting(stack: Stack) -> None:
    """A bad model list: one clear line in the log, a bounded number of restarts, and `up --wait` fails."""
    env = {**stack.env, "BERTSERVE_MODELS": "no-such-model"}
    failing = Stack(env, stack.http, stack.grpc_target, stack.results)
    result = failing.compose("up", "-d", "--wait", "api", timeout=300, check=False)
    assert result.returncode != 0
    container = failing.container("api")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        status = subprocess.run(
            ["docker", "inspect", "-f", "{{.State.Status}} {{.RestartCount}} {{.State.ExitCode}}", container],
            capture_output=True,
            text=True,
        ).stdout.split()
        if status and status[0] == "exited" and int(status[1]) >= 3:
            break
        time.sleep(2)
    assert status[0] == "exited" and status[1] == "3" and status[2] != "0", status
    logs = failing.compose("logs", "--no-color", "api").stdout
    error_lines = [line for line in logs.splitlines() if "no-such-model" in line]
    assert error_lines and "Traceback" not in logs, logs[-3000:]
    failing.compose("down", timeout=120)
