"""The gRPC front door under malformed and hostile input, against a real server (the six tiny models, an API key).

Property-based fuzzing of every bert.v1 RPC with hypothesis, as the schemathesis test does for REST: messages built
from the proto descriptors (every field of every request type, valid and invalid values), wire encodings no
client library produces (wrong wire types, negative varints in uint32 fields, invalid UTF-8, unknown fields,
lying lengths), mutations of valid messages and random bytes. Every answer must be OK (a well-formed response,
one result per input) or a status that says what to change (INVALID_ARGUMENT, RESOURCE_EXHAUSTED for what is too
big); never UNKNOWN, INTERNAL, a hang, or a crash; requests valid by the contract are answered. Then fixed abuse:
unknown methods and services, API-key variants, metadata floods and `-bin` headers, oversize and compressed
messages, deadlines, streams with no or several messages, and raw HTTP/2 frames (h2) for what no gRPC client sends
(invalid `grpc-timeout`, truncated length prefixes). After each batch a normal call must still succeed.
References: https://protobuf.dev/programming-guides/encoding/ ,
https://grpc.github.io/grpc/core/md_doc_statuscodes.html , https://github.com/grpc/grpc/blob/master/doc/PROTOCOL-HTTP2.md
"""

from __future__ import annotations

import gzip
import re
import socket
import struct
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.grpc_api.servicers import MAX_DETAILS_BYTES, status_details
from service.grpc_api.stubs import bert_pb2 as pb
from tests.service.server import ServerProcess, serving

pytestmark = pytest.mark.integration

API_KEY = "fuzz-key"
AUTH = (("authorization", f"Bearer {API_KEY}"),)
MAX_BODY_BYTES = 2_000_000  # the server's default max_body_bytes (grpc.max_receive_message_length)
CALL_TIMEOUT_S = 20.0
"""A call that takes longer counts as a hang (DEADLINE_EXCEEDED is not an allowed answer to a fuzzed request)."""
MODELS = ["tiny-classify", "tiny-qa", "tiny-ner", "tiny-embed", "tiny-fill-mask", "tiny-rerank"]
WORDS = ["the", "film", "was", "good", "bad", "Ada", "Lovelace", "London", "river", "[MASK]", "[SEP]", "é", "北京"]
TARGETS = ["good", "bad", "the", "river", "london"]
"""Single tokens of the uncased vocabulary (fill-mask targets)."""


@dataclass(frozen=True)
class Rpc:
    path: str
    request: Any
    response: Any
    inputs: str | None
    """The request's repeated field with one result per element (None: Models.List)."""
    results: str | None


INPUTS = {"ClassifyRequest": "inputs", "ExtractRequest": "inputs", "RecognizeRequest": "texts"}
INPUTS |= {"EmbedRequest": "texts", "EmbedAllRequest": "texts", "FillRequest": "texts", "RerankRequest": "texts"}
RESULTS = {"EmbedResponse": "embeddings", "RerankResponse": "ranks"}


def _rpcs() -> list[Rpc]:
    rpcs = []
    for service in pb.DESCRIPTOR.services_by_name.values():
        for method in service.methods:
            request, response = getattr(pb, method.input_type.name), getattr(pb, method.output_type.name)
            inputs = INPUTS.get(method.input_type.name)
            results = RESULTS.get(method.output_type.name, "results") if inputs else None
            rpcs.append(Rpc(f"/{service.full_name}/{method.name}", request, response, inputs, results))
    return rpcs


RPCS = _rpcs()
RPC_IDS = [rpc.path.rsplit("/", 1)[1] for rpc in RPCS]


