"""InferenceService without a server: model loading releases what it started when a model cannot be served."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from bert_model.tasks.spec import MANIFEST_FILE
from service.bundles import ServingBundle
from service.inference import InferenceService
from service.settings import ServiceSettings


class SpyBackend:
    """A backend that counts how often it was started and closed."""

    kind = "spy"
    variant = "spy"
    batches_itself = False
    width_multiple = 1
    concurrency = 1

    def __init__(self) -> None:
        self.started = 0
        self.closed = 0

    async def start(self) -> None:
        self.started += 1

    async def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        raise AssertionError("not called in these tests")

    async def infer_alone(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        raise AssertionError("not called in these tests")

    async def close(self) -> None:
        self.closed += 1


def test_a_model_that_fails_the_pipeline_check_leaves_no_backend_open(
    tiny_bundles: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bundle = shutil.copytree(tiny_bundles["qa"], tmp_path / "bad-qa")
    manifest = json.loads((bundle / MANIFEST_FILE).read_text())
    manifest["task_settings"] = {"doc_stride": "wide"}  # not an integer: the QA pipeline refuses the bundle
    (bundle / MANIFEST_FILE).write_text(json.dumps(manifest))
    backends: list[SpyBackend] = []

    def make_backend(self: InferenceService, bundle: ServingBundle) -> SpyBackend:
        backends.append(SpyBackend())
        return backends[-1]

    monkeypatch.setattr(InferenceService, "_make_backend", make_backend)
    service = InferenceService(ServiceSettings(models=[str(bundle)], warmup_rounds=0, grpc_port=-1))
    with pytest.raises(ValueError, match="doc_stride"):
        asyncio.run(service.load())
    assert all(backend.started == backend.closed for backend in backends), [vars(b) for b in backends]
    assert not service.models and not service.state.ready
