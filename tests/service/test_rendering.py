"""Task responses rendered to bytes (service/http_api/rendering.py): the same head and body as Starlette's own
JSON `Response` with the outcome's headers, which the routes returned before; float32 values in their shortest
float32 form."""

from __future__ import annotations

import json

import numpy as np
import pytest
from starlette.responses import Response

from service.engine.engine import RESPONSE_HEADERS, Outcome, Timings
from service.http_api.rendering import task_response


@pytest.mark.parametrize(
    "timings",
    [Timings(), Timings(1.23456, 2.0, 3.5, 0.0004999, 99.99951, 3), Timings(1e6, 0.1, 1 / 3, 2 / 3, 12345.6785, 17)],
)
def test_a_task_response_has_the_head_starlette_would_build(timings: Timings) -> None:
    outcome = Outcome(model="minilm-sst2", results=[], timings=timings)
    content = [{"label": "positive", "score": np.float32(0.9)}, {"vector": np.arange(3, dtype=np.float32)}]
    response = task_response(content, outcome)
    reference = Response(response.body, media_type="application/json", headers=outcome.headers())
    assert response.status_code == reference.status_code == 200
    assert response.raw_headers == reference.raw_headers
    assert [name for name, _ in response.raw_headers[: len(RESPONSE_HEADERS)]] == [
        name.encode() for name in RESPONSE_HEADERS
    ]
    assert json.loads(response.body) == [{"label": "positive", "score": 0.9}, {"vector": [0.0, 1.0, 2.0]}]


def test_timing_headers_are_written_with_three_decimals() -> None:
    """The values, as the HTTP head and gRPC metadata both carry them (the latter decoded from the former)."""
    timings = Timings(1.23456, 2.0, 3.5, 0.0004999, 99.99951, 3)
    expected = {
        "x-tokenize-time-ms": "1.235",
        "x-queue-time-ms": "2.000",
        "x-inference-time-ms": "3.500",
        "x-postprocess-time-ms": "0.000",
        "x-total-time-ms": "100.000",
        "x-backend-calls": "3",
    }
    assert timings.headers() == expected
    assert Outcome(model="m", results=[], timings=timings).headers() == {"x-model": "m", **expected}
