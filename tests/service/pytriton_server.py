"""A real Triton server (the one nvidia-pytriton bundles) serving an export-step model repository, for tests.

Run with the Triton venv (`make triton-venv`):
    .venv-triton/bin/python tests/service/pytriton_server.py GRPC_PORT HTTP_PORT METRICS_PORT REPOSITORY
REPOSITORY is what `export.triton.write_triton_repository` writes: `<model>/config.pbtxt` + `<model>/1/model.onnx`.
pytriton ships only Triton's Python backend, not the onnxruntime backend, so each model is bound as a Python
function running its `model.onnx` with onnxruntime, under the config's name, inputs, outputs, max_batch_size and
dynamic-batcher delay. Prints READY when every model is loaded. Runs in the Triton venv (numpy<2, no project).
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
from google.protobuf import text_format
from pytriton.decorators import batch
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.server import triton_server
from pytriton.triton import Triton, TritonConfig
from tritonclient.grpc import model_config_pb2 as pb

DTYPES = {pb.TYPE_INT64: np.int64, pb.TYPE_FP32: np.float32}


def make_infer(session: ort.InferenceSession, inputs: list[str], outputs: list[str]):  # type: ignore[no-untyped-def]
    @batch
    def infer(**arrays: np.ndarray) -> dict[str, np.ndarray]:
        values = session.run(outputs, {name: arrays[name].astype(np.int64) for name in inputs})
        return dict(zip(outputs, values, strict=True))

    return infer


def bind(triton: Triton, model_dir: Path) -> None:
    config = text_format.Parse((model_dir / "config.pbtxt").read_text(), pb.ModelConfig())
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(model_dir / "1" / "model.onnx"), options, providers=["CPUExecutionProvider"])
    inputs = [Tensor(name=i.name, dtype=DTYPES[i.data_type], shape=tuple(i.dims)) for i in config.input]
    outputs = [Tensor(name=o.name, dtype=DTYPES[o.data_type], shape=tuple(o.dims)) for o in config.output]
    delay = config.dynamic_batching.max_queue_delay_microseconds
    triton.bind(
        model_name=config.name,
        infer_func=make_infer(session, [i.name for i in config.input], [o.name for o in config.output]),
        inputs=inputs,
        outputs=outputs,
        config=ModelConfig(
            max_batch_size=config.max_batch_size, batcher=DynamicBatcher(max_queue_delay_microseconds=delay)
        ),
        strict=False,
    )


def main() -> None:
    # tritonserver's Python-backend stubs do not exit on SIGINT here; pytriton would wait 30 s before killing it
    triton_server.SERVER_OUTPUT_TIMEOUT_SECS = 3
    grpc_port, http_port, metrics_port = (int(arg) for arg in sys.argv[1:4])
    repository = Path(sys.argv[4])
    config = TritonConfig(
        grpc_port=grpc_port,
        http_port=http_port,
        metrics_port=metrics_port,
        exit_timeout_secs=2,
        grpc_address="127.0.0.1",
        http_address="127.0.0.1",
    )
    with Triton(config=config) as triton:
        for model_dir in sorted(p for p in repository.iterdir() if (p / "config.pbtxt").is_file()):
            bind(triton, model_dir)
        triton.run()
        print("READY", flush=True)
        signal.sigwait({signal.SIGTERM, signal.SIGINT})


if __name__ == "__main__":
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    main()
