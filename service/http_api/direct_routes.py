"""The POST task routes served straight from the ASGI scope, ahead of FastAPI's router.

A POST to a task route (`/classify`, `/qa`, `/ner`, `/embed`, `/v1/embeddings`, `/fill-mask`: every POST route whose
endpoint takes `(body: <pydantic model>, request: Request)`) whose JSON body validates, and whose API key matches
when the server has one, is answered here: pydantic parses and validates the bytes in one pass
(`model_validate_json`), then the route's own endpoint function runs with that body and its `Response` is sent.
Everything else goes on to FastAPI unchanged, its body replayed: a body that does not validate, another content
type, a missing or wrong API key, another method or path. FastAPI then answers it as it answers every request, so
the 422 messages, 401s and 405s stay the app's own, and this path changes no answer, only its cost: Starlette's
routing, exception and exit-stack middleware, FastAPI's request object and dependency solving, and a second pass
over the body (stdlib `json`, then validation of the Python objects) are skipped. Under a `/classify` load they
were a third of the event loop's time (py-spy, GIL samples of the event-loop thread).

Errors the endpoint raises are answered as the app's exception handlers answer them (`service_error_response`,
`unexpected_error_response` of service/http_api/middleware.py).
"""

from __future__ import annotations

import inspect
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from fastapi.routing import APIRoute
from pydantic import BaseModel, SecretStr, ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from service.errors import ServiceError
from service.http_api.middleware import replay_body, service_error_response, unexpected_error_response


@dataclass(frozen=True)
class DirectRoute:
    route: APIRoute
    body_model: type[BaseModel]


def direct_routes(routes: Iterable[Any], key_check: Any) -> dict[str, DirectRoute]:
    """The POST routes this path can serve, by path: endpoint `(body: <model>, request)`, and no dependency but
    `key_check` (the API key's, which `DirectRoutes` checks itself)."""
    found: dict[str, DirectRoute] = {}
    for route in routes:
        if not isinstance(route, APIRoute) or route.methods != {"POST"} or route.path_regex.groups:
            continue
        if any(dependency.dependency is not key_check for dependency in route.dependencies):
            continue
        parameters = inspect.signature(route.endpoint, eval_str=True).parameters
        if list(parameters) != ["body", "request"] or parameters["request"].annotation is not Request:
            continue
        body_model = parameters["body"].annotation
        if isinstance(body_model, type) and issubclass(body_model, BaseModel):
            found[route.path] = DirectRoute(route, body_model)
    return found


class DirectRoutes:
    """Pure ASGI middleware, the innermost of the service's own (`ServiceApp` puts them around FastAPI's stack): the
    requests above served here, the rest passed on to `app` (FastAPI's middleware stack and router) as they came.
    It expects the whole body in one message, as `AdmissionMiddleware` hands it on."""

    def __init__(self, app: ASGIApp, routes: dict[str, DirectRoute], api_key: SecretStr | None) -> None:
        self.app = app
        self.routes = routes
        self.api_key = None if api_key is None else api_key.get_secret_value().encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        direct = self.routes.get(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        if direct is None or not self._takes(scope):
            await self.app(scope, receive, send)
            return
        message = await receive()
        body = message.get("body", b"") if message["type"] == "http.request" else b""
        try:
            parsed = direct.body_model.model_validate_json(body)
        except ValidationError:
            await self.app(scope, replay_body(body, receive), send)
            return
        scope["route"] = direct.route
        scope["endpoint"] = direct.route.endpoint
        scope["path_params"] = {}
        try:
            response = await direct.route.endpoint(body=parsed, request=Request(scope, receive))
            if not isinstance(response, Response):
                raise TypeError(f"{direct.route.path}'s endpoint returned {type(response).__name__}, not a Response")
        except ServiceError as error:
            response = service_error_response(error)
        except Exception as error:
            response = unexpected_error_response(error)
        await response(scope, receive, send)

    def _takes(self, scope: Scope) -> bool:
        """A JSON body, and the server's API key when it has one (anything else is FastAPI's to answer). Headers
        are read as Starlette reads them (the first of a name, latin-1) and the key as `HTTPBearer` and the app's
        key check read it, so that a request taken here is one FastAPI would have served."""
        content_type = authorization = None
        for name, value in scope["headers"]:
            if name == b"content-type" and content_type is None:
                content_type = value
            elif name == b"authorization" and authorization is None:
                authorization = value
        if content_type is None or content_type.split(b";", 1)[0].strip().lower() != b"application/json":
            return False
        if self.api_key is None:
            return True
        header = authorization.decode("latin-1") if authorization is not None else ""
        scheme, _, param = header.partition(" ")
        credentials = param.strip()
        if not (scheme and credentials) or scheme.lower() != "bearer":
            return False
        return secrets.compare_digest(credentials.encode(), self.api_key)
