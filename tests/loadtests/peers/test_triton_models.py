"""The triton peer's model runner (`loadtests.peers.triton_models.Runner`) in this venv, without Triton: with streams,
each calling thread (a Triton model instance) has its own infer request on the shared compiled graph, and the
answers equal the one-stream answers."""

from __future__ import annotations

import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from bundles.spec import BundleManifest


@pytest.fixture(scope="module")
def openvino_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("openvino", reason="the optional openvino extra is not installed")
    pytest.importorskip("torch", reason="building a test bundle needs torch")
    from tests.service.tiny_bundles import build_tiny_bundle

    folder = build_tiny_bundle(tmp_path_factory.mktemp("bundles"), "classify")
    data = json.loads((folder / "manifest.json").read_text())
    data["variants"]["openvino-bf16"] = {  # preferred to cpu-fp32 on every CPU family
        "file": "cpu-fp32.onnx",
        "provider": "OpenVINO",
        "precision": "bf16",
        "runtime_options": {"INFERENCE_PRECISION_HINT": "bf16"},
    }
    copy = folder.parent / "openvino-classify"
    shutil.copytree(folder, copy)
    (copy / "manifest.json").write_text(json.dumps(data))
    return copy


def test_instances_share_a_graph_with_streams_and_answer_alike(openvino_bundle: Path) -> None:
    from loadtests.peers.triton_models import Runner

    manifest = BundleManifest.read(openvino_bundle)
    rng = np.random.default_rng(3)
    feeds = []
    for length in (6, 15, 28, 33):
        ids = rng.integers(1000, 5000, size=(3, length)).astype(np.int64)
        feeds.append({"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)})
    single = Runner(openvino_bundle, manifest, streams=1)
    double = Runner(openvino_bundle, manifest, streams=2)
    assert single.variant == double.variant == "openvino-bf16"
    assert int(double.opened.compiled.get_property("NUM_STREAMS")) == 2  # type: ignore[attr-defined]
    expected = [single.run(feed) for feed in feeds]
    with ThreadPoolExecutor(2) as pool:  # two instances calling at once
        answers = list(pool.map(double.run, feeds * 3))
    for index, answer in enumerate(answers):
        np.testing.assert_allclose(answer["logits"], expected[index % len(feeds)]["logits"], atol=1e-5)
