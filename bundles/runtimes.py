"""Opening a variant of a bundle for inference, the one module that does it, and which runtimes this process can run.

`open_variant(path, spec, output_names, settings)` opens a graph on the runtime its `VariantSpec.provider` names
with the thread and stream `RuntimeSettings`: the service's backend, the export's accuracy guard, the benchmarks and
the load tests' Triton peer all open variants here, and the guard with `RuntimeSettings()`, the service's defaults,
so it judges a graph compiled exactly as the service serves it.

- ONNX Runtime (its performance-tuning guide): intra-op threads (0: the runtime's default, one per physical core),
  inter-op threads, full graph optimization. Worker threads do not spin unless asked: spinning trades idle CPU for
  latency, and a spinning pool takes the cores a server's event loop and tokenization need. A CUDA graph runs on
  the CUDA provider where this ONNX Runtime has it (else on the CPU, as the export's guard runs gpu-fp16), through
  IO binding: outputs allocated on the device and copied back once, so fp16 graphs with fp32 inputs and outputs
  make no extra host copies.
- Outputs: a variant is opened with the outputs every call returns (`output_names`); a call may ask for others of the
  graph beside them (`run(feed, extra=...)`: the on-request outputs of `bundles.spec.ON_REQUEST_OUTPUTS`), which
  are copied out of the runtime only for that call.
- OpenVINO (the optional `openvino` extra; a variant's `runtime_options` are `compile_model` properties such as
  INFERENCE_PRECISION_HINT): one stream compiles for latency (all cores on one batch); N streams compile for
  throughput (N batches at once, each on its share of the cores), plus, with `openvino_lone_latency`, a second copy
  compiled for latency that runs a batch with nothing beside it. Each calling thread has its own infer request.

Torch-free and onnx-free: onnxruntime and openvino are imported when a variant is opened (or asked about).
References: https://onnxruntime.ai/docs/performance/tune-performance/ , .../api/python/api_summary.html#iobinding ,
OpenVINO's "High-level Performance Hints".
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bundles.spec import INPUT_NAMES, VariantSpec

log = logging.getLogger(__name__)

CPU_PROVIDER = "CPUExecutionProvider"
CUDA_PROVIDER = "CUDAExecutionProvider"
OPENVINO_PROVIDER = "OpenVINO"
"""A variant whose graph runs on the OpenVINO runtime (the optional `openvino` extra), not ONNX Runtime."""
CPU_RUNTIMES = (CPU_PROVIDER, OPENVINO_PROVIDER)
"""Providers of the variants that run on the CPU."""
REQUIRED_INPUTS = ("input_ids", "attention_mask")
"""Inputs every graph takes; `token_type_ids` only where the model has token types."""

Feed = Mapping[str, np.ndarray]
Outputs = dict[str, np.ndarray]

_OPENVINO_PRIMING = threading.Lock()
"""Held while an OpenVINO variant makes its first calls (`OpenVinoVariant._prime`)."""


def without_openvino_telemetry() -> None:
    """Keep OpenVINO's usage telemetry out of this process; call before openvino or nncf is first imported.

    `import openvino` sends a usage event to Google Analytics unless the user opted out in ~/intel, and on Linux it
    sends it from a forked child process (`multiprocessing`, fork start method) that it waits on for a second. A
    server must not phone home, and a fork while gRPC's and the runtimes' threads run can deadlock the child or, in
    gRPC's fork handlers, the server. openvino and nncf fall back to their own no-op telemetry when the
    `openvino_telemetry` package does not import, which a `None` entry in `sys.modules` makes so. Without effect
    once the package was imported."""
    sys.modules.setdefault("openvino_telemetry", None)  # type: ignore[arg-type]


@functools.cache
def openvino_available() -> bool:
    """Whether `openvino` imports (installed is not enough: a broken install fails only on import)."""
    if importlib.util.find_spec("openvino") is None:
        return False
    without_openvino_telemetry()
    try:
        import openvino  # noqa: F401
    except Exception as error:  # a native library that fails to load raises more than ImportError
        log.warning("openvino is installed but does not import: %s", error)
        return False
    return True


def cuda_available() -> bool:
    """Whether this process's ONNX Runtime has the CUDA execution provider."""
    if importlib.util.find_spec("onnxruntime") is None:
        return False
    import onnxruntime

    return CUDA_PROVIDER in onnxruntime.get_available_providers()


def can_run(provider: str) -> bool:
    """Whether this process can run a graph built for `provider`."""
    if provider == CUDA_PROVIDER:
        return cuda_available()
    if provider == OPENVINO_PROVIDER:
        return openvino_available()
    return provider == CPU_PROVIDER


