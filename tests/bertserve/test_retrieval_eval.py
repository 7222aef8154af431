"""`bertserve retrieval-eval`: input errors before any work, scoring through an injected embedder, and (slow) the
served default `minilm` bundle against sentence-transformers on the first paragraphs of SQuAD v1.1 dev-half-a."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from bert_model.tasks.readers import read_squad
from bert_model.tasks.retrieval import RetrievalSet, squad_retrieval_set
from bertserve.cli import build_app
from bertserve.retrieval_eval import (
    embed_over_http,
    embed_with_sentence_transformers,
    evaluate,
    served_model,
)
from tests.service.server import REPO, ServerProcess

SQUAD = Path("squad_v1.1") / "dev-v1.1.half-a.json"
BUNDLE = REPO / "artifacts" / "bundles" / "minilm"
SUBSET_PARAGRAPHS = 100
"""The slow test's subset: the first 100 paragraphs (five articles) and their 565 questions."""


def test_scoring_uses_the_embedder_for_questions_and_paragraphs() -> None:
    retrieval_set = RetrievalSet(questions=["a?", "b?", "c?"], paragraphs=["A", "B"], gold=[0, 1, 1])
    axes = {"a?": [1.0, 0.1], "b?": [0.1, 1.0], "c?": [1.0, 0.0], "A": [1.0, 0.0], "B": [0.0, 1.0]}
    metrics = evaluate(lambda texts: np.array([axes[t] for t in texts]), retrieval_set)
    assert metrics["recall@1"] == pytest.approx(200 / 3)
    assert metrics["recall@5"] == pytest.approx(100.0)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ([], "give --host (the service) or --reference"),
        (["--host", "http://example.com:8000"], "is not on this machine"),
        (["--reference", "minilm", "--max-paragraphs", "0"], "max_paragraphs must be at least 1"),
    ],
)
def test_input_errors_exit_2_with_one_line(arguments: list[str], message: str, data_dir: Path) -> None:
    command = ["retrieval-eval", "--squad", str(data_dir / SQUAD), *arguments]
    done = CliRunner().invoke(build_app(), command)
    assert done.exit_code == 2, done.output
    assert message in done.output


@pytest.fixture(scope="module")
def minilm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """`bertserve serve` over the shared `minilm` bundle, default variant; skip without the bundle."""
    if not (BUNDLE / "manifest.json").is_file():
        pytest.skip(f"{BUNDLE} is missing: bertserve export minilm --out {BUNDLE}")
    server = ServerProcess([BUNDLE], tmp_path_factory.mktemp("retrieval") / "server.log")
    try:
        server.wait_ready(300)
        yield server
    finally:
        server.terminate()


@pytest.mark.slow
@pytest.mark.integration
def test_served_minilm_retrieves_as_sentence_transformers(minilm_server: ServerProcess, data_dir: Path) -> None:
    pytest.importorskip("sentence_transformers")
    retrieval_set = squad_retrieval_set(read_squad(data_dir / SQUAD), max_paragraphs=SUBSET_PARAGRAPHS)
    served = evaluate(embed_over_http(minilm_server.url), retrieval_set)
    reference = evaluate(embed_with_sentence_transformers("minilm"), retrieval_set)
    assert served_model(minilm_server.url, None)["name"] == "minilm"
    for k in (1, 5):
        assert abs(served[f"recall@{k}"] - reference[f"recall@{k}"]) <= 0.5, (served, reference)
    assert reference["recall@5"] > 80.0  # a working encoder: the gold paragraph is nearly always in the top 5


def test_two_stage_scores_embeddings_alone_and_reranked() -> None:
    """A reranker that puts the gold paragraph first lifts recall@1 to 100 where the embeddings rank it second;
    MRR@10 counts 1/rank within the first ten."""
    from bertserve.retrieval_eval import evaluate_two_stage

    retrieval_set = RetrievalSet(questions=["q0", "q1"], paragraphs=["p0", "p1", "p2"], gold=[0, 1])
    vectors = {"q0": [1.0, 0.0], "q1": [0.0, 1.0], "p0": [0.6, 0.8], "p1": [0.8, 0.6], "p2": [-1.0, 0.0]}

    def embed(texts: list[str]) -> np.ndarray:
        return np.array([vectors[t] for t in texts], dtype=np.float32)

    def rerank(query: str, passages: list[str]) -> list[int]:
        gold = retrieval_set.paragraphs[retrieval_set.gold[retrieval_set.questions.index(query)]]
        return sorted(range(len(passages)), key=lambda i: passages[i] != gold)

    result = evaluate_two_stage(embed, rerank, retrieval_set, top_k=2)
    assert result["embeddings"]["recall@1"] == 0.0 and result["embeddings"]["mrr@10"] == 50.0
    assert result["reranked"]["recall@1"] == 100.0 and result["reranked"]["mrr@10"] == 100.0
    assert result["rerank_ms_per_query"]["p50"] >= 0
