"""A real Triton server (the one nvidia-pytriton bundles) serving bundles' ONNX graphs, for the Triton test.

Run with the Triton venv (`make triton-venv`): `.venv-triton/bin/python tests/service/pytriton_server.py
GRPC_PORT HTTP_PORT METRICS_PORT BUNDLE...`. pytriton ships only Triton's Python backend, so each model is
a Python function running the bundle's ONNX graph with onnxruntime, under the bundle's name, with the
contract's input/output names and Triton's dynamic batcher on. Prints READY when every model is loaded.
Standalone on purpose (stdlib + numpy + onnxruntime + pytriton): the Triton venv has numpy<2 and no project.
"""

from __future__ import annotations

import json
import signal
import sys
import sysconfig
from pathlib import Path

import numpy as np
import onnxruntime as ort
from pytriton.decorators import batch
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.server import triton_server
from pytriton.triton import Triton, TritonConfig

INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")
OUTPUTS = {
    "classify": {"logits": (-1,)},
    "qa": {"start_logits": (-1,), "end_logits": (-1,)},
    "ner": {"logits": (-1, -1)},
}


def make_infer(session: ort.InferenceSession, output_names: list[str]):  # type: ignore[no-untyped-def]
    @batch
    def infer(**inputs: np.ndarray) -> dict[str, np.ndarray]:
        feed = {name: inputs[name].astype(np.int64) for name in INPUT_NAMES}
        values = session.run(output_names, feed)
        return dict(zip(output_names, values, strict=True))

    return infer


def main() -> None:
    # tritonserver's Python-backend stubs do not exit on SIGINT here; pytriton would wait 30 s before killing it
    triton_server.SERVER_OUTPUT_TIMEOUT_SECS = 3
    grpc_port, http_port, metrics_port = (int(arg) for arg in sys.argv[1:4])
    bundles = [Path(arg) for arg in sys.argv[4:]]
    config = TritonConfig(
        grpc_port=grpc_port,
        http_port=http_port,
        metrics_port=metrics_port,
        exit_timeout_secs=2,
        grpc_address="127.0.0.1",
        http_address="127.0.0.1",
    )
    with Triton(config=config) as triton:
        for bundle in bundles:
            manifest = json.loads((bundle / "manifest.json").read_text())
            variant = manifest["variants"][manifest["default_variants"]["cpu"]]
            options = ort.SessionOptions()
            options.intra_op_num_threads = 1
            session = ort.InferenceSession(str(bundle / variant["file"]), options, providers=["CPUExecutionProvider"])
            outputs = OUTPUTS[manifest["task"]]
            triton.bind(
                model_name=manifest["name"],
                infer_func=make_infer(session, list(outputs)),
                inputs=[Tensor(name=name, dtype=np.int64, shape=(-1,)) for name in INPUT_NAMES],
                outputs=[Tensor(name=name, dtype=np.float32, shape=shape) for name, shape in outputs.items()],
                config=ModelConfig(max_batch_size=64, batcher=DynamicBatcher(max_queue_delay_microseconds=2000)),
                strict=False,
            )
        triton.run()
        print("READY", flush=True)
        signal.sigwait({signal.SIGTERM, signal.SIGINT})


if __name__ == "__main__":
    print("libdir", sysconfig.get_config_var("LIBDIR"), file=sys.stderr)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    main()
