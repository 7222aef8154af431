"""Pure ASGI middleware for the drain after SIGTERM: every response says `Connection: close`.

While the server drains (unready, still serving; see service/runner.py), a keep-alive client that gets a
response with `Connection: close` closes that connection itself and opens a new one for its next request, so
no connection is left idle for the server to close under a request already on its way (which the client would
see as a reset with no response). Reference: RFC 9112 section 9.6 (tear-down).
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.inference import ServiceState


class DrainMiddleware:
    """Add `Connection: close` to every HTTP response while `state.draining`."""

    def __init__(self, app: ASGIApp, state: ServiceState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_closing(message: Message) -> None:
            if message["type"] == "http.response.start" and self.state.draining:
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"connection"]
                message = {**message, "headers": [*headers, (b"connection", b"close")]}
            await send(message)

        await self.app(scope, receive, send_closing)
