"""ONNX Runtime in-process backend: picks the bundle variant for the hardware, runs batches off the event loop.

Variant choice: an explicit `variant` wins; otherwise the manifest's `default_variants["gpu"]` when CUDA is
available (and asked for), else `default_variants["cpu"]`, else the first variant built for that provider.
On CUDA, inputs and outputs go through IO binding (outputs allocated by ORT on the device, copied back once)
so fp16 graphs with fp32 I/O run without extra host copies of intermediates.
Thread settings (intra-/inter-op) are exposed because a CPU server shares cores with its own event loop.
Reference: https://onnxruntime.ai/docs/performance/tune-performance/ , .../api/python/api_summary.html#iobinding
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnxruntime as ort

from bert_model.tasks.spec import INPUT_NAMES, BundleManifest
from service.errors import BackendError, BackendUnavailable

log = logging.getLogger(__name__)

CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"


def cuda_available() -> bool:
    return CUDA in ort.get_available_providers()


def choose_variant(manifest: BundleManifest, device: str = "auto", forced: str | None = None) -> tuple[str, str]:
    """(variant name, provider) for this machine; raises ValueError naming the choices if impossible."""
    if forced is not None:
        if forced not in manifest.variants:
            raise ValueError(f"bundle {manifest.name!r} has no variant {forced!r}; it has {sorted(manifest.variants)}")
        spec = manifest.variants[forced]
        if spec.provider == CUDA and not cuda_available():
            raise ValueError(f"variant {forced!r} needs CUDA, which this ONNX Runtime build does not offer")
        return forced, spec.provider
    use_gpu = device == "cuda" or (device == "auto" and cuda_available())
    if device == "cuda" and not cuda_available():
        raise ValueError("device cuda was asked for, but this ONNX Runtime has no CUDAExecutionProvider")
    for hardware, provider in (("gpu", CUDA), ("cpu", CPU)) if use_gpu else (("cpu", CPU),):
        name = manifest.default_variants.get(hardware)
        if name is not None:
            return name, manifest.variants[name].provider
        for candidate, spec in manifest.variants.items():
            if spec.provider == provider:
                return candidate, provider
    raise ValueError(f"bundle {manifest.name!r} has no variant for this hardware: {sorted(manifest.variants)}")


class OrtBackend:
    """One ONNX Runtime session over one bundle variant."""

    kind = "ort"
    batches_itself = False

    def __init__(
        self,
        bundle_dir: str | Path,
        manifest: BundleManifest,
        *,
        device: str = "auto",
        variant: str | None = None,
        intra_op_threads: int = 0,
        inter_op_threads: int = 0,
        workers: int = 1,
    ) -> None:
        self.bundle_dir = Path(bundle_dir)
        self.manifest = manifest
        self.variant, self.provider = choose_variant(manifest, device, variant)
        self.output_names = list(manifest.output_names)
        self._intra = intra_op_threads
        self._inter = inter_op_threads
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"ort-{manifest.name}")
        self._session: ort.InferenceSession | None = None
        self._input_names: list[str] = []

    def _create_session(self) -> ort.InferenceSession:
        options = ort.SessionOptions()
        options.intra_op_num_threads = self._intra
        options.inter_op_num_threads = self._inter
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.log_severity_level = 3
        providers = [CUDA, CPU] if self.provider == CUDA else [CPU]
        path = self.bundle_dir / self.manifest.variants[self.variant].file
        session = ort.InferenceSession(str(path), sess_options=options, providers=providers)
        graph_inputs = {node.name for node in session.get_inputs()}
        missing = [name for name in ("input_ids", "attention_mask") if name not in graph_inputs]
        if missing:
            raise ValueError(f"{path} lacks the inputs {missing}; a bundle graph takes {INPUT_NAMES}")
        outputs = {node.name for node in session.get_outputs()}
        absent = [name for name in self.output_names if name not in outputs]
        if absent:
            raise ValueError(f"{path} lacks the outputs {absent} of a {self.manifest.task} bundle")
        self._input_names = [name for name in INPUT_NAMES if name in graph_inputs]
        return session

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        session = await loop.run_in_executor(self._executor, self._create_session)
        self._session = session
        log.info("loaded %s variant %s on %s", self.manifest.name, self.variant, session.get_providers()[0])

    def _run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        session = self._session
        if session is None:
            raise BackendUnavailable(f"model {self.manifest.name!r} is not loaded")
        feed = {name: np.ascontiguousarray(inputs[name], dtype=np.int64) for name in self._input_names}
        if self.provider == CUDA:
            return self._run_io_binding(session, feed)
        values = session.run(self.output_names, feed)
        return dict(zip(self.output_names, values, strict=True))

    def _run_io_binding(self, session: ort.InferenceSession, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        binding = session.io_binding()
        for name, array in feed.items():
            binding.bind_cpu_input(name, array)
        for name in self.output_names:
            binding.bind_output(name, "cuda")
        session.run_with_iobinding(binding)
        values = binding.copy_outputs_to_cpu()
        return {
            name: np.asarray(value, dtype=np.float32) for name, value in zip(self.output_names, values, strict=True)
        }

    async def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, self._run, inputs)
        except (BackendError, BackendUnavailable):
            raise
        except Exception as error:  # onnxruntime raises its own exception types (Fail, InvalidArgument, ...)
            raise BackendError(
                f"ONNX Runtime failed on a batch of shape {inputs['input_ids'].shape}: {error}"
            ) from error

    async def close(self) -> None:
        self._session = None
        self._executor.shutdown(wait=True, cancel_futures=False)
