"""Accuracy guards: the judging rules on synthetic predictions, and every variant on real text (SST-2)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from export.parity import AGREEMENT, EVAL_SET, Scored, entity_f1, judge_fp32, judge_task


def feeds(rows: int = 4, length: int = 6) -> list[dict[str, np.ndarray]]:
    mask = np.ones((rows, length), np.int64)
    segments = np.zeros((rows, length), np.int64)
    segments[:, 2:] = 1
    return [{"input_ids": np.ones((rows, length), np.int64), "attention_mask": mask, "token_type_ids": segments}]


def masks(batches: list[dict[str, np.ndarray]]) -> list[np.ndarray]:
    return [batch["attention_mask"] for batch in batches]


def test_fp32_guard_is_max_abs_diff() -> None:
    reference = [{"logits": np.zeros((4, 2), np.float32)}]
    assert judge_fp32(reference, [{"logits": np.full((4, 2), 5e-5, np.float32)}], masks(feeds())).passed
    result = judge_fp32(reference, [{"logits": np.full((4, 2), 2e-4, np.float32)}], masks(feeds()))
    assert not result.passed
    assert "max |diff|" in result.message and "1e-04" in result.message


def test_fp32_guard_ignores_padding_positions_of_token_outputs() -> None:
    rows = feeds(1)
    rows[0]["attention_mask"][0, 4:] = 0
    reference = [{"logits": np.zeros((1, 6, 3), np.float32)}]
    candidate = [{"logits": np.zeros((1, 6, 3), np.float32)}]
    candidate[0]["logits"][0, 5] = 7.0  # a padding position
    assert judge_fp32(reference, candidate, masks(rows)).figures["max_abs_diff"] == 0.0
    candidate[0]["logits"][0, 3] = 1e-3  # a real token
    assert not judge_fp32(reference, candidate, masks(rows)).passed


def labels(values: list[str]) -> Scored:
    return Scored({i: {"label": label, "score": 0.9} for i, label in enumerate(values)})


@pytest.mark.parametrize("judgment", [AGREEMENT, EVAL_SET])
def test_classify_guard_counts_label_agreement(judgment: str) -> None:
    reference = labels(["positive"] * 100)
    reference.metrics = {"accuracy": 90.0}
    candidate = labels(["negative"] + ["positive"] * 99)  # one flip in 100 = 99% agreement: passes
    candidate.metrics = {"accuracy": 89.0}
    result = judge_task("classify", judgment, reference, candidate)
    assert result.passed and result.figures["label_agreement"] == pytest.approx(0.99)
    candidate = labels(["negative"] * 2 + ["positive"] * 98)
    candidate.metrics = {"accuracy": 88.0}
    result = judge_task("classify", judgment, reference, candidate)
    assert not result.passed and "label_agreement 0.98" in result.message
    if judgment == EVAL_SET:
        assert result.figures["accuracy_fp32"] == 90.0 and result.figures["accuracy"] == 88.0


def test_qa_eval_set_guard_allows_one_point_of_squad_f1() -> None:
    reference = Scored({0: "Denver Broncos", 1: "1990"}, {"f1": 70.0, "exact_match": 60.0})
    within = Scored({0: "Broncos", 1: "1990"}, {"f1": 69.2, "exact_match": 55.0})
    result = judge_task("qa", EVAL_SET, reference, within)
    assert result.passed
    assert result.figures["f1_delta"] == pytest.approx(-0.8) and result.figures["prediction_agreement"] == 0.5
    assert result.figures["exact_match_fp32"] == 60.0 and result.figures["metric"] == "squad_f1"
    below = Scored({0: "Broncos", 1: "1991"}, {"f1": 68.9, "exact_match": 50.0})
    result = judge_task("qa", EVAL_SET, reference, below)
    assert not result.passed
    assert result.message == "SQuAD F1 68.90 vs PyTorch fp32 70.00 on 2 questions (may drop at most 1 point)"


def test_ner_eval_set_guard_uses_the_entity_f1() -> None:
    reference = Scored({0: ["B-PER", "O"]}, {"f1": 85.0})
    result = judge_task("ner", EVAL_SET, reference, Scored({0: ["B-PER", "O"]}, {"f1": 83.5}))
    assert not result.passed and result.message.startswith("entity F1 (seqeval) 83.50 vs PyTorch fp32 85.00")


def test_qa_agreement_scores_answers_against_fp32_answers() -> None:
    reference = Scored(
        {0: {"answer": "the Denver Broncos", "start": 0, "end": 18}, 1: {"answer": "1990", "start": 5, "end": 9}}
    )
    same_text = Scored(
        {0: {"answer": "Denver Broncos", "start": 4, "end": 18}, 1: {"answer": "1990", "start": 5, "end": 9}}
    )
    result = judge_task("qa", AGREEMENT, reference, same_text)  # SQuAD normalisation drops the article
    assert result.passed and result.figures["answer_f1_vs_fp32"] == 100.0 and result.figures["span_agreement"] == 0.5
    half = Scored({0: {"answer": "Broncos", "start": 11, "end": 18}, 1: {"answer": "1990", "start": 5, "end": 9}})
    result = judge_task("qa", AGREEMENT, reference, half)
    assert not result.passed and result.figures["answer_f1_vs_fp32"] == pytest.approx(100 * (2 / 3 + 1) / 2)
    assert "answer F1 vs PyTorch fp32's answers 83.33 on 2 questions (needs >= 99)" in result.message


def test_ner_agreement_is_seqeval_entity_f1_against_fp32_tags() -> None:
    reference = Scored({0: ["B-PER", "I-PER", "O", "B-LOC"], 1: ["O", "O"]})
    assert (
        judge_task("ner", AGREEMENT, reference, Scored(dict(reference.predictions))).figures["entity_f1_vs_fp32"] == 100
    )
    shifted = Scored({0: ["B-PER", "O", "O", "B-LOC"], 1: ["O", "O"]})  # the PER entity loses its last word
    result = judge_task("ner", AGREEMENT, reference, shifted)
    assert not result.passed and result.figures["entity_f1_vs_fp32"] == pytest.approx(50.0)
    assert entity_f1([["O", "O"]], [["O", "O"]]) == 100.0  # no entity on either side: nothing to disagree on
    assert entity_f1([["O", "O"]], [["B-LOC", "O"]]) == 0.0


def test_embed_guard_is_the_mean_and_minimum_cosine_and_retrieval_agreement() -> None:
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(200, 16))
    reference = Scored(dict(enumerate(vectors)), {"retrieved": [0] * 20, "retrieval_top1_accuracy": 0.9})
    close = Scored(dict(enumerate(vectors + 0.01 * rng.normal(size=vectors.shape))), dict(reference.metrics))
    result = judge_task("embed", AGREEMENT, reference, close)
    assert result.passed and 0.995 < result.figures["cosine_min"] <= result.figures["cosine_mean"] < 1
    assert result.figures["retrieval_top1_agreement"] == 1.0
    one_off = Scored(dict(close.predictions), dict(close.metrics))
    one_off.predictions[7] = -vectors[7]  # a single bad vector: the mean passes (0.99), the minimum does not
    result = judge_task("embed", AGREEMENT, reference, one_off)
    assert not result.passed and result.figures["cosine_min"] == pytest.approx(-1.0, abs=1e-3)
    drifting = Scored(dict(close.predictions), {"retrieved": [0] * 18 + [1, 1], "retrieval_top1_accuracy": 0.8})
    result = judge_task("embed", AGREEMENT, reference, drifting)  # 2 of 20 questions retrieve another paragraph
    assert not result.passed and result.figures["retrieval_top1_agreement"] == pytest.approx(0.9)
    assert "retrieval top-1 agreement 0.9000" in result.message


def test_fill_mask_guard_is_top1_agreement_and_top5_overlap() -> None:
    reference = Scored({i: (i, 200, 201, 202, 203) for i in range(100)}, {"masked_top1_accuracy": 0.5})
    # order below the first ignored; half the positions have another 5th token: overlap 0.9, passes
    reordered = Scored({i: (i, 201, 200, 202, 203 if i % 2 else 999) for i in range(100)})
    result = judge_task("fill-mask", AGREEMENT, reference, reordered)
    assert result.passed and result.figures["top1_agreement"] == 1.0
    assert result.figures["top5_overlap"] == pytest.approx(0.9) and result.figures["top5_same_set"] == 0.5
    assert result.figures["masked_top1_accuracy_fp32"] == 0.5
    other_fifth = Scored({i: (i, 200, 201, 202, 999) for i in range(100)})
    assert not judge_task("fill-mask", AGREEMENT, reference, other_fifth).passed  # overlap 0.8
    flipped = Scored({i: ((200, i, 201, 202, 203) if i < 6 else reference.predictions[i]) for i in range(100)})
    result = judge_task("fill-mask", AGREEMENT, reference, flipped)  # 6% of positions change their best token
    assert not result.passed and result.figures["top1_agreement"] == pytest.approx(0.94)


def test_every_written_variant_is_within_its_guard_on_real_text(minilm_bundle: tuple[Path, dict]) -> None:
    """minilm-sst2 (or MiniLM + a fitted stand-in head until it exists) on the 436 SST-2 dev-half-a sentences: every
    variant written meets its guard, every refused one is absent; fp32 and fp16 always pass."""
    from bundles.spec import BundleManifest

    bundle, refused = minilm_bundle
    manifest = BundleManifest.read(bundle)
    guard = manifest.source["guard_inputs"]
    assert guard["source"].endswith("sst2/dev.half-a.tsv") and guard["count"] == 436
    # minilm-sst2 scores SST-2's gold labels (eval set); the stand-in head knows no label map: agreement only
    assert guard["judgment"] == ("eval-set" if "pytorch_fp32" in guard else "agreement-with-fp32")
    assert manifest.variants["cpu-fp32"].parity["max_abs_diff"] <= 1e-4
    assert manifest.variants["gpu-fp16"].parity["label_agreement"] >= 0.99
    for name, spec in manifest.variants.items():
        if spec.precision != "fp32":
            assert spec.parity["label_agreement"] >= 0.99, name
    for name, why in refused.items():
        assert name not in manifest.variants and not (bundle / f"{name}.onnx").exists()
        assert "label_agreement" in why or "skipped" in why
    for spec in manifest.variants.values():
        if spec.provider == "OpenVINO":
            assert spec.runtime_options["INFERENCE_PRECISION_HINT"] == "bf16"
    # every written variant is judged by batch invariance; ONNX Runtime's dynamic int8 moves a real model's logits
    # with its batchmates, fp32 does not
    assert all(spec.batch_invariant is not None and spec.batch_invariance for spec in manifest.variants.values())
    assert manifest.variants["cpu-fp32"].batch_invariant is True
    if "cpu-int8" in manifest.variants:  # (unless its accuracy guard refused it)
        assert manifest.variants["cpu-int8"].batch_invariant is False


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
