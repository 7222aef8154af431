"""Task responses rendered once, straight to JSON bytes.

The routes declare their `response_model` for OpenAPI, but return a `Response` built here: FastAPI then neither
validates the result against the model again nor turns it into JSON through `jsonable_encoder` (a Python object
per float of an embedding). orjson writes NumPy arrays and scalars as they are (float32 vectors in their shortest
float32 form), so results need not become lists first. A large answer (every token's vector of many texts) is
rendered on a worker thread, one of its items per orjson call: orjson holds the GIL while it writes, so between
items the event loop gets it back, and it is never held for the whole answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import orjson
from starlette.responses import Response

from service.engine.engine import Engine, Outcome

JSON_OPTIONS = orjson.OPT_SERIALIZE_NUMPY
FLOATS_PER_CHARACTER = 16
"""About how many floats orjson writes in the time the tokenizer takes for one character of text: the size of an
answer of arrays on the scale `Engine.off_loop` judges (characters of text)."""


def json_bytes(content: Any) -> bytes:
    """`content` as JSON (NumPy arrays and scalars included)."""
    return orjson.dumps(content, option=JSON_OPTIONS)


def task_response(content: Any, outcome: Outcome) -> Response:
    """A 200 JSON response of `content` with the outcome's headers (model, timings)."""
    return Response(json_bytes(content), media_type="application/json", headers=outcome.headers())


def json_list_bytes(items: Sequence[Any]) -> bytes:
    """`items` as a JSON list, each item by its own orjson call (a thread gives the GIL up between them)."""
    return b"[" + b",".join([json_bytes(item) for item in items]) + b"]"


async def arrays_response(engine: Engine, arrays: Sequence[np.ndarray], outcome: Outcome) -> Response:
    """A 200 JSON response of a list of float arrays (nested lists), rendered off the event loop when large."""
    characters = sum(array.size for array in arrays) // FLOATS_PER_CHARACTER
    body = await engine.off_loop(characters, json_list_bytes, arrays, bounded=False)
    return Response(body, media_type="application/json", headers=outcome.headers())
