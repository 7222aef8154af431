"""Export + fusion: one fused Attention per layer, SkipLayerNorm x2 per layer, one EmbedLayerNorm, BiasGelu."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch

from bert_model.config import BertConfig
from bert_model.heads import BertForSequenceClassification
from bundles.spec import INPUT_NAMES
from export.bundle import build_graphs
from export.canonicalize import canonicalize
from export.graph import export_onnx, fused_op_counts
from tests.export.conftest import tiny_config


def expected_counts(layers: int) -> dict[str, int]:
    return {"Attention": layers, "SkipLayerNormalization": 2 * layers, "EmbedLayerNormalization": 1, "BiasGelu": layers}


def assert_fused(counts: dict[str, int], layers: int) -> None:
    for op, count in expected_counts(layers).items():
        assert counts.get(op) == count, f"{op}: {counts}"


def test_tiny_model_fuses_every_layer(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = BertForSequenceClassification(tiny_config(num_hidden_layers=3).with_labels(["a", "b"])).eval()
    _raw, fused, rewrites, counts = build_graphs(model, "classify", tmp_path)
    assert rewrites == {"attention_scale_to_div": 3, "expand_position_ids": 1}
    assert_fused(counts, 3)
    # The fused graph keeps the contract's names and dynamic axes and computes what PyTorch computes.
    session = ort.InferenceSession(str(fused), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == list(INPUT_NAMES)
    for batch, length in ((1, 7), (3, 20)):
        ids = np.random.default_rng(batch).integers(5, 99, (batch, length))
        mask = np.ones_like(ids)
        mask[-1, length // 2 :] = 0
        feed = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
        (logits,) = session.run(None, feed)
        with torch.inference_mode():
            expected = model(*(torch.from_numpy(feed[k]) for k in INPUT_NAMES)).logits.numpy()
        np.testing.assert_allclose(logits, expected, atol=1e-5)


def test_canonicalize_is_exact_and_idempotent(tmp_path: Path) -> None:
    torch.manual_seed(1)
    model = BertForSequenceClassification(tiny_config().with_labels(["a", "b"])).eval()
    traced = export_onnx(model, "classify", tmp_path / "traced.onnx")
    graph = onnx.load(str(traced))
    assert canonicalize(graph) == {"attention_scale_to_div": 2, "expand_position_ids": 1}
    onnx.checker.check_model(graph)
    feed = {"input_ids": np.array([[2, 7, 9, 3]]), "attention_mask": np.ones((1, 4), np.int64)}
    feed["token_type_ids"] = np.zeros((1, 4), np.int64)
    before = ort.InferenceSession(str(traced), providers=["CPUExecutionProvider"]).run(None, feed)[0]
    after = ort.InferenceSession(graph.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)[0]
    np.testing.assert_allclose(before, after, atol=1e-6)
    # A second pass finds nothing left to rewrite (positions are already expanded, scales already divide).
    assert canonicalize(graph)["attention_scale_to_div"] == 0


def test_export_restores_eval_mode_and_attention() -> None:
    model = BertForSequenceClassification(tiny_config().with_labels(["a", "b"])).eval()
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        export_onnx(model, "classify", Path(folder) / "m.onnx")
    assert not model.training
    assert model.bert.config.attn_implementation == "sdpa"


def test_minilm_fuses_six_layers(tmp_path: Path) -> None:
    model = BertForSequenceClassification.from_pretrained("minilm", id2label={0: "negative", 1: "positive"})
    _, fused, _, counts = build_graphs(model, "classify", tmp_path)
    assert_fused(counts, 6)
    assert fused_op_counts(onnx.load(str(fused)))["nodes"] < 60


def test_bert_base_shaped_config_fuses_twelve_layers(tmp_path: Path) -> None:
    config = BertConfig(vocab_size=1000).with_labels(["a", "b"])  # BERT-base shape, random weights, small vocab
    model = BertForSequenceClassification(config).eval()
    _, _, _, counts = build_graphs(model, "classify", tmp_path)
    assert_fused(counts, 12)
