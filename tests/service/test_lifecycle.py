"""Process-level behaviour: no torch, readiness transitions, graceful SIGTERM, API key, CORS, settings, CLI."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from service import errors
from service.errors import GRPC_STATUS, HTTP_STATUS, ServiceError, grpc_status, http_status
from service.grpc_api.stubs import bert_pb2 as pb
from service.grpc_api.stubs import bert_pb2_grpc as pb_grpc
from service.settings import ServiceSettings
from tests.service.server import REPO, ServerProcess, free_port
from tests.service.test_http_api import LONG_CONTEXT


def test_service_imports_no_torch() -> None:
    code = (
        "import sys\n"
        "import bertserve.commands.serve, service.serve, service.http_api, service.grpc_api.server\n"
        "import service.engine.engine\n"
        "import service.backends.ort_backend, service.backends.triton_backend, service.operations.healthcheck\n"
        "import bertserve.benchmarks.service\n"
        "from service.http_api import create_app\n"
        "create_app()\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers', 'onnx'))\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=60)


Code = grpc.StatusCode
INTENDED_STATUS = {
    "ServiceError": (500, Code.INTERNAL),
    "InvalidInput": (422, Code.INVALID_ARGUMENT),
    "InvalidJson": (400, Code.INVALID_ARGUMENT),
    "UnsupportedMediaType": (415, Code.INVALID_ARGUMENT),
    "HeadersTooLarge": (431, Code.RESOURCE_EXHAUSTED),
    "RouteNotFound": (404, Code.UNIMPLEMENTED),
    "MethodNotAllowed": (405, Code.INVALID_ARGUMENT),
    "RequestTimeout": (408, Code.CANCELLED),
    "InputTooLong": (422, Code.INVALID_ARGUMENT),
    "UnknownModel": (422, Code.INVALID_ARGUMENT),
    "PayloadTooLarge": (413, Code.RESOURCE_EXHAUSTED),
    "Unauthenticated": (401, Code.UNAUTHENTICATED),
    "Overloaded": (429, Code.RESOURCE_EXHAUSTED),
    "DeadlineExceeded": (504, Code.DEADLINE_EXCEEDED),
    "NotReady": (503, Code.UNAVAILABLE),
    "BackendUnavailable": (503, Code.UNAVAILABLE),
    "BackendBroken": (503, Code.UNAVAILABLE),
    "ModelFailed": (503, Code.UNAVAILABLE),
    "BackendError": (500, Code.INTERNAL),
    "Internal": (500, Code.INTERNAL),
}
"""Every domain error's (HTTP, gRPC) status, as docs/reference/errors.md lists them."""


def test_every_domain_error_maps_to_its_intended_status() -> None:
    def subclasses(klass: type) -> list[type]:
        return [klass, *(s for c in klass.__subclasses__() for s in subclasses(c))]

    defined = {klass.__name__: klass for klass in subclasses(ServiceError) if klass.__module__ == errors.__name__}
    assert set(defined) == set(INTENDED_STATUS), "a new domain error needs its intended statuses here"
    for name, (http, code) in INTENDED_STATUS.items():
        error = defined[name]("x")
        assert (http_status(error), grpc_status(error)) == (http, code), name
    assert set(GRPC_STATUS) <= set(HTTP_STATUS)


def test_settings_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BERTSERVE_MODELS", "a, b,c")
    monkeypatch.setenv("BERTSERVE_CORS_ORIGINS", '["http://x.org"]')
    monkeypatch.setenv("BERTSERVE_MAX_WAIT_MS", "7.5")
    monkeypatch.setenv("BERTSERVE_BATCHING", "false")
    monkeypatch.setenv("BERTSERVE_API_KEY", "")
    settings = ServiceSettings()
    assert settings.models == ["a", "b", "c"] and settings.cors_origins == ["http://x.org"]
    assert settings.max_wait_ms == 7.5 and settings.effective_max_batch_size == 1 and settings.api_key is None
    assert ServiceSettings(models="d").models == ["d"]  # explicit values win over the environment
    monkeypatch.setenv("BERTSERVE_MAX_BATCH_SIZE", "0")
    with pytest.raises(ValueError, match="max_batch_size"):
        ServiceSettings()


