"""The Open Inference Protocol v2's REST shapes, as the served OpenAPI schema states them
(`service.http_api.v2_routes` reads the bodies itself, to take the binary tensor data extension too).

The inference request's tensors are named by the model's metadata (`GET /v2/models/{name}`), which a JSON schema
shared by every model cannot state: the request schema holds the protocol's form, and the server answers 400 or
422 with a message for tensors the model does not take.
Reference: https://kserve.github.io/website/latest/modelserving/data_plane/v2_protocol/
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, StrictInt, StrictStr

from service.engine.tensors import MODEL_VERSION
from service.http_api.schemas import INTEGRAL


class V2Error(BaseModel):
    """The protocol's error body."""

    error: str = Field(..., examples=["unknown model 'x'; loaded: minilm-sst2"])


class V2ServerMetadata(BaseModel):
    name: str
    version: str
    extensions: list[str]


class V2TensorMetadata(BaseModel):
    name: str = Field(..., examples=["text"])
    datatype: str = Field(..., examples=["BYTES"])
    shape: list[int] = Field(..., description="-1 for a dimension that varies.", examples=[[-1]])


class V2ModelMetadata(BaseModel):
    name: str
    versions: list[str] = Field(..., examples=[[MODEL_VERSION]])
    platform: str = Field(..., examples=["bertserve_classify"])
    inputs: list[V2TensorMetadata]
    outputs: list[V2TensorMetadata]
    parameters: dict[str, str] = Field(..., description="classify models: `labels`, comma-separated.")


class V2OutputTensor(V2TensorMetadata):
    data: list[Any] | None = Field(None, description="The elements, row-major (absent when sent as binary).")
    parameters: dict[str, Any] | None = Field(None, description="`binary_data_size` when sent as binary.")


class V2InferResponse(BaseModel):
    model_name: str
    model_version: str
    id: str | None = None
    outputs: list[V2OutputTensor]


class V2InputTensor(BaseModel):
    name: StrictStr
    datatype: Literal["BYTES", "FP32", "INT64"]
    shape: Annotated[list[Annotated[StrictInt, Field(ge=0), INTEGRAL]], Field(max_length=4)]
    data: list[JsonValue] | None = Field(None, description="The elements, row-major or nested by the shape.")
    parameters: dict[str, JsonValue] | None = Field(
        None, description="`binary_data_size` when the tensor follows the JSON head as raw bytes."
    )


class V2RequestedOutput(BaseModel):
    name: StrictStr
    parameters: dict[str, JsonValue] | None = Field(None, description="`binary_data`: send it as raw bytes.")


class V2InferRequest(BaseModel):
    """The inference request's JSON form (with the binary extension, this head comes first and the raw tensors
    after it, `Inference-Header-Content-Length` giving the head's size)."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [{"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["a good film"]}]}]
        }
    )
    id: StrictStr | None = None
    inputs: Annotated[list[V2InputTensor], Field(min_length=1)]
    outputs: list[V2RequestedOutput] | None = Field(None, description="Only these outputs (omitted = all).")
    parameters: dict[str, JsonValue] | None = Field(
        None, description="`binary_data_output`: send the outputs as raw bytes."
    )


def inline_schema(model: type[BaseModel]) -> dict[str, Any]:
    """`model`'s JSON schema with its nested models written in place (an operation's own schema, outside the
    schema's shared components)."""
    schema = model.model_json_schema()
    definitions = schema.pop("$defs", {})

    def resolve(node: Any) -> Any:
        if isinstance(node, dict):
            reference = node.get("$ref")
            if isinstance(reference, str):
                return resolve(definitions[reference.rpartition("/")[2]])
            return {key: resolve(value) for key, value in node.items()}
        if isinstance(node, list):
            return [resolve(item) for item in node]
        return node

    resolved: dict[str, Any] = resolve(schema)
    return resolved


def error_responses(responses: dict[int | str, dict[str, Any]]) -> dict[int | str, dict[str, Any]]:
    """The service's error responses, those the protocol's routes answer in the protocol's body (the door's own
    errors, such as 401 and 413, keep the service's body)."""
    protocol = {
        400: "The body is not valid JSON, or a model that is not loaded is asked whether it is ready.",
        422: "Invalid input: unknown model or tensor, wrong datatype or shape; the message says what to change.",
        429: responses[429]["description"],
        503: responses[503]["description"],
        504: responses[504]["description"],
    }
    return {**responses, **{code: {"model": V2Error, "description": text} for code, text in protocol.items()}}
