"""The `triton` peer of the load tests: a real Triton server's dynamic batcher behind the service's REST paths.

Two parts, as one would deploy Triton behind an API: this process (FastAPI in the project's venv) starts
`loadtests.peers.triton_models` in the Triton venv (Triton itself and the bound Python functions that tokenize, run
the bundle's default variant and post-process), waits until Triton reports every model ready, then forwards
every POST /classify, /qa, /ner, /embed and /v1/embeddings as one Triton inference request (tritonclient's
asyncio gRPC client): the JSON body goes in as it came, the status and JSON answer come back as they are.
`x-inference-time-ms` carries the bound function's model-call time of the batch the request was in. GET /health
answers 200 once Triton serves. Stopping this process stops Triton. For comparison only: not part of the product.

    python -m loadtests.peers.triton_peer --port 8200 --model classify=artifacts/bundles/minilm-sst2 \
        [--triton-python .venv-triton/bin/python] [--max-batch-size 8] [--max-queue-delay-us 0]
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import numpy as np
from fastapi import FastAPI, Request, Response

from loadtests.targets import REPO, TRITON_PYTHON, triton_venv_problem

ROUTES = {"/classify": "classify", "/qa": "qa", "/ner": "ner", "/embed": "embed", "/v1/embeddings": "embed"}
READY_TIMEOUT_S = 300.0
START_ATTEMPTS = 3
"""Starts of Triton before giving up when it exits before it is ready. With two instances of a model, pytriton's
second instance may connect to the first one's handshake socket after it is bound but before it listens
(`ConnectionRefusedError` in `get_config_from_handshake_server`), and the model fails to load; a loaded machine
widens that window. A new start draws the race again; a real error (a bad bundle) fails every attempt alike."""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _stop_with_parent() -> None:
    """In the child before exec: SIGTERM when this process dies, even by SIGKILL (Linux prctl PR_SET_PDEATHSIG)."""
    if sys.platform == "linux":
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)


class TritonProcess:
    """`loadtests.peers.triton_models` in the Triton venv: started, polled until Triton says every model is ready,
    stopped with its process group. Its output goes to ours (the runner's server log)."""

    def __init__(
        self, python: Path, models: dict[str, str], max_batch_size: int, delay_us: int, instances: int = 2
    ) -> None:
        self.grpc_port = _free_port()
        self.models = list(models)
        self.command = [str(python), "-m", "loadtests.peers.triton_models", "--grpc-port", str(self.grpc_port)]
        self.command += ["--http-port", str(_free_port()), "--metrics-port", str(_free_port())]
        self.command += ["--max-batch-size", str(max_batch_size), "--max-queue-delay-us", str(delay_us)]
        self.command += ["--instances", str(instances)]
        for task, folder in models.items():
            self.command += ["--model", f"{task}={folder}"]
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = READY_TIMEOUT_S, attempts: int = START_ATTEMPTS) -> None:
        """Start Triton and wait until every model is ready; start again (at most `attempts` starts in all) when it
        exits before that (see START_ATTEMPTS)."""
        for attempt in range(1, attempts + 1):
            status = self._start_once(timeout_s)
            if status is None:
                return
            message = f"Triton exited with status {status} before it was ready (start {attempt} of {attempts})"
            if attempt == attempts:
                raise RuntimeError(message)
            print(f"{message}; starting it again", file=sys.stderr, flush=True)

    def _start_once(self, timeout_s: float) -> int | None:
        """None once Triton is ready, its exit status if it exits first; RuntimeError when time runs out."""
        # Triton's Python-backend stub links the system libpython, found through LD_LIBRARY_PATH
        library = str(sysconfig.get_config_var("LIBDIR"))
        env = {**os.environ, "PYTHONPATH": str(REPO), "LD_LIBRARY_PATH": library}
        self.process = subprocess.Popen(
            self.command, cwd=REPO, env=env, start_new_session=True, preexec_fn=_stop_with_parent
        )
        deadline = time.monotonic() + timeout_s
        while not self._ready():
            if self.process.poll() is not None:
                return self.process.returncode
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"Triton did not become ready within {timeout_s:.0f} s (its log is above)")
            time.sleep(0.5)
        return None

    def _ready(self) -> bool:
        """Triton's own readiness: the server and every model (a polled gRPC call; False while it starts)."""
        from tritonclient.grpc import InferenceServerClient
        from tritonclient.utils import InferenceServerException

        client = InferenceServerClient(f"127.0.0.1:{self.grpc_port}")
        try:
            return bool(client.is_server_ready()) and all(client.is_model_ready(model) for model in self.models)
        except InferenceServerException:
            return False
        finally:
            client.close()

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


def create_app(triton_url: str) -> FastAPI:
    """The REST paths of the service, each forwarded to the Triton model of its task."""
    from tritonclient.grpc import InferInput, InferRequestedOutput
    from tritonclient.grpc.aio import InferenceServerClient

    client: dict[str, Any] = {}

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        client["triton"] = InferenceServerClient(triton_url)
        try:
            yield
        finally:
            await client["triton"].close()

    app = FastAPI(title="Triton peer (load tests)", lifespan=lifespan)
    outputs = [InferRequestedOutput(name) for name in ("status", "body", "inference_ms")]

    async def forward(request: Request) -> Response:
        route = request.url.path
        payloads = {"request": await request.body(), "route": route.encode()}
        inputs = []
        for name, payload in payloads.items():
            tensor = InferInput(name, [1, 1], "BYTES")
            tensor.set_data_from_numpy(np.array([[payload]], dtype=object))
            inputs.append(tensor)
        result = await client["triton"].infer(ROUTES[route], inputs, outputs=outputs)
        headers = {"x-inference-time-ms": f"{float(result.as_numpy('inference_ms')[0, 0]):.3f}"}
        status = int(result.as_numpy("status")[0, 0])
        return Response(result.as_numpy("body")[0, 0], status, headers, media_type="application/json")

    for path in ROUTES:
        app.add_api_route(path, forward, methods=["POST"])

    @app.get("/health")
    async def health() -> dict[str, str]:
        """Triton serves every model."""
        return {"status": "ready"}

    return app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8200)
    parser.add_argument("--model", action="append", default=[], help="TASK=BUNDLE_FOLDER (classify, qa, ner, embed)")
    parser.add_argument("--triton-python", type=Path, default=TRITON_PYTHON)
    parser.add_argument("--max-batch-size", type=int, default=8, help="requests per call of the bound function")
    parser.add_argument("--max-queue-delay-us", type=int, default=0, help="Triton's dynamic batcher delay")
    parser.add_argument(
        "--instances", type=int, default=2, help="Triton model instances (the service's --openvino-streams default)"
    )
    args = parser.parse_args(argv)
    models = dict(item.split("=", 1) for item in args.model if "=" in item)
    if not models or len(models) != len(args.model) or set(models) - set(ROUTES.values()):
        parser.error(f"give --model TASK=BUNDLE with TASK in {sorted(set(ROUTES.values()))} (got {args.model})")
    problem = triton_venv_problem(args.triton_python)
    if problem:
        parser.error(problem)
    import uvicorn

    triton = TritonProcess(args.triton_python, models, args.max_batch_size, args.max_queue_delay_us, args.instances)
    # uvicorn re-raises SIGTERM / SIGINT after its shutdown: exit through `finally` so that Triton stops too
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: sys.exit(0))
    try:
        triton.start()
        app = create_app(f"127.0.0.1:{triton.grpc_port}")
        uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    except RuntimeError as error:
        sys.exit(f"error: {error}")
    finally:
        triton.stop()


if __name__ == "__main__":
    main()
