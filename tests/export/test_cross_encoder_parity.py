"""A sentence-transformers CrossEncoder, exported with `bertserve export` and served: the served `/rerank` scores are
`CrossEncoder.predict`'s (sigmoid of its one logit) on cpu-fp32, and every variant the export wrote puts the passages
in the same order.

The CrossEncoder is a tiny random BERT over MiniLM's vocabulary, saved by sentence-transformers itself (so its folder
is what users bring: `config_sentence_transformers.json` says CrossEncoder); its weights are drawn wide (standard
deviation 0.2) so that the passages' scores differ by more than reduced precision moves them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from bert_model.registry import minilm_path
from bert_model.tasks.rerank import build_rerank_features, rerank_postprocess
from bert_model.tokenization import BertTokenizer
from bertserve.cli import build_app
from bundles.runtimes import open_variant, openvino_available
from bundles.spec import TOKENIZER_DIR, BundleManifest
from tests.service.server import serving

QUERIES = {
    "Where did the committee meet?": [
        "The committee met in the old town hall on Monday.",
        "Paris is the capital of France.",
        "The river crossing was discussed at length by the engineers.",
        "Stock prices fell sharply after the announcement.",
        "The town hall was built in 1820 and restored in 1990.",
        "Rain is expected over the weekend in the north.",
    ],
    "Who wrote the novel?": [
        "The novel was written by a young teacher from Leeds.",
        "Sales of the book doubled in its second year.",
        "A film adaptation is planned for next spring.",
        "The teacher later moved to London and wrote poetry.",
        "Critics praised the novel's careful structure.",
    ],
}
VARIANTS = "cpu-fp32,cpu-int8,gpu-fp16,openvino-int8,openvino-bf16"


@pytest.fixture(scope="module")
def cross_encoder(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    sentence_transformers = pytest.importorskip("sentence_transformers")
    import torch
    import transformers

    root = tmp_path_factory.mktemp("cross-encoder")
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        num_labels=1,
        initializer_range=0.2,
    )
    transformers.BertForSequenceClassification(config).save_pretrained(root / "raw")
    transformers.AutoTokenizer.from_pretrained(minilm_path()).save_pretrained(root / "raw")
    model = sentence_transformers.CrossEncoder(str(root / "raw"), device="cpu")
    model.save(str(root / "tiny-cross-encoder"))
    return root / "tiny-cross-encoder", model


@pytest.fixture(scope="module")
def bundle(cross_encoder: tuple[Path, object], tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder, _ = cross_encoder
    out = tmp_path_factory.mktemp("bundles") / "tiny-cross-encoder"
    args = ["export", str(folder), "--out", str(out), "--variants", VARIANTS, "--data-dir", "/nonexistent"]
    result = CliRunner().invoke(build_app(), args)
    assert result.exit_code == 0, result.output
    return out


def expected_scores(cross_encoder: tuple[Path, object]) -> dict[str, np.ndarray]:
    _, model = cross_encoder
    return {
        query: np.asarray(model.predict([(query, passage) for passage in passages]), dtype=np.float64)  # type: ignore[attr-defined]
        for query, passages in QUERIES.items()
    }


def served_scores(url: str) -> dict[str, np.ndarray]:
    import httpx

    scores = {}
    with httpx.Client(base_url=url, timeout=30) as client:
        for query, passages in QUERIES.items():
            answer = client.post("/rerank", json={"query": query, "texts": passages})
            assert answer.status_code == 200, answer.text
            by_index = {rank["index"]: rank["score"] for rank in answer.json()}
            scores[query] = np.array([by_index[i] for i in range(len(passages))])
    return scores


def order(scores: np.ndarray) -> list[int]:
    return np.argsort(-scores, kind="stable").tolist()


def test_cpu_fp32_scores_equal_cross_encoder_predict(cross_encoder: tuple[Path, object], tmp_path: Path) -> None:
    """The exported graph and the service's post-processing (sigmoid, as the manifest says), without a server."""
    folder, _ = cross_encoder
    args = ["export", str(folder), "--out", str(tmp_path / "b"), "--variants", "cpu-fp32", "--data-dir", "/nonexistent"]
    result = CliRunner().invoke(build_app(), args)
    assert result.exit_code == 0, result.output
    manifest = BundleManifest.read(tmp_path / "b")
    assert manifest.task == "rerank" and manifest.task_settings == {"activation": "sigmoid"}
    tokenizer = BertTokenizer.from_pretrained(tmp_path / "b" / TOKENIZER_DIR)
    spec = manifest.variants["cpu-fp32"]
    opened = open_variant(tmp_path / "b" / spec.file, spec, manifest.output_names)
    try:
        for query, values in expected_scores(cross_encoder).items():
            features = build_rerank_features(tokenizer, query, QUERIES[query], max_seq_length=manifest.max_seq_length)
            logits = opened.run(_feed(tokenizer, features))["logits"]
            ranks = rerank_postprocess(features, list(logits), activation=manifest.task_settings["activation"])
            ours = np.array([score for _, score in sorted((rank["index"], rank["score"]) for rank in ranks)])
            assert np.abs(ours - values).max() <= 1e-4, (query, ours, values)
    finally:
        opened.close()


