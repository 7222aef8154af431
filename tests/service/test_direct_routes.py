"""The task routes answered past FastAPI's routing (`service.http_api.direct_routes`): which routes are taken,
which requests are passed on, and that a real server answers the same either way."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from fastapi import Body, Depends, FastAPI, Query, Request
from pydantic import BaseModel
from starlette.responses import Response
from starlette.testclient import TestClient
from starlette.types import Receive, Scope, Send

from service.errors import UnknownModel
from service.http_api import create_app
from service.http_api.app import JsonRoute, _add_error_handlers
from service.http_api.direct_routes import DirectRoutes, direct_routes
from service.http_api.middleware import DoorMiddleware
from tests.service.server import ServerProcess


class Body1(BaseModel):
    text: str
    repeat: int = 1


def _echo(body: Body1) -> Any:
    """The text repeated; a domain error, a bug or something else than a Response for the texts that ask."""
    if body.text == "unknown":
        raise UnknownModel("unknown model 'x'")
    if body.text == "bug":
        raise RuntimeError("a bug")
    if body.text == "dict":
        return {"not": "a response"}
    return Response((body.text * body.repeat).encode(), media_type="text/plain")


def _toy_app() -> FastAPI:
    app = FastAPI()
    app.router.route_class = JsonRoute
    _add_error_handlers(app)  # the service's answers to errors

    @app.post("/echo")
    async def echo(body: Body1, request: Request) -> Any:
        return _echo(body)

    @app.post("/items/{name}")
    async def with_path(name: str, body: Body1, request: Request) -> Any:
        return Response(name)

    @app.post("/query")
    async def with_query(body: Body1, request: Request, limit: int = Query(1)) -> Any:
        return Response(str(limit))

    @app.post("/depends")
    async def with_dependency(body: Body1, request: Request, extra: str = Depends(lambda: "x")) -> Any:
        return Response(extra)

    @app.post("/embedded")
    async def embedded(request: Request, body: Body1 = Body(embed=True)) -> Any:
        return Response(body.text)

    @app.post("/no-request")
    async def without_request(body: Body1) -> Any:
        return Response(body.text)

    @app.get("/read")
    async def read(request: Request) -> Any:
        return Response("read")

    return app


class _Recorder:
    """The app behind the direct routes, recording the paths that were passed on to it."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app
        self.passed_on: list[str] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            self.passed_on.append(scope["path"])
        await self.app(scope, receive, send)


def test_only_routes_of_one_json_body_and_the_request_are_direct() -> None:
    assert sorted(direct_routes(_toy_app().routes)) == ["/echo"]


def test_the_task_routes_of_the_service_are_direct() -> None:
    routes = direct_routes(create_app().routes)
    assert {"/classify", "/qa", "/ner", "/embed", "/fill-mask", "/v1/embeddings", "/predict", "/rerank"} <= set(routes)
    assert not any("{" in path for path in routes)  # paths with parameters go through FastAPI's router


@pytest.fixture
def toy() -> tuple[TestClient, _Recorder]:
    app = _toy_app()
    recorder = _Recorder(app)
    direct = DirectRoutes(recorder, direct_routes(app.routes))
    door = DoorMiddleware(direct, door=None, max_bytes=1 << 20)  # hands the whole body on in one message
    return TestClient(door, raise_server_exceptions=False), recorder


def test_a_valid_request_is_served_without_fastapis_routing(toy: tuple[TestClient, _Recorder]) -> None:
    client, recorder = toy
    response = client.post("/echo", json={"text": "ab", "repeat": 2})
    assert (response.status_code, response.text) == (200, "abab")
    response = client.post("/echo", content=b'{"text": "no content type"}')  # read as JSON, as FastAPI does
    assert (response.status_code, response.text) == (200, "no content type")
    assert recorder.passed_on == []


@pytest.mark.parametrize(
    ("method", "path", "content", "content_type", "status"),
    [
        ("POST", "/echo", b'{"text": ', "application/json", 400),  # not JSON: FastAPI's invalid_json
        ("POST", "/echo", b'{"text": 3}', "application/json", 422),  # does not validate: FastAPI's message
        ("POST", "/echo", b"", "application/json", 422),  # no body
        ("POST", "/echo", b'{"text": "a"}', "text/plain", 415),  # another media type
        ("POST", "/echo", b'{"text": "a"}', "application/vnd.test+json", 200),  # JSON, but not taken here
        ("POST", "/items/x", b'{"text": "a"}', "application/json", 200),  # not a direct route
        ("GET", "/read", b"", "application/json", 200),
    ],
)
def test_everything_else_is_passed_on(
    toy: tuple[TestClient, _Recorder], method: str, path: str, content: bytes, content_type: str, status: int
) -> None:
    client, recorder = toy
    response = client.request(method, path, content=content, headers={"content-type": content_type})
    assert response.status_code == status, response.text
    assert recorder.passed_on == [path]


def test_errors_of_the_endpoint_are_the_apps_answers(toy: tuple[TestClient, _Recorder]) -> None:
    client, recorder = toy
    response = client.post("/echo", json={"text": "unknown"})
    assert response.status_code == 422 and response.json()["error"]["code"] == "unknown_model"
    for text in ("bug", "dict"):  # a bug, and an endpoint that returns no Response: 500 internal with its log id
        response = client.post("/echo", json={"text": text})
        assert response.status_code == 500 and response.json()["error"]["code"] == "internal"
    assert recorder.passed_on == []


BODIES: list[tuple[str, dict[str, Any]]] = [
    (
        "/classify",
        {"inputs": [{"text": "a good film", "text_pair": "a pair"}, {"text": "b", "text_pair": "c"}], "top_k": None},
    ),
    ("/qa", {"question": "Where is Paris?", "context": "Paris is in France, on the Seine."}),
    ("/ner", {"inputs": "George Washington went to Washington.", "aggregation_strategy": "simple"}),
    ("/predict", {"inputs": "a good film", "raw_scores": True}),
    ("/tokenize", {"inputs": "a good film"}),
]


@pytest.mark.integration
@pytest.mark.parametrize(("path", "body"), BODIES, ids=[path for path, _ in BODIES])
def test_a_real_server_answers_the_same_past_the_router_as_through_it(
    server: ServerProcess, path: str, body: dict[str, Any]
) -> None:
    """`application/json` is answered directly; `application/vnd.bertserve+json` (JSON as well) goes through
    FastAPI's router: same status, body and headers (timings aside), and the route's metrics are counted alike."""
    counter = f'bertserve_requests_total{{route="{path}",status="200",transport="http"}}'
    with httpx.Client(base_url=server.url, timeout=30.0) as client:
        before = _count(client.get("/metrics").text, counter)
        direct = client.post(path, json=body)
        routed = client.post(path, json=body, headers={"content-type": "application/vnd.bertserve+json"})
        after = _count(client.get("/metrics").text, counter)
    assert direct.status_code == routed.status_code == 200, (direct.text, routed.text)
    assert direct.json() == routed.json()
    assert set(direct.headers) == set(routed.headers)
    assert direct.headers["content-type"] == routed.headers["content-type"]
    assert after == before + 2


def _count(exposition: str, series: str) -> float:
    """The value of one series of a Prometheus exposition (0 before its first sample)."""
    for line in exposition.splitlines():
        if line.startswith(series + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0
