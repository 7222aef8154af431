"""openvino-int8-static: calibration inputs, the written QDQ graph against its manifest, and the guard's refusal."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from bert_model.tasks.runtimes import OPENVINO_PROVIDER
from bert_model.tasks.spec import OUTPUT_NAMES, BundleManifest
from export.bundle import build_bundle
from export.parity import AccuracyGuardError
from export.runtime import openvino_runner
from export.static_quant import calibration_samples
from export.variants import RECIPES

NO_DATA = Path("/nonexistent")
VARIANT = "openvino-int8-static"
needs_build = pytest.mark.skipif(RECIPES[VARIANT].unavailable() is not None, reason="needs openvino and nncf")


def _batch(lengths: list[int], width: int) -> dict[str, np.ndarray]:
    mask = np.array([[1] * n + [0] * (width - n) for n in lengths], np.int64)
    ids = np.where(mask == 1, 7, 0).astype(np.int64)
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}


def test_calibration_samples_are_single_unpadded_examples_evenly_spaced() -> None:
    feeds = [_batch([3, 5], 5), _batch([2, 6, 4], 6)]
    every = calibration_samples(feeds, limit=10)
    assert [s["input_ids"].shape for s in every] == [(1, 3), (1, 5), (1, 2), (1, 6), (1, 4)]
    assert all(s["attention_mask"].all() for s in every)
    assert [s["input_ids"].shape[1] for s in calibration_samples(feeds, limit=3)] == [3, 2, 4]


def test_calibration_needs_inputs_and_a_positive_limit() -> None:
    with pytest.raises(ValueError, match="needs calibration inputs"):
        calibration_samples([])
    with pytest.raises(ValueError, match="positive integer"):
        calibration_samples([_batch([3], 3)], limit=0)


@needs_build
def test_written_graph_is_int8_qdq_runs_and_matches_its_manifest(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    result = build_bundle(tiny_models["classify"], tmp_path / "b", variants=f"cpu-fp32,{VARIANT}", data_dir=NO_DATA)
    assert VARIANT not in result.refused, result.refused
    manifest = BundleManifest.read(tmp_path / "b")
    spec = manifest.variants[VARIANT]
    assert (spec.file, spec.provider, spec.precision) == (f"{VARIANT}.onnx", OPENVINO_PROVIDER, "int8")
    assert spec.runtime_options == dict(RECIPES[VARIANT].runtime_options)
    assert manifest.default_variants["cpu"] == VARIANT  # ranked before the ONNX Runtime variants
    assert spec.parity["judgment"] == "agreement-with-fp32" and spec.parity["label_agreement"] >= 0.99
    graph = onnx.load(str(tmp_path / "b" / spec.file))
    ops = [node.op_type for node in graph.graph.node]
    assert ops.count("QuantizeLinear") >= 4  # activations are quantized, not only weights
    run = openvino_runner(tmp_path / "b" / spec.file, spec.runtime_options)
    feed = _batch([6, 4], 6)
    feed["input_ids"][:, 0] = 2
    outputs = run(feed)
    assert set(outputs) == set(OUTPUT_NAMES["classify"])
    assert outputs["logits"].shape == (2, len(manifest.labels)) and np.isfinite(outputs["logits"]).all()


@needs_build
def test_static_variant_outside_its_guard_is_refused(
    tiny_models: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import export.parity

    monkeypatch.setattr(export.parity, "TASK_AGREEMENT", 1.01)  # no int8 graph can agree on 101% of inputs
    result = build_bundle(tiny_models["classify"], tmp_path / "b", variants=f"cpu-fp32,{VARIANT}", data_dir=NO_DATA)
    assert "label_agreement" in result.refused[VARIANT]
    assert sorted(p.name for p in (tmp_path / "b").glob("*.onnx")) == ["cpu-fp32.onnx"]
    assert VARIANT not in result.manifest.variants and result.manifest.default_variants["cpu"] == "cpu-fp32"
    with pytest.raises(AccuracyGuardError, match=f"variant {VARIANT} refused: label_agreement"):
        build_bundle(
            tiny_models["classify"], tmp_path / "c", variants=f"cpu-fp32,{VARIANT}", data_dir=NO_DATA, strict=True
        )
    assert not (tmp_path / "c").exists()


def test_missing_nncf_skips_the_variant_with_its_install_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "nncf" else real(name, *a))
    reason = RECIPES[VARIANT].unavailable()
    assert reason is not None and ("nncf" in reason or "OpenVINO" in reason)