@pytest.fixture(scope="module")
def server(
    tiny_bundles: dict[str, Path],
    encoder_bundles: dict[str, Path],
    rerank_bundle: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[ServerProcess]:
    """This module's server, with every task and an API key (the shared `channel` fixture connects to it)."""
    log = tmp_path_factory.mktemp("grpc-fuzz") / "server.log"
    bundles = [*tiny_bundles.values(), *encoder_bundles.values(), rerank_bundle]
    with serving(bundles, log, {"BERTSERVE_API_KEY": API_KEY}) as process:
        yield process


def assert_serving(server: ServerProcess, channel: grpc.Channel) -> None:
    """A normal call succeeds, the process is up, and nothing was logged as an unexpected error."""
    raw = channel.unary_unary("/bert.v1.Classifier/Classify")
    request = pb.ClassifyRequest(inputs=[pb.TextInput(text="still serving")])
    response = pb.ClassifyResponse.FromString(raw(request.SerializeToString(), timeout=10, metadata=AUTH))
    assert len(response.results) == 1
    assert server.process.poll() is None
    logs = server.logs()
    assert "Traceback" not in logs and "unexpected error" not in logs, logs[-3000:]


# ---- one call, judged --------------------------------------------------------------------------------
def call_raw(channel: grpc.Channel, rpc: Rpc, payload: bytes, metadata: Any = AUTH) -> tuple[grpc.StatusCode, Any]:
    """Send `payload` as the request bytes; (status, response message or details)."""
    raw = channel.unary_unary(rpc.path, request_serializer=None, response_deserializer=None)
    try:
        return grpc.StatusCode.OK, rpc.response.FromString(raw(payload, timeout=CALL_TIMEOUT_S, metadata=metadata))
    except grpc.RpcError as error:
        return error.code(), error.details() or ""


def expected_results(request: Any, rpc: Rpc) -> int:
    """One result per input; a ranking holds the best `top_n` passages when the request sets it."""
    count = len(getattr(request, rpc.inputs or ""))
    top_n = getattr(request, "top_n", 0) if isinstance(request, pb.RerankRequest) else 0
    return min(count, top_n) if top_n else count


def judge(channel: grpc.Channel, rpc: Rpc, payload: bytes) -> grpc.StatusCode:
    """The answer to `payload` is a well-formed response or a status that says what to change."""
    code, answer = call_raw(channel, rpc, payload)
    try:
        request = rpc.request.FromString(payload)
    except Exception:  # the server's protobuf must refuse it too
        request = None
    if code == grpc.StatusCode.OK:
        assert request is not None, f"{rpc.path} answered OK to bytes that do not parse: {payload[:80]!r}"
        if rpc.inputs and rpc.results:
            assert len(getattr(answer, rpc.results)) == expected_results(request, rpc), answer
        return code
    details = answer
    assert code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED), (code, details)
    assert details.strip(), f"{code} without a message"
    assert len(details.encode()) <= MAX_DETAILS_BYTES, f"{len(details)}-character message"
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        # too big a message, or more work than the server takes at once; never its own answer outgrowing the
        # caller's metadata limit ('received metadata size exceeds ...')
        assert "metadata" not in details, details
        assert len(payload) > MAX_BODY_BYTES or "larger than max" not in details, details
    if request is not None:
        assert "not a valid" not in details, f"the server could not parse what protobuf parses: {details}"
    return code


# ---- strategies from the descriptors -------------------------------------------------------------------
def short_texts() -> st.SearchStrategy[str]:
    return st.one_of(
        st.lists(st.sampled_from(WORDS), min_size=1, max_size=10).map(" ".join),
        st.text(max_size=24),  # any code point but surrogates: control characters, NUL, combining marks, ...
        st.sampled_from(["", " ", "\t\n", "\x00", "[MASK]", "[CLS] [SEP] [PAD] [UNK]", "%", "a%00b", "\u200b"]),
    )


def texts() -> st.SearchStrategy[str]:
    very_long = st.builds(
        lambda unit, n: unit * n,
        st.sampled_from(["word ", "é", "[MASK] ", "x", "北"]),
        st.one_of(st.sampled_from([70, 3_000, 12_000]), st.integers(1, 12_000)),  # past a window, 8 KiB, 64 KiB
    )
    return st.one_of(short_texts(), short_texts(), very_long)


UINT32 = st.one_of(st.integers(0, 70), st.sampled_from([2**31 - 1, 2**31, 2**32 - 1]), st.integers(0, 2**32 - 1))
NAMED = {
    "model": st.one_of(st.sampled_from(["", *MODELS, "nope"]), texts()),
    "targets": st.one_of(st.sampled_from(TARGETS), short_texts()),
}
"""Fields whose useful values are names the server knows."""


def scalar(field: FieldDescriptor) -> st.SearchStrategy[Any]:
    if field.name in NAMED:
        return NAMED[field.name]
    if field.type == FieldDescriptor.TYPE_STRING:
        return texts()
    if field.type == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if field.type == FieldDescriptor.TYPE_ENUM:
        known = st.sampled_from([value.number for value in field.enum_type.values])
        return st.one_of(known, st.integers(-(2**31), 2**31 - 1))
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        return messages(field.message_type)
    assert field.type == FieldDescriptor.TYPE_UINT32, f"no strategy for {field.full_name}"
    return UINT32


