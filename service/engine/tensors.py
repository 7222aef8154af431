"""Task inputs and results as named tensors: the Open Inference Protocol v2 (KServe, Triton's clients, MLServer)
view of each task, shared by its REST (`service.http_api.v2_routes`) and gRPC (`service.grpc_api.v2_servicer`)
front doors.

| task | inputs (BYTES, shape [N]) | outputs |
|---|---|---|
| classify | text, text_pair (optional) | label BYTES [N], score FP32 [N], scores FP32 [N, labels] |
| qa | question, context | answer BYTES [N], score FP32 [N], start INT64 [N], end INT64 [N] |
| ner | text | entities BYTES [N] (each the JSON list of the text's entities) |
| embed | text | embedding FP32 [N, size] |
| fill-mask | text | fills BYTES [N] (each the JSON of the text's fills) |
| rerank | query (shape [1]), text | score FP32 [N] (each passage's, in input order) |

BYTES elements travel as UTF-8 text; in raw (binary) form each is a 4-byte little-endian length and its bytes.
Reference: https://kserve.github.io/website/latest/modelserving/data_plane/v2_protocol/
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from service.engine.engine import Engine, LoadedModel
from service.engine.inputs import ClassifyInput, EmbedInput, FillMaskInput, NERInput, QAInput, RerankInput, TaskInput
from service.errors import InvalidInput, UnknownModel

MODEL_VERSION = "1"
"""The one version of every model (the protocol names versions; a bundle has one)."""
DATATYPES = {"BYTES": np.object_, "FP32": np.float32, "INT64": np.int64}
"""The datatypes the tasks use -> numpy dtypes."""


@dataclass(frozen=True)
class TensorSpec:
    name: str
    datatype: str
    shape: tuple[int, ...]
    """-1 for a dimension that varies (the batch, a vector's size)."""


INPUTS: dict[str, tuple[TensorSpec, ...]] = {
    "classify": (TensorSpec("text", "BYTES", (-1,)), TensorSpec("text_pair", "BYTES", (-1,))),
    "qa": (TensorSpec("question", "BYTES", (-1,)), TensorSpec("context", "BYTES", (-1,))),
    "ner": (TensorSpec("text", "BYTES", (-1,)),),
    "embed": (TensorSpec("text", "BYTES", (-1,)),),
    "fill-mask": (TensorSpec("text", "BYTES", (-1,)),),
    "rerank": (TensorSpec("query", "BYTES", (1,)), TensorSpec("text", "BYTES", (-1,))),
}
OPTIONAL_INPUTS = frozenset({"text_pair"})
OUTPUTS: dict[str, tuple[TensorSpec, ...]] = {
    "classify": (
        TensorSpec("label", "BYTES", (-1,)),
        TensorSpec("score", "FP32", (-1,)),
        TensorSpec("scores", "FP32", (-1, -1)),
    ),
    "qa": (
        TensorSpec("answer", "BYTES", (-1,)),
        TensorSpec("score", "FP32", (-1,)),
        TensorSpec("start", "INT64", (-1,)),
        TensorSpec("end", "INT64", (-1,)),
    ),
    "ner": (TensorSpec("entities", "BYTES", (-1,)),),
    "embed": (TensorSpec("embedding", "FP32", (-1, -1)),),
    "fill-mask": (TensorSpec("fills", "BYTES", (-1,)),),
    "rerank": (TensorSpec("score", "FP32", (-1,)),),
}


@dataclass
class Tensor:
    """A named tensor: `data` as a numpy array (BYTES: an object array of `bytes`)."""

    name: str
    datatype: str
    data: np.ndarray

    @property
    def shape(self) -> list[int]:
        return list(self.data.shape)


def protocol_model(engine: Engine, name: str, version: str) -> LoadedModel:
    """The loaded model a v2 request names (`version` "" or MODEL_VERSION), ready to take it; UnknownModel /
    InvalidInput / NotReady otherwise."""
    model = engine.models.get(name)
    if model is None:
        raise UnknownModel(f"unknown model {name!r}; loaded: {', '.join(engine.models) or 'none'}")
    if version not in ("", MODEL_VERSION):
        raise UnknownModel(f"model {name!r} has version {MODEL_VERSION} only, not {version!r}")
    if model.bundle.task not in INPUTS:
        raise InvalidInput(f"model {name!r} serves {model.bundle.task}, not served over this protocol")
    return engine.model_for(model.bundle.task, name)  # NotReady while loading or stopping


def task_input(task: str, tensors: dict[str, Tensor]) -> TaskInput:
    """The task input of a v2 request's input tensors; InvalidInput names a missing, unknown or malformed one."""
    if task not in INPUTS:
        raise InvalidInput(f"the {task} task is not served over the Open Inference Protocol")
    expected = {spec.name: spec for spec in INPUTS[task]}
    unknown = sorted(set(tensors) - set(expected))
    if unknown:
        raise InvalidInput(
            f"inputs: unknown tensor {', '.join(unknown)}; this {task} model takes {', '.join(expected)}"
        )
    texts = {name: _texts(tensors[name]) for name in expected if name in tensors}
    missing = [name for name in expected if name not in texts and name not in OPTIONAL_INPUTS]
    if missing:
        raise InvalidInput(
            f"inputs: tensor {', '.join(missing)} missing; this {task} model takes {', '.join(expected)}"
        )
    if task == "rerank":
        if len(texts["query"]) != 1:
            raise InvalidInput(f"inputs: tensor query holds one query, got {len(texts['query'])}")
        return RerankInput(query=texts["query"][0], texts=texts["text"])
    lengths = {len(values) for values in texts.values()}
    if len(lengths) > 1:
        raise InvalidInput(f"inputs: the tensors have different lengths {sorted(lengths)}; send one element per item")
    if task == "classify":
        return ClassifyInput(texts=texts["text"], pairs=texts.get("text_pair"), top_k=None)
    if task == "qa":
        return QAInput(questions=texts["question"], contexts=texts["context"])
    return {"ner": NERInput, "embed": EmbedInput, "fill-mask": FillMaskInput}[task](texts=texts["text"])


def _texts(tensor: Tensor) -> list[str]:
    if tensor.datatype != "BYTES":
        raise InvalidInput(f"inputs: tensor {tensor.name} must be BYTES (UTF-8 text), got {tensor.datatype}")
    if tensor.data.ndim != 1:
        raise InvalidInput(f"inputs: tensor {tensor.name} must have shape [N], got {list(tensor.data.shape)}")
    texts = []
    for index, value in enumerate(tensor.data.tolist()):
        try:
            texts.append(value.decode("utf-8") if isinstance(value, bytes) else str(value))
        except UnicodeDecodeError:
            raise InvalidInput(f"inputs: {tensor.name}[{index}] is not UTF-8 text") from None
    return texts


def result_tensors(task: str, labels: list[str], results: list[Any]) -> list[Tensor]:
    """The output tensors of a task's results (one per input, in order)."""
    if task == "classify":
        return _classify_tensors(labels, results)
    if task == "qa":
        best = [answers[0] for answers in results]
        return [
            _bytes("answer", [a["answer"] for a in best]),
            Tensor("score", "FP32", np.array([a["score"] for a in best], np.float32)),
            Tensor("start", "INT64", np.array([a["start"] for a in best], np.int64)),
            Tensor("end", "INT64", np.array([a["end"] for a in best], np.int64)),
        ]
    if task == "rerank":
        scores = np.zeros(len(results[0]["ranks"]), np.float32)
        for rank in results[0]["ranks"]:
            scores[rank["index"]] = rank["score"]
        return [Tensor("score", "FP32", scores)]
    if task == "embed":
        return [Tensor("embedding", "FP32", np.stack([np.asarray(r["embedding"], np.float32) for r in results]))]
    name = "entities" if task == "ner" else "fills"
    return [
        Tensor(name, "BYTES", np.array([orjson.dumps(r, option=orjson.OPT_SERIALIZE_NUMPY) for r in results], object))
    ]


def _classify_tensors(labels: list[str], results: list[Any]) -> list[Tensor]:
    order = {label: index for index, label in enumerate(labels)}
    scores = np.zeros((len(results), len(labels)), np.float32)
    for row, ranked in enumerate(results):
        for item in ranked:
            scores[row, order[item["label"]]] = item["score"]
    return [
        _bytes("label", [ranked[0]["label"] for ranked in results]),
        Tensor("score", "FP32", np.array([ranked[0]["score"] for ranked in results], np.float32)),
        Tensor("scores", "FP32", scores),
    ]


def _bytes(name: str, texts: list[str]) -> Tensor:
    return Tensor(name, "BYTES", np.array([text.encode("utf-8") for text in texts], dtype=object))


# ---- raw (binary) tensor data -------------------------------------------------------------------------------
def from_raw(name: str, datatype: str, shape: list[int], raw: bytes) -> Tensor:
    """A tensor from its raw bytes (BYTES: length-prefixed elements; numbers: little-endian)."""
    count = int(np.prod(shape)) if shape else 1
    if datatype == "BYTES":
        return Tensor(name, datatype, np.array(_split_bytes(name, raw, count), dtype=object).reshape(shape))
    if datatype not in DATATYPES:
        raise InvalidInput(f"inputs: tensor {name} has datatype {datatype}; the tasks take BYTES")
    dtype = np.dtype(DATATYPES[datatype]).newbyteorder("<")
    if len(raw) != count * dtype.itemsize:
        raise InvalidInput(f"inputs: tensor {name} has {len(raw)} bytes of data for shape {shape}")
    return Tensor(name, datatype, np.frombuffer(raw, dtype=dtype).reshape(shape))


def _split_bytes(name: str, raw: bytes, count: int) -> list[bytes]:
    items, offset = [], 0
    for _ in range(count):
        if offset + 4 > len(raw):
            raise InvalidInput(f"inputs: tensor {name}'s raw data ends inside an element's length")
        (size,) = struct.unpack_from("<I", raw, offset)
        offset += 4
        if offset + size > len(raw):
            raise InvalidInput(f"inputs: tensor {name}'s raw data ends inside an element")
        items.append(raw[offset : offset + size])
        offset += size
    if offset != len(raw):
        raise InvalidInput(f"inputs: tensor {name} has {len(raw) - offset} bytes beyond its {count} elements")
    return items


def to_raw(tensor: Tensor) -> bytes:
    """A tensor's raw bytes (the inverse of `from_raw`)."""
    if tensor.datatype == "BYTES":
        return b"".join(struct.pack("<I", len(value)) + value for value in tensor.data.reshape(-1).tolist())
    return np.ascontiguousarray(tensor.data, dtype=np.dtype(DATATYPES[tensor.datatype]).newbyteorder("<")).tobytes()


def from_json(name: str, datatype: str, shape: list[int], data: Any) -> Tensor:
    """A tensor from the JSON form's `data` (flat or nested, row-major)."""
    if data is None:
        raise InvalidInput(f"inputs: tensor {name} has no data: send data, or its raw bytes (binary_data_size)")
    if datatype not in DATATYPES:
        raise InvalidInput(f"inputs: tensor {name} has datatype {datatype}; the tasks take BYTES")
    try:
        values = np.array(data, dtype=object).reshape(-1).tolist() if isinstance(data, list) else [data]
        if datatype == "BYTES":
            items = [value.encode("utf-8") if isinstance(value, str) else value for value in values]
            if not all(isinstance(item, bytes) for item in items):
                raise InvalidInput(f"inputs: tensor {name} is BYTES: send strings")
            array = np.array(items, dtype=object)
        else:
            array = np.array(values, dtype=DATATYPES[datatype])
    except (TypeError, ValueError, OverflowError):
        raise InvalidInput(f"inputs: tensor {name} is {datatype}: send a flat or nested list of numbers") from None
    try:
        return Tensor(name, datatype, array.reshape(shape))
    except ValueError:
        raise InvalidInput(f"inputs: tensor {name} has {array.size} elements for shape {shape}") from None


def to_json(tensor: Tensor) -> list[Any]:
    """A tensor's `data` in the JSON form: flat, row-major; BYTES as text."""
    flat = tensor.data.reshape(-1).tolist()
    return [value.decode("utf-8") for value in flat] if tensor.datatype == "BYTES" else flat
