"""The load tests' `triton` peer against a real Triton server (nvidia-pytriton, in the Triton venv).

The peer (`python -m loadtests.peers.triton_peer`) serves the same tiny bundles as a real `bertserve serve`: its
answers on every REST path must equal ours (it runs the same pipeline code on the same variant), also when
Triton's dynamic batcher puts many requests in one call; bad bodies get a 4xx and the peer keeps serving;
SIGTERM stops Triton and every process it started. Skipped, with the reason, without the Triton venv.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from loadtests.targets import REPO, triton_venv_problem
from tests.service.server import free_port, serving

pytestmark = pytest.mark.integration

SENTENCES = [
    "a gripping, beautifully acted film",
    "dull and far too long",
    "Ada Lovelace worked with Charles Babbage in London .",
    "the plot makes no sense at all, but the music is lovely and the cast clearly had fun",
]
CONTEXT = "The Analytical Engine was designed by Charles Babbage. Ada Lovelace wrote its first program in 1843. " * 6


@pytest.fixture(scope="module")
def bundles(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    problem = triton_venv_problem()
    if problem:
        pytest.skip(problem)
    pytest.importorskip("torch", reason="building test bundles needs torch (the peer itself does not)")
    from tests.service.tiny_bundles import build_all, build_encoders

    folder = tmp_path_factory.mktemp("bundles")
    return {**build_all(folder / "heads"), "embed": build_encoders(folder / "encoders")["embed"]}


@pytest.fixture(scope="module")
def ours(bundles: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with serving(list(bundles.values()), tmp_path_factory.mktemp("ours") / "server.log") as server:
        yield server.url


@pytest.fixture(scope="module")
def peer(bundles: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, subprocess.Popen]]:
    port = free_port()
    command = [sys.executable, "-m", "loadtests.peers.triton_peer", "--port", str(port)]
    command += [f"--model={task}={folder}" for task, folder in bundles.items()]
    log = tmp_path_factory.mktemp("peer") / "peer.log"
    with open(log, "w") as sink:
        process = subprocess.Popen(command, cwd=REPO, stdout=sink, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240
        while True:
            if process.poll() is not None:
                pytest.fail(f"the triton peer exited with {process.returncode}:\n{log.read_text()[-3000:]}")
            assert time.monotonic() < deadline, f"the triton peer was not ready in 240 s:\n{log.read_text()[-3000:]}"
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        assert "READY (" in log.read_text()
        yield url, process
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def _post(url: str, path: str, body: Any) -> httpx.Response:
    return httpx.post(url + path, json=body, timeout=60)


def _close(left: Any, right: Any, path: str = "") -> None:
    """Equal JSON answers, floats within 1e-4."""
    if isinstance(left, float) or isinstance(right, float):
        assert left == pytest.approx(right, abs=1e-4), path
    elif isinstance(left, dict):
        assert set(left) == set(right), path
        for key in left:
            _close(left[key], right[key], f"{path}.{key}")
    elif isinstance(left, list):
        assert len(left) == len(right), path
        for i, (a, b) in enumerate(zip(left, right, strict=True)):
            _close(a, b, f"{path}[{i}]")
    else:
        assert left == right, path


REQUESTS = [
    ("/classify", {"inputs": SENTENCES[0]}),
    ("/classify", {"inputs": SENTENCES}),
    ("/qa", {"question": "Who wrote the first program?", "context": CONTEXT}),  # several windows
    ("/ner", {"inputs": SENTENCES[2]}),
    ("/ner", {"inputs": SENTENCES}),
    ("/embed", {"inputs": SENTENCES[1]}),
    ("/embed", {"inputs": SENTENCES}),
]


def test_the_peer_answers_as_ours_does(ours: str, peer: tuple[str, subprocess.Popen]) -> None:
    url, _ = peer
    for path, body in REQUESTS:
        mine, theirs = _post(ours, path, body), _post(url, path, body)
        assert mine.status_code == theirs.status_code == 200, (path, theirs.text)
        _close(theirs.json(), mine.json(), path)
        assert float(theirs.headers["x-inference-time-ms"]) > 0
    mine = _post(ours, "/v1/embeddings", {"input": SENTENCES})
    theirs = _post(url, "/v1/embeddings", {"input": SENTENCES})
    assert theirs.status_code == 200
    assert theirs.json()["usage"] == mine.json()["usage"]
    _close([d["embedding"] for d in theirs.json()["data"]], [d["embedding"] for d in mine.json()["data"]])


def test_batched_requests_get_their_own_answers(ours: str, peer: tuple[str, subprocess.Popen]) -> None:
    """Many requests at once: Triton's batcher hands several to one call; each must get its own answer."""
    url, _ = peer
    work = [(path, body) for path, body in REQUESTS for _ in range(4)]
    with ThreadPoolExecutor(16) as pool:
        theirs = list(pool.map(lambda item: _post(url, *item), work))
    for (path, body), answer in zip(work, theirs, strict=True):
        assert answer.status_code == 200, (path, answer.text)
        _close(answer.json(), _post(ours, path, body).json(), path)


def test_bad_bodies_get_a_4xx_and_the_peer_keeps_serving(peer: tuple[str, subprocess.Popen]) -> None:
    url, _ = peer
    for path, body in [("/classify", {"inputs": []}), ("/classify", {"inputs": 5}), ("/qa", {"question": "x"})]:
        answer = _post(url, path, body)
        assert answer.status_code == 422, (path, body, answer.text)
        assert answer.json()["error"]
    answer = httpx.post(url + "/ner", content=b"{not json", timeout=30)
    assert answer.status_code == 422 and "JSON" in answer.json()["error"]
    assert _post(url, "/classify", {"inputs": SENTENCES[0]}).status_code == 200


def test_sigterm_stops_triton_and_everything_it_started(peer: tuple[str, subprocess.Popen]) -> None:
    _, process = peer
    descendants = _descendants(process.pid)
    assert any("tritonserver" in command for command in descendants.values()), descendants
    process.send_signal(signal.SIGTERM)
    assert process.wait(30) == 0
    deadline = time.monotonic() + 20
    while any(Path(f"/proc/{pid}").exists() for pid in descendants) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = {pid: command for pid, command in descendants.items() if Path(f"/proc/{pid}").exists()}
    assert not left, f"still running after the peer stopped: {json.dumps(left)}"


def _descendants(root: int) -> dict[int, str]:
    """pid -> command line of every live process below `root`."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError):
                continue
    found, todo = {}, [root]
    while todo:
        pid = todo.pop()
        for child in [c for c, p in parents.items() if p == pid]:
            try:
                found[child] = (Path(f"/proc/{child}") / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            todo.append(child)
    return found