@pytest.mark.slow
@pytest.mark.integration
def test_served_rerank_equals_cross_encoder_predict(
    cross_encoder: tuple[Path, object], bundle: Path, tmp_path: Path
) -> None:
    manifest = BundleManifest.read(bundle)
    assert manifest.task == "rerank" and manifest.task_settings == {"activation": "sigmoid"}
    expected = expected_scores(cross_encoder)
    gaps = [np.diff(np.sort(values)).min() for values in expected.values()]
    assert min(gaps) > 1e-3, "the oracle's scores must differ enough for their order to be a test"
    runnable = [
        name
        for name, spec in manifest.variants.items()
        if spec.provider == "CPUExecutionProvider" or (spec.provider == "OpenVINO" and openvino_available())
    ]
    assert "cpu-fp32" in runnable and len(manifest.variants) >= 2
    for name in runnable:
        with serving([bundle], tmp_path / f"{name}.log", None, "--variant", name) as server:
            served = served_scores(server.url)
        for query, values in expected.items():
            if name == "cpu-fp32":
                assert np.abs(served[query] - values).max() <= 1e-4, (query, served[query], values)
            assert order(served[query]) == order(values), (name, query)


@pytest.mark.slow
def test_every_written_variant_orders_as_the_cross_encoder(cross_encoder: tuple[Path, object], bundle: Path) -> None:
    """Also the variants this machine cannot serve (gpu-fp16 needs CUDA to serve), run as the export's guard runs
    them, on ONNX Runtime's CPU provider."""
    manifest = BundleManifest.read(bundle)
    tokenizer = BertTokenizer.from_pretrained(bundle / TOKENIZER_DIR)
    expected = expected_scores(cross_encoder)
    for name, spec in manifest.variants.items():
        if spec.provider == "OpenVINO" and not openvino_available():
            continue
        opened = open_variant(bundle / spec.file, spec, manifest.output_names)
        try:
            for query, passages in QUERIES.items():
                features = build_rerank_features(tokenizer, query, passages, max_seq_length=manifest.max_seq_length)
                logits = [opened.run(_feed(tokenizer, [feature]))["logits"][0] for feature in features]
                ranks = rerank_postprocess(features, logits)
                assert [rank["index"] for rank in ranks] == order(expected[query]), (name, query)
        finally:
            opened.close()


def _feed(tokenizer: BertTokenizer, features: list) -> dict[str, np.ndarray]:  # type: ignore[type-arg]
    from bert_model.tasks.features import collate

    return collate(features, tokenizer.pad_id)
