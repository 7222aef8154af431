import pytest

from bert_model.tasks.metrics import (
    best_null_threshold,
    best_scores,
    classification_metrics,
    exact_match,
    ner_metrics,
    normalize_answer,
    squad_metrics,
    token_f1,
)
from bert_model.tasks.readers import SquadAnswer, SquadExample


def test_normalisation_drops_case_punctuation_articles_and_extra_spaces() -> None:
    assert normalize_answer("  The  Eiffel-Tower, in  PARIS! ") == "eiffeltower in paris"
    assert normalize_answer("an apple a day") == "apple day"
    assert normalize_answer("Theatre another answer") == "theatre another answer"  # only whole words
    assert exact_match("the Denver Broncos.", "Denver Broncos") == 1.0


def test_token_f1_partial_overlap_by_hand() -> None:
    # prediction tokens: denver broncos won (3); reference: broncos (1); common 1 -> P=1/3, R=1, F1=0.5
    assert token_f1("Denver Broncos won", "the Broncos") == pytest.approx(0.5)
    # repeated tokens count with multiplicity: pred "a b b" -> "b b"; ref "b c" -> common 1: P=1/2 R=1/2
    assert token_f1("b b", "b c") == pytest.approx(0.5)
    assert token_f1("", "") == 1.0 and token_f1("x", "") == 0.0 and token_f1("x", "y") == 0.0


def test_max_over_multiple_references() -> None:
    em, f1 = best_scores("Denver Broncos", ["Broncos", "the Denver Broncos", "Denver"])
    assert (em, f1) == (1.0, 1.0)
    em, f1 = best_scores("Carolina Panthers team", ["Panthers", "Carolina Panthers"])
    assert em == 0.0 and f1 == pytest.approx(0.8)  # P=2/3, R=1 against "Carolina Panthers"


def example(qid, *answers, impossible=False):
    return SquadExample(qid, "q?", "context", [SquadAnswer(a, 0) for a in answers], impossible)


def test_squad_v1_averages_and_missing_predictions() -> None:
    examples = [example("1", "Broncos"), example("2", "Paris", "the city of Paris"), example("3", "x")]
    metrics = squad_metrics({"1": "the Broncos", "2": "city of Paris France"}, examples)
    # q1 EM 1 F1 1; q2 best F1 vs "city of paris": P=3/4, R=1 -> 6/7; q3 missing -> 0
    assert metrics["exact_match"] == pytest.approx(100 / 3)
    assert metrics["f1"] == pytest.approx(100 * (1 + 6 / 7) / 3)
    assert metrics["missing"] == 1.0 and "HasAns_f1" not in metrics


def test_squad_v2_breakdown() -> None:
    examples = [example("1", "Broncos"), example("2", impossible=True), example("3", impossible=True)]
    metrics = squad_metrics({"1": "Broncos", "2": "", "3": "something"}, examples)
    assert metrics["HasAns_exact_match"] == 100.0 and metrics["HasAns_total"] == 1.0
    assert metrics["NoAns_exact_match"] == 50.0 and metrics["NoAns_f1"] == 50.0 and metrics["NoAns_total"] == 2.0
    assert metrics["exact_match"] == pytest.approx(200 / 3)


def test_best_null_threshold_switches_the_right_questions() -> None:
    examples = [example("1", "Broncos"), example("2", impossible=True), example("3", "Paris")]
    spans = {"1": "Broncos", "2": "wrong", "3": "London"}
    # q2 (diff 5) gains by switching to "", q3 (diff 1) neither gains nor loses, q1 (diff -3) loses.
    threshold, f1 = best_null_threshold(examples, spans, {"1": -3.0, "2": 5.0, "3": 1.0})
    assert 1.0 <= threshold < 5.0
    assert f1 == pytest.approx(200 / 3)


def test_classification_accuracy_and_binary_f1() -> None:
    metrics = classification_metrics(["pos", "pos", "neg", "neg"], ["pos", "neg", "neg", "pos"], ["neg", "pos"])
    assert metrics["accuracy"] == 50.0 and metrics["f1"] == pytest.approx(50.0)
    assert "f1" not in classification_metrics(["a"], ["a"], ["a", "b", "c"])
    with pytest.raises(ValueError, match="empty"):
        classification_metrics([], [])


def test_entity_level_scores_by_hand() -> None:
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "O"]]
    pred = [["B-PER", "I-PER", "O", "B-ORG"], ["B-ORG", "O"]]  # 2 of 3 right, 3 predicted
    metrics = ner_metrics(gold, pred)
    assert metrics["precision"] == pytest.approx(200 / 3) and metrics["recall"] == pytest.approx(200 / 3)
    assert metrics["f1"] == pytest.approx(200 / 3) and metrics["entities"] == 3.0
    assert metrics["per_type"]["LOC"]["recall"] == 0.0 and metrics["per_type"]["PER"]["f1"] == 100.0
    # a partial span is a miss: I-PER alone on the second word is a different entity
    assert ner_metrics([["B-PER", "I-PER"]], [["B-PER", "O"]])["f1"] == 0.0


def test_entity_scores_accept_iob1() -> None:
    iob1 = [["I-PER", "I-PER", "B-PER", "O", "I-LOC"]]
    iob2 = [["B-PER", "I-PER", "B-PER", "O", "B-LOC"]]
    assert ner_metrics(iob1, iob2)["f1"] == 100.0
    # IOB1 prediction = one PER over words 0-2 (wrong) and LOC (right): P = 1/2, R = 1/3, F1 = 0.4
    assert ner_metrics(iob2, [["I-PER", "I-PER", "I-PER", "O", "I-LOC"]])["f1"] == pytest.approx(40.0)
    with pytest.raises(ValueError, match="sentence 0: 1 predicted tags for 2 words"):
        ner_metrics([["O", "O"]], [["O"]])
