"""What the hostile profile sends: distinct-value sweeps of every numeric request option, maximum-size legal
requests, small /classify requests, and malformed requests (bodies, HTTP, protobuf).

The numeric options are those of the REST bodies (service/http_api/schemas.py, service/http_api/encoder_schemas.py),
the gRPC messages (proto/bert/v1/bert.proto) and the caller's deadline (`x-request-timeout-ms`, gRPC timeouts):
`/classify top_k`, `/qa doc_stride top_k max_answer_len`, `/embed` and `/v1/embeddings dimensions`, `/fill-mask
top_k`, and their gRPC fields. Each sweep sends `count` consecutive values from the option's smallest, legal or
not (values past a bound must be refused as cheaply as legal ones are served); unknown model names, distinct
request ids and distinct gRPC metadata keys ride along, since any of them could key server state.
Maximum-size requests fill the server's limits (`max_inputs_per_request`, `max_text_chars`, `max_body_bytes`,
`max_queue`: as the server's OpenAPI schema states them, else the defaults of `bertserve serve` unless told
otherwise) without passing them. A QA or NER input needs one model row per window, and one request may need at
most the model's queue (`max_queue`) of rows: the largest legal request of those tasks is sized by the server's
own count of the windows of a request over that bound (`size_windowed`), which it must refuse with a 4xx.
"""

from __future__ import annotations

import json
import math
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from loadtests.hostile.net import GrpcRequest, RestRequest
from loadtests.payloads import Payloads
from proto.stubs import load_stubs

pb, _ = load_stubs()

CLASSIFY = "/bert.v1.Classifier/Classify"
EXTRACT = "/bert.v1.QA/Extract"
RECOGNIZE = "/bert.v1.NER/Recognize"
EMBED = "/bert.v1.Embedder/Embed"
FILL = "/bert.v1.FillMask/Fill"
MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"
MASK = "[MASK]"
CHARS_PER_TOKEN = 4
"""Rough characters per WordPiece token of English text: sizes a QA context to a number of windows."""


@dataclass(frozen=True)
class ModelInfo:
    """What GET /models says of a task's default model."""

    name: str
    task: str
    max_seq_length: int


@dataclass(frozen=True)
class Limits:
    """The server's input limits the maximum-size requests fill."""

    max_inputs: int = 64
    max_text_chars: int = 100_000
    max_body_bytes: int = 2_000_000
    max_queue: int = 512
    """Model rows (QA / NER windows) one request may need: the model's queue."""
    max_header_bytes: int = 32_768
    """The largest request head (request line and headers)."""


Request = RestRequest | GrpcRequest


@dataclass(frozen=True)
class Sweep:
    """`count` requests to one option, the i-th with the option's i-th distinct value."""

    name: str
    protocol: str
    build: Callable[[int], Request]
    count: int


@dataclass
class Texts:
    """The texts requests are made of: real sentences and QA pairs from the payloads."""

    sentences: list[str]
    qa: list[tuple[str, str]]
    rng: random.Random = field(default_factory=lambda: random.Random(0))

    @classmethod
    def from_payloads(cls, payloads: Payloads, seed: int) -> Texts:
        return cls(list(payloads.classify), list(payloads.qa), random.Random(seed))

    def sentence(self, index: int) -> str:
        return self.sentences[index % len(self.sentences)]

    def filler(self, chars: int, offset: int = 0) -> str:
        """Exactly `chars` characters of running text (sentences and contexts joined), not ending in a space."""
        pieces = [*self.sentences, *(context for _, context in self.qa)]
        parts: list[str] = []
        size, index = 0, offset
        while size < chars:
            parts.append(pieces[index % len(pieces)])
            size += len(parts[-1]) + 1
            index += 1
        text = " ".join(parts)[:chars]
        return text[:-1] + "x" if text[-1:].isspace() else text

    def qa_pair(self, context_tokens: int) -> tuple[str, str]:
        """A real question and its context grown (with the following text) to about `context_tokens` tokens."""
        question, context = self.qa[0]
        wanted = context_tokens * CHARS_PER_TOKEN
        return question, context if len(context) >= wanted else context + " " + self.filler(wanted - len(context))


