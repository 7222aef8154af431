"""Accuracy guards: the judging rules on synthetic outputs, and every variant on real text (SST-2, CoNLL, SQuAD)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from export.parity import best_span, judge, span_f1


def feeds(rows: int = 4, length: int = 6) -> list[dict[str, np.ndarray]]:
    mask = np.ones((rows, length), np.int64)
    segments = np.zeros((rows, length), np.int64)
    segments[:, 2:] = 1
    return [{"input_ids": np.ones((rows, length), np.int64), "attention_mask": mask, "token_type_ids": segments}]


def test_fp32_guard_is_max_abs_diff() -> None:
    reference = [{"logits": np.zeros((4, 2), np.float32)}]
    assert judge("classify", "fp32", reference, [{"logits": np.full((4, 2), 5e-5, np.float32)}], feeds()).passed
    result = judge("classify", "fp32", reference, [{"logits": np.full((4, 2), 2e-4, np.float32)}], feeds())
    assert not result.passed
    assert "max |diff|" in result.message and "1e-04" in result.message


def test_classify_guard_counts_label_agreement() -> None:
    reference = [{"logits": np.tile([[0.0, 1.0]], (100, 1)).astype(np.float32)}]
    candidate = [{"logits": reference[0]["logits"].copy()}]
    candidate[0]["logits"][0] = [1.0, 0.0]  # one flip in 100 = 99% agreement: passes
    rows = feeds(100)
    assert judge("classify", "int8", reference, candidate, rows).figures["label_agreement"] == pytest.approx(0.99)
    assert judge("classify", "int8", reference, candidate, rows).passed
    candidate[0]["logits"][1] = [1.0, 0.0]
    result = judge("classify", "int8", reference, candidate, rows)
    assert not result.passed and "label_agreement 0.98" in result.message


def test_ner_guard_ignores_special_and_padding_tokens() -> None:
    logits = np.zeros((1, 6, 3), np.float32)
    logits[..., 1] = 1.0
    candidate = logits.copy()
    candidate[0, 0] = [9, 0, 0]  # [CLS]: not judged
    candidate[0, 5] = [9, 0, 0]  # final [SEP]: not judged
    result = judge("ner", "fp16", [{"logits": logits}], [{"logits": candidate}], feeds(1))
    assert result.passed and result.figures["token_f1_vs_fp32"] == 100.0
    candidate[0, 2] = [9, 0, 0]
    assert not judge("ner", "fp16", [{"logits": logits}], [{"logits": candidate}], feeds(1)).passed


def test_qa_span_decoding_and_f1() -> None:
    allowed = np.array([False, False, True, True, True, True])
    start = np.array([9.0, 0, 1, 5, 0, 0])
    end = np.array([9.0, 0, 0, 0, 4, 1])
    assert best_span(start, end, allowed) == (3, 4)  # [CLS] (index 0) is not a context token
    assert span_f1((3, 4), (3, 4)) == 1.0
    assert span_f1((3, 4), (4, 5)) == pytest.approx(0.5)
    assert span_f1((2, 2), (4, 5)) == 0.0
    ref = [{"start_logits": start[None].astype(np.float32), "end_logits": end[None].astype(np.float32)}]
    assert judge("qa", "int8", ref, ref, feeds(1)).figures["span_f1_vs_fp32"] == 100.0


def test_every_variant_within_its_guard_on_real_text(minilm_bundle: Path) -> None:
    """MiniLM encoder + classification head (random, until minilm-sst2 exists) on SST-2 dev sentences."""
    from bert_model.tasks.spec import BundleManifest

    manifest = BundleManifest.read(minilm_bundle)
    assert manifest.source["guard_inputs"]["source"].endswith("sst2/dev.half-a.tsv")
    assert manifest.source["guard_inputs"]["count"] == 256
    fp32 = manifest.variants["cpu-fp32"].parity
    assert fp32["max_abs_diff"] <= 1e-4
    for name in ("cpu-int8", "gpu-fp16", "openvino-int8"):
        if name in manifest.variants:
            assert manifest.variants[name].parity["label_agreement"] >= 0.99, name
    assert manifest.default_variants["gpu"] == "gpu-fp16"
    if "openvino-int8" in manifest.variants:
        assert manifest.default_variants["cpu"] == "openvino-int8"
        assert manifest.default_variants["cpu-onnxruntime"] == "cpu-int8"
        assert manifest.variants["openvino-int8"].provider == "OpenVINO"
        assert manifest.variants["openvino-int8"].runtime_options["INFERENCE_PRECISION_HINT"] == "bf16"


@pytest.fixture(scope="module")
def minilm_bundle(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from bert_model.heads import BertForSequenceClassification
    from bert_model.registry import minilm_path
    from export.bundle import build_bundle
    from export.runtime import openvino_available

    folder = tmp_path_factory.mktemp("minilm") / "minilm-random-sst2"
    model = BertForSequenceClassification.from_pretrained("minilm", id2label={0: "negative", 1: "positive"})
    model.save_pretrained(folder)
    (folder / "vocab.txt").write_bytes((minilm_path() / "vocab.txt").read_bytes())
    variants = "cpu-fp32,cpu-int8,gpu-fp16" + (",openvino-int8" if openvino_available() else "")
    out = tmp_path_factory.mktemp("minilm-bundle") / "bundle"
    build_bundle(folder, out, variants=variants, max_seq_len=128, data_dir=data_dir, strict=True)
    return out
