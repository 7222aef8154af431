"""Exporting score heads: which folders are rerankers, the rank-agreement guard of a reranker and of any one-output
classifier, and a reranker's bundle (task, activation, trained length, guard figures, batch invariance).

Tiny random models over MiniLM's vocabulary (so the guard's texts are words, not [UNK]s), initialised with a large
spread so that a query's candidates get clearly different scores, and the built-in guard lists keep these fast;
tests/export/test_cross_encoder_parity.py serves a sentence-transformers CrossEncoder.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from bert_model.config import META_KEY, BertConfig
from bert_model.heads import BertForSequenceClassification
from bert_model.tokenization import BertTokenizer
from bundles.spec import BundleManifest
from export import parity
from export.bundle import build_bundle
from export.parity import RANKING, Scored, judge_rankings
from export.rerank_layout import rerank_settings
from export.wrapper import task_of_folder

NO_DATA = Path("/nonexistent")
CLASSIFIER = {"architectures": ["BertForSequenceClassification"], "model_type": "bert"}
SIGMOID, IDENTITY = "torch.nn.modules.activation.Sigmoid", "torch.nn.modules.linear.Identity"


def save_scorer(folder: Path, labels: list[str], task: dict | None = None, seed: int = 0) -> Path:
    """A tiny sequence classifier (one output for a scorer), its stored task settings when given. Weights drawn
    with a standard deviation of 0.2 (BERT's is 0.02) make the first token's state depend on the text enough that
    candidates' scores differ by more than fp16 rounding moves them."""
    tokenizer = BertTokenizer.from_pretrained("minilm")
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=128,
        initializer_range=0.2,
    ).with_labels(labels)
    if task is not None:
        config = config.replace(extra={META_KEY: {"task": task}})
    BertForSequenceClassification(config).save_pretrained(folder)
    tokenizer.save(folder)
    return folder


def write_config(folder: Path, config: dict, cross_encoder: dict | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({**CLASSIFIER, **config}))
    if cross_encoder is not None:
        (folder / "config_sentence_transformers.json").write_text(json.dumps(cross_encoder))
    return folder


@pytest.mark.parametrize(
    ("config", "cross_encoder", "task", "activation"),
    [
        ({"id2label": {"0": "LABEL_0"}, "bertserve": {"task": {"name": "rerank"}}}, None, "rerank", "sigmoid"),
        ({"id2label": {"0": "LABEL_0"}}, {"model_type": "CrossEncoder", "activation_fn": IDENTITY}, "rerank", "none"),
        ({"id2label": {"0": "LABEL_0"}}, {"model_type": "CrossEncoder", "activation_fn": SIGMOID}, "rerank", "sigmoid"),
        ({"num_labels": 1, "sbert_ce_default_activation_function": IDENTITY}, None, "rerank", "none"),
        ({"id2label": {"0": "LABEL_0"}}, None, "classify", None),  # a one-output head that does not say it reranks
        ({"id2label": {"0": "a", "1": "b", "2": "c"}}, {"model_type": "CrossEncoder"}, "classify", None),  # NLI
    ],
)
def test_a_one_output_classifier_that_says_it_is_a_cross_encoder_is_a_reranker(
    config: dict, cross_encoder: dict | None, task: str, activation: str | None, tmp_path: Path
) -> None:
    folder = write_config(tmp_path / "model", config, cross_encoder)
    assert task_of_folder(folder) == task
    settings = rerank_settings(folder)
    assert (settings.activation if settings else None) == activation


def test_an_activation_the_service_cannot_apply_is_refused(tmp_path: Path) -> None:
    cross_encoder = {"model_type": "CrossEncoder", "activation_fn": "torch.nn.modules.activation.Tanh"}
    folder = write_config(tmp_path / "model", {"id2label": {"0": "LABEL_0"}}, cross_encoder)
    with pytest.raises(ValueError, match=r"config_sentence_transformers.json: activation_fn.*Tanh.*is not served"):
        task_of_folder(folder)


def lists(*rows: list[float]) -> Scored:
    return Scored({index: np.asarray(row) for index, row in enumerate(rows)})


def test_rank_judgment_passes_the_same_order_and_refuses_a_reordered_one() -> None:
    reference = lists(*([[3.0, 1.0, 2.0, 0.0]] * 20))
    nudged = lists(*([[2.9, 1.1, 2.0, 0.1]] * 20))
    same = judge_rankings(reference, nudged)
    assert same.passed and same.figures["top1_agreement"] == 1.0 and same.figures["spearman_mean"] == 1.0
    assert same.figures["max_abs_score_diff"] == pytest.approx(0.1) and same.figures["lists"] == 20
    flipped = lists(*([[1.9, 1.0, 2.0, 0.0]] * 2 + [[3.0, 1.0, 2.0, 0.0]] * 18))  # 2 of 20 lists change their best
    result = judge_rankings(reference, flipped)
    assert not result.passed and result.figures["top1_agreement"] == 0.9 and "top-1 agreement 0.9000" in result.message
    reversed_tail = lists(*([[3.0, 0.0, 1.0, 2.0]] * 20))  # the best stays, the rest is reordered
    result = judge_rankings(reference, reversed_tail)
    assert not result.passed and result.figures["top1_agreement"] == 1.0 and result.figures["spearman_mean"] < 0.5
    assert parity.judge_task("rerank", RANKING, reference, nudged).passed


