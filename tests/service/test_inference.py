"""Engine without a server: model loading releases what it started when a model cannot be served."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from bundles.serving import ServingBundle
from bundles.spec import MANIFEST_FILE
from service.engine.engine import Engine
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

    def make_backend(self: Engine, bundle: ServingBundle) -> SpyBackend:
        backends.append(SpyBackend())
        return backends[-1]

    monkeypatch.setattr(Engine, "_make_backend", make_backend)
    service = Engine(ServiceSettings(models=[str(bundle)], warmup_rounds=0, grpc_port=-1))
    with pytest.raises(ValueError, match="doc_stride"):
        asyncio.run(service.load())
    assert all(backend.started == backend.closed for backend in backends), [vars(b) for b in backends]
    assert not service.models and not service.state.ready


def test_warm_up_runs_one_batch_of_the_largest_shape_per_model(
    tiny_bundles: dict[str, Path], encoder_bundles: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """After the warm-up request each model runs the most rows of its longest window in one call, so the runtime's
    memory is at its working size before the first request (a QA model's arena grew ~50 MB under the first
    requests with windows of 256 tokens otherwise)."""
    from service.backends.ort_backend import OrtBackend

    shapes: dict[str, list[tuple[int, ...]]] = {}
    infer = OrtBackend.infer

    async def recording(self: OrtBackend, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        shapes.setdefault(self.manifest.name, []).append(inputs["input_ids"].shape)
        return await infer(self, inputs)

    monkeypatch.setattr(OrtBackend, "infer", recording)
    monkeypatch.setattr(OrtBackend, "infer_alone", recording)
    bundles = [*tiny_bundles.values(), *encoder_bundles.values()]
    settings = ServiceSettings(models=[str(b) for b in bundles], warmup_rounds=1, grpc_port=-1, max_batch_tokens=512)

    async def load() -> dict[str, tuple[int, int]]:
        service = Engine(settings)
        try:
            await service.load()
            service.set_ready()
            # the call cost was measured on each backend and handed to its batcher
            assert all(0 <= m.batcher.config.call_overhead_tokens <= 256 for m in service.models.values())
            return {name: (model.batcher.config.max_batch_size, model.pipeline.max_seq_length)
                    for name, model in service.models.items()}  # fmt: skip
        finally:
            await service.close()

    largest = asyncio.run(load())
    assert set(shapes) == set(largest) and len(largest) == 5
    for name, (rows, width) in largest.items():
        expected = (max(1, min(rows, 512 // width)), width)
        assert expected in shapes[name], (name, shapes[name])


def test_what_loading_left_alive_is_out_of_the_collectors_reach(tiny_bundles: dict[str, Path]) -> None:
    """The server's own state (bundles, pipelines, batchers) is frozen once loaded, so a full collection under load
    walks only what requests allocated; closing the service hands it back to the collector."""
    import gc

    settings = ServiceSettings(models=[str(tiny_bundles["classify"])], warmup_rounds=1, grpc_port=-1)

    def tracked(*objects: object) -> list[bool]:
        ids = {id(o) for o in gc.get_objects()}
        return [id(o) in ids for o in objects]

    async def load() -> tuple[list[bool], list[bool]]:
        service = Engine(settings)
        try:
            await service.load()
            service.set_ready()
            model = next(iter(service.models.values()))
            serving = tracked(model, model.pipeline)
        finally:
            await service.close()
        return serving, tracked(model, model.pipeline)

    gc.unfreeze()
    try:
        assert asyncio.run(load()) == ([False, False], [True, True])
    finally:
        gc.unfreeze()
