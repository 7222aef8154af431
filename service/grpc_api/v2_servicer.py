"""The Open Inference Protocol v2 over gRPC (`inference.GRPCInferenceService`, KServe's and Triton's), so that
`tritonclient.grpc` and other v2 clients work unchanged: ServerLive, ServerReady, ModelReady, ServerMetadata,
ModelMetadata and ModelInfer, with named tensors (`service.engine.tensors`) in typed contents or, as
`tritonclient.grpc` sends and reads them, raw contents. The other methods of the service (model repository, shared
memory, statistics, streaming) answer UNIMPLEMENTED.

The protocol's messages are the generated ones `tritonclient` ships (`tritonclient.grpc.service_pb2`): the client
library is already the Triton backend's dependency, and its stubs are the protocol's contract.
Reference: https://kserve.github.io/website/latest/modelserving/data_plane/v2_protocol/
"""

from __future__ import annotations

from typing import Any

import grpc
import numpy as np
from tritonclient.grpc import service_pb2 as v2

from service.engine.engine import Engine, LoadedModel
from service.engine.tensors import (
    INPUTS,
    MODEL_VERSION,
    OUTPUTS,
    Tensor,
    from_raw,
    protocol_model,
    result_tensors,
    task_input,
    to_raw,
)
from service.errors import InvalidInput
from service.grpc_api.servicers import run_call

SERVICE = v2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
SERVER_NAME = "bertserve"
VERSION = "1.0.0"
CONTENTS = {"BYTES": "bytes_contents", "FP32": "fp32_contents", "INT64": "int64_contents"}
"""Datatype -> the typed-contents field that carries it."""


class InferenceServicer:
    """The v2 methods over the engine; errors end the call through the service's one gRPC status table."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def _ready(self) -> bool:
        state = self.engine.state
        return state.ready and not state.draining and state.failure is None

    async def ServerLive(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return v2.ServerLiveResponse(live=self.engine.state.failure is None)

    async def ServerReady(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return v2.ServerReadyResponse(ready=self._ready())

    async def ModelReady(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return v2.ModelReadyResponse(ready=request.name in self.engine.models and self._ready())

    async def ServerMetadata(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return v2.ServerMetadataResponse(name=SERVER_NAME, version=VERSION, extensions=[])

    async def ModelMetadata(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def run(timeout: float | None) -> Any:
            model = protocol_model(self.engine, request.name, request.version)
            task = model.bundle.task

            def specs(items: Any) -> list[Any]:
                return [v2.ModelMetadataResponse.TensorMetadata(name=s.name, datatype=s.datatype, shape=list(s.shape))
                        for s in items]  # fmt: skip

            return v2.ModelMetadataResponse(
                name=model.name,
                versions=[MODEL_VERSION],
                platform=f"{SERVER_NAME}_{task}",
                inputs=specs(INPUTS[task]),
                outputs=specs(OUTPUTS[task]),
            )

        return await run_call(self.engine, context, "/inference.GRPCInferenceService/ModelMetadata", run)

    async def ModelInfer(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def run(timeout: float | None) -> Any:
            model = protocol_model(self.engine, request.model_name, request.model_version)
            inputs = _input_tensors(request)
            outcome = await self.engine.submit(
                task_input(model.bundle.task, inputs), model=model.name, timeout_s=timeout
            )
            outputs = result_tensors(model.bundle.task, list(model.bundle.manifest.labels), outcome.results)
            context.set_trailing_metadata(tuple(outcome.headers().items()))
            return _response(model, request, outputs)

        return await run_call(self.engine, context, "/inference.GRPCInferenceService/ModelInfer", run)


def _input_tensors(request: Any) -> dict[str, Tensor]:
    raw = list(request.raw_input_contents)
    if raw and len(raw) != len(request.inputs):
        raise InvalidInput(f"raw_input_contents has {len(raw)} entries for {len(request.inputs)} inputs")
    tensors: dict[str, Tensor] = {}
    for index, item in enumerate(request.inputs):
        shape = list(item.shape)
        if any(d < 0 for d in shape) or len(shape) > 4:
            raise InvalidInput(f"inputs: tensor {item.name}'s shape must be a list of sizes")
        if raw:
            tensors[item.name] = from_raw(item.name, item.datatype, shape, raw[index])
        else:
            tensors[item.name] = _from_contents(item, shape)
    return tensors


def _from_contents(item: Any, shape: list[int]) -> Tensor:
    field = CONTENTS.get(item.datatype)
    if field is None:
        raise InvalidInput(f"inputs: tensor {item.name} has datatype {item.datatype}; the tasks take BYTES")
    values = list(getattr(item.contents, field))
    dtype = object if item.datatype == "BYTES" else (np.float32 if item.datatype == "FP32" else np.int64)
    array = np.array(values, dtype=dtype)
    if array.size != int(np.prod(shape)):
        raise InvalidInput(f"inputs: tensor {item.name} has {array.size} elements for shape {shape}")
    return Tensor(item.name, item.datatype, array.reshape(shape))


def _response(model: LoadedModel, request: Any, outputs: list[Tensor]) -> Any:
    """Outputs in raw contents (as `tritonclient.grpc` reads them), the requested ones only when some are named."""
    names = [item.name for item in request.outputs]
    known = {tensor.name for tensor in outputs}
    unknown = [name for name in names if name not in known]
    if unknown:
        raise InvalidInput(f"outputs: unknown tensor {unknown[0]!r}; this model puts out {', '.join(sorted(known))}")
    chosen = [tensor for tensor in outputs if not names or tensor.name in names]
    response = v2.ModelInferResponse(model_name=model.name, model_version=MODEL_VERSION, id=request.id)
    for tensor in chosen:
        response.outputs.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape)
        response.raw_output_contents.append(to_raw(tensor))
    return response


METHODS = ("ServerLive", "ServerReady", "ModelReady", "ServerMetadata", "ModelMetadata", "ModelInfer")
"""The methods served; the rest of GRPCInferenceService answers UNIMPLEMENTED."""
