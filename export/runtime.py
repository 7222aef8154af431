"""Opening an exported graph for inference on this CPU: ONNX Runtime sessions (and OpenVINO, optional).

Session settings follow ONNX Runtime's performance-tuning guide: intra-op threads = physical cores, one
inter-op thread, full graph optimization. Worker threads do not spin unless asked (`spinning=True`): spinning
trades idle CPU for latency, and a spinning pool takes the cores a server's event loop and tokenization need.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np

Runner = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]
"""feed (input name -> int64 array) -> outputs (output name -> float32 array)."""


def cpu_threads() -> int:
    """Threads to use: the cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def ort_session_options(threads: int | None = None, spinning: bool = False) -> object:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads or cpu_threads()
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
    options.log_severity_level = 3
    return options


def ort_runner(path: Path, provider: str = "CPUExecutionProvider", threads: int | None = None) -> Runner:
    """An ONNX Runtime session over `path` on `provider` (falls back to CPU when it is not available here)."""
    import onnxruntime as ort

    available = ort.get_available_providers()
    providers = list(dict.fromkeys([provider, "CPUExecutionProvider"])) if provider in available else []
    session = ort.InferenceSession(
        str(path), ort_session_options(threads), providers=providers or ["CPUExecutionProvider"]
    )
    names = [output.name for output in session.get_outputs()]

    def run(feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(zip(names, session.run(names, feed), strict=True))

    return run


def openvino_runner(path: Path, options: dict[str, str] | None = None, threads: int | None = None) -> Runner:
    """An OpenVINO CPU compiled model over an ONNX file (the optional `openvino` extra).

    `options` are the variant's `runtime_options` (compile_model properties such as INFERENCE_PRECISION_HINT).
    """
    try:
        import openvino as ov
    except ImportError as error:
        raise ValueError(
            f"{path} is an OpenVINO variant: install the optional runtime with `pip install 'bertserve[openvino]'`"
        ) from error
    config: dict[str, object] = {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": threads or cpu_threads()}
    config.update(options or {})
    core = ov.Core()
    model = core.read_model(str(path))
    # the graph's output names, read before compiling: a compiled output may also carry the name of a node fused
    # into it (a MatMul whose bias Add wrote the output), and get_any_name() may return that one
    names = [output.get_any_name() for output in model.outputs]
    compiled = core.compile_model(model, "CPU", config)
    request = compiled.create_infer_request()

    def run(feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        result = request.infer(feed)
        return {name: np.asarray(result[compiled.output(name)]) for name in names}

    return run