def test_every_setting_is_a_serve_option_with_its_help_and_default(monkeypatch: pytest.MonkeyPatch) -> None:
    import typer

    from bertserve.commands.serve import register

    for name in [name for name in __import__("os").environ if name.startswith("BERTSERVE_")]:
        monkeypatch.delenv(name)
    app = typer.Typer(add_completion=False)
    register(app)
    command = typer.main.get_command(app)
    options = {param.name: param for param in command.params}
    defaults = ServiceSettings()
    for name, field in ServiceSettings.model_fields.items():
        option = options.pop(name, None)
        assert option is not None, f"setting {name} has no serve option"
        assert option.default is None, name  # left out = nothing passed: the environment, then the default
        assert option.help and field.description and option.help.startswith(field.description), name
        assert f"BERTSERVE_{name.upper()}" in option.help, name
        shown = option.show_default
        if not isinstance(shown, str):  # no default shown: the setting is unset by default
            assert getattr(defaults, name) in (None, "", []), name
            continue
        # the default the help shows, given on the command line, is the setting's default
        args = [f"--{shown}"] if option.is_flag else [option.opts[0], shown]
        given = command.make_context("serve", args).params[name]
        assert getattr(ServiceSettings(**{name: given}), name) == getattr(defaults, name), (name, shown)
    assert not options, f"options without a setting: {sorted(options)}"


