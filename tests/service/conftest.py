"""Service test fixtures: tiny bundles (built once per session) and one real server per test module."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest

from tests.service.server import ServerProcess, serving
from tests.service.tiny_bundles import (
    as_earlier_embed_bundle,
    build_all,
    build_encoders,
    build_tiny_bundle,
    export_tiny_encoder,
)


@pytest.fixture(scope="session")
def tiny_bundles(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """task -> bundle folder of a tiny random model (classify, qa, ner)."""
    pytest.importorskip("torch", reason="building test bundles needs torch (the service itself does not)")
    return build_all(tmp_path_factory.mktemp("bundles"))


@pytest.fixture(scope="session")
def encoder_bundles(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """task -> bundle folder of a tiny random encoder model (embed, fill-mask)."""
    pytest.importorskip("torch", reason="building test bundles needs torch (the service itself does not)")
    return build_encoders(tmp_path_factory.mktemp("encoder-bundles"))


@pytest.fixture(scope="session")
def exported_embed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(Hugging Face folder, bundle) of a tiny random encoder exported through `bertserve export`'s build_bundle."""
    pytest.importorskip("torch", reason="building test bundles needs torch (the service itself does not)")
    return export_tiny_encoder(tmp_path_factory.mktemp("exported-embed"))


@pytest.fixture(scope="session")
def earlier_embed_bundle(exported_embed: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """That bundle as an earlier build wrote it: sentence vectors only, no token states."""
    return as_earlier_embed_bundle(exported_embed[1], tmp_path_factory.mktemp("earlier-embed"))


@pytest.fixture(scope="session")
def rerank_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bundle of a tiny random cross-encoder (task rerank)."""
    pytest.importorskip("torch", reason="building test bundles needs torch (the service itself does not)")
    return build_tiny_bundle(tmp_path_factory.mktemp("rerank-bundle"), "rerank")


@pytest.fixture(scope="module")
def server(tiny_bundles: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A real `bertserve serve` (REST + gRPC) over the three tiny bundles, on free ports."""
    log = tmp_path_factory.mktemp("server") / "server.log"
    with serving(list(tiny_bundles.values()), log) as process:
        yield process


@pytest.fixture(scope="module")
def http(server: ServerProcess) -> Iterator[httpx.Client]:
    """A REST client of the module's `server` (a module overriding `server` gets a client of its own)."""
    with httpx.Client(base_url=server.url, timeout=30.0) as client:
        yield client


@pytest.fixture(scope="module")
def channel(server: ServerProcess) -> Iterator[grpc.Channel]:
    """A ready gRPC channel to the module's `server`."""
    with grpc.insecure_channel(server.grpc_target) as chan:
        grpc.channel_ready_future(chan).result(timeout=10)
        yield chan
