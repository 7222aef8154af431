"""The playground: one static page (HTML, CSS, JavaScript in `static/`, no build step, nothing fetched from
outside) at `GET /` and `GET /playground` that tries every loaded model in a browser.

The page itself holds no data and needs no key; everything it shows comes from the API routes it calls
(`/models`, `/classify`, `/qa`, `/ner`, `/embed`, `/fill-mask`), which keep their own authentication, so
with an API key set the page asks for the key and sends it as a bearer token. The page builds its DOM with
`textContent` only, and the Content-Security-Policy below allows nothing but this origin's own files on top.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.responses import Response

STATIC = Path(__file__).parent / "static"

ASSETS = {"playground.js": "text/javascript; charset=utf-8", "playground.css": "text/css; charset=utf-8"}
"""The page's files under `/playground/<name>`, with their media types."""

HEADERS = {
    # only this origin's own scripts, styles and API; no inline script, no frames, no plugins
    "content-security-policy": "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cache-control": "no-cache",
}


def add_playground_routes(app: FastAPI) -> None:
    """`GET /`, `GET /playground` (the page) and `GET /playground/<asset>`; `GET /` is in the OpenAPI schema (the
    path has `POST /` too, Hugging Face's shape), the rest is kept out."""
    page = (STATIC / "playground.html").read_bytes()
    assets = {name: ((STATIC / name).read_bytes(), media) for name, media in ASSETS.items()}

    async def playground() -> Response:
        """The playground page."""
        return Response(page, media_type="text/html; charset=utf-8", headers=HEADERS)

    page_response: dict[int | str, dict[str, Any]] = {
        200: {"description": "The page.", "content": {"text/html": {"schema": {"type": "string"}}}},
        401: {"description": "An API key is set and the docs are not public."},
    }
    app.add_api_route(
        "/", playground, methods=["GET"], response_class=Response, responses=page_response, tags=["playground"]
    )
    app.add_api_route("/playground", playground, methods=["GET"], include_in_schema=False)
    for name, (body, media) in assets.items():
        app.add_api_route(f"/playground/{name}", _asset(body, media), methods=["GET"], include_in_schema=False)


def _asset(body: bytes, media_type: str) -> Callable[[], Awaitable[Response]]:
    async def asset() -> Response:
        return Response(body, media_type=media_type, headers=HEADERS)

    return asset


__all__ = ["add_playground_routes"]
