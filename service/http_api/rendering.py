"""Task responses rendered once, straight to JSON bytes.

The routes declare their `response_model` for OpenAPI, but return a `Response` built here: FastAPI then neither
validates the result against the model again nor turns it into JSON through `jsonable_encoder` (a Python object
per float of an embedding). orjson writes NumPy arrays and scalars as they are (float32 vectors in their shortest
float32 form), so results need not become lists first.
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import Response

from service.engine.engine import Outcome

JSON_OPTIONS = orjson.OPT_SERIALIZE_NUMPY


def json_bytes(content: Any) -> bytes:
    """`content` as JSON (NumPy arrays and scalars included)."""
    return orjson.dumps(content, option=JSON_OPTIONS)


def task_response(content: Any, outcome: Outcome) -> Response:
    """A 200 JSON response of `content` with the outcome's headers (model, timings)."""
    return Response(json_bytes(content), media_type="application/json", headers=outcome.headers())
