"""A fake classification server for the hostile profile's tests: HTTP/1.1 on raw asyncio with h11, that behaves
as a sound server does by default and breaks one bound per fault flag.

Sound: requests in flight bounded (429 beyond `--max-in-flight`), every connection's request head and body read
within `--cut-s` seconds (then the connection is closed), bodies over the limit refused (413), bad JSON 400,
wrong shapes and values 422, unknown paths 404, broken HTTP 400; RSS exported as
`process_resident_memory_bytes` on /metrics.
With `--qa-chars-per-window N` it also serves /qa: a context needs one window per N characters, and a request
that needs more windows than `--max-queue` is refused with 422 and the real server's message (the windows it
needs, the queue's size).
Faults: `--leak-mb-per-top-k MB` keeps MB of memory per distinct top_k ever seen (state grown by a request value);
`--error-on-bad-json` answers 500 to a body that is not JSON; `--no-cut` never cuts a slow client;
`--over-queue-status 500` answers a QA request over the queue with 500 instead of 422.
Run: `python -m tests.loadtests.hostile_fake_server --port 8123 [faults]`; it prints `ready` once listening.
Reference: https://h11.readthedocs.io/en/latest/api.html
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
from pathlib import Path
from typing import Any

import h11

MAX_BODY = 2_000_000
MAX_INPUTS = 64
MAX_TEXT_CHARS = 100_000


class State:
    def __init__(self, options: argparse.Namespace) -> None:
        self.options = options
        self.in_flight = 0
        self.kept: dict[int, bytes] = {}


def _rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def _json_response(status: int, body: Any) -> tuple[int, bytes, str]:
    return status, json.dumps(body).encode(), "application/json"


def _error(status: int, message: str) -> tuple[int, bytes, str]:
    return _json_response(status, {"error": {"code": str(status), "message": message}})


def _check_texts(inputs: Any) -> str | None:
    items = inputs if isinstance(inputs, list) else [inputs]
    if not items or len(items) > MAX_INPUTS:
        return f"between 1 and {MAX_INPUTS} inputs"
    if not all(isinstance(item, str) and item.strip() for item in items):
        return "inputs must be non-blank strings"
    if any(len(item) > MAX_TEXT_CHARS for item in items):
        return f"texts of at most {MAX_TEXT_CHARS} characters"
    return None


QA_OPTIONS = {"doc_stride": (0, 63), "top_k": (1, 20), "max_answer_len": (1, 512)}
"""The QA options the fake takes, with their legal ranges (beyond them: 422)."""


def _qa_pairs(body: Any) -> list[tuple[Any, Any]] | str:
    """The (question, context) pairs of a /qa body, or what is wrong with it."""
    if not isinstance(body, dict) or set(body) - {"inputs", "question", "context", *QA_OPTIONS}:
        return "a JSON object with inputs, or question and context (and options)"
    if "inputs" in body:
        items = body["inputs"]
        if not isinstance(items, list) or not all(isinstance(item, dict) for item in items):
            return "inputs must be a list of {question, context}"
        return [(item.get("question"), item.get("context")) for item in items]
    return [(body.get("question"), body.get("context"))]


def _qa_problem(body: Any) -> str | None:
    pairs = _qa_pairs(body)
    if isinstance(pairs, str):
        return pairs
    if not 1 <= len(pairs) <= MAX_INPUTS:
        return f"between 1 and {MAX_INPUTS} pairs"
    texts = [text for pair in pairs for text in pair]
    if not all(isinstance(text, str) and text.strip() and len(text) <= MAX_TEXT_CHARS for text in texts):
        return f"questions and contexts must be non-blank strings of at most {MAX_TEXT_CHARS} characters"
    for option, (low, high) in QA_OPTIONS.items():
        value = body.get(option, low)
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
            return f"{option} must be an integer in [{low}, {high}]"
    return None


async def _qa(state: State, raw: bytes) -> tuple[int, bytes, str]:
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        return _error(400, "the body is not JSON")
    problem = _qa_problem(body)
    if problem:
        return _error(422, problem)
    pairs = _qa_pairs(body)
    assert isinstance(pairs, list)
    windows = sum(math.ceil(len(context) / state.options.qa_chars_per_window) for _, context in pairs)
    if windows > state.options.max_queue:
        return _error(
            state.options.over_queue_status,
            f"the request needs {windows} sequences, more than this model's queue holds ({state.options.max_queue});"
            " send fewer or shorter inputs",
        )
    await asyncio.sleep(0.001 * windows)  # the "inference"
    answer = [{"answer": "x", "score": 0.5, "start": 0, "end": 1}]
    return _json_response(200, [answer] * len(pairs) if "inputs" in body else answer)


def _classify_problem(state: State, body: Any) -> str | None:
    if not isinstance(body, dict) or set(body) - {"inputs", "top_k", "model"} or "inputs" not in body:
        return "a JSON object with inputs (and top_k, model)"
    problem = _check_texts(body["inputs"])
    if problem:
        return problem
    top_k = body.get("top_k", 1)
    if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1:
        return "top_k must be an integer >= 1"
    if state.options.leak_mb_per_top_k and top_k not in state.kept:
        state.kept[top_k] = b"\x01" * int(state.options.leak_mb_per_top_k * 1024 * 1024)
    return None


def _timeout_problem(headers: dict[bytes, bytes]) -> str | None:
    value = headers.get(b"x-request-timeout-ms")
    if value is None:
        return None
    try:
        number = float(value)
    except ValueError:
        return "x-request-timeout-ms must be a number"
    return None if math.isfinite(number) and number > 0 else "x-request-timeout-ms must be positive"


async def _classify(state: State, raw: bytes, headers: dict[bytes, bytes]) -> tuple[int, bytes, str]:
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        return _error(500 if state.options.error_on_bad_json else 400, "the body is not JSON")
    problem = _timeout_problem(headers) or _classify_problem(state, body)
    if problem:
        return _error(422, problem)
    if body.get("model") not in (None, "fake"):
        return _error(404, f"no model {body['model']!r}")
    count = len(body["inputs"]) if isinstance(body["inputs"], list) else 1
    await asyncio.sleep(0.002 * count)  # the "inference"
    answer = [{"label": "positive", "score": 0.9}]
    return _json_response(200, [answer] * count if isinstance(body["inputs"], list) else answer)


def _models(state: State) -> list[dict[str, Any]]:
    models = [{"name": "fake", "task": "classify", "max_seq_length": 128, "is_default": True}]
    if state.options.qa_chars_per_window > 0:
        models.append({"name": "fake-qa", "task": "qa", "max_seq_length": 128, "is_default": True})
    return models


async def route(state: State, method: bytes, path: bytes, raw: bytes, headers: dict[bytes, bytes]) -> tuple:
    if path in (b"/health/ready", b"/health/live"):
        return _json_response(200, {"status": "ready"})
    if path == b"/metrics":
        return 200, f"process_resident_memory_bytes {_rss()}.0\n".encode(), "text/plain"
    if path == b"/models":
        return _json_response(200, {"models": _models(state)})
    serves_qa = path == b"/qa" and state.options.qa_chars_per_window > 0
    if path != b"/classify" and not serves_qa:
        return _error(404, "not found")
    if method != b"POST":
        return _error(405, "method not allowed")
    if state.in_flight >= state.options.max_in_flight:
        return _error(429, "busy")
    state.in_flight += 1
    try:
        return await (_qa(state, raw) if serves_qa else _classify(state, raw, headers))
    finally:
        state.in_flight -= 1


async def _read_request(connection: h11.Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> Any:
    """(request, body) of the next request; None when the peer closed; 413 / 400 are answered here."""
    request, chunks, size = None, [], 0
    while True:
        event = connection.next_event()
        if event is h11.NEED_DATA:
            data = await reader.read(65536)
            connection.receive_data(data)
            continue
        if isinstance(event, h11.Request):
            request = event
            declared = dict(event.headers).get(b"content-length")
            if declared is not None and declared.isdigit() and int(declared) > MAX_BODY:
                return request, None
        elif isinstance(event, h11.Data):
            size += len(event.data)
            if size > MAX_BODY:
                return request, None
            chunks.append(event.data)
        elif isinstance(event, h11.EndOfMessage):
            return request, b"".join(chunks)
        elif isinstance(event, h11.ConnectionClosed):
            return None


def _send(connection: h11.Connection, writer: asyncio.StreamWriter, status: int, body: bytes, kind: str) -> None:
    headers = [(b"content-type", kind.encode()), (b"content-length", str(len(body)).encode())]
    headers.append((b"connection", b"close"))
    writer.write(connection.send(h11.Response(status_code=status, headers=headers)))
    writer.write(connection.send(h11.Data(data=body)))
    writer.write(connection.send(h11.EndOfMessage()))


async def handle(state: State, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """One request per connection (every answer closes it), read within --cut-s seconds."""
    connection = h11.Connection(h11.SERVER)
    cut = None if state.options.no_cut else state.options.cut_s
    try:
        try:
            got = await asyncio.wait_for(_read_request(connection, reader, writer), timeout=cut)
        except TimeoutError:
            return
        except h11.RemoteProtocolError:
            writer.write(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
            return
        if got is None:
            return
        request, raw = got
        if raw is None:
            _send(connection, writer, *_error(413, "body too large"))
            return
        status, body, kind = await route(state, request.method, request.target, raw, dict(request.headers))
        _send(connection, writer, status, body, kind)
    finally:
        with contextlib.suppress(OSError):
            await writer.drain()
        writer.close()


async def main(options: argparse.Namespace) -> None:
    state = State(options)
    server = await asyncio.start_server(lambda r, w: handle(state, r, w), "127.0.0.1", options.port, backlog=4096)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--max-in-flight", type=int, default=16)
    parser.add_argument("--cut-s", type=float, default=1.0)
    parser.add_argument("--leak-mb-per-top-k", type=float, default=0.0)
    parser.add_argument("--error-on-bad-json", action="store_true")
    parser.add_argument("--no-cut", action="store_true")
    parser.add_argument("--qa-chars-per-window", type=int, default=0)
    parser.add_argument("--max-queue", type=int, default=40)
    parser.add_argument("--over-queue-status", type=int, default=422)
    return parser.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse()))