def _json(body: dict[str, Any]) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()


def _rest(name: str, path: str, body: dict[str, Any], headers: tuple[tuple[str, str], ...] = ()) -> RestRequest:
    return RestRequest(name, path, _json(body), headers)


# ---- distinct values ---------------------------------------------------------------------------------------
def rest_sweeps(models: dict[str, ModelInfo], texts: Texts, count: int) -> list[Sweep]:
    """REST sweeps for the tasks the server serves."""
    sweeps: list[Sweep] = []
    sentence = texts.sentence(0)
    if "classify" in models:
        sweeps += [
            Sweep("/classify top_k", "rest", lambda i: _rest("/classify top_k", "/classify",
                  {"inputs": sentence, "top_k": 1 + i}), count),
            Sweep("/classify model", "rest", lambda i: _rest("/classify model", "/classify",
                  {"inputs": sentence, "model": f"hostile-model-{i}"}), count),
            Sweep("/classify x-request-timeout-ms", "rest", lambda i: _rest("/classify x-request-timeout-ms",
                  "/classify", {"inputs": sentence},
                  (("x-request-timeout-ms", str(5000 + 3 * i)), ("x-request-id", f"hostile-{i:06d}"))), count),
        ]  # fmt: skip
    if "qa" in models:
        question, context = texts.qa_pair(int(models["qa"].max_seq_length * 1.2))
        for option, first in (("doc_stride", 0), ("top_k", 1), ("max_answer_len", 1)):
            name = f"/qa {option}"
            sweeps.append(Sweep(name, "rest", _qa_builder(name, question, context, option, first), count))
    if "embed" in models:
        for path, key in (("/embed", "inputs"), ("/v1/embeddings", "input")):
            name = f"{path} dimensions"
            sweeps.append(Sweep(name, "rest", _embed_builder(name, path, key, sentence), count))
    if "fill-mask" in models:
        masked = f"the film was {MASK} from start to end."
        sweeps.append(Sweep("/fill-mask top_k", "rest", lambda i: _rest("/fill-mask top_k", "/fill-mask",
                            {"inputs": masked, "top_k": 1 + i}), count))  # fmt: skip
    return sweeps + _other_api_sweeps(models, sentence, count)