@pytest.mark.parametrize(
    ("args", "env", "needle"),
    [
        (["--models", "/does/not/exist"], {}, "no serving bundle '/does/not/exist'"),
        (["--models", "x", "--backend", "tensorflow"], {}, "backend"),
        ([], {"BERTSERVE_MAX_QUEUE": "-3", "BERTSERVE_MODELS": "x"}, "max_queue"),
    ],
)
def test_cli_user_errors_are_one_line(args: list[str], env: dict[str, str], needle: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "bertserve", "serve", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={**__import__("os").environ, **env},
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("error: ") and needle in result.stderr and "Traceback" not in result.stderr


@pytest.mark.integration
def test_readiness_transitions_and_graceful_sigterm(tiny_bundles: dict[str, Path], tmp_path: Path) -> None:
    # a drain of 2 s: requests still on their way when SIGTERM lands (a busy machine) are served, not refused
    env = {
        "BERTSERVE_WARMUP_ROUNDS": "300",
        "BERTSERVE_MAX_QUEUE": "100000",
        "BERTSERVE_LOG_LEVEL": "info",
        "BERTSERVE_DRAIN_S": "2",
    }
    server = ServerProcess(list(tiny_bundles.values()), tmp_path / "server.log", env)
    try:
        server.wait_live()
        with grpc.insecure_channel(server.grpc_target) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            ready = httpx.get(server.url + "/health/ready")
            assert ready.status_code == 503 and ready.json()["status"] == "loading"
            # the gRPC port opens once the models are ready: until then a connection is refused (which a balancer
            # retries on another replica), not answered UNAVAILABLE
            with pytest.raises(grpc.RpcError) as refused:
                health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, refused.value
            assert "connect" in str(refused.value.details()).lower(), refused.value.details()
            early = httpx.post(server.url + "/classify", json={"inputs": "too early"})
            assert early.status_code == 503 and "loading" in early.json()["error"]["message"]
            server.wait_ready()
            # wait_for_ready: the channel is in its reconnect backoff after the refused connection
            request = health_pb2.HealthCheckRequest(service="bert.v1.QA")
            status = health.Check(request, timeout=10, wait_for_ready=True).status
            assert status == health_pb2.HealthCheckResponse.SERVING

            # in-flight work when SIGTERM arrives is finished, on both front doors
            body = {"inputs": [{"question": "Which river?", "context": LONG_CONTEXT}] * 48}
            results: list[int] = []

            def rest_call() -> None:
                results.append(httpx.post(server.url + "/qa", json=body, timeout=60).status_code)

            grpc_request = pb.ExtractRequest(inputs=[pb.QAInput(question="Which river?", context=LONG_CONTEXT)] * 48)
            grpc_results: list[int] = []

            def grpc_call() -> None:
                response = pb_grpc.QAStub(channel).Extract(grpc_request, timeout=60)
                grpc_results.append(len(response.results))

            threads = [threading.Thread(target=rest_call) for _ in range(4)]
            threads += [threading.Thread(target=grpc_call) for _ in range(2)]
            for thread in threads:
                thread.start()
            time.sleep(0.3)
            started = time.monotonic()
            server.process.send_signal(15)
            for thread in threads:
                thread.join(60)
        code = server.process.wait(30)
        assert results == [200] * 4, (results, server.logs())
        assert grpc_results == [48, 48], server.logs()
        assert code == 0, server.logs()
        assert time.monotonic() - started < 30
        assert "stop signal received" in server.logs()
    finally:
        server.terminate()


@pytest.mark.integration
def test_api_key_and_cors(tiny_bundles: dict[str, Path], tmp_path: Path) -> None:
    env = {"BERTSERVE_API_KEY": "s3cret", "BERTSERVE_CORS_ORIGINS": "http://app.example"}
    server = ServerProcess([tiny_bundles["classify"]], tmp_path / "server.log", env)
    try:
        server.wait_live()
        server._wait("/health/ready", 60)
        body = {"inputs": "hello"}
        denied = httpx.post(server.url + "/classify", json=body)
        assert denied.status_code == 401 and denied.json()["error"]["code"] == "unauthenticated"
        wrong = httpx.post(server.url + "/classify", json=body, headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        assert httpx.get(server.url + "/models").status_code == 401
        ok = httpx.post(server.url + "/classify", json=body, headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200
        assert httpx.get(server.url + "/metrics").status_code == 200
        # the compose healthcheck command, run without Docker
        check = [sys.executable, "-m", "service.operations.healthcheck"]
        assert subprocess.run([*check, server.url + "/health/ready"], cwd=REPO, timeout=30).returncode == 0
        assert subprocess.run([*check, "http://127.0.0.1:9/health/ready"], cwd=REPO, timeout=30).returncode == 1
        preflight = httpx.options(
            server.url + "/classify",
            headers={"Origin": "http://app.example", "Access-Control-Request-Method": "POST"},
        )
        assert preflight.headers["access-control-allow-origin"] == "http://app.example"
        # a browser lets the page read only the headers the response exposes: every one the service adds
        cross_origin = httpx.post(
            server.url + "/classify",
            json=body,
            headers={"Authorization": "Bearer s3cret", "Origin": "http://app.example"},
        )
        assert cross_origin.headers["access-control-allow-origin"] == "http://app.example"
        exposed = {name.strip().lower() for name in cross_origin.headers["access-control-expose-headers"].split(",")}
        service_headers = {name for name in cross_origin.headers if name.startswith("x-")}
        assert {"x-tokenize-time-ms", "x-postprocess-time-ms", "x-server-time-ms"} <= service_headers
        assert service_headers <= exposed, service_headers - exposed
        with grpc.insecure_channel(server.grpc_target) as channel:
            stub = pb_grpc.ClassifierStub(channel)
            request = pb.ClassifyRequest(inputs=[pb.TextInput(text="hello")])
            with pytest.raises(grpc.RpcError) as caught:
                stub.Classify(request, timeout=10)
            assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert stub.Classify(request, metadata=[("authorization", "Bearer s3cret")], timeout=10).results
            health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
            assert health.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        assert server.terminate() == 0


@pytest.mark.integration
@pytest.mark.parametrize("option", ["--http-port", "--grpc-port"])
def test_a_taken_port_is_a_one_line_error_before_loading(option: str, tiny_bundles: dict[str, Path]) -> None:
    # the gRPC server binds its port only once the models are ready: both ports are checked at the start
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        ports = {"--http-port": str(free_port()), "--grpc-port": str(free_port()), option: str(port)}
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "bertserve",
                "serve",
                "--models",
                str(tiny_bundles["classify"]),
                "--host",
                "127.0.0.1",
            ]
            + [arg for pair in ports.items() for arg in pair],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == (
        f"error: cannot listen on 127.0.0.1:{port} (Address already in use): choose another {option}"
    ), result.stderr
