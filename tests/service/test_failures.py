"""Failure paths fail loudly and promptly: through a real server process, a batch loop killed by a test hook and a
backend that keeps failing answer their callers at once, turn liveness and gRPC health off, and end the process
with status 1 after its drain; a bundle that cannot load, or a `--variant` no bundle has, ends it with status 1
and the reason on one log line. Also: closing a backend never blocks the event loop."""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bundles.spec import BundleManifest, VariantSpec
from service.backends.ort_backend import OrtBackend
from service.grpc_api.stubs import bert_pb2 as pb
from service.grpc_api.stubs import bert_pb2_grpc as pb_grpc
from service.serve import QUIET_MAX_S
from tests.service.server import LAUNCH, ServerProcess

# Faults injected into the server process by monkeypatching before it starts; each fires once the file named by
# FAULT_TRIGGER exists, so the server loads and warms up normally first.
FAULTS = {
    "loop": (
        "import service.engine.batcher as patched\n"
        "cut = patched.Batcher._take_batch\n"
        "def take(self, *args, **kwargs):\n"
        "    if os.path.exists(os.environ['FAULT_TRIGGER']):\n"
        "        raise RuntimeError('batch loop killed by the test hook')\n"
        "    return cut(self, *args, **kwargs)\n"
        "patched.Batcher._take_batch = take\n"
    ),
    "backend": (
        "import service.backends.ort_backend as patched\n"
        "run = patched.OrtBackend._run\n"
        "def dying(self, *args):\n"
        "    if os.path.exists(os.environ['FAULT_TRIGGER']):\n"
        "        raise RuntimeError('the runtime died (test hook)')\n"
        "    return run(self, *args)\n"
        "patched.OrtBackend._run = dying\n"
    ),
}
DRAIN_S, GRACE_S = 1.0, 2.0
EXIT_BOUND_S = DRAIN_S + GRACE_S + QUIET_MAX_S + 10.0
"""A failed server exits within its drain, grace and listener-closing bounds (+ interpreter teardown, a busy CPU)."""


def launch_with(fault: str) -> str:
    return "import os, sys; sys.modules['torch'] = None\n" + FAULTS[fault] + LAUNCH


def timed(call: Callable[[], tuple[int, str]]) -> tuple[int, str, float]:
    start = time.monotonic()
    status, code = call()
    return status, code, time.monotonic() - start


def rest_classify(url: str) -> tuple[int, str]:
    response = httpx.post(url + "/classify", json={"inputs": "hello there"}, timeout=20)
    return response.status_code, response.json()["error"]["code"] if response.status_code != 200 else "ok"


def grpc_classify(target: str) -> tuple[int, str]:
    with grpc.insecure_channel(target) as channel:
        try:
            pb_grpc.ClassifierStub(channel).Classify(pb.ClassifyRequest(inputs=[pb.TextInput(text="hi")]), timeout=20)
        except grpc.RpcError as error:
            return 0, error.code().name
    return 0, "OK"


def assert_failed_and_exits(server: ServerProcess, triggered: float, reason: str) -> None:
    live = httpx.get(server.url + "/health/live", timeout=5)
    assert live.status_code == 503 and live.json()["status"] == "failed", live.text
    assert reason in live.json()["detail"]
    with grpc.insecure_channel(server.grpc_target) as channel:
        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
    assert health.status == health_pb2.HealthCheckResponse.NOT_SERVING
    code = server.process.wait(EXIT_BOUND_S)
    assert code == 1, server.logs()
    assert time.monotonic() - triggered < EXIT_BOUND_S
    assert "exiting with status 1" in server.logs() and reason in server.logs()


# "loop": every caller hears 503 model_failed; "backend" (2 failures in a row allowed): two 500 backend_error, then
# the model has failed and callers hear 503 model_failed.
EXPECTED = {
    "loop": ([(503, "model_failed")] * 3, "batch loop killed by the test hook"),
    "backend": ([(500, "backend_error")] * 2 + [(503, "model_failed")], "2 batches in a row failed"),
}