@pytest.fixture(scope="module")
def tiny_reranker(tmp_path_factory: pytest.TempPathFactory) -> Path:
    task = {"name": "rerank", "max_seq_length": 64}
    return save_scorer(tmp_path_factory.mktemp("reranker") / "tiny-rerank", ["LABEL_0"], task)


def test_reranker_bundle_is_judged_by_rank_agreement(tiny_reranker: Path, tmp_path: Path) -> None:
    variants = "cpu-fp32,gpu-fp16,cpu-int8"
    result = build_bundle(tiny_reranker, tmp_path / "bundle", variants=variants, data_dir=NO_DATA)
    manifest = BundleManifest.read(result.path)
    assert (manifest.task, manifest.labels, manifest.task_settings) == ("rerank", [], {"activation": "sigmoid"})
    assert manifest.max_seq_length == 64  # the length it was fine-tuned with, not the 512 its positions allow
    guard = manifest.source["guard_inputs"]
    assert guard["judgment"] == RANKING and guard["count"] == 4 and guard["features"] == 4 * 10
    assert guard["source"] == "built-in questions and sentences" and "recall@1" in guard["pytorch_fp32"]
    fp32 = manifest.variants["cpu-fp32"]
    assert fp32.parity["judgment"] == "max-abs-diff" and fp32.parity["max_abs_diff"] <= 1e-4
    assert fp32.batch_invariant is True
    assert "gpu-fp16" in manifest.variants  # fp16 rounding moves these scores far less than they differ
    for name in ("gpu-fp16", "cpu-int8"):  # each reduced variant: written within the rank rule, or refused by it
        if name in result.refused:
            assert result.refused[name].startswith("candidate lists: top-1 agreement"), result.refused[name]
            continue
        figures = manifest.variants[name].parity
        assert figures["judgment"] == RANKING and figures["lists"] == 4 and figures["candidates"] == 40
        assert figures["top1_agreement"] >= parity.RANK_TOP1_AGREEMENT
        assert figures["spearman_mean"] >= parity.RANK_SPEARMAN_MEAN and "recall@1_fp32" in figures


def test_a_reranker_that_reorders_is_refused(
    tiny_reranker: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(parity, "RANK_SPEARMAN_MEAN", 1.01)  # no list can correlate better than perfectly
    result = build_bundle(tiny_reranker, tmp_path / "b", variants="cpu-fp32,gpu-fp16", data_dir=NO_DATA)
    assert "gpu-fp16" in result.refused and "mean Spearman" in result.refused["gpu-fp16"]
    assert list(result.manifest.variants) == ["cpu-fp32"]


def test_the_rerank_guard_reads_squad_candidate_lists(tiny_reranker: Path, data_dir: Path, tmp_path: Path) -> None:
    result = build_bundle(tiny_reranker, tmp_path / "b", variants="cpu-fp32", data_dir=data_dir, guard_limit=12)
    guard = result.manifest.source["guard_inputs"]
    assert guard["source"].endswith("squad_v1.1/dev-v1.1.half-a.json")
    assert guard["count"] == 12 and guard["features"] == 12 * 10 and guard["settings"]["candidates"] == 10


def test_a_one_output_classifier_is_ranked_not_labelled(tmp_path: Path) -> None:
    folder = save_scorer(tmp_path / "scorer", ["LABEL_0"])
    result = build_bundle(folder, tmp_path / "b", variants="cpu-fp32,gpu-fp16", data_dir=NO_DATA)
    assert result.manifest.task == "classify" and result.manifest.source["guard_inputs"]["judgment"] == RANKING
    figures = result.manifest.variants["gpu-fp16"].parity
    assert figures["judgment"] == RANKING and "label_agreement" not in figures
    assert figures["lists"] == 2 and figures["candidates"] == 12  # the 12 built-in sentences in lists of 10
    with pytest.raises(ValueError, match="give --calibration texts"):
        build_bundle(folder, tmp_path / "c", variants="cpu-fp32", eval_data=tmp_path / "scorer" / "vocab.txt")


def test_task_rerank_serves_a_plain_one_output_classifier_and_nothing_else(tmp_path: Path) -> None:
    scorer = save_scorer(tmp_path / "scorer", ["LABEL_0"])
    result = build_bundle(scorer, tmp_path / "b", variants="cpu-fp32", data_dir=NO_DATA, task="rerank")
    assert result.manifest.task == "rerank" and result.manifest.task_settings == {"activation": "sigmoid"}
    two_labels = save_scorer(tmp_path / "sentiment", ["negative", "positive"])
    with pytest.raises(ValueError, match="a reranker has one output"):
        build_bundle(two_labels, tmp_path / "c", variants="cpu-fp32", data_dir=NO_DATA, task="rerank")
    with pytest.raises(ValueError, match="is a classify model and cannot be served as 'qa'"):
        build_bundle(two_labels, tmp_path / "d", variants="cpu-fp32", data_dir=NO_DATA, task="qa")
