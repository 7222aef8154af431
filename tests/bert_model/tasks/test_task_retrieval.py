"""recall@k over a cosine ranking on hand-made vectors, and the SQuAD retrieval set built from examples."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bert_model.tasks import retrieval
from bert_model.tasks.readers import SquadExample, read_squad
from bert_model.tasks.retrieval import gold_ranks, recall_at_k, squad_retrieval_set

# Three paragraphs along the axes of a plane-and-a-bit; questions placed so their ranks are known by hand.
PARAGRAPHS = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
QUESTIONS = np.array(
    [
        [10.0, 1.0, 0.0],  # nearest p0, then p1, then p2: gold p0 -> rank 1 (length does not matter: cosine)
        [0.9, 0.5, 0.1],  # p0 > p1 > p2: gold p1 -> rank 2
        [0.9, 0.5, 0.1],  # same question, gold p2 -> rank 3
        [-1.0, -2.0, 3.0],  # p2 > p0 > p1: gold p2 -> rank 1
    ]
)
GOLD = [0, 1, 2, 2]


def test_gold_ranks_follow_cosine_order() -> None:
    assert gold_ranks(QUESTIONS, PARAGRAPHS, GOLD).tolist() == [1, 2, 3, 1]


def test_recall_at_k_counts_questions_whose_gold_is_in_the_top_k() -> None:
    metrics = recall_at_k(QUESTIONS, PARAGRAPHS, GOLD, ks=(1, 2, 5))
    assert metrics["recall@1"] == pytest.approx(50.0)
    assert metrics["recall@2"] == pytest.approx(75.0)
    assert metrics["recall@5"] == pytest.approx(100.0)  # k beyond the number of paragraphs: everything found
    assert metrics["mrr"] == pytest.approx(100.0 * (1 + 1 / 2 + 1 / 3 + 1) / 4)
    assert (metrics["questions"], metrics["paragraphs"]) == (4.0, 3.0)


def test_a_tie_with_the_gold_paragraph_ranks_the_gold_below() -> None:
    paragraphs = np.array([[1.0, 0.0], [2.0, 0.0], [0.0, 1.0]])  # p0 and p1 point the same way
    assert gold_ranks([[1.0, 0.0]], paragraphs, [0]).tolist() == [2]
    assert gold_ranks([[1.0, 0.0]], paragraphs, [1]).tolist() == [2]
    constant = np.ones((3, 2))
    assert recall_at_k(np.ones((2, 2)), constant, [0, 1], ks=(1, 2, 3)) == pytest.approx(
        {"recall@1": 0.0, "recall@2": 0.0, "recall@3": 100.0, "mrr": 100 / 3, "questions": 2.0, "paragraphs": 3.0}
    )


def test_ranking_in_chunks_equals_one_product(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(0)
    questions, paragraphs = rng.normal(size=(50, 8)), rng.normal(size=(20, 8))
    gold = rng.integers(0, 20, size=50).tolist()
    whole = gold_ranks(questions, paragraphs, gold)
    monkeypatch.setattr(retrieval, "RANKING_CHUNK", 7)
    assert gold_ranks(questions, paragraphs, gold).tolist() == whole.tolist()


@pytest.mark.parametrize(
    ("questions", "paragraphs", "gold", "ks", "message"),
    [
        (QUESTIONS, PARAGRAPHS, [0, 1], (1,), "2 gold indices for 4 questions"),
        (QUESTIONS, PARAGRAPHS, [0, 1, 2, 3], (1,), r"gold indices must lie in \[0, 3\)"),
        (QUESTIONS, PARAGRAPHS[:, :2], GOLD, (1,), "expected"),
        (QUESTIONS, PARAGRAPHS, GOLD, (0,), "every k must be at least 1"),
        (np.zeros((0, 3)), PARAGRAPHS, [], (1,), "empty set of questions"),
    ],
)
def test_bad_input_is_refused_with_a_message(
    questions: np.ndarray, paragraphs: np.ndarray, gold: list[int], ks: tuple[int, ...], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        recall_at_k(questions, paragraphs, gold, ks=ks)


def _example(question: str, context: str) -> SquadExample:
    return SquadExample(id=question, question=question, context=context)


def test_squad_retrieval_set_pairs_each_question_with_its_paragraph() -> None:
    examples = [_example("q1", "A"), _example("q2", "A"), _example("q3", "B"), _example("q4", "C")]
    full = squad_retrieval_set(examples)
    assert (full.questions, full.paragraphs, full.gold) == (["q1", "q2", "q3", "q4"], ["A", "B", "C"], [0, 0, 1, 2])
    first_two = squad_retrieval_set(examples, max_paragraphs=2)
    assert (first_two.questions, first_two.paragraphs, first_two.gold) == (["q1", "q2", "q3"], ["A", "B"], [0, 0, 1])
    with pytest.raises(ValueError, match="max_paragraphs"):
        squad_retrieval_set(examples, max_paragraphs=0)
    with pytest.raises(ValueError, match="no questions"):
        squad_retrieval_set([])


def test_squad_dev_half_a_is_every_question_against_its_1023_paragraphs(data_dir: Path) -> None:
    retrieval_set = squad_retrieval_set(read_squad(data_dir / "squad_v1.1" / "dev-v1.1.half-a.json"))
    assert (len(retrieval_set.questions), len(retrieval_set.paragraphs)) == (5397, 1023)
    assert sorted(set(retrieval_set.gold)) == list(range(1023))