def _other_api_sweeps(models: dict[str, ModelInfo], sentence: str, count: int) -> list[Sweep]:
    """The shapes of the other APIs the server speaks (Hugging Face's, TEI's, the Open Inference Protocol's),
    each with a new value of a name or an option per request."""
    sweeps = [
        Sweep("/models/<name>", "rest", lambda i: _rest("/models/<name>", f"/models/hostile-{i}",
              {"inputs": sentence, "parameters": {}}), count),
        Sweep("/tokenize inputs", "rest", lambda i: _rest("/tokenize inputs", "/tokenize",
              {"inputs": f"{sentence} {i}"}), count),
        Sweep("/v2 model name", "rest", lambda i: _rest("/v2 model name", f"/v2/models/hostile-{i}/infer",
              {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": [sentence]}]}), count),
    ]  # fmt: skip
    if "classify" in models:
        name = models["classify"].name
        sweeps += [
            Sweep("/models/<name> parameter", "rest", lambda i: _rest("/models/<name> parameter", f"/models/{name}",
                  {"inputs": sentence, "parameters": {f"hostile_{i}": i}}), count),
            Sweep("/v2 infer id", "rest", lambda i: _rest("/v2 infer id", f"/v2/models/{name}/infer", {"id": f"h-{i}",
                  "inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": [sentence]}]}), count),
        ]  # fmt: skip
    return sweeps


def _qa_builder(name: str, question: str, context: str, option: str, first: int) -> Callable[[int], Request]:
    return lambda i: _rest(name, "/qa", {"question": question, "context": context, option: first + i})


def _embed_builder(name: str, path: str, key: str, sentence: str) -> Callable[[int], Request]:
    return lambda i: _rest(name, path, {key: sentence, "dimensions": 1 + i})


def grpc_sweeps(models: dict[str, ModelInfo], texts: Texts, count: int) -> list[Sweep]:
    """gRPC sweeps for the tasks the server serves (uint32 fields: 0 is a value too)."""
    sweeps: list[Sweep] = []
    sentence = texts.sentence(0)
    one = [pb.TextInput(text=sentence)]
    if "classify" in models:
        sweeps += [
            Sweep("Classify top_k", "grpc", lambda i: GrpcRequest("Classify top_k", CLASSIFY,
                  pb.ClassifyRequest(inputs=one, top_k=i)), count),
            Sweep("Classify model", "grpc", lambda i: GrpcRequest("Classify model", CLASSIFY,
                  pb.ClassifyRequest(inputs=one, model=f"hostile-model-{i}")), count),
            Sweep("Classify deadline+metadata", "grpc", lambda i: GrpcRequest("Classify deadline+metadata",
                  CLASSIFY, pb.ClassifyRequest(inputs=one), 5.0 + 0.003 * i,
                  ((f"x-hostile-{i}", f"value-{i}"), ("x-request-id", f"hostile-{i:06d}"))), count),
        ]  # fmt: skip
    if "qa" in models:
        question, context = texts.qa_pair(int(models["qa"].max_seq_length * 1.2))
        pair = [pb.QAInput(question=question, context=context)]
        for option in ("top_k", "max_answer_len", "doc_stride"):
            name = f"Extract {option}"
            sweeps.append(Sweep(name, "grpc", _extract_builder(name, pair, option), count))
    if "embed" in models:
        sweeps.append(Sweep("Embed dimensions", "grpc", lambda i: GrpcRequest("Embed dimensions", EMBED,
                            pb.EmbedRequest(texts=[sentence], dimensions=i)), count))  # fmt: skip
    if "fill-mask" in models:
        masked = f"the film was {MASK} from start to end."
        sweeps.append(Sweep("Fill top_k", "grpc", lambda i: GrpcRequest("Fill top_k", FILL,
                            pb.FillRequest(texts=[masked], top_k=i)), count))  # fmt: skip
    return sweeps


def _extract_builder(name: str, pair: list[Any], option: str) -> Callable[[int], Request]:
    return lambda i: GrpcRequest(name, EXTRACT, pb.ExtractRequest(inputs=pair, **{option: i}))


def warmup_requests(models: dict[str, ModelInfo], texts: Texts, grpc: bool) -> list[Request]:
    """One request of each kind the sweeps send, with the option left to its default."""
    sentence = texts.sentence(0)
    requests: list[Request] = []
    if "classify" in models:
        requests.append(_rest("warm-up /classify", "/classify", {"inputs": sentence}))
    if "qa" in models:
        question, context = texts.qa_pair(int(models["qa"].max_seq_length * 1.2))
        requests.append(_rest("warm-up /qa", "/qa", {"question": question, "context": context}))
    if "ner" in models:
        requests.append(_rest("warm-up /ner", "/ner", {"inputs": sentence}))
    if "embed" in models:
        requests += [_rest("warm-up /embed", "/embed", {"inputs": sentence}),
                     _rest("warm-up /embed_all", "/embed_all", {"inputs": sentence}),
                     _rest("warm-up /v1/embeddings", "/v1/embeddings", {"input": sentence})]  # fmt: skip
    if grpc and "classify" in models:
        requests.append(
            GrpcRequest("warm-up Classify", CLASSIFY, pb.ClassifyRequest(inputs=[pb.TextInput(text=sentence)]))
        )
    return requests


def small_classify(texts: Texts, index: int) -> RestRequest:
    """The small request whose latency the profile watches: one real sentence to /classify."""
    return _rest("small /classify", "/classify", {"inputs": texts.sentence(index)})


# ---- maximum size ------------------------------------------------------------------------------------------
WINDOWED = ("qa", "ner")
"""Tasks whose inputs need one model row per window of the model's length (the others: one row per input)."""
QUEUE_REFUSAL = re.compile(r"needs (\d+) (?:sequences|windows)\b.*?queue holds \((\d+)\b")
"""The server's refusal of a request that needs more model rows than the model's queue holds
(`service.engine.batcher.Batcher.reserve`, `service.engine.pipelines`' window plans): the rows
(sequences, or windows of a QA / NER request) the request needs, and the queue's size."""
ESTIMATE_CHARS_PER_TOKEN = 3
"""Characters per token when the server does not say how many windows a request needs: fewer than English text
has (about 4), so that the estimate errs towards more windows, i.e. a smaller request."""


def _fit_texts(texts: Texts, count: int, limits: Limits, overhead: int) -> list[str]:
    """`count` distinct texts, each at most max_text_chars, that together fill the body budget."""
    budget = int(limits.max_body_bytes * 0.97) - overhead
    chars = max(1, min(limits.max_text_chars, budget // max(count, 1) - 8))
    return [texts.filler(chars, offset=i) for i in range(count)]


def _windowed_input(task: str, texts: Texts, chars: int) -> Any:
    """One longest input of a windowed task: a QA pair (a real question, a context of `chars`) or a NER text."""
    return {"question": texts.qa[0][0], "context": texts.filler(chars)} if task == "qa" else texts.filler(chars)


def longest_input_count(task: str, texts: Texts, limits: Limits, chars: int) -> int:
    """How many copies of one longest input (`chars` characters) one request holds within max_inputs and the
    body limit (the JSON as sent: escapes counted)."""
    one = len(_json(_windowed_input(task, texts, chars))) + 1
    return max(1, min(limits.max_inputs, (int(limits.max_body_bytes * 0.97) - 64) // one))


def windowed_request(task: str, name: str, texts: Texts, count: int, chars: int) -> RestRequest:
    """`count` copies of one longest input (identical, so the windows of the request are `count` times one's)."""
    path = "/qa" if task == "qa" else "/ner"
    return _rest(name, path, {"inputs": [_windowed_input(task, texts, chars)] * count})


def windowed_name(task: str, kind: str, count: int) -> str:
    """`over /qa 19 longest contexts`, `max /ner 3 longest texts`."""
    what = "context" if task == "qa" else "text"
    return f"{kind} /{task} {count} longest {what}{'' if count == 1 else 's'}"


def extract_request(name: str, texts: Texts, count: int, chars: int) -> GrpcRequest:
    """The gRPC counterpart of `windowed_request("qa", ...)`."""
    pair = pb.QAInput(question=texts.qa[0][0], context=texts.filler(chars))
    return GrpcRequest(name, EXTRACT, pb.ExtractRequest(inputs=[pair] * count))


@dataclass(frozen=True)
class Windowed:
    """How the largest legal request of a windowed task was sized, from a request over the bound."""

    task: str
    over_inputs: int
    """Longest inputs in the request sent over the bound (as many as max_inputs and the body limit allow)."""
    over_chars: int
    """Characters of each of them (max_text_chars)."""
    over_status: str
    needed: int | None
    """Model rows the server said that request needs (None: it did not say)."""
    max_queue: int
    """Rows one request may need: the server's word, else `Limits.max_queue`."""
    windows_per_input: int
    source: str
    """`server` (from its refusal), `estimate` (it did not say: `estimate_windows`), or `accepted` (it took the
    request over what was thought the bound: that request is legal, and the largest one sent)."""
    legal_inputs: int
    input_chars: int
    """Characters of each input of the legal request (max_text_chars unless one input alone needs more rows than
    the queue holds)."""

    @property
    def legal_windows(self) -> int:
        return self.legal_inputs * self.windows_per_input


def estimate_windows(task: str, chars: int, max_seq_length: int, question_chars: int = 0) -> int:
    """An upper estimate of the windows of one input: tokens at ESTIMATE_CHARS_PER_TOKEN, windows overlapping by
    half their context room (more overlap than the servers' defaults)."""
    tokens = math.ceil(chars / ESTIMATE_CHARS_PER_TOKEN)
    question = math.ceil(question_chars / ESTIMATE_CHARS_PER_TOKEN) if task == "qa" else 0
    room = max(16, max_seq_length - question - 3)
    return 1 if tokens <= room else 1 + math.ceil((tokens - room) / max(1, room // 2))


def size_windowed(
    task: str, over_inputs: int, status: str, detail: str, limits: Limits, chars: int, estimate: int
) -> Windowed:
    """The largest legal request of `task` from the answer (`status`, `detail`) to `over_inputs` longest inputs
    of `chars` characters each: as many of them as the queue's rows allow; `estimate` = windows of one input when
    the answer does not say."""
    taken = Windowed(task, over_inputs, chars, status, None, limits.max_queue, estimate, "accepted", over_inputs, chars)
    if status in ("200", "OK"):
        return taken
    found = QUEUE_REFUSAL.search(detail)
    if found:
        needed, queue = int(found.group(1)), int(found.group(2))
        refused = replace(taken, needed=needed, max_queue=queue, source="server",
                          windows_per_input=max(1, math.ceil(needed / over_inputs)))  # fmt: skip
    else:
        refused = replace(taken, source="estimate")
    legal = min(over_inputs, refused.max_queue // refused.windows_per_input)
    if legal >= 1:
        return replace(refused, legal_inputs=legal)
    # one longest input alone needs more rows than the queue holds: one shorter input, with a margin
    shorter = max(1, int(chars * refused.max_queue / refused.windows_per_input * 0.8))
    return replace(refused, windows_per_input=refused.max_queue, legal_inputs=1, input_chars=shorter)


def max_size_requests(
    models: dict[str, ModelInfo], texts: Texts, limits: Limits, grpc: bool, windowed: dict[str, Windowed]
) -> list[Request]:
    """The largest legal request of each kind the server serves: bodies and messages under max_body_bytes, at most
    max_inputs inputs of at most max_text_chars each, and QA / NER requests of at most the queue's windows
    (`windowed`, sized by `size_windowed`)."""
    n = limits.max_inputs
    requests: list[Request] = []
    for task, sized in windowed.items():
        name = windowed_name(task, "max", sized.legal_inputs)
        requests.append(windowed_request(task, name, texts, sized.legal_inputs, sized.input_chars))
        if grpc and task == "qa":
            name = f"max Extract {sized.legal_inputs} longest context{'' if sized.legal_inputs == 1 else 's'}"
            requests.append(extract_request(name, texts, sized.legal_inputs, sized.input_chars))
    for task, path, key in (
        ("classify", "/classify", "inputs"),
        ("embed", "/embed", "inputs"),
        ("embed", "/embed_all", "inputs"),
    ):
        if task in models:
            requests.append(_rest(f"max {path} {n} inputs", path, {key: _fit_texts(texts, n, limits, 64)}))
    if "fill-mask" in models:
        masked = [f"{MASK} {text}" for text in _fit_texts(texts, n, limits, 64 + 10 * n)]
        requests.append(_rest(f"max /fill-mask {n} inputs", "/fill-mask", {"inputs": masked}))
    if grpc and "classify" in models:
        inputs = [pb.TextInput(text=text) for text in _fit_texts(texts, n, limits, 64 + 8 * n)]
        requests.append(GrpcRequest(f"max Classify {n} inputs", CLASSIFY, pb.ClassifyRequest(inputs=inputs)))
    return requests


def flood_request(texts: Texts) -> tuple[str, bytes]:
    """The flood's request: POST /classify with 64 real sentences."""
    return "/classify", _json({"inputs": [texts.sentence(i) for i in range(64)]})


# ---- malformed ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Malformed:
    """A malformed request and the status classes a sound server may answer it with."""

    name: str
    request: RestRequest | GrpcRequest | bytes
    """A REST call with a bad body, a gRPC call (typed or raw bytes), or raw bytes for one TCP connection."""
    allowed: frozenset[str] = frozenset({"client-error"})


def _m(name: str, request: RestRequest | GrpcRequest | bytes, *allowed: str) -> Malformed:
    return Malformed(name, request, frozenset(allowed or ("client-error",)))


def _raw_rest(
    name: str, body: bytes, path: str = "/classify", headers: tuple[tuple[str, str], ...] = ()
) -> RestRequest:
    return RestRequest(name, path, body, headers)


def malformed_rest(models: dict[str, ModelInfo], limits: Limits) -> list[Malformed]:
    """Bad bodies and headers over a well-formed HTTP exchange."""
    deep = 100_000
    cases = [
        _m("body not JSON", _raw_rest("body not JSON", b"{not json")),
        _m("empty body", _raw_rest("empty body", b"")),
        _m("truncated JSON", _raw_rest("truncated JSON", b'{"inputs": "a good fil')),
        _m("inputs a number", _rest("inputs a number", "/classify", {"inputs": 5})),
        _m("inputs null", _rest("inputs null", "/classify", {"inputs": None})),
        _m("top_k a string", _rest("top_k a string", "/classify", {"inputs": "fine", "top_k": "3"})),
        _m("top_k 10^30", _rest("top_k 10^30", "/classify", {"inputs": "fine", "top_k": 10**30}), "ok", "client-error"),
        _m("top_k NaN", _raw_rest("top_k NaN", b'{"inputs": "fine", "top_k": NaN}')),
        _m("top_k 1e400", _raw_rest("top_k 1e400", b'{"inputs": "fine", "top_k": 1e400}')),
        _m("inputs nested 100,000 deep", _raw_rest("inputs nested 100,000 deep",
           b'{"inputs": ' + b"[" * deep + b"]" * deep + b"}")),
        _m("invalid UTF-8", _raw_rest("invalid UTF-8", b'{"inputs": "\xff\xfe bad"}')),
        _m("lone surrogate", _raw_rest("lone surrogate", b'{"inputs": "\\ud800 lone"}'), "ok", "client-error"),
        _m("text/plain content type", _raw_rest("text/plain content type", b'{"inputs": "fine"}',
           headers=(("content-type", "text/plain"),)), "ok", "client-error"),
        _m("unknown field", _rest("unknown field", "/classify", {"inputs": "fine", "topk": 2})),
        _m("blank text", _rest("blank text", "/classify", {"inputs": " \t "})),
        _m("empty list", _rest("empty list", "/classify", {"inputs": []})),
        _m("texts and pairs mixed", _rest("texts and pairs mixed", "/classify",
           {"inputs": ["a", {"text": "a", "text_pair": "b"}]})),
        _m(f"{limits.max_inputs + 1} inputs", _rest(f"{limits.max_inputs + 1} inputs", "/classify",
           {"inputs": ["fine"] * (limits.max_inputs + 1)})),
        _m("a text over max_text_chars", _rest("a text over max_text_chars", "/classify",
           {"inputs": _words(limits.max_text_chars + 1)})),
        _m("a body over max_body_bytes", _rest("a body over max_body_bytes", "/classify", _over_body(limits))),
        _m("random bytes body", _raw_rest("random bytes body", random.Random(1).randbytes(65536))),
        _m("GET /classify", RestRequest("GET /classify", "/classify", b"", method="GET")),
        _m("POST /nowhere", _rest("POST /nowhere", "/nowhere", {"inputs": "fine"})),
    ]  # fmt: skip
    for value in ("abc", "0", "-5", "1e400", "nan"):
        name = f"x-request-timeout-ms {value}"
        cases.append(_m(name, _rest(name, "/classify", {"inputs": "fine"}, (("x-request-timeout-ms", value),))))
    cases.append(_m("x-request-timeout-ms 1", _rest("x-request-timeout-ms 1", "/classify", {"inputs": "fine"},
                 (("x-request-timeout-ms", "1"),)), "ok", "timeout"))  # fmt: skip
    if "qa" in models:
        cases.append(_m("QA question only", _rest("QA question only", "/qa", {"question": "why?"})))
    if "embed" in models:
        cases.append(_m("token ids to /v1/embeddings", _rest("token ids to /v1/embeddings", "/v1/embeddings",
                        {"input": [[101, 2023, 102]]})))  # fmt: skip
    return cases + _malformed_other_apis(models)


def _malformed_other_apis(models: dict[str, ModelInfo]) -> list[Malformed]:
    """Bad requests in the shapes of the other APIs the server speaks."""
    v2_path = f"/v2/models/{models['classify'].name}/infer" if "classify" in models else "/v2/models/x/infer"
    binary = (("inference-header-content-length", "999999"),)
    return [
        _m("/decode a huge id", _rest("/decode a huge id", "/decode", {"ids": [10**12]})),
        _m("/decode 200,000 ids", _rest("/decode 200,000 ids", "/decode", {"ids": [1] * 200_000})),
        _m("/predict a triple", _rest("/predict a triple", "/predict", {"inputs": ["a", "b", "c"]})),
        _m("/tokenize no inputs", _rest("/tokenize no inputs", "/tokenize", {"inputs": []})),
        _m("/models inputs a number", _rest("/models inputs a number", "/models/x", {"inputs": 5})),
        _m("/v2 infer no inputs", _rest("/v2 infer no inputs", v2_path, {"inputs": []})),
        _m("/v2 infer header length past the body", _raw_rest("/v2 infer header length past the body",
           b'{"inputs": []}', v2_path, binary)),
        _m("/v2 infer binary size past the body", _rest("/v2 infer binary size past the body", v2_path,
           {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "parameters": {"binary_data_size": 9}}]})),
        _m("/v2 infer shape and data disagree", _rest("/v2 infer shape and data disagree", v2_path,
           {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [3], "data": ["a"]}]})),
        _m("/v2 infer FP32 text", _rest("/v2 infer FP32 text", v2_path,
           {"inputs": [{"name": "text", "datatype": "FP32", "shape": [1], "data": [1.5]}]})),
    ]  # fmt: skip


def _words(chars: int) -> str:
    """Exactly `chars` characters of words."""
    return ("word " * (chars // 5 + 1))[: chars - 1] + "x"


def _over_body(limits: Limits) -> dict[str, Any]:
    """A /classify body just over max_body_bytes, of texts within max_text_chars (within max_inputs too where
    the limits allow it: only the body's size is wrong then)."""
    per_text = min(limits.max_text_chars, max(1, limits.max_body_bytes // max(1, limits.max_inputs)) + 1)
    count = limits.max_body_bytes // per_text + 1
    return {"inputs": [_words(per_text)] * count}


def malformed_http(limits: Limits) -> list[Malformed]:
    """Broken HTTP on raw connections (answered with 4xx, or the connection closed)."""
    bad = ("client-error", "connection")
    over = limits.max_body_bytes + 1024
    chunked = f"{over:x}\r\n".encode() + b"a" * over + b"\r\n0\r\n\r\n"
    many = "".join(f"x-header-{i}: {i}\r\n" for i in range(200))
    big = 65536
    big_head = bad if big > limits.max_header_bytes else ("ok", *bad)
    return [
        _m("TLS hello on the HTTP port", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 64, *bad),
        _m("garbage request line", b"HELLO THERE\r\n\r\n", *bad),
        _m("HTTP/1.1 without host", b"GET /health/live HTTP/1.1\r\n\r\n", "ok", *bad),  # RFC 9112: 400; harmless
        _m("negative content-length", b"POST /classify HTTP/1.1\r\nhost: x\r\ncontent-length: -5\r\n\r\n", *bad),
        _m("content-length 10^9", b"POST /classify HTTP/1.1\r\nhost: x\r\ncontent-length: 1000000000\r\n"
           b"content-type: application/json\r\nconnection: close\r\n\r\n{}", *bad),
        _m("chunked body over the limit", b"POST /classify HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n"
           b"content-type: application/json\r\nconnection: close\r\n\r\n" + chunked, *bad),
        _m("64 KB header", b"GET /health/live HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * big + b"\r\n\r\n", *big_head),
        _m("4 MB of headers", b"GET /health/live HTTP/1.1\r\nhost: x\r\n"
           + b"".join(b"x-h%d: %s\r\n" % (i, b"a" * 4000) for i in range(1000)) + b"\r\n", *bad),
        _m("200 headers", f"GET /health/live HTTP/1.1\r\nhost: x\r\nconnection: close\r\n{many}\r\n".encode(),
           "ok", *bad),
    ]  # fmt: skip


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field(number: int, wire: int, payload: bytes | int) -> bytes:
    tag = _varint(number << 3 | wire)
    if isinstance(payload, int):
        return tag + _varint(payload)
    return tag + _varint(len(payload)) + payload


def malformed_grpc(models: dict[str, ModelInfo], limits: Limits) -> list[Malformed]:
    """Truncated and garbage protobuf, unknown enum values and methods, oversize messages, invalid UTF-8."""
    text = _field(1, 2, _field(1, 2, b"a fine sentence"))  # ClassifyRequest.inputs[0].text
    whole = pb.ClassifyRequest(inputs=[pb.TextInput(text=f"sentence {i}") for i in range(16)]).SerializeToString()
    garbage = random.Random(2).randbytes(256)
    cases = [
        _m("truncated ClassifyRequest", GrpcRequest("truncated ClassifyRequest", CLASSIFY, whole[: len(whole) // 2])),
        _m("garbage ClassifyRequest", GrpcRequest("garbage ClassifyRequest", CLASSIFY, garbage)),
        _m("empty ClassifyRequest", GrpcRequest("empty ClassifyRequest", CLASSIFY, b"")),
        _m("function_to_apply 99", GrpcRequest("function_to_apply 99", CLASSIFY, text + _field(5, 0, 99))),
        _m("invalid UTF-8 text", GrpcRequest("invalid UTF-8 text", CLASSIFY, _field(1, 2, _field(1, 2, b"\xff\xfe")))),
        _m("top_k 2^32-1", GrpcRequest("top_k 2^32-1", CLASSIFY, text + _field(2, 0, 2**32 - 1)), "ok", "client-error"),
        _m("unknown method", GrpcRequest("unknown method", "/bert.v1.Classifier/Nope", text)),
        _m("unknown service", GrpcRequest("unknown service", "/bert.v9.Nothing/Here", text)),
        _m("ClassifyRequest text over max_text_chars", GrpcRequest("ClassifyRequest text over max_text_chars", CLASSIFY,
           pb.ClassifyRequest(inputs=[pb.TextInput(text=_words(limits.max_text_chars + 1))]))),
        _m("message over the limit", GrpcRequest("message over the limit", CLASSIFY,
           _field(1, 2, _field(1, 2, b"a" * (limits.max_body_bytes + 1024)))), "rejected", "client-error"),
        _m("100 metadata entries", GrpcRequest("100 metadata entries", CLASSIFY, text,
           metadata=tuple((f"x-flood-{i}", "v" * 40) for i in range(100))), "ok", "client-error", "rejected"),
    ]  # fmt: skip
    cases.append(_m("garbage ModelInferRequest", GrpcRequest("garbage ModelInferRequest", MODEL_INFER, garbage)))
    for task, method in (("qa", EXTRACT), ("ner", RECOGNIZE), ("embed", EMBED)):
        if task in models:
            name = f"garbage {method.rsplit('/', 1)[1]}Request"
            cases.append(_m(name, GrpcRequest(name, method, garbage)))
    if "ner" in models:
        name = "aggregation_strategy 77"
        cases.append(_m(name, GrpcRequest(name, RECOGNIZE, _field(1, 2, b"Ada in London") + _field(2, 0, 77))))
    return cases


def sweep_names(sweeps: Sequence[Sweep]) -> list[str]:
    return [sweep.name for sweep in sweeps]
