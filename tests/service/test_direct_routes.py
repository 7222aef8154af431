"""The task routes' direct path (service/http_api/direct_routes.py): which requests it takes, that it hands every
other request to FastAPI as it came, and that its answers are FastAPI's, byte for byte, on a real server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from fastapi import Depends, FastAPI, Request, Response
from pydantic import BaseModel, ConfigDict, SecretStr
from starlette.testclient import TestClient
from starlette.types import Receive, Scope, Send

from service.errors import Overloaded, ServiceError
from service.http_api.app import _require_key
from service.http_api.direct_routes import DirectRoutes, direct_routes
from service.http_api.middleware import service_error_response
from tests.service.server import ServerProcess, serving

KEY = "direct-key"


# ---- which routes and requests it takes (a small app of its own, no model) -------------------------------
class Echo(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: str
    times: int = 1


def _other_dependency() -> None:
    return None


def _app(api_key: str | None) -> tuple[FastAPI, list[str]]:
    api = FastAPI()
    api.state.settings = SimpleNamespace(api_key=None if api_key is None else SecretStr(api_key))
    secured = [Depends(_require_key)]

    @api.exception_handler(ServiceError)
    async def service_error(_: Request, error: ServiceError) -> Response:
        return service_error_response(error)

    @api.post("/echo", dependencies=secured)
    async def echo(body: Echo, request: Request) -> Response:
        if body.text == "busy":
            raise Overloaded("full")
        if body.text == "bug":
            raise RuntimeError("a bug")
        return Response((body.text * body.times).encode(), media_type="text/plain")

    @api.post("/other-dependency", dependencies=[Depends(_other_dependency)])
    async def other(body: Echo, request: Request) -> Response:
        return Response(b"other")

    @api.post("/no-request")
    async def no_request(body: Echo) -> Response:
        return Response(b"no-request")

    @api.get("/echo-get")
    async def get(request: Request) -> Response:
        return Response(b"get")

    return api, []


def _client(api_key: str | None = None) -> tuple[TestClient, list[str]]:
    api, passed = _app(api_key)

    async def fastapi(scope: Scope, receive: Receive, send: Send) -> None:
        passed.append(scope["path"])
        await api(scope, receive, send)

    direct = DirectRoutes(
        fastapi, direct_routes(api.routes, _require_key), None if api_key is None else SecretStr(api_key)
    )
    return TestClient(direct), passed


def test_only_post_routes_of_body_and_request_with_no_other_dependency_are_taken() -> None:
    api, _ = _app(None)
    assert list(direct_routes(api.routes, _require_key)) == ["/echo"]


def test_a_valid_json_request_is_answered_without_fastapi() -> None:
    client, passed = _client()
    response = client.post("/echo", json={"text": "ab", "times": 2})
    assert (response.status_code, response.text) == (200, "abab")
    response = client.post(
        "/echo", content=b'{"text": "x"}', headers={"content-type": "Application/JSON; charset=utf-8"}
    )
    assert (response.status_code, response.text) == (200, "x")
    assert passed == []


@pytest.mark.parametrize(
    ("content", "content_type", "status"),
    [
        (b'{"text": 1}', "application/json", 422),  # does not validate
        (b'{"text": "a", "typo": 1}', "application/json", 422),
        (b"{not json", "application/json", 422),
        (b"", "application/json", 422),
        (b'{"text": "a"}', "text/plain", 422),  # not JSON: FastAPI's to refuse
        (b'{"text": "a"}', "application/merge-patch+json", 200),  # JSON to FastAPI, not to this path
    ],
)
def test_anything_else_goes_on_to_fastapi_with_its_body(content: bytes, content_type: str, status: int) -> None:
    client, passed = _client()
    response = client.post("/echo", content=content, headers={"content-type": content_type})
    assert response.status_code == status, response.text
    assert passed == ["/echo"]


def test_other_methods_paths_and_routes_go_on_to_fastapi() -> None:
    client, passed = _client()
    assert client.get("/echo-get").text == "get"
    assert client.post("/other-dependency", json={"text": "a"}).text == "other"
    assert client.post("/no-request", json={"text": "a"}).text == "no-request"
    assert client.post("/missing", json={"text": "a"}).status_code == 404
    assert passed == ["/echo-get", "/other-dependency", "/no-request", "/missing"]


@pytest.mark.parametrize(
    ("authorization", "direct", "status"),
    [
        (f"Bearer {KEY}", True, 200),
        (f"bearer   {KEY}  ", True, 200),  # HTTPBearer's reading: any case, credentials stripped
        ("Bearer wrong", False, 401),
        (f"Basic {KEY}", False, 401),
        ("Bearer", False, 401),
        (None, False, 401),
    ],
)
def test_the_api_key_is_checked_as_fastapi_checks_it(authorization: str | None, direct: bool, status: int) -> None:
    client, passed = _client(KEY)
    headers = {} if authorization is None else {"authorization": authorization}
    response = client.post("/echo", json={"text": "a"}, headers=headers)
    assert response.status_code == status
    assert passed == ([] if direct else ["/echo"])


def test_errors_of_the_endpoint_are_answered_as_the_app_answers_them() -> None:
    client, passed = _client()
    busy = client.post("/echo", json={"text": "busy"})
    assert busy.status_code == 429 and busy.json()["error"]["code"] == "overloaded"
    assert busy.headers["retry-after"] == "1"
    bug = client.post("/echo", json={"text": "bug"})
    assert bug.status_code == 500 and bug.json()["error"]["code"] == "internal"
    assert passed == []


# ---- on a real server: the direct path answers as FastAPI does ------------------------------------------
@pytest.fixture(scope="module")
def server(
    tiny_bundles: dict[str, Path], encoder_bundles: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    log = tmp_path_factory.mktemp("direct-server") / "server.log"
    models = [*tiny_bundles.values(), encoder_bundles["embed"], encoder_bundles["fill-mask"]]
    with serving(models, log, {"BERTSERVE_API_KEY": KEY}) as process:
        yield process


BODIES: list[tuple[str, Any]] = [
    ("/classify", {"inputs": "a gripping, beautifully acted film"}),
    ("/classify", {"inputs": ["loved it", "a tedious mess"], "top_k": None}),
    ("/classify", {"inputs": {"text": "A man plays.", "text_pair": "Music."}, "function_to_apply": "sigmoid"}),
    ("/classify", {"inputs": "x", "top_k": 5.0}),
    ("/classify", {"inputs": "word " * 2000, "truncate": False}),  # valid JSON, refused by the service
    ("/classify", {"inputs": "   "}),
    ("/classify", {"inputs": 5}),  # does not validate
    ("/classify", {"inputs": "a", "top_k": "5"}),
    ("/classify", {"inputs": "a", "model": "no-such-model"}),
    ("/qa", {"question": "Where do I live?", "context": "My name is Wolfgang and I live in Berlin."}),
    ("/qa", {"inputs": [{"question": "Who?", "context": "Wolfgang lives in Berlin."}], "top_k": 2}),
    ("/qa", {"question": "Where?"}),
    ("/ner", {"inputs": "My name is Wolfgang and I live in Berlin."}),
    ("/ner", {"inputs": ["Angela Merkel visited Paris.", "Nothing here."], "aggregation_strategy": "none"}),
    ("/ner", {"inputs": []}),
    ("/embed", {"inputs": ["one text", "another text"], "normalize": False}),
    ("/embed", {"inputs": "one text", "dimensions": 8}),
    ("/v1/embeddings", {"input": ["one text"], "model": "tiny-embed", "encoding_format": "base64"}),
    ("/v1/embeddings", {"input": "one text", "model": "tiny-embed"}),
    ("/fill-mask", {"inputs": "Paris is the [MASK] of France.", "top_k": 3}),
    ("/fill-mask", {"inputs": "no mask here"}),
    ("/fill-mask", {"inputs": "[MASK]", "targets": ["a", "b"]}),
]


@pytest.mark.integration
@pytest.mark.parametrize(("path", "body"), BODIES, ids=[f"{path}-{i}" for i, (path, _) in enumerate(BODIES)])
def test_the_direct_path_answers_as_fastapi_does(server: ServerProcess, path: str, body: Any) -> None:
    auth = {"authorization": f"Bearer {KEY}"}
    with httpx.Client(base_url=server.url, timeout=30.0) as http:
        direct = http.post(path, json=body, headers=auth)
        # a JSON type of FastAPI's that this path leaves alone
        routed = http.post(path, json=body, headers={**auth, "content-type": "application/vnd.bertserve+json"})
    assert direct.status_code == routed.status_code != 401
    assert direct.content == routed.content
    assert direct.headers["content-type"] == routed.headers["content-type"]
    for header in ("x-model", "x-request-id", "x-server-time-ms"):
        assert (header in direct.headers) == (header in routed.headers)


@pytest.mark.integration
def test_direct_answers_are_counted_under_their_route(server: ServerProcess) -> None:
    def count(exposition: str) -> float:
        prefix = 'bertserve_requests_total{route="/ner",status="200",transport="http"} '
        lines = [line for line in exposition.splitlines() if line.startswith(prefix)]
        return float(lines[0].removeprefix(prefix)) if lines else 0.0

    with httpx.Client(base_url=server.url, timeout=30.0) as http:
        before = count(http.get("/metrics").text)
        answer = http.post(
            "/ner", json={"inputs": "Wolfgang lives in Berlin."}, headers={"authorization": f"Bearer {KEY}"}
        )
        assert answer.status_code == 200 and answer.headers["x-model"]
        assert count(http.get("/metrics").text) == before + 1
