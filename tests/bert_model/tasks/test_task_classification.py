import numpy as np
import pytest

from bert_model.tasks import build_classification_features, classification_postprocess, collate
from bert_model.tokenization import InputTooLongError

LABELS = ["negative", "positive"]


def test_features_encode_texts_and_pairs(tokenizer) -> None:
    features = build_classification_features(tokenizer, ["a fine film", "dull"], ["yes", "no"], max_seq_length=16)
    assert [f.request_index for f in features] == [0, 1]
    first = features[0]
    assert first.input_ids[0] == tokenizer.cls_id and first.input_ids[-1] == tokenizer.sep_id
    assert tokenizer.convert_ids_to_tokens(first.input_ids) == ["[CLS]", "a", "fine", "film", "[SEP]", "yes", "[SEP]"]
    assert first.token_type_ids == [0, 0, 0, 0, 0, 1, 1]
    batch = collate(features, tokenizer.pad_id)
    assert batch["input_ids"].shape == (2, 7) and batch["input_ids"].dtype == np.int64
    assert batch["attention_mask"][1].tolist() == [1, 1, 1, 1, 1, 0, 0]


def test_long_texts_are_truncated_or_refused(tokenizer) -> None:
    text = "word " * 100
    (feature,) = build_classification_features(tokenizer, [text], max_seq_length=32)
    assert len(feature) == 32
    with pytest.raises(InputTooLongError):
        build_classification_features(tokenizer, [text], max_seq_length=32, truncation="none")


def test_postprocess_ranks_labels_with_softmax(tokenizer) -> None:
    features = build_classification_features(tokenizer, ["x", "y"])
    results = classification_postprocess(features, np.array([[0.0, 2.0], [3.0, 1.0]]), LABELS, top_k=None)
    assert [r["label"] for r in results[0]] == ["positive", "negative"]
    assert results[0][0]["score"] == pytest.approx(1 / (1 + np.exp(-2.0)), rel=1e-6)
    assert sum(r["score"] for r in results[1]) == pytest.approx(1.0)
    assert len(classification_postprocess(features, np.zeros((2, 2)), LABELS)[1]) == 1


def test_postprocess_accepts_rows_from_mixed_batches(tokenizer) -> None:
    first = build_classification_features(tokenizer, ["a", "b"])
    second = build_classification_features(tokenizer, ["c"])
    for feature in second:
        feature.request_index = 7  # a batcher renumbers features of another request
    mixed = [first[1], second[0], first[0]]
    rows = [np.array([0.0, 1.0]), np.array([5.0, 0.0]), np.array([1.0, 0.0])]
    results = classification_postprocess(mixed, rows, LABELS)
    assert results[1][0]["label"] == "positive" and results[7][0]["label"] == "negative"
    assert results[0][0]["label"] == "negative"


def test_postprocess_refuses_misaligned_outputs(tokenizer) -> None:
    features = build_classification_features(tokenizer, ["a", "b"])
    with pytest.raises(ValueError, match="2 features but 1"):
        classification_postprocess(features, np.zeros((1, 2)), LABELS)
    with pytest.raises(ValueError, match="expected \\(2,\\)"):
        classification_postprocess(features, np.zeros((2, 3)), LABELS)


@pytest.mark.parametrize("function", ["softmax", "sigmoid", "none"])
@pytest.mark.parametrize("k", [1, 3, None])
def test_label_scores_rank_each_row_as_alone(function: str, k: int | None) -> None:
    """All rows ranked in one call give each row the answer of ranking it alone (the 1-D score function and top_k),
    ties in label order."""
    from bert_model.tasks.classification import label_scores
    from bert_model.tasks.numeric import sigmoid, softmax, top_k

    labels = ["a", "b", "c", "d", "e"]
    rng = np.random.default_rng(3)
    rows = (rng.standard_normal((40, 5)) * rng.choice([0.01, 1.0, 50.0], (40, 1))).astype(np.float32)
    rows[::5, 2] = rows[::5, 0]  # ties
    alone_scores = {"softmax": softmax, "sigmoid": sigmoid, "none": lambda row: row}[function]
    expected = []
    for row in rows:
        order, values = top_k(alone_scores(row), k)
        expected.append([{"label": labels[int(i)], "score": float(v)} for i, v in zip(order, values, strict=True)])
    assert label_scores(rows, labels, top_k=k, function=function) == expected  # type: ignore[arg-type]
