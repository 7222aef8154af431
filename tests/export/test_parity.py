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


def test_fp32_guard_ignores_padding_positions_of_token_outputs() -> None:
    rows = feeds(1)
    rows[0]["attention_mask"][0, 4:] = 0
    reference = [{"logits": np.zeros((1, 6, 3), np.float32)}]
    candidate = [{"logits": np.zeros((1, 6, 3), np.float32)}]
    candidate[0]["logits"][0, 5] = 7.0  # a padding position
    assert judge("ner", "fp32", reference, candidate, rows).figures["max_abs_diff"] == 0.0
    candidate[0]["logits"][0, 3] = 1e-3  # a real token
    assert not judge("ner", "fp32", reference, candidate, rows).passed


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


def test_every_written_variant_is_within_its_guard_on_real_text(minilm_bundle: tuple[Path, dict]) -> None:
    """minilm-sst2 (or MiniLM + a fitted stand-in head until it exists) on 256 SST-2 dev sentences: every
    variant written meets its guard, every refused one is absent; fp32 and fp16 always pass."""
    from bert_model.tasks.spec import BundleManifest

    bundle, refused = minilm_bundle
    manifest = BundleManifest.read(bundle)
    assert manifest.source["guard_inputs"]["source"].endswith("sst2/dev.half-a.tsv")
    assert manifest.source["guard_inputs"]["count"] == 256
    assert manifest.variants["cpu-fp32"].parity["max_abs_diff"] <= 1e-4
    assert manifest.variants["gpu-fp16"].parity["label_agreement"] >= 0.99
    for name, spec in manifest.variants.items():
        if spec.precision != "fp32":
            assert spec.parity["label_agreement"] >= 0.99, name
    for name, why in refused.items():
        assert name not in manifest.variants and not (bundle / f"{name}.onnx").exists()
        assert "label_agreement" in why or "skipped" in why
    assert manifest.default_variants["gpu"] == "gpu-fp16"
    cpu_default = manifest.variants[manifest.default_variants["cpu"]]
    if cpu_default.provider == "OpenVINO":
        assert manifest.variants[manifest.default_variants["cpu-onnxruntime"]].provider == "CPUExecutionProvider"
        assert cpu_default.runtime_options["INFERENCE_PRECISION_HINT"] == "bf16"


def sst2_probe_model(data_dir: Path, folder: Path, ridge_lambda: float = 1.0) -> Path:
    """`minilm-sst2` when it is built, else MiniLM + a classification head fitted by ridge regression on the
    pooled outputs of 256 SST-2 *train* sentences: a stand-in with real margins (a random head's logits barely
    vary across inputs, so any rounding flips its labels and no guard could be meaningful)."""
    import gzip

    import torch

    from bert_model.heads import BertForSequenceClassification
    from bert_model.registry import PRETRAINED_DIR, minilm_path
    from bert_model.tokenization import BertTokenizer

    if (PRETRAINED_DIR / "minilm-sst2" / "config.json").is_file():
        return PRETRAINED_DIR / "minilm-sst2"
    torch.manual_seed(0)
    model = BertForSequenceClassification.from_pretrained("minilm", id2label={0: "negative", 1: "positive"})
    with gzip.open(data_dir / "sst2/train.tsv.gz", "rt") as lines:
        pairs = [line.rstrip("\n").split("\t") for line in lines][1:]
    rows = [(text, int(label)) for text, label in pairs if len(text.split()) >= 6][:256]
    batch = BertTokenizer.from_pretrained("minilm")([text for text, _ in rows], max_length=64)
    with torch.inference_mode():
        pooled = model.bert(*(torch.from_numpy(batch[k]) for k in ("input_ids", "attention_mask", "token_type_ids")))
        features = torch.cat([pooled.pooler_output.double(), torch.ones(len(rows), 1, dtype=torch.float64)], 1)
        targets = torch.nn.functional.one_hot(torch.tensor([label for _, label in rows]), 2).double() * 2 - 1
        ridge = features.T @ features + ridge_lambda * torch.eye(features.shape[1], dtype=torch.float64)
        weights = torch.linalg.solve(ridge, features.T @ targets)  # (H + 1, 2)
        model.classifier.weight.copy_(weights[:-1].T.float())
        model.classifier.bias.copy_(weights[-1].float())
    model.save_pretrained(folder)
    (folder / "vocab.txt").write_bytes((minilm_path() / "vocab.txt").read_bytes())
    return folder


@pytest.fixture(scope="module")
def minilm_bundle(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    from export.bundle import build_bundle

    folder = sst2_probe_model(data_dir, tmp_path_factory.mktemp("minilm") / "minilm-probe-sst2")
    out = tmp_path_factory.mktemp("minilm-bundle") / "bundle"
    result = build_bundle(folder, out, max_seq_len=128, data_dir=data_dir)  # every default variant
    return out, result.refused


def test_qa_with_gold_answers_is_judged_on_gold_f1() -> None:
    start = np.array([[0.0, 0, 5, 0, 0, 0], [0.0, 0, 0, 5, 0, 0]], np.float32)
    end = np.array([[0.0, 0, 0, 5, 0, 0], [0.0, 0, 0, 0, 5, 0]], np.float32)
    reference = [{"start_logits": start, "end_logits": end}]
    gold = [[[(2, 3)], [(3, 4)]]]  # fp32 finds both answers: F1 100
    shifted = [{"start_logits": start, "end_logits": np.roll(end, 1, axis=1)}]  # ends one token late
    result = judge("qa", "int8", reference, shifted, feeds(2), gold)
    assert result.figures["gold_f1_fp32"] == 100.0
    # row 0 predicts (2, 4): F1 0.8; row 1's late end is the final [SEP], not a context token: (3, 3), F1 2/3
    assert result.figures["gold_f1"] == pytest.approx(100 * (0.8 + 2 / 3) / 2)
    assert not result.passed and "gold F1 73.33 vs PyTorch fp32 100.00" in result.message
    assert judge("qa", "int8", reference, reference, feeds(2), gold).passed


def test_squad_guard_rows_carry_gold_token_spans(data_dir: Path) -> None:
    from bert_model.tokenization import BertTokenizer
    from export.guard_data import guard_set

    tokenizer = BertTokenizer.from_pretrained("minilm")
    guard = guard_set("qa", tokenizer, 384, data_dir=data_dir, limit=8, batch_size=4)
    assert guard.gold is not None and len(guard.gold) == 2
    ids = guard.batches[0]["input_ids"][0]
    (start, end), *_ = guard.gold[0][0]
    assert tokenizer.decode(ids[start : end + 1]) == "denver broncos"  # the first SQuAD v1.1 dev answer
