"""The JSON task routes answered past FastAPI's routing: a valid request goes straight to its endpoint.

A task request (`POST /classify` with a JSON body) through FastAPI's own stack passes its exception and exit-stack
middleware, the router's match over every route, the request handler's dependency solving and body parsing, and
back: Python work on the event loop for each answer, beside which the engine's own is small. `DirectRoutes`, the
innermost of the service's middleware (inside the door, which has read the whole body already), serves the routes
that take nothing but their JSON body and the request (`direct_routes` finds them among the app's routes): it
parses the body, validates it with the route's own pydantic model, calls the endpoint, and sends the `Response` it
returns. Anything else is passed on to FastAPI as it came: other routes and methods, a body of another media type
(FastAPI answers 415), a body that does not parse or validate (FastAPI answers 400 / 422 with its own messages),
so that every refusal is the one FastAPI gives.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Any

import orjson
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.errors import ServiceError
from service.http_api.middleware import first_header, service_error_response, unexpected_error_response


@dataclass(frozen=True)
class DirectRoute:
    """A route served directly: its body's model, and the endpoint's names for the body and the request."""

    route: APIRoute
    body_model: type[BaseModel]
    body_name: str
    request_name: str


def direct_routes(routes: typing.Sequence[BaseRoute]) -> dict[str, DirectRoute]:
    """By path: the POST routes at a fixed path whose endpoint takes one pydantic body (not embedded) and the
    `Request`, and nothing else (no path, query, header or cookie parameters, no dependencies)."""
    found: dict[str, DirectRoute] = {}
    for route in routes:
        if not isinstance(route, APIRoute) or route.methods != {"POST"} or route.param_convertors:
            continue
        dependant = route.dependant
        if (
            dependant.path_params
            or dependant.query_params
            or dependant.header_params
            or dependant.cookie_params
            or dependant.dependencies
            or dependant.response_param_name
            or dependant.background_tasks_param_name
            or dependant.request_param_name is None
            or len(dependant.body_params) != 1
            or route._embed_body_fields
        ):
            continue
        body = dependant.body_params[0]
        model = typing.get_type_hints(route.endpoint).get(body.name)
        if isinstance(model, type) and issubclass(model, BaseModel):
            found.setdefault(route.path, DirectRoute(route, model, body.name, dependant.request_param_name))
    return found


class DirectRoutes:
    """Pure ASGI middleware: the requests of `routes` with a JSON body that validates served here, the rest passed
    on to `app`. It expects the whole body in the first message, as the door (`DoorMiddleware`) hands it on."""

    def __init__(self, app: ASGIApp, routes: dict[str, DirectRoute]) -> None:
        self.app = app
        self.routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        direct = self.routes.get(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        if direct is None or not _json_body(scope):
            await self.app(scope, receive, send)
            return
        message = await receive()
        body = message.get("body", b"") if message["type"] == "http.request" else b""
        try:
            parsed = direct.body_model.model_validate(orjson.loads(body))
        except (orjson.JSONDecodeError, ValidationError):
            await self.app(scope, _replay(body, receive), send)
            return
        scope["route"] = direct.route
        scope["endpoint"] = direct.route.endpoint
        scope["path_params"] = {}
        arguments: dict[str, Any] = {direct.body_name: parsed, direct.request_name: Request(scope, receive)}
        try:
            response = await direct.route.endpoint(**arguments)
            if not isinstance(response, Response):
                raise TypeError(f"{direct.route.path}'s endpoint returned {type(response).__name__}, not a Response")
        except ServiceError as error:
            response = service_error_response(error)
        except Exception as error:  # a bug: 500 `internal`, as the route class answers it on FastAPI's path
            response = unexpected_error_response(error)
        await response(scope, receive, send)


def _json_body(scope: Scope) -> bool:
    """The body is JSON by its Content-Type: `application/json`, or none given (read as JSON, as the routes do)."""
    content_type = first_header(scope, b"content-type")
    return content_type is None or content_type.split(b";", 1)[0].strip().lower() == b"application/json"


def _replay(body: bytes, receive: Receive) -> Receive:
    """`receive` with `body` given again first (it was read here)."""
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed


__all__ = ["DirectRoute", "DirectRoutes", "direct_routes"]
