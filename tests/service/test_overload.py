"""Overload: far beyond capacity the server refuses with 429 before any work, answers every request, nothing
crashes; and (slow) memory stays flat over a 5-minute soak at overload."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.service.server import ServerProcess, serving

pytestmark = pytest.mark.integration

QUEUE = 64  # sequences per model
TEXTS = [f"review number {i}: " + "a surprisingly moving and well acted film " * (1 + i % 4) for i in range(50)]


@pytest.fixture(scope="module")
def small_queue_server(
    tiny_bundles: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    env = {"BERTSERVE_MAX_QUEUE": str(QUEUE), "BERTSERVE_REQUEST_TIMEOUT_S": "10"}
    log = tmp_path_factory.mktemp("overload") / "server.log"
    with serving([tiny_bundles["classify"]], log, env, clean_exit=True) as server:
        yield server


async def _blast(url: str, clients: int, duration: float, per_request: int) -> dict[int, list[float]]:
    """`clients` closed-loop clients for `duration` s; latencies (ms) by status code."""
    by_status: dict[int, list[float]] = {}
    stop_at = time.perf_counter() + duration
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=30, limits=limits) as client:

        async def user(offset: int) -> None:
            index = offset
            while time.perf_counter() < stop_at:
                body = {"inputs": [TEXTS[(index + k) % len(TEXTS)] for k in range(per_request)]}
                start = time.perf_counter()
                response = await client.post("/classify", json=body)
                by_status.setdefault(response.status_code, []).append((time.perf_counter() - start) * 1000)
                server_ms = float(response.headers.get("x-server-time-ms", "nan"))
                by_status.setdefault(-response.status_code, []).append(server_ms)  # negative key: server-side
                index += 1

        await asyncio.gather(*(user(i) for i in range(clients)))
    return by_status


def _batch_metric(url: str, suffix: str) -> float:
    """`bertserve_batch_size_<suffix>` of the tiny model: backend calls (count) or sequences run (sum)."""
    prefix = f'bertserve_batch_size_{suffix}{{model="tiny-classify"}}'
    text = httpx.get(url + "/metrics").text
    return float(next(line for line in text.splitlines() if line.startswith(prefix)).split()[-1])


def test_overload_rejects_at_the_door_and_answers_every_request(small_queue_server: ServerProcess) -> None:
    # 32 clients x 48 sequences = 1536 sequences in flight against a queue of 64: one request fits at a time
    rows_before = _batch_metric(small_queue_server.url, "sum")
    result = asyncio.run(_blast(small_queue_server.url, clients=32, duration=6, per_request=48))
    # every request answered: accepted or refused with 429, never a timeout (504), a 5xx or a dropped connection
    assert set(result) <= {200, 429, -200, -429}, {k: len(v) for k, v in result.items()}
    accepted, rejected = result.get(200, []), result.get(429, [])
    assert len(rejected) >= 50 and len(accepted) >= 20, (len(accepted), len(rejected))
    # a refusal is decided before any tokenization or queueing: the model ran exactly the accepted requests' rows
    rows_run = _batch_metric(small_queue_server.url, "sum") - rows_before
    assert rows_run == 48 * len(accepted), (rows_run, len(accepted), len(rejected))
    response = httpx.post(small_queue_server.url + "/classify", json={"inputs": "still alive"}, timeout=30)
    assert response.status_code == 200
    reject_p50, accept_p50 = np.percentile(rejected, 50), np.percentile(accepted, 50)
    print(
        f"overload: {len(accepted)} accepted (client p50 {accept_p50:.0f} ms), {len(rejected)} refused with 429 "
        f"(client p50 {reject_p50:.0f} ms); the model ran {rows_run:.0f} rows"
    )
    metrics = httpx.get(small_queue_server.url + "/metrics").text
    assert 'bertserve_rejected_total{model="tiny-classify",reason="queue_full"}' in metrics
    assert "Traceback" not in small_queue_server.logs()


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


@pytest.mark.slow
def test_memory_is_flat_over_a_soak(small_queue_server: ServerProcess) -> None:
    """5 minutes (BERTSERVE_SOAK_S) at overload; RSS sampled every 10 s must not keep growing."""
    if not Path("/proc/self/status").exists():
        pytest.skip("needs /proc to read the server's memory")
    duration = float(os.environ.get("BERTSERVE_SOAK_S", "300"))
    pid = small_queue_server.process.pid
    samples: list[tuple[float, int]] = []

    async def sample() -> None:
        start = time.perf_counter()
        while time.perf_counter() - start < duration:
            samples.append((time.perf_counter() - start, _rss_kb(pid)))
            await asyncio.sleep(10)

    async def soak() -> dict[int, list[float]]:
        results = await asyncio.gather(_blast(small_queue_server.url, 32, duration, 8), sample())
        return results[0]

    result = {k: v for k, v in asyncio.run(soak()).items() if k > 0}
    assert set(result) <= {200, 429}
    warm = [rss for t, rss in samples if t >= 60] or [rss for _, rss in samples]
    first, last = np.mean(warm[: max(1, len(warm) // 4)]), np.mean(warm[-max(1, len(warm) // 4) :])
    count = sum(map(len, result.values()))
    print(f"soak: {count} requests, RSS first quarter {first / 1024:.1f} MiB, last quarter {last / 1024:.1f} MiB")
    assert last <= first * 1.05 + 10 * 1024, samples  # flat: under 5 % + 10 MiB growth after warm-up


@pytest.fixture(scope="module")
def batching_server(tiny_bundles: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    env = {"BERTSERVE_MAX_WAIT_MS": "50"}  # so that 64 requests sent at once meet in the queue even on a busy CPU
    log = tmp_path_factory.mktemp("batching") / "server.log"
    with serving([tiny_bundles["classify"]], log, env, clean_exit=True) as server:
        yield server


def test_64_concurrent_requests_share_backend_calls_with_unbatched_results(batching_server: ServerProcess) -> None:
    texts = [TEXTS[i % len(TEXTS)][: 20 + 7 * i] for i in range(64)]
    alone = []
    with httpx.Client(base_url=batching_server.url, timeout=30) as client:
        for text in texts:
            alone.append(client.post("/classify", json={"inputs": text, "top_k": None}).json())

    async def together() -> list:
        async with httpx.AsyncClient(base_url=batching_server.url, timeout=30) as client:
            responses = await asyncio.gather(
                *(client.post("/classify", json={"inputs": text, "top_k": None}) for text in texts)
            )
        return [r.json() for r in responses]

    before = _batch_metric(batching_server.url, "count")
    batched = asyncio.run(together())
    calls = _batch_metric(batching_server.url, "count") - before
    print(f"batching: 64 concurrent requests -> {calls:.0f} backend calls")
    assert calls <= 16, calls
    for a, b in zip(batched, alone, strict=True):
        assert [x["label"] for x in a] == [x["label"] for x in b]
        np.testing.assert_allclose([x["score"] for x in a], [x["score"] for x in b], atol=1e-5)
