"""Deployment test fixtures: one real server over a tiny classification bundle, with a short gRPC connection age."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.service.server import ServerProcess, serving

CONNECTION_AGE_S = 1.0
"""The server's gRPC max connection age here: short, so that a test sees the GOAWAY in seconds."""


@pytest.fixture(scope="session")
def tiny_classify_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("torch", reason="building a test bundle needs torch (the service itself does not)")
    from tests.service.tiny_bundles import build_tiny_bundle

    return build_tiny_bundle(tmp_path_factory.mktemp("deploy-bundles"), "classify")


@pytest.fixture(scope="session")
def deploy_server(tiny_classify_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A real `bertserve serve` (REST + gRPC) whose gRPC connections are sent GOAWAY after CONNECTION_AGE_S."""
    env = {
        "BERTSERVE_GRPC_MAX_CONNECTION_AGE_S": str(CONNECTION_AGE_S),
        "BERTSERVE_GRPC_MAX_CONNECTION_AGE_GRACE_S": "1",
    }
    with serving([tiny_classify_bundle], tmp_path_factory.mktemp("deploy-server") / "server.log", env) as server:
        yield server