def value(field: FieldDescriptor) -> st.SearchStrategy[Any]:
    if not field.is_repeated:
        return scalar(field)
    # a few of anything, or many of one short value around the per-request limit (64 inputs)
    element = scalar(field)
    bulk = element if field.type == FieldDescriptor.TYPE_MESSAGE else short_texts()
    many = st.builds(lambda item, n: [item] * n, bulk, st.sampled_from([63, 64, 65, 300]))
    return st.one_of(st.lists(element, max_size=3), st.lists(element, max_size=3), many)


def messages(descriptor: Descriptor) -> st.SearchStrategy[Any]:
    """Messages of `descriptor`'s type: each field set or not (proto3 presence included), to any value."""
    message_class = getattr(pb, descriptor.name)
    fields = {field.name: value(field) for field in descriptor.fields}
    return st.fixed_dictionaries({}, optional=fields).map(lambda given: message_class(**given))


# Wire encodings a client library never sends (https://protobuf.dev/programming-guides/encoding/).
def varint(number: int) -> bytes:
    out = bytearray()
    while True:
        low, number = number & 0x7F, number >> 7
        out.append(low | (0x80 if number else 0))
        if not number:
            return bytes(out)


def entry(number: int, wire_type: int, payload: Any) -> bytes:
    tag = varint((number << 3) | wire_type)
    if wire_type == 0:
        return tag + varint(payload)
    if wire_type == 2:
        return tag + varint(len(payload)) + payload
    return tag + payload  # fixed64 / fixed32 bytes, or the raw rest of a group / an invalid wire type


def payloads(wire_type: int, field: FieldDescriptor | None, depth: int) -> st.SearchStrategy[Any]:
    if wire_type == 0:
        return st.one_of(st.integers(0, 2**64 - 1), st.sampled_from([2**64 - 1, 2**63, 2**32, 2**32 - 1]))
    if wire_type == 1:
        return st.binary(min_size=8, max_size=8)
    if wire_type == 5:
        return st.binary(min_size=4, max_size=4)
    if wire_type == 2:
        text = st.text(max_size=20).map(str.encode)
        options = [st.binary(max_size=24), text]  # random bytes are mostly invalid UTF-8
        if field is not None and field.type == FieldDescriptor.TYPE_MESSAGE and depth < 2:
            options.append(wire_messages(field.message_type, depth + 1))
        return st.one_of(*options)
    return st.binary(max_size=8)


def wire_entries(descriptor: Descriptor, depth: int) -> st.SearchStrategy[bytes]:
    fields = {field.number: field for field in descriptor.fields}
    unknown = st.integers(1, 2**29 - 1)
    numbers = st.one_of(st.sampled_from(sorted(fields)), unknown) if fields else unknown
    right_type = {
        number: 2 if field.type in (field.TYPE_STRING, field.TYPE_MESSAGE) or field.is_repeated else 0
        for number, field in fields.items()
    }

    def for_number(number: int) -> st.SearchStrategy[bytes]:
        wire_types = st.one_of(st.just(right_type.get(number, 0)), st.integers(0, 7))
        return wire_types.flatmap(
            lambda wire_type: payloads(wire_type, fields.get(number), depth).map(
                lambda payload: entry(number, wire_type, payload)
            )
        )

    return numbers.flatmap(for_number)


def wire_messages(descriptor: Descriptor, depth: int = 0) -> st.SearchStrategy[bytes]:
    return st.lists(wire_entries(descriptor, depth), max_size=6).map(b"".join)


def mutate(data: bytes, position: int, junk: bytes, how: str) -> bytes:
    at = position % (len(data) + 1)
    if how == "truncate":
        return data[:at]
    if how == "flip" and data:
        at = min(at, len(data) - 1)
        return data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1 :]
    if how == "insert":
        return data[:at] + junk + data[at:]
    return data + junk


def raw_requests(rpc: Rpc) -> st.SearchStrategy[bytes]:
    """Bytes a hostile client sends as `rpc`'s request."""
    descriptor = rpc.request.DESCRIPTOR
    mutated = st.builds(
        mutate,
        messages(descriptor).map(lambda message: message.SerializeToString()),
        st.integers(0, 2**16),
        st.binary(min_size=1, max_size=12),
        st.sampled_from(["truncate", "flip", "insert", "append"]),
    )
    return st.one_of(wire_messages(descriptor), mutated, st.binary(max_size=200))


