"""The encoder tasks through a real Triton server: embed graphs (pooled and normalized vectors, B x H, and the token
states B x S x H when a request asks for them) and fill-mask graphs (logits at the mask tokens, B x M x V) in the
model repository the export step writes, served by our service with `--backend triton`, answer as the in-process ONNX
Runtime backend does on the same bundles. A request of more texts than the model's max_batch_size is split into calls
whose most masks per row differ: the backend joins them with filler rows. Needs the Triton venv
(`make triton-venv`); skipped with the reason otherwise (test_triton.py).
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from export.triton import TritonOptions
from tests.service.server import ServerProcess
from tests.service.test_triton import _assert_close, servers, triton_server  # noqa: F401  (fixtures)

pytestmark = pytest.mark.integration

MAX_ROWS = TritonOptions().max_batch_size
"""The max_batch_size of the written Triton configs (a batch over it is split into calls)."""


@pytest.fixture(scope="module")
def tiny_bundles(encoder_bundles: dict[str, Path]) -> dict[str, Path]:
    """This module's servers (Triton, ours over Triton, ours in-process) serve the embed and fill-mask bundles."""
    return encoder_bundles


def _post_both(pair: tuple[ServerProcess, ServerProcess], path: str, body: dict) -> tuple[object, object]:
    via_triton, in_process = pair
    a = httpx.post(via_triton.url + path, json=body, timeout=60)
    b = httpx.post(in_process.url + path, json=body, timeout=60)
    assert a.status_code == b.status_code == 200, (a.text, b.text)
    return a.json(), b.json()


def test_embed_through_triton_answers_like_onnx_runtime(servers: tuple[ServerProcess, ServerProcess]) -> None:  # noqa: F811
    texts = [f"sentence {i} " + "word " * (i % 7) for i in range(MAX_ROWS + 8)]
    for body in ({"inputs": texts}, {"inputs": texts[:3], "normalize": False}, {"inputs": texts[:3], "dimensions": 8}):
        got, expected = _post_both(servers, "/embed", body)
        _assert_close(got, expected)
    got, expected = _post_both(servers, "/v1/embeddings", {"input": texts[:2], "model": "tiny-embed"})
    _assert_close(got["data"], expected["data"])  # type: ignore[index]


def test_token_embeddings_through_triton_answer_like_onnx_runtime(
    servers: tuple[ServerProcess, ServerProcess],  # noqa: F811
) -> None:
    """The graph's token states, an output the Triton config declares and each call asks for only when a request
    needs them: a request of more texts than max_batch_size is split into calls and joined row by row."""
    texts = [f"sentence {i} " + "word " * (i % 7) for i in range(MAX_ROWS + 8)]
    got, expected = _post_both(servers, "/embed_all", {"inputs": texts})
    assert [len(vectors) for vectors in got] == [len(vectors) for vectors in expected]  # type: ignore[arg-type]
    _assert_close(got, expected)


def test_fill_mask_through_triton_answers_like_onnx_runtime(servers: tuple[ServerProcess, ServerProcess]) -> None:  # noqa: F811
    """33 texts: Triton gets two calls, one of them with the three-mask row, so their most masks per row differ."""
    texts = [f"text {i} has one [MASK] here." for i in range(MAX_ROWS)] + ["[MASK] and [MASK] or [MASK] then."]
    got, expected = _post_both(servers, "/fill-mask", {"inputs": texts, "top_k": 25})
    assert len(got[-1]) == 3 and len(got[0]) == 25  # type: ignore[index, arg-type]
    _assert_close(got, expected)
    body = {"inputs": texts[-1], "targets": ["happy", "sad", "the"]}
    got, expected = _post_both(servers, "/fill-mask", body)
    _assert_close(got, expected)
