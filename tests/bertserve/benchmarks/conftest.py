"""Benchmark test fixtures: tiny serving bundles (the service's test bundles) and a tiny exported bundle with its
source model (what `bench-model` needs), each built once per session."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_bundles(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """task -> bundle folder of a tiny random model (classify, qa, embed), as the service tests build them."""
    pytest.importorskip("torch", reason="building test bundles needs torch (the benchmarks of the service do not)")
    from tests.service.tiny_bundles import build_tiny_bundle

    root = tmp_path_factory.mktemp("bundles")
    return {task: build_tiny_bundle(root, task) for task in ("classify", "qa", "embed")}


@pytest.fixture(scope="session")
def exported_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A classify bundle exported from a tiny model folder with three ONNX Runtime variants (built-in guard
    sentences); its manifest names that folder as its source, which `bench-model` loads in PyTorch."""
    from export.bundle import build_bundle
    from tests.export.conftest import save_tiny

    root = tmp_path_factory.mktemp("exported")
    model = save_tiny(root / "tiny-classify", "classify")
    out = root / "tiny-sst2"
    build_bundle(model, out, variants="cpu-fp32,cpu-int8,gpu-fp16", data_dir=Path("/nonexistent"))
    return out
