"""Invalid runner input fails with one clear line before any load is sent (nothing connects, nothing written)."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import loadtests.runner as runner_module
import loadtests.targets as targets_module
from loadtests.runner import RunOptions, plan_run
from loadtests.targets import free_port

REPO = Path(__file__).resolve().parents[2]


class CountingListener:
    """A TCP socket on 127.0.0.1 that counts connections (and answers nothing)."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                connection, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            connection.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()


@pytest.fixture
def listener() -> Iterator[CountingListener]:
    counting = CountingListener()
    yield counting
    counting.close()


def _options(tmp_path: Path, **overrides: object) -> RunOptions:
    return RunOptions(results_dir=tmp_path / "results", **overrides)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("overrides", "error", "message"),
    [
        ({"profile": "nope"}, ValueError, "unknown profile 'nope'"),
        ({"mix": "/translate"}, ValueError, "unknown endpoint '/translate'"),
        ({"host": "http://10.0.0.7:8000"}, ValueError, "not on this machine"),
        ({"host": "http://example.com"}, ValueError, "not on this machine"),
        ({"mix": "QA.Extract", "grpc_host": "192.168.0.3:50051"}, ValueError, "not on this machine"),
        ({"mix": "QA.Extract", "host": "http://127.0.0.1:8000"}, ValueError, "give --grpc-host"),
        ({"peers": True, "host": "http://127.0.0.1:8000"}, ValueError, "drop --host"),
        ({"peers": True, "skip_peers": ["tgi"]}, ValueError, "--skip-peer tgi: the peers are naive, triton"),
        ({"sst2": Path("/nonexistent/sst2.tsv")}, FileNotFoundError, "does not exist"),
        ({"baseline": "v1"}, ValueError, "baseline 'v1' is neither a tag nor a run id"),
        ({"max_rps_drop": 1.5}, ValueError, "--max-rps-drop"),
        ({"models": "summarize=x"}, ValueError, "not TASK=MODEL"),
        ({"duration_s": 0.5}, ValueError, "warm-up"),
        ({"models": "classify=/nonexistent/bundle"}, FileNotFoundError, "no serving bundle '/nonexistent/bundle'"),
        ({"mix": "/ner", "bundles_dir": Path("/nonexistent")}, FileNotFoundError, "no serving bundle 'minilm-conll03'"),
        ({"workers": -1}, ValueError, "--workers must be between 0"),
        ({"workers": 33}, ValueError, "--workers must be between 0"),
    ],
)
def test_bad_input_is_refused(tmp_path: Path, overrides: dict, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        plan_run(_options(tmp_path, **overrides))
    assert not (tmp_path / "results").exists()


def test_missing_peer_model_is_refused(tmp_path: Path, tiny: tuple[Path, Path]) -> None:
    _, bundle = tiny
    with pytest.raises(FileNotFoundError, match="neither a model folder nor a built-in model name"):
        plan_run(_options(tmp_path, peers=True, mix="/classify", models=f"classify={bundle}", peer_models="classify=x"))
    plan = plan_run(_options(tmp_path, mix="/classify", models=f"classify={bundle}"))
    assert [t.label for t in plan.targets] == ["ours-batching"]
    assert str(bundle.resolve()) in plan.targets[0].command


def test_peers_and_skipped_peers(tmp_path: Path, tiny: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    checkpoint, bundle = tiny
    options = {"peers": True, "mix": "/classify,Classifier.Classify", "models": f"classify={bundle}"}
    options["peer_models"] = f"classify={checkpoint}"
    fake_python = tmp_path / "venv-triton" / "bin" / "python"
    fake_python.parent.mkdir(parents=True)
    fake_python.touch()
    monkeypatch.setattr(runner_module, "triton_venv_problem", lambda: targets_module.triton_venv_problem(fake_python))
    plan = plan_run(_options(tmp_path, **options))
    assert [t.label for t in plan.targets] == ["naive", "triton", "ours-no-batching", "ours-batching"]
    triton = plan.targets[1]
    assert triton.mix == {"/classify": 2}  # the peers answer REST only: the gRPC share goes to its REST path
    assert triton.command[1:3] == ["-m", "loadtests.peers.triton_peer"]
    assert f"classify={bundle.resolve()}" in triton.command  # the very bundles ours serves
    assert plan.skipped == {}

    plan = plan_run(_options(tmp_path, **options, skip_peers=["naive", "ours-no-batching"]))
    assert [t.label for t in plan.targets] == ["triton", "ours-batching"]

    fake_python.unlink()  # no Triton venv: the peer is skipped with the reason, the others run
    plan = plan_run(_options(tmp_path, **options))
    assert [t.label for t in plan.targets] == ["naive", "ours-no-batching", "ours-batching"]
    assert "make triton-venv" in plan.skipped["triton"]


def test_unreachable_host_is_refused(tmp_path: Path) -> None:
    port = free_port()  # nothing listens there
    with pytest.raises(ValueError, match=rf"--host http://127.0.0.1:{port} is not ready .*start the service"):
        plan_run(_options(tmp_path, host=f"http://127.0.0.1:{port}", mix="/classify"))
    with pytest.raises(ValueError, match=f"--grpc-host 127.0.0.1:{port} is not serving"):
        plan_run(_options(tmp_path, grpc_host=f"127.0.0.1:{port}", mix="QA.Extract"))


def test_cli_one_line_error_and_no_connection(tmp_path: Path, listener: CountingListener) -> None:
    """A bad data file with a live host: exit 2, one line, and the host never saw a connection."""
    bad = tmp_path / "broken.json"
    bad.write_text("{")
    command = [
        sys.executable, "-m", "bertserve", "loadtest", "--host", f"http://127.0.0.1:{listener.port}",
        "--mix", "/qa", "--squad", str(bad), "--results-dir", str(tmp_path / "results"),
    ]  # fmt: skip
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"error: {bad} is not valid JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"
    ]
    assert listener.connections == 0
    assert not (tmp_path / "results").exists()
    unknown = subprocess.run(
        [sys.executable, "-m", "bertserve", "loadtest", "--profile", "soak"], cwd=REPO, capture_output=True, text=True
    )
    assert unknown.returncode == 2
    choices = "smoke, steady, ramp, overload, hostile"
    assert unknown.stderr.strip() == f"error: unknown profile 'soak'; choose one of {choices}"


def test_unreadable_data_file_is_refused_before_load(
    tmp_path: Path, listener: CountingListener, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A data file the user may not read (simulated: root reads anything) stops the run before any connection."""
    import loadtests.payloads as payloads

    locked = tmp_path / "sst2.tsv"
    locked.write_text("sentence\tlabel\nfine\t1\n")

    def refuse(path: object, *args: object, **kwargs: object) -> object:
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(payloads, "open", refuse, raising=False)
    with pytest.raises(PermissionError, match=r"sst2\.tsv is not readable \(permission denied\)"):
        plan_run(_options(tmp_path, host=f"http://127.0.0.1:{listener.port}", mix="/classify", sst2=locked))
    assert listener.connections == 0
    assert not (tmp_path / "results").exists()


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "bertserve", "loadtest", "--results-dir", str(tmp_path / "results"), *args]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)


def test_cli_unreachable_host_and_remote_address_are_one_line_errors(tmp_path: Path) -> None:
    port = free_port()  # nothing listens there
    done = _cli(tmp_path, "--host", f"http://127.0.0.1:{port}", "--mix", "/classify")
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1
    assert re.fullmatch(
        rf"error: --host http://127\.0\.0\.1:{port} is not ready \(GET /health/ready: .*Connection refused\): "
        "start the service first",
        lines[0],
    ), lines[0]
    done = _cli(tmp_path, "--grpc-host", "10.1.2.3:50051", "--mix", "QA.Extract")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "error: --grpc-host '10.1.2.3:50051' is not on this machine: load tests only send load to 127.0.0.0/8, "
        "localhost or ::1"
    ]
    assert not (tmp_path / "results").exists()
