"""What a backend is: something that runs a padded int64 batch and returns named numpy outputs.

Two implementations: `service.backends.ort_backend.OrtBackend` (ONNX Runtime in-process) and
`service.backends.triton_backend.TritonBackend` (a Triton server over gRPC). Both raise only domain errors
(`BackendError`, `BackendUnavailable`) for failures a caller can see, and `BackendBroken` when they know they can
never serve again (the batcher then fails the model for good: `service.engine.batcher.Batcher`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np


class Backend(Protocol):
    """A loaded model graph that runs batches."""

    kind: str
    """The runtime: `ort` (ONNX Runtime), `openvino` (an OpenVINO variant run in-process) or `triton`."""
    variant: str
    """The bundle variant it runs (cpu-int8, gpu-fp16, ...) or the Triton model name."""
    batches_itself: bool
    """True when the backend does its own dynamic batching (our batcher then passes requests through)."""
    width_multiple: int
    """Batches are padded to their longest row rounded up to a multiple of this (1 = the longest row)."""

    @property
    def concurrency(self) -> int:
        """Batches it computes at once (OpenVINO streams); the batcher's default for calls in flight."""

    async def start(self) -> None:
        """Open sessions / connections; raise BackendUnavailable if it cannot serve."""

    async def infer(self, inputs: dict[str, np.ndarray], extra_outputs: Sequence[str] = ()) -> dict[str, np.ndarray]:
        """Run one batch: inputs are INPUT_NAMES int64 (B, S) arrays; outputs the bundle's `output_names`, and the
        on-request `extra_outputs` of its graph the batch's requests ask for (`bundles.spec.ON_REQUEST_OUTPUTS`)."""

    async def infer_alone(
        self, inputs: dict[str, np.ndarray], extra_outputs: Sequence[str] = ()
    ) -> dict[str, np.ndarray]:
        """Run a batch that nothing else competes with (the batcher has no other batch running or waiting): a
        backend with a latency path for it uses that (OpenVINO streams: a copy on all cores), others run `infer`."""

    async def close(self) -> None:
        """Release sessions / connections, waiting (off the event loop) for calls still running."""
