"""openvino-int8-static: calibration inputs, the written QDQ graph against its manifest, and the guard's refusal."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from bundles.runtimes import OPENVINO_PROVIDER, open_variant
from bundles.spec import OUTPUT_NAMES, BundleManifest
from export.bundle import build_bundle
from export.parity import AccuracyGuardError
from export.static_quant import MIN_CALIBRATION_SIZE, TooFewCalibrationExamples, calibration_samples
from export.variants import RECIPES

NO_DATA = Path("/nonexistent")
VARIANT = "openvino-int8-static"
needs_build = pytest.mark.skipif(RECIPES[VARIANT].unavailable() is not None, reason="needs openvino and nncf")


def _batch(lengths: list[int], width: int) -> dict[str, np.ndarray]:
    mask = np.array([[1] * n + [0] * (width - n) for n in lengths], np.int64)
    ids = np.where(mask == 1, 7, 0).astype(np.int64)
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}


def sst2_sentences(data_dir: Path, folder: Path, count: int = 120) -> Path:
    """A `--calibration` file: the first `count` SST-2 dev-half-a sentences, one per line."""
    lines = (data_dir / "sst2" / "dev.half-a.tsv").read_text(encoding="utf-8").splitlines()[1 : count + 1]
    path = folder / "sst2-calibration.txt"
    path.write_text("\n".join(line.split("\t")[0] for line in lines) + "\n", encoding="utf-8")
    return path


def test_calibration_samples_are_single_unpadded_examples_evenly_spaced() -> None:
    feeds = [_batch([3, 5], 5), _batch([2, 6, 4], 6)]
    every = calibration_samples(feeds, limit=10, minimum=1)
    assert [s["input_ids"].shape for s in every] == [(1, 3), (1, 5), (1, 2), (1, 6), (1, 4)]
    assert all(s["attention_mask"].all() for s in every)
    assert [s["input_ids"].shape[1] for s in calibration_samples(feeds, limit=3, minimum=1)] == [3, 2, 4]


def test_calibration_needs_enough_inputs_and_a_positive_limit() -> None:
    with pytest.raises(ValueError, match="needs calibration inputs"):
        calibration_samples([])
    with pytest.raises(ValueError, match="positive integer"):
        calibration_samples([_batch([3], 3)], limit=0)
    few = [_batch([4] * 33, 4)] * 3  # 99 examples
    with pytest.raises(TooFewCalibrationExamples, match=f"at least {MIN_CALIBRATION_SIZE} examples .* has 99"):
        calibration_samples(few)
    assert len(calibration_samples([*few, _batch([4], 4)])) == MIN_CALIBRATION_SIZE


@needs_build
def test_written_graph_is_int8_qdq_runs_and_matches_its_manifest(
    tiny_models: dict[str, Path], data_dir: Path, tmp_path: Path
) -> None:
    texts = sst2_sentences(data_dir, tmp_path)
    result = build_bundle(tiny_models["classify"], tmp_path / "b", variants=f"cpu-fp32,{VARIANT}", calibration=texts)
    assert VARIANT not in result.refused, result.refused
    manifest = BundleManifest.read(tmp_path / "b")
    spec = manifest.variants[VARIANT]
    assert (spec.file, spec.provider, spec.precision) == (f"{VARIANT}.onnx", OPENVINO_PROVIDER, "int8")
    assert spec.runtime_options == dict(RECIPES[VARIANT].runtime_options)
    assert spec.parity["judgment"] == "agreement-with-fp32" and spec.parity["label_agreement"] >= 0.99
    graph = onnx.load(str(tmp_path / "b" / spec.file))
    ops = [node.op_type for node in graph.graph.node]
    assert ops.count("QuantizeLinear") >= 4  # activations are quantized, not only weights
    run = open_variant(tmp_path / "b" / spec.file, spec, OUTPUT_NAMES["classify"]).run
    feed = _batch([6, 4], 6)
    feed["input_ids"][:, 0] = 2
    outputs = run(feed)
    assert set(outputs) == set(OUTPUT_NAMES["classify"])
    assert outputs["logits"].shape == (2, len(manifest.labels)) and np.isfinite(outputs["logits"]).all()


@needs_build
def test_static_variant_outside_its_guard_is_refused(
    tiny_models: dict[str, Path], data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import export.parity

    monkeypatch.setattr(export.parity, "TASK_AGREEMENT", 1.01)  # no int8 graph can agree on 101% of inputs
    texts = sst2_sentences(data_dir, tmp_path)
    result = build_bundle(tiny_models["classify"], tmp_path / "b", variants=f"cpu-fp32,{VARIANT}", calibration=texts)
    assert "label_agreement" in result.refused[VARIANT]
    assert sorted(p.name for p in (tmp_path / "b").glob("*.onnx")) == ["cpu-fp32.onnx"]
    assert VARIANT not in result.manifest.variants
    with pytest.raises(AccuracyGuardError, match=f"variant {VARIANT} refused: label_agreement"):
        build_bundle(
            tiny_models["classify"], tmp_path / "c", variants=f"cpu-fp32,{VARIANT}", calibration=texts, strict=True
        )
    assert not (tmp_path / "c").exists()


@needs_build
def test_too_few_calibration_examples_skip_the_variant_with_the_reason(
    tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    """Without data the guard has the built-in sentences, too few to calibrate on: the variant is skipped with the
    reason, and --strict refuses the export."""
    result = build_bundle(tiny_models["classify"], tmp_path / "b", variants=f"cpu-fp32,{VARIANT}", data_dir=NO_DATA)
    assert result.refused[VARIANT].startswith("skipped: static int8 is calibrated on at least 100 examples")
    assert "--calibration FILE" in result.refused[VARIANT]
    assert VARIANT not in result.manifest.variants
    assert not (tmp_path / "b" / f"{VARIANT}.onnx").exists()
    assert result.manifest.source["refused_variants"][VARIANT] == result.refused[VARIANT]
    with pytest.raises(AccuracyGuardError, match=f"variant {VARIANT} refused: skipped: static int8"):
        build_bundle(
            tiny_models["classify"], tmp_path / "c", variants=f"cpu-fp32,{VARIANT}", data_dir=NO_DATA, strict=True
        )


def test_missing_nncf_skips_the_variant_with_its_install_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "nncf" else real(name, *a))
    reason = RECIPES[VARIANT].unavailable()
    assert reason is not None and ("nncf" in reason or "OpenVINO" in reason)


@pytest.mark.parametrize("task", ["classify", "qa", "ner", "embed", "fill-mask"])
def test_kept_float_scopes_match_every_graph_kind(task: str, tmp_path: Path) -> None:
    """The ignored scopes must name the same layers in every task's traced graph (task models nest the encoder
    under `bert/`, an embed bundle's bare encoder does not): of each layer's eight MatMuls only Q, K, V, the
    attention output and the first feed-forward one are quantized, and no head MatMul is."""
    import re

    import torch

    from bert_model.heads import (
        BertForMaskedLM,
        BertForQuestionAnswering,
        BertForSequenceClassification,
        BertForTokenClassification,
    )
    from bert_model.modeling import BertModel
    from export.bundle import build_graphs
    from export.static_quant import KEPT_FLOAT
    from export.wrapper import GraphOptions
    from tests.export.conftest import tiny_config

    models = {
        "classify": BertForSequenceClassification,
        "qa": BertForQuestionAnswering,
        "ner": BertForTokenClassification,
        "embed": BertModel,
        "fill-mask": BertForMaskedLM,
    }
    torch.manual_seed(0)
    config = tiny_config(num_hidden_layers=3, id2label={0: "O", 1: "B-PER", 2: "I-PER"})
    model = models[task](config).eval()
    raw, _, _, _ = build_graphs(model, task, tmp_path, GraphOptions(mask_token_id=4))  # the tiny vocab's [MASK]
    matmuls = [node.name for node in onnx.load(str(raw)).graph.node if node.op_type in ("MatMul", "Gemm")]
    quantized = [name for name in matmuls if not any(re.match(pattern, name) for pattern in KEPT_FLOAT)]
    layer = r"/model/(bert/)?encoder/layer\.\d/"
    wanted = layer + r"(attention/self/(query|key|value)|attention/output/dense|intermediate/dense)/"
    assert len(quantized) == 5 * config.num_hidden_layers, quantized
    assert all(re.match(wanted, name) for name in quantized), quantized