@dataclass(frozen=True)
class RuntimeSettings:
    """How a variant's runtime is opened. The defaults are the service's (its settings take them from here), so the
    export's guard, which opens every variant with them, judges what the service serves."""

    intra_op_threads: int = 0
    """Threads inside one operator (ONNX Runtime) / inference threads (OpenVINO); 0 = the runtime's default."""
    inter_op_threads: int = 0
    """ONNX Runtime threads across operators; 0 = the runtime's default."""
    spinning: bool = False
    """Let ONNX Runtime's worker threads spin between operators."""
    openvino_streams: int = 2
    """OpenVINO: batches computed at once, the cores split between them; 1 = all cores on one batch (latency)."""
    openvino_lone_latency: bool = True
    """OpenVINO with several streams: also compile a copy for latency, for a batch with nothing beside it."""

    def __post_init__(self) -> None:
        if self.intra_op_threads < 0 or self.inter_op_threads < 0 or self.openvino_streams < 1:
            raise ValueError(f"threads must be >= 0 and streams >= 1: {self}")

    def concurrency(self, provider: str) -> int:
        """Batches a `provider` graph opened with these settings computes at once."""
        return self.openvino_streams if provider == OPENVINO_PROVIDER else 1

    def lone_copy(self, provider: str) -> bool:
        """Whether a `provider` graph opened with these settings has a latency copy for batches that run alone."""
        return provider == OPENVINO_PROVIDER and self.openvino_streams > 1 and self.openvino_lone_latency


def ort_session_options(settings: RuntimeSettings) -> Any:
    """ONNX Runtime's SessionOptions for `settings`."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = settings.intra_op_threads
    options.inter_op_num_threads = settings.inter_op_threads
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    spin = "1" if settings.spinning else "0"
    options.add_session_config_entry("session.intra_op.allow_spinning", spin)
    options.add_session_config_entry("session.inter_op.allow_spinning", spin)
    options.log_severity_level = 3
    return options


def ort_session(path: Path, settings: RuntimeSettings, providers: Sequence[Any] = (CPU_PROVIDER,)) -> Any:
    """An ONNX Runtime InferenceSession over `path` with `settings` on `providers` (names, or (name, options))."""
    import onnxruntime as ort

    return ort.InferenceSession(str(path), sess_options=ort_session_options(settings), providers=list(providers))


def openvino_configs(
    runtime_options: Mapping[str, Any], settings: RuntimeSettings
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The `compile_model` properties of an OpenVINO variant: (the graph that serves batches, the latency copy for a
    batch that runs alone, or None)."""
    latency: dict[str, Any] = {"PERFORMANCE_HINT": "LATENCY"}
    if settings.intra_op_threads:
        latency["INFERENCE_NUM_THREADS"] = settings.intra_op_threads
    latency.update(runtime_options)
    if settings.openvino_streams == 1:
        return latency, None
    streams = {**latency, "PERFORMANCE_HINT": "THROUGHPUT", "NUM_STREAMS": str(settings.openvino_streams)}
    return streams, (latency if settings.openvino_lone_latency else None)


class OpenedVariant:
    """A variant's graph, opened: `run(feed)` -> the contract outputs as numpy arrays (and the `extra` ones asked
    for)."""

    provider: str
    input_names: list[str]
    """The graph's inputs, in INPUT_NAMES order (what `run` takes of a feed)."""
    output_names: list[str]
    concurrency: int = 1
    """Batches it computes at once (calls from that many threads)."""
    lone_copy: bool = False
    """Whether `run(feed, alone=True)` runs on a copy compiled for latency."""

    def run(self, feed: Feed, alone: bool = False, extra: Sequence[str] = ()) -> Outputs:
        raise NotImplementedError

    def close(self) -> None:
        """Drop the runtime's objects (the memory goes when the calls still running end)."""

    def _names(self, extra: Sequence[str]) -> list[str]:
        """The outputs of one call: the variant's own, then the `extra` ones it asks for."""
        return self.output_names + [name for name in extra if name not in self.output_names]

    def _inputs(self, feed: Feed) -> dict[str, np.ndarray]:
        return {name: np.ascontiguousarray(feed[name], dtype=np.int64) for name in self.input_names}


def _graph_inputs(path: Path, inputs: set[str]) -> list[str]:
    """The graph's inputs in INPUT_NAMES order; ValueError when it lacks a required one."""
    missing = [name for name in REQUIRED_INPUTS if name not in inputs]
    if missing:
        raise ValueError(f"{path} lacks the inputs {missing}; a bundle graph takes {INPUT_NAMES}")
    return [name for name in INPUT_NAMES if name in inputs]


def _check_outputs(path: Path, outputs: set[str], output_names: Sequence[str]) -> None:
    absent = [name for name in output_names if name not in outputs]
    if absent:
        raise ValueError(f"{path} lacks the outputs {absent} of its task; it has {sorted(outputs)}")


