"""The Triton backend against a real Triton server (nvidia-pytriton, in its own venv: `make triton-venv`).

The repository is written by `export.triton.write_triton_repository` (the export step's writer); pytriton has only
Triton's Python backend, so tests/service/pytriton_server.py binds each config's model.onnx through onnxruntime.
Our service runs with `--backend triton`; answers must equal the in-process ONNX Runtime backend's on the same
bundles (REST and gRPC), tritonclient talks to the same Triton directly, and with Triton batching on our
batcher passes requests through. Skipped, with the reason, when the Triton venv is absent or Triton cannot start.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sysconfig
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.service.server import REPO, ServerProcess, free_port, serving
from tests.service.test_http_api import LONG_CONTEXT

pytestmark = pytest.mark.integration

TRITON_PYTHON = REPO / ".venv-triton" / "bin" / "python"


@pytest.fixture(scope="module")
def triton_server(tiny_bundles: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if not TRITON_PYTHON.exists():
        pytest.skip("no Triton venv: run `make triton-venv` (nvidia-pytriton needs numpy<2, so it has its own venv)")
    grpc_port, http_port, metrics_port = free_port(), free_port(), free_port()
    log = tmp_path_factory.mktemp("triton") / "triton.log"
    # pytriton's Python-backend stub links the system libpython (see ../shared/README.md)
    env = {**os.environ, "LD_LIBRARY_PATH": str(sysconfig.get_config_var("LIBDIR"))}
    # the model repository exactly as the export step writes it (config.pbtxt + 1/model.onnx per bundle)
    from export.triton import write_triton_repository

    repository = tmp_path_factory.mktemp("triton-repo")
    for bundle in tiny_bundles.values():
        write_triton_repository(bundle, repository)
    command = [str(TRITON_PYTHON), str(Path(__file__).with_name("pytriton_server.py")), str(grpc_port), str(http_port)]
    command += [str(metrics_port), str(repository)]
    with open(log, "w") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            deadline = time.monotonic() + 120
            while "READY" not in log.read_text():
                if process.poll() is not None or time.monotonic() > deadline:
                    process.kill()
                    pytest.skip(f"Triton did not start here: {log.read_text()[-2000:]}")
                time.sleep(0.2)
            yield f"127.0.0.1:{grpc_port}"
        finally:
            process.terminate()
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)  # the group this fixture started: Triton + its stubs
                process.wait()


@pytest.fixture(scope="module")
def servers(
    triton_server: str, server: ServerProcess, tiny_bundles: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    log = tmp_path_factory.mktemp("api-triton") / "server.log"
    env = {"BERTSERVE_TRITON_URL": triton_server}
    with serving(list(tiny_bundles.values()), log, env, "--backend", "triton", clean_exit=True) as via_triton:
        yield via_triton, server


def test_tritonclient_talks_to_the_same_models(triton_server: str) -> None:
    import tritonclient.grpc as client

    with client.InferenceServerClient(url=triton_server) as triton:
        assert triton.is_server_live() and triton.is_model_ready("tiny-classify")
        ids = np.array([[101, 7592, 2088, 102]], dtype=np.int64)
        inputs = []
        for name, value in (
            ("input_ids", ids),
            ("attention_mask", np.ones_like(ids)),
            ("token_type_ids", np.zeros_like(ids)),
        ):
            tensor = client.InferInput(name, list(value.shape), "INT64")
            tensor.set_data_from_numpy(value)
            inputs.append(tensor)
        logits = triton.infer("tiny-classify", inputs).as_numpy("logits")
        assert logits.shape == (1, 2)


def test_triton_backend_answers_like_onnx_runtime(servers: tuple[ServerProcess, ServerProcess]) -> None:
    via_triton, in_process = servers
    requests = [
        ("/classify", {"inputs": ["loved it", "a tedious mess", "fine"], "top_k": None}),
        ("/classify", {"inputs": [f"review {i} " + "word " * i for i in range(40)]}),  # > Triton's max_batch_size
        ("/qa", {"question": "Which river?", "context": LONG_CONTEXT, "top_k": 3}),
        ("/ner", {"inputs": ["Ada Lovelace worked with Charles Babbage in London."], "aggregation_strategy": "first"}),
    ]
    for path, body in requests:
        a = httpx.post(via_triton.url + path, json=body, timeout=60)
        b = httpx.post(in_process.url + path, json=body, timeout=60)
        assert a.status_code == b.status_code == 200, a.text
        _assert_close(a.json(), b.json())
    models = httpx.get(via_triton.url + "/models").json()["models"]
    assert {m["backend"] for m in models} == {"triton"} and models[0]["variant"].startswith("triton:")


def test_triton_backend_under_concurrency_and_grpc(servers: tuple[ServerProcess, ServerProcess]) -> None:
    import grpc

    from service.grpc_api.stubs import bert_pb2 as pb
    from service.grpc_api.stubs import bert_pb2_grpc as pb_grpc

    via_triton, in_process = servers
    with grpc.insecure_channel(via_triton.grpc_target) as a, grpc.insecure_channel(in_process.grpc_target) as b:
        request = pb.ClassifyRequest(inputs=[pb.TextInput(text=f"text number {i}") for i in range(8)], top_k=0)
        futures = [pb_grpc.ClassifierStub(a).Classify.future(request, timeout=60) for _ in range(32)]
        expected = pb_grpc.ClassifierStub(b).Classify(request, timeout=60)
        for future in futures:
            got = future.result()
            for x, y in zip(got.results, expected.results, strict=True):
                assert [s.label for s in x.labels] == [s.label for s in y.labels]
                np.testing.assert_allclose([s.score for s in x.labels], [s.score for s in y.labels], atol=1e-5)
    started = time.monotonic()
    assert httpx.get(via_triton.url + "/health/ready").status_code == 200
    assert time.monotonic() - started < 5


def _assert_close(a: object, b: object) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        assert a.keys() == b.keys()
        for key in a:
            _assert_close(a[key], b[key])
    elif isinstance(a, list) and isinstance(b, list):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _assert_close(x, y)
    elif isinstance(a, float):
        assert a == pytest.approx(b, abs=1e-4)
    else:
        assert a == b
