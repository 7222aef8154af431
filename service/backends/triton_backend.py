"""Triton backend: each batch is one `ModelInfer` call over Triton's gRPC API (tritonclient, asyncio).

The model repository comes from the export step (one model per bundle, named like the bundle, inputs
INPUT_NAMES int64 [-1] with a batch dimension, outputs the task's OUTPUT_NAMES). When Triton's own dynamic
batcher is on (`batches_itself`, the default), our batcher passes each request straight through, so Triton
merges requests from all API replicas; otherwise our batcher forms the batches and Triton just runs them.
Connection problems become `BackendUnavailable` (503 / UNAVAILABLE), anything else `BackendError`.
Reference: https://github.com/triton-inference-server/client (grpc aio client), Triton model configuration docs.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import numpy as np
import tritonclient.grpc.aio as triton
from tritonclient.utils import InferenceServerException

from bundles.spec import INPUT_NAMES, BundleManifest
from service.errors import BackendError, BackendUnavailable, DeadlineExceeded, Overloaded

log = logging.getLogger(__name__)

UNAVAILABLE_STATUSES = ("StatusCode.UNAVAILABLE", "StatusCode.DEADLINE_EXCEEDED", "StatusCode.CANCELLED")


class TritonBackend:
    """One Triton model, reached over gRPC."""

    kind = "triton"

    def __init__(
        self,
        manifest: BundleManifest,
        *,
        url: str,
        model_name: str,
        batches_itself: bool = True,
        timeout_s: float = 60.0,
    ) -> None:
        self.manifest = manifest
        self.url = url
        self.model_name = model_name
        self.variant = f"triton:{model_name}"
        self.batches_itself = batches_itself
        self.width_multiple = 1  # requests go to Triton padded to their longest row
        self.concurrency = 1
        self.output_names = list(manifest.output_names)
        self.graph_outputs = list(manifest.outputs)
        """Every output of the bundle's graphs (the on-request ones included): the Triton model must have them."""
        self._timeout = timeout_s
        self._client: triton.InferenceServerClient | None = None
        self._inputs: list[str] = list(INPUT_NAMES)
        self.max_rows: int | None = None
        """The model's max_batch_size in Triton (bigger batches are split), None = no limit."""

    async def start(self) -> None:
        self._client = triton.InferenceServerClient(url=self.url)
        try:
            if not await self._client.is_server_live():
                raise BackendUnavailable(f"Triton at {self.url} is not live")
            if not await self._client.is_model_ready(self.model_name):
                raise BackendUnavailable(
                    f"Triton at {self.url} has no ready model {self.model_name!r}; "
                    "check the model repository written by the export step"
                )
            metadata = await self._client.get_model_metadata(self.model_name, as_json=True)
        except InferenceServerException as error:
            raise BackendUnavailable(f"cannot reach Triton at {self.url}: {error.message()}") from error
        config = (await self._client.get_model_config(self.model_name, as_json=True)).get("config", {})
        self.max_rows = int(config.get("max_batch_size", 0)) or None
        served_inputs = {item["name"] for item in metadata.get("inputs", [])}
        served_outputs = {item["name"] for item in metadata.get("outputs", [])}
        missing = [name for name in self.graph_outputs if name not in served_outputs]
        if missing:
            raise ValueError(f"Triton model {self.model_name!r} lacks the outputs {missing}")
        self._inputs = [name for name in INPUT_NAMES if name in served_inputs]
        log.info("using Triton model %s at %s", self.model_name, self.url)

    async def infer_alone(
        self, inputs: dict[str, np.ndarray], extra_outputs: Sequence[str] = ()
    ) -> dict[str, np.ndarray]:
        """Triton schedules its own instances: a lone batch is sent as any other."""
        return await self.infer(inputs, extra_outputs)

    async def infer(self, inputs: dict[str, np.ndarray], extra_outputs: Sequence[str] = ()) -> dict[str, np.ndarray]:
        """One batch; split into calls of at most the model's `max_batch_size` rows (sent concurrently)."""
        if self._client is None:
            raise BackendUnavailable("the Triton backend is not started")
        names = self.output_names + [name for name in extra_outputs if name not in self.output_names]
        rows = len(inputs["input_ids"])
        if self.max_rows is None or rows <= self.max_rows:
            return await self._infer(inputs, names)
        parts = await asyncio.gather(
            *(
                self._infer({name: array[start : start + self.max_rows] for name, array in inputs.items()}, names)
                for start in range(0, rows, self.max_rows)
            )
        )
        return {name: _concatenate_rows([part[name] for part in parts]) for name in names}

    async def _infer(self, inputs: dict[str, np.ndarray], names: list[str]) -> dict[str, np.ndarray]:
        assert self._client is not None
        request = []
        for name in self._inputs:
            array = np.ascontiguousarray(inputs[name], dtype=np.int64)
            tensor = triton.InferInput(name, list(array.shape), "INT64")
            tensor.set_data_from_numpy(array)
            request.append(tensor)
        outputs = [triton.InferRequestedOutput(name) for name in names]
        try:
            result = await self._client.infer(self.model_name, request, outputs=outputs, client_timeout=self._timeout)
        except InferenceServerException as error:
            status = str(error.status())
            message = error.message() or ""
            if "queue size" in message:  # Triton's bounded queue rejected it: shed load
                raise Overloaded(f"Triton's queue for {self.model_name!r} is full; retry later") from error
            if "timeout" in message.lower():  # Triton's queue policy timed it out
                raise DeadlineExceeded(f"Triton timed the request out in its queue: {message}") from error
            if any(code in status for code in UNAVAILABLE_STATUSES):
                raise BackendUnavailable(f"Triton at {self.url} is unavailable: {error.message()}") from error
            raise BackendError(
                f"Triton failed on a batch of shape {inputs['input_ids'].shape}: {error.message()}"
            ) from error
        values = {name: result.as_numpy(name) for name in names}
        absent = [name for name, value in values.items() if value is None]
        if absent:
            raise BackendError(f"Triton returned no {absent} for model {self.model_name!r}")
        return {name: np.asarray(value) for name, value in values.items()}

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None


def _concatenate_rows(parts: list[np.ndarray]) -> np.ndarray:
    """The calls' outputs of one batch, along the batch axis. An axis 1 that differs between calls (fill-mask's
    masked positions: each call has its own most masks in a row) is padded with zeros to the longest: filler rows,
    which carry no answer."""
    if parts[0].ndim < 2:
        return np.concatenate(parts)
    longest = max(part.shape[1] for part in parts)
    if any(part.shape[1] != longest for part in parts):
        parts = [np.pad(part, [(0, 0), (0, longest - part.shape[1])] + [(0, 0)] * (part.ndim - 2)) for part in parts]
    return np.concatenate(parts)