class OrtVariant(OpenedVariant):
    """An ONNX Runtime session (CPU, or CUDA through IO binding)."""

    def __init__(self, path: Path, provider: str, output_names: Sequence[str], settings: RuntimeSettings) -> None:
        self.on_cuda = provider == CUDA_PROVIDER and cuda_available()
        self.provider = CUDA_PROVIDER if self.on_cuda else CPU_PROVIDER
        providers = [CUDA_PROVIDER, CPU_PROVIDER] if self.on_cuda else [CPU_PROVIDER]
        self.session: Any = ort_session(path, settings, providers)
        _check_outputs(path, {node.name for node in self.session.get_outputs()}, output_names)
        self.input_names = _graph_inputs(path, {node.name for node in self.session.get_inputs()})
        self.output_names = list(output_names)

    def run(self, feed: Feed, alone: bool = False, extra: Sequence[str] = ()) -> Outputs:
        inputs = self._inputs(feed)
        names = self._names(extra)
        if self.on_cuda:
            return self._run_io_binding(inputs, names)
        return dict(zip(names, self.session.run(names, inputs), strict=True))

    def _run_io_binding(self, inputs: dict[str, np.ndarray], names: list[str]) -> Outputs:
        binding = self.session.io_binding()
        for name, array in inputs.items():
            binding.bind_cpu_input(name, array)
        for name in names:
            binding.bind_output(name, "cuda")
        self.session.run_with_iobinding(binding)
        values = binding.copy_outputs_to_cpu()
        return {name: np.asarray(v, dtype=np.float32) for name, v in zip(names, values, strict=True)}

    def close(self) -> None:
        self.session = None


class OpenVinoVariant(OpenedVariant):
    """An OpenVINO CPU compiled model (and its latency copy, when the settings ask for one)."""

    provider = OPENVINO_PROVIDER

    def __init__(
        self, path: Path, runtime_options: Mapping[str, Any], output_names: Sequence[str], settings: RuntimeSettings
    ) -> None:
        without_openvino_telemetry()
        try:
            import openvino as ov
        except ImportError as error:
            raise ValueError(
                f"{path} is an OpenVINO variant: install the optional runtime with `pip install 'bertserve[openvino]'`"
            ) from error
        config, lone = openvino_configs(runtime_options, settings)
        core = ov.Core()
        model = core.read_model(str(path))
        self.compiled: Any = core.compile_model(model, "CPU", config)
        self.compiled_lone: Any = core.compile_model(model, "CPU", lone) if lone is not None else None
        self.output_names = list(output_names)
        self.concurrency = settings.openvino_streams
        self.lone_copy = self.compiled_lone is not None
        self._ports = self._contract_ports(path, self.compiled)
        self._lone_ports = self._contract_ports(path, self.compiled_lone) if self.lone_copy else {}
        self.input_names = _graph_inputs(path, {node.get_any_name() for node in self.compiled.inputs})
        self._local = threading.local()
        self._prime()

    def _prime(self) -> None:
        """One call of each compiled model on this thread, one variant at a time in the process, before any thread
        serves. OpenVINO's Python binding initialises function-local statics (its view of numpy's C API) on the
        first call that converts inputs: two threads making their first calls at once can deadlock there, one
        holding the GIL while it waits for the other's initialisation, the other waiting for the GIL inside it (a
        server that hung at warm-up with both runtime threads stopped in `data_dispatcher`)."""
        feed = {name: np.ones((1, 2), dtype=np.int64) for name in self.input_names}
        with _OPENVINO_PRIMING:
            self.run(feed)
            if self.lone_copy:
                self.run(feed, alone=True)

    def _contract_ports(self, path: Path, compiled: Any) -> dict[str, Any]:
        """Each output's port by each of its names (a compiled output may carry several, a fused node's among them);
        the contract outputs must be there."""
        ports = {name: port for port in compiled.outputs for name in port.get_names()}
        _check_outputs(path, set(ports), self.output_names)
        return ports

    def run(self, feed: Feed, alone: bool = False, extra: Sequence[str] = ()) -> Outputs:
        lone = alone and self.lone_copy
        key = "lone_request" if lone else "request"
        request = getattr(self._local, key, None)
        if request is None:  # one infer request per calling thread (and copy)
            request = (self.compiled_lone if lone else self.compiled).create_infer_request()
            setattr(self._local, key, request)
        result = request.infer(self._inputs(feed))
        ports = self._lone_ports if lone else self._ports
        # a copy: the request reuses its buffers
        return {name: np.array(result[ports[name]]) for name in self._names(extra)}

    def close(self) -> None:
        self.compiled = self.compiled_lone = None


def open_variant(
    path: Path, spec: VariantSpec, output_names: Sequence[str], settings: RuntimeSettings | None = None
) -> OpenedVariant:
    """Variant `spec` (its graph at `path`) opened on its runtime with `settings` (default: the service's), whose
    `run` returns `output_names` (the task's contract outputs). Raises ValueError when the graph does not fit."""
    settings = settings if settings is not None else RuntimeSettings()
    if spec.provider == OPENVINO_PROVIDER:
        return OpenVinoVariant(path, spec.runtime_options, output_names, settings)
    return OrtVariant(path, spec.provider, output_names, settings)