@pytest.mark.integration
@pytest.mark.parametrize("fault", ["loop", "backend"])
def test_a_dead_batch_loop_or_backend_answers_at_once_turns_unlive_and_exits_1(
    fault: str, tiny_bundles: dict[str, Path], tmp_path: Path
) -> None:
    trigger = tmp_path / "fault"
    env = {
        "FAULT_TRIGGER": str(trigger),
        "BERTSERVE_DRAIN_S": str(DRAIN_S),
        "BERTSERVE_SHUTDOWN_GRACE_S": str(GRACE_S),
        "BERTSERVE_REQUEST_TIMEOUT_S": "10",
        "BERTSERVE_MAX_CONSECUTIVE_FAILURES": "2",
        "BERTSERVE_WARMUP_ROUNDS": "1",
    }
    server = ServerProcess([tiny_bundles["classify"]], tmp_path / "server.log", env, launch=launch_with(fault))
    try:
        server.wait_ready()
        assert rest_classify(server.url) == (200, "ok")
        trigger.touch()
        triggered = time.monotonic()
        expected, reason = EXPECTED[fault]
        answers = [timed(lambda: rest_classify(server.url)) for _ in expected]
        assert [(status, code) for status, code, _ in answers] == expected, server.logs()
        assert max(seconds for *_, seconds in answers) < 1.0, answers
        with ThreadPoolExecutor(4) as pool:  # callers at once, over both doors, after the failure
            later = [
                *(pool.submit(timed, lambda: rest_classify(server.url)) for _ in range(2)),
                *(pool.submit(timed, lambda: grpc_classify(server.grpc_target)) for _ in range(2)),
            ]
            results = [future.result() for future in later]
        assert [code for _, code, _ in results] == ["model_failed"] * 2 + ["UNAVAILABLE"] * 2, results
        assert max(seconds for *_, seconds in results) < 1.0, results
        assert_failed_and_exits(server, triggered, reason)
    finally:
        server.terminate()


def broken_copy(bundle: Path, out: Path) -> Path:
    """The bundle with its graph replaced by bytes that are no ONNX model."""
    shutil.copytree(bundle, out)
    (out / "cpu-fp32.onnx").write_bytes(b"these bytes are no ONNX graph")
    return out


@pytest.mark.integration
@pytest.mark.parametrize(
    ("case", "needle"),
    [
        ("graph", "cpu-fp32.onnx"),
        ("variant", "--variant 'cpu-fp3': bundle 'tiny-classify' has no such variant; its variants are cpu-fp32"),
    ],
    ids=["graph", "variant"],
)
def test_a_model_that_fails_to_load_exits_1_with_the_reason_on_one_line(
    case: str, needle: str, tiny_bundles: dict[str, Path], tmp_path: Path
) -> None:
    bundle = tiny_bundles["classify"]
    if case == "graph":
        bundle = broken_copy(bundle, tmp_path / "tiny-classify")
    args = ("--variant", "cpu-fp3") if case == "variant" else ()
    server = ServerProcess([bundle], tmp_path / "server.log", {"BERTSERVE_DRAIN_S": "30"}, *args)
    try:
        code = server.process.wait(60)  # no drain: nothing was ever routed to a server that never loaded
        assert code == 1, server.logs()
        lines = [json.loads(line) for line in server.logs().splitlines() if line.startswith("{")]
        failed = [line for line in lines if line["message"].startswith("loading models failed: ")]
        assert len(failed) == 1 and needle in failed[0]["message"], server.logs()
        assert any(line["message"].startswith("exiting with status 1: loading models failed") for line in lines)
    finally:
        server.terminate()


def test_closing_a_backend_never_blocks_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """A backend call still running when the backend closes: the loop keeps ticking while close waits for it."""
    manifest = BundleManifest(
        name="m",
        task="classify",
        max_seq_length=16,
        labels=["a", "b"],
        variants={"cpu-fp32": VariantSpec("cpu-fp32.onnx", "CPUExecutionProvider", "fp32")},
    )
    backend = OrtBackend(".", manifest, device="cpu")

    def slow_run(inputs: dict[str, np.ndarray], lone: bool = False, extra: Sequence[str] = ()) -> dict[str, np.ndarray]:
        time.sleep(0.5)
        return {"logits": np.zeros((1, 2), np.float32)}

    monkeypatch.setattr(backend, "_run", slow_run)

    async def go() -> float:
        ids = np.ones((1, 4), np.int64)
        call = asyncio.create_task(backend.infer({"input_ids": ids, "attention_mask": ids, "token_type_ids": ids}))
        await asyncio.sleep(0.05)  # the call runs in the worker thread
        longest_gap, last = 0.0, time.perf_counter()

        async def tick() -> None:
            nonlocal longest_gap, last
            while True:
                await asyncio.sleep(0.01)
                now = time.perf_counter()
                longest_gap, last = max(longest_gap, now - last), now

        ticker = asyncio.create_task(tick())
        await asyncio.sleep(0.05)  # the ticker runs
        await backend.close()
        await asyncio.sleep(0.05)  # a loop blocked inside close shows as the ticker's gap once it runs again
        ticker.cancel()
        await call
        return longest_gap

    assert asyncio.run(go()) < 0.2