# Requests valid by the contract (the .proto's comments and the documented limits): each must be answered.
def _non_blank(max_size: int) -> st.SearchStrategy[str]:
    return st.one_of(
        st.lists(st.sampled_from(WORDS[:9]), min_size=1, max_size=max_size // 6).map(" ".join),
        st.text(min_size=1, max_size=max_size).filter(str.strip),
    )


def _masked() -> st.SearchStrategy[str]:
    side = st.text(st.characters(codec="utf-8", exclude_characters="[]"), max_size=16)
    return st.builds(lambda before, after: f"{before} [MASK] {after}", side, side)


def _inputs(element: st.SearchStrategy[Any]) -> st.SearchStrategy[list[Any]]:
    return st.lists(element, min_size=1, max_size=5)


def _options(**fields: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries({}, optional=fields)


TRUNCATE = st.booleans()


def _classify() -> st.SearchStrategy[Any]:
    pairs = st.booleans().flatmap(
        lambda paired: _inputs(
            st.builds(pb.TextInput, text=_non_blank(40), text_pair=_non_blank(40))
            if paired
            else st.builds(pb.TextInput, text=_non_blank(60))
        )
    )
    options = _options(
        top_k=UINT32,
        model=st.sampled_from(["", "tiny-classify"]),
        truncate=st.just(True),
        function_to_apply=st.integers(0, 3),
    )
    return st.builds(lambda inputs, given: pb.ClassifyRequest(inputs=inputs, **given), pairs, options)


def _extract() -> st.SearchStrategy[Any]:
    inputs = _inputs(st.builds(pb.QAInput, question=_non_blank(20), context=_non_blank(300)))
    options = _options(
        top_k=st.integers(1, 20),
        max_answer_len=st.integers(1, 512),
        doc_stride=st.integers(0, 30),  # below the tiny model's context tokens per window (31)
        handle_impossible_answer=st.booleans(),
        model=st.sampled_from(["", "tiny-qa"]),
        truncate=st.just(True),
    )
    return st.builds(lambda inputs, given: pb.ExtractRequest(inputs=inputs, **given), inputs, options)


VALID: dict[str, Callable[[], st.SearchStrategy[Any]]] = {
    "Classify": _classify,
    "Extract": _extract,
    "Recognize": lambda: st.builds(
        lambda texts, given: pb.RecognizeRequest(texts=texts, **given),
        _inputs(_non_blank(80)),
        _options(aggregation_strategy=st.integers(0, 5), model=st.sampled_from(["", "tiny-ner"]), truncate=TRUNCATE),
    ),
    "Embed": lambda: st.builds(
        lambda texts, given: pb.EmbedRequest(texts=texts, **given),
        _inputs(_non_blank(80)),
        _options(
            normalize=st.booleans(), dimensions=st.integers(0, 32), model=st.just("tiny-embed"), truncate=TRUNCATE
        ),
    ),
    "EmbedAll": lambda: st.builds(
        lambda texts, given: pb.EmbedAllRequest(texts=texts, **given),
        _inputs(_non_blank(80)),
        _options(model=st.sampled_from(["", "tiny-embed"]), truncate=TRUNCATE),
    ),
    "Fill": lambda: st.builds(
        lambda texts, given: pb.FillRequest(texts=texts, **given),
        _inputs(_masked()),
        _options(
            top_k=st.integers(1, 100),
            targets=st.lists(st.sampled_from(TARGETS), max_size=3, unique=True),
            model=st.just("tiny-fill-mask"),
            truncate=st.just(True),
        ),
    ),
    "Rerank": lambda: st.builds(
        lambda query, texts, given: pb.RerankRequest(query=query, texts=texts, **given),
        _non_blank(40),
        _inputs(_non_blank(80)),
        _options(
            raw_scores=st.booleans(),
            return_text=st.booleans(),
            model=st.sampled_from(["", "tiny-rerank"]),
            truncate=st.just(True),
        ),
    ),
    "List": lambda: st.just(pb.ListModelsRequest()),
}


FUZZ = settings(
    max_examples=20,
    deadline=None,
    database=None,
    derandomize=True,  # the default suite runs the same examples every time; the slow run explores
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
)
FUZZ_LONG = settings(FUZZ, max_examples=1000, derandomize=False)


def _fuzz_messages(channel: grpc.Channel, rpc: Rpc, data: st.DataObject) -> None:
    judge(channel, rpc, data.draw(messages(rpc.request.DESCRIPTOR), label="request").SerializeToString())


def _fuzz_bytes(channel: grpc.Channel, rpc: Rpc, data: st.DataObject) -> None:
    judge(channel, rpc, data.draw(raw_requests(rpc), label="bytes"))


def _answer_valid(channel: grpc.Channel, rpc: Rpc, data: st.DataObject) -> None:
    request = data.draw(VALID[rpc.path.rsplit("/", 1)[1]](), label="request")
    code, answer = call_raw(channel, rpc, request.SerializeToString())
    assert code == grpc.StatusCode.OK, f"a valid {type(request).__name__} was refused: {code} {answer}"
    if rpc.inputs and rpc.results:
        assert len(getattr(answer, rpc.results)) == expected_results(request, rpc)
    else:
        assert sorted(model.name for model in answer.models) == sorted(MODELS)


@pytest.mark.parametrize("rpc", RPCS, ids=RPC_IDS)
@FUZZ
@given(data=st.data())
def test_fuzzed_messages_get_an_answer_or_a_reason(channel: grpc.Channel, rpc: Rpc, data: st.DataObject) -> None:
    _fuzz_messages(channel, rpc, data)


@pytest.mark.parametrize("rpc", RPCS, ids=RPC_IDS)
@FUZZ
@given(data=st.data())
def test_fuzzed_bytes_get_an_answer_or_a_reason(channel: grpc.Channel, rpc: Rpc, data: st.DataObject) -> None:
    _fuzz_bytes(channel, rpc, data)


@pytest.mark.parametrize("rpc", RPCS, ids=RPC_IDS)
@FUZZ
@given(data=st.data())
def test_valid_requests_are_answered(channel: grpc.Channel, rpc: Rpc, data: st.DataObject) -> None:
    _answer_valid(channel, rpc, data)


@pytest.mark.slow
@pytest.mark.parametrize("rpc", RPCS, ids=RPC_IDS)
@FUZZ_LONG
@given(data=st.data())
def test_long_fuzz(channel: grpc.Channel, rpc: Rpc, data: st.DataObject) -> None:
    check = data.draw(st.sampled_from([_fuzz_messages, _fuzz_bytes, _answer_valid]), label="check")
    check(channel, rpc, data)


BASE: dict[str, Any] = {
    "Classify": pb.ClassifyRequest(inputs=[pb.TextInput(text="a fine film", text_pair="it was")]),
    "Extract": pb.ExtractRequest(inputs=[pb.QAInput(question="who?", context="Ada wrote it.")]),
    "Recognize": pb.RecognizeRequest(texts=["Ada went to London."]),
    "Embed": pb.EmbedRequest(texts=["a sentence"]),
    "EmbedAll": pb.EmbedAllRequest(texts=["a sentence"]),
    "Fill": pb.FillRequest(texts=["a [MASK] film"], targets=["good"]),
    "Rerank": pb.RerankRequest(query="which film?", texts=["a fine film", "a river"]),
    "List": pb.ListModelsRequest(),
}
"""A valid request per method, whose fields the tests below replace one at a time."""


def string_fields(message: Any) -> Iterator[tuple[Any, str]]:
    """(holder, field name) of every string field in `message`, the first element of nested messages included."""
    for field in message.DESCRIPTOR.fields:
        if field.type == FieldDescriptor.TYPE_STRING:
            yield message, field.name
        elif field.type == FieldDescriptor.TYPE_MESSAGE and field.is_repeated and getattr(message, field.name):
            yield from string_fields(getattr(message, field.name)[0])


LONG_VALUES = {"é x 20,000": "é" * 20_000, "1.9 MB": "x" * 1_900_000}


@pytest.mark.parametrize("rpc", RPCS, ids=RPC_IDS)
def test_very_long_strings_in_every_field(server: ServerProcess, channel: grpc.Channel, rpc: Rpc) -> None:
    base = BASE[rpc.path.rsplit("/", 1)[1]]
    count = len(list(string_fields(base)))
    for long in LONG_VALUES.values():
        for index in range(count):  # the index-th string field set to `long`, the others as in `base`
            request = type(base)()
            request.CopyFrom(base)
            holder, name = list(string_fields(request))[index]
            if holder.DESCRIPTOR.fields_by_name[name].is_repeated:
                getattr(holder, name)[0] = long
            else:
                setattr(holder, name, long)
            judge(channel, rpc, request.SerializeToString())
    assert_serving(server, channel)


def test_server_serves_after_the_fuzz(server: ServerProcess, channel: grpc.Channel) -> None:
    assert_serving(server, channel)


@pytest.mark.parametrize("unit", ["m", "é", "%", "北", "\x00"])
def test_status_details_fit_the_wire_limit(unit: str) -> None:
    from urllib.parse import quote

    def wire(text: str) -> int:  # grpc-message's percent-encoding: printable ASCII but '%' stays as it is
        return len(quote(text, safe="".join(chr(c) for c in range(0x20, 0x7F) if chr(c) != "%")))

    assert status_details("unknown model 'x'") == "unknown model 'x'"
    message = f"unknown model {unit * 100_000!r}; loaded: tiny-classify (classify), tiny-qa (qa)"
    details = status_details(message)
    assert wire(details) <= MAX_DETAILS_BYTES < wire(message)
    assert details.startswith("unknown model '") and details.endswith("loaded: tiny-classify (classify), tiny-qa (qa)")
    parts = re.fullmatch(r"(.*) \.\.\. \[(\d+) characters cut\] \.\.\. (.*)", details, re.DOTALL)
    assert parts is not None, details
    head, cut, tail = parts.groups()
    assert message.startswith(head) and message.endswith(tail) and len(head) + int(cut) + len(tail) == len(message)


# ---- fixed abuse ----------------------------------------------------------------------------------------
CLASSIFY = RPCS[0]
OK_REQUEST = pb.ClassifyRequest(inputs=[pb.TextInput(text="fine")]).SerializeToString()


def _code(call: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[grpc.StatusCode, str]:
    """The status of `call(*args, **kwargs)` (a response streamed back is read whole) and its details."""
    try:
        answer = call(*args, **kwargs)
        if isinstance(answer, Iterator):
            list(answer)
    except grpc.RpcError as error:
        return error.code(), error.details() or ""
    return grpc.StatusCode.OK, ""


def test_unknown_methods_and_the_api_key(server: ServerProcess, channel: grpc.Channel) -> None:
    unknown = ["/bert.v1.Classifier/Nope", "/bert.v9.Classifier/Classify", "/no.Such/Service", "not-a-path", "/"]
    for path in unknown:
        raw = channel.unary_unary(path)
        assert _code(raw, b"", timeout=10, metadata=AUTH)[0] == grpc.StatusCode.UNIMPLEMENTED, path
        # without the key nothing is said about what exists
        assert _code(raw, b"", timeout=10)[0] == grpc.StatusCode.UNAUTHENTICATED, path
    keys: list[Any] = [
        (),
        (("authorization", "Bearer wrong"),),
        (("authorization", API_KEY),),
        (("authorization", f"Basic {API_KEY}"),),
        (("authorization-bin", f"Bearer {API_KEY}".encode()),),
        (("authorization", "Bearer " + "k" * 8000),),
        (("x-api-key", API_KEY),),
    ]
    for metadata in keys:
        code, details = call_raw(channel, CLASSIFY, OK_REQUEST, metadata)
        assert code == grpc.StatusCode.UNAUTHENTICATED and "API key" in details, (metadata, code, details)
    for scheme in ("bearer", "BEARER", "Bearer"):  # the scheme in any case, as over REST (RFC 9110 section 11.1)
        assert (
            call_raw(channel, CLASSIFY, OK_REQUEST, (("authorization", f"{scheme} {API_KEY}"),))[0]
            == grpc.StatusCode.OK
        )
    assert call_raw(channel, CLASSIFY, b"\xff\xff", ())[0] == grpc.StatusCode.UNAUTHENTICATED  # before parsing
    health = health_pb2_grpc.HealthStub(channel)  # public, and strict about its own messages
    assert health.Check(health_pb2.HealthCheckRequest(), timeout=10).status == health_pb2.HealthCheckResponse.SERVING
    garbage = [
        (channel.unary_unary("/grpc.health.v1.Health/Check"), b"\xff\xff"),
        (channel.unary_stream("/grpc.health.v1.Health/Watch"), b"\xff\xff"),
        (channel.stream_stream("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"), iter([b"\xff\xff"])),
    ]
    for call, request in garbage:
        code, details = _code(call, request, timeout=10)
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "not a valid" in details, (code, details)
    assert_serving(server, channel)


def test_metadata_floods(server: ServerProcess, channel: grpc.Channel) -> None:
    accepted: list[Any] = [
        [(f"x-k{i}", "v") for i in range(150)],
        [("x-big", "v" * 12_000)],  # between grpc's soft and hard defaults: accepted every time
        [("x-blob-bin", bytes(range(256)) * 20)],
        [("x-blob-bin", b"")],
        [("x-dup", "a")] * 100,
        [("x-odd", "a % b ~")],
    ]
    for metadata in accepted:
        for _ in range(5):
            code, details = call_raw(channel, CLASSIFY, OK_REQUEST, (*AUTH, *metadata))
            assert code == grpc.StatusCode.OK, (metadata[0][0], len(metadata), code, details)
    refused: list[Any] = [
        [("x-big", "v" * 17_000)],
        [("x-huge", "v" * 1_000_000)],
        [(f"x-k{i}", "v") for i in range(1000)],
    ]
    for metadata in refused:
        for _ in range(3):
            code, _ = call_raw(channel, CLASSIFY, OK_REQUEST, (*AUTH, *metadata))
            assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, (metadata[0][0], len(metadata), code)
    assert_serving(server, channel)


def test_oversize_compressed_and_echoed_values(server: ServerProcess, channel: grpc.Channel) -> None:
    over = pb.ClassifyRequest(inputs=[pb.TextInput(text="w" * 700_000)] * 3).SerializeToString()
    code, details = call_raw(channel, CLASSIFY, over)
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "larger than max" in details, (code, details)
    raw = channel.unary_unary(CLASSIFY.path)
    bomb = pb.ClassifyRequest(inputs=[pb.TextInput(text="word " * 19_000)] * 64).SerializeToString()
    assert len(gzip.compress(bomb)) < MAX_BODY_BYTES < len(bomb)
    code, details = _code(raw, bomb, timeout=30, metadata=AUTH, compression=grpc.Compression.Gzip)
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "larger than max" in details, (code, details)
    assert _code(raw, OK_REQUEST, timeout=10, metadata=AUTH, compression=grpc.Compression.Gzip)[0].name == "OK"
    # values the error message quotes back: capped, still saying what to change and what exists
    name = pb.ClassifyRequest(inputs=[pb.TextInput(text="x")], model="m" * 1_900_000).SerializeToString()
    code, details = call_raw(channel, CLASSIFY, name)
    assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, details[:200])
    assert details.startswith("unknown model 'mmm") and "characters cut" in details and "tiny-classify" in details
    fill = next(rpc for rpc in RPCS if rpc.path.endswith("/Fill"))
    target = pb.FillRequest(texts=["a [MASK] b"], targets=["w0 " * 5000]).SerializeToString()
    code, details = call_raw(channel, fill, target)
    # a target longer than any vocabulary token is refused by its length, without quoting it back
    assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, details[:200])
    assert details.startswith("targets[0] has 15000 characters, more than the limit of") and len(details) < 200
    assert_serving(server, channel)


def test_deadlines_and_message_counts(server: ServerProcess, channel: grpc.Channel) -> None:
    raw = channel.unary_unary(CLASSIFY.path)
    # a deadline far shorter than the work (64 long texts to tokenize): with a small request and a microsecond
    # deadline, a busy client's deadline timer can lose the race to the server's answer (seen: OK)
    heavy = pb.ClassifyRequest(inputs=[pb.TextInput(text="word " * 400)] * 64).SerializeToString()
    assert _code(raw, heavy, timeout=1e-3, metadata=AUTH)[0] == grpc.StatusCode.DEADLINE_EXCEEDED
    assert _code(raw, OK_REQUEST, timeout=10**9, metadata=AUTH)[0] == grpc.StatusCode.OK
    streamed = channel.stream_unary(CLASSIFY.path)
    start = time.monotonic()
    code, details = _code(streamed, iter([]), timeout=CALL_TIMEOUT_S, metadata=AUTH)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and time.monotonic() - start < 5, (code, details)
    assert _code(streamed, iter([OK_REQUEST] * 2), timeout=10, metadata=AUTH)[0] == grpc.StatusCode.OK
    check = channel.stream_unary("/grpc.health.v1.Health/Check")
    code, details = _code(check, iter([]), timeout=CALL_TIMEOUT_S)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "whole" in details, (code, details)
    assert_serving(server, channel)


# ---- raw HTTP/2 (h2): what no gRPC client library sends ---------------------------------------------------
def _frame(message: bytes, compressed: int = 0, length: int | None = None) -> bytes:
    return struct.pack(">BI", compressed, len(message) if length is None else length) + message


def h2_call(target: str, headers: list[tuple[str, str]], body: bytes, drop: tuple[str, ...] = ()) -> dict[str, Any]:
    """One HTTP/2 request to the gRPC port with `headers` added (or replacing), `drop` left out; the response
    headers and trailers, whether the stream was reset, and the seconds until the stream ended."""
    import h2.config
    import h2.connection
    import h2.events

    base = {":method": "POST", ":scheme": "http", ":path": CLASSIFY.path, ":authority": target}
    base |= {"content-type": "application/grpc", "te": "trailers", "authorization": AUTH[0][1]}
    base |= dict(headers)
    sent = [(name, value) for name, value in base.items() if name not in drop]
    config = h2.config.H2Configuration(client_side=True, validate_outbound_headers=False)
    connection = h2.connection.H2Connection(config)
    host, port = target.rsplit(":", 1)
    answer: dict[str, Any] = {"headers": {}, "reset": None, "ended": None}
    start = time.monotonic()
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        connection.initiate_connection()
        stream = connection.get_next_available_stream_id()
        connection.send_headers(stream, sent, end_stream=not body)
        if body:
            connection.send_data(stream, body, end_stream=True)
        sock.sendall(connection.data_to_send())
        while answer["ended"] is None:
            data = sock.recv(65536)
            if not data:
                break
            for event in connection.receive_data(data):
                if isinstance(event, h2.events.ResponseReceived | h2.events.TrailersReceived):
                    answer["headers"].update({k.decode(): v.decode() for k, v in event.headers})
                if isinstance(event, h2.events.StreamReset):
                    answer["reset"] = event.error_code
                if isinstance(event, h2.events.StreamEnded | h2.events.StreamReset | h2.events.ConnectionTerminated):
                    answer["ended"] = time.monotonic() - start
            sock.sendall(connection.data_to_send())
    return answer


H2_INVALID_ARGUMENT: dict[str, tuple[list[tuple[str, str]], bytes]] = {
    "no message": ([], b""),
    "a length prefix cut short": ([], b"\x00\x00\x00"),
    "a message shorter than its prefix says": ([], _frame(OK_REQUEST, length=len(OK_REQUEST) + 50)),
    "a body that is not protobuf": ([], _frame(b"\xff\xfe\xfd\xfc")),
}
H2_GRPC_CORE = {
    # answered by grpc's C core before any Python code runs (its HPACK parser / decompression filter), with
    # INTERNAL and a message naming the header: promptly, and the server serves on
    "grpc-timeout 'soon'": ([("grpc-timeout", "soon")], _frame(OK_REQUEST), "grpc-timeout"),
    "grpc-timeout '-1S'": ([("grpc-timeout", "-1S")], _frame(OK_REQUEST), "grpc-timeout"),
    "grpc-timeout '1.5S'": ([("grpc-timeout", "1.5S")], _frame(OK_REQUEST), "grpc-timeout"),
    "grpc-encoding 'zip9'": ([("grpc-encoding", "zip9")], _frame(OK_REQUEST, compressed=1), "grpc-encoding"),
    "a compressed flag without grpc-encoding": ([], _frame(OK_REQUEST, compressed=1), "ompression"),
    "gzip that is not gzip": ([("grpc-encoding", "gzip")], _frame(b"not gzip", compressed=1), "ecompression"),
}


def test_raw_http2_frames(server: ServerProcess, channel: grpc.Channel) -> None:
    pytest.importorskip("h2", reason="raw HTTP/2 needs h2 (the dev extra)")
    target = server.grpc_target
    for name, (headers, body) in H2_INVALID_ARGUMENT.items():
        answer = h2_call(target, headers, body)
        assert answer["headers"].get("grpc-status") == "3", (name, answer)
        assert answer["ended"] is not None and answer["ended"] < 5, (name, answer)
    for name, (headers, body, needle) in H2_GRPC_CORE.items():
        answer = h2_call(target, headers, body)
        assert answer["ended"] is not None and answer["ended"] < 5, (name, answer)
        assert answer["headers"].get("grpc-status") == "13" and needle in answer["headers"].get("grpc-message", "")
    for name, value in [
        ("grpc-timeout", "99999999H"),
        ("grpc-timeout", "100m"),
        ("content-type", "application/grpc+proto"),
    ]:
        answer = h2_call(target, [(name, value)], _frame(OK_REQUEST))
        assert answer["headers"].get("grpc-status") == "0", (name, value, answer)
    answer = h2_call(target, [(":method", "GET")], _frame(OK_REQUEST))  # not gRPC at all: the stream is reset
    assert answer["reset"] is not None and answer["ended"] < 5, answer
    answer = h2_call(target, [], _frame(OK_REQUEST), drop=("te",))
    assert answer["reset"] is not None and answer["ended"] < 5, answer
    assert_serving(server, channel)
