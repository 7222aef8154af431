import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bert_model.tasks import (
    AGGREGATION_STRATEGIES,
    align_labels,
    bio_labels,
    build_ner_features,
    build_ner_word_features,
    iob1_to_iob2,
    ner_postprocess,
    ner_word_predictions,
)

LABELS = bio_labels(["PER", "LOC"])  # O, B-PER, I-PER, B-LOC, I-LOC
TEXT = "Schwarzenegger visited New York"  # schwarz ##ene ##gger visited new york
TOKEN_PROBS = np.array(
    [
        [0.10, 0.70, 0.10, 0.05, 0.05],  # schwarz: B-PER
        [0.10, 0.00, 0.40, 0.50, 0.00],  # ##ene: B-LOC
        [0.10, 0.00, 0.90, 0.00, 0.00],  # ##gger: I-PER
        [0.90, 0.00, 0.00, 0.00, 0.10],  # visited: O
        [0.20, 0.00, 0.00, 0.80, 0.00],  # new: B-LOC
        [0.40, 0.00, 0.00, 0.00, 0.60],  # york: I-LOC
    ]
)


def logits_for(features, token_probs):
    """Logits whose softmax at each real token is the given distribution ([CLS]/[SEP] get anything)."""
    rows = []
    for feature in features:
        row = np.zeros((len(feature), token_probs.shape[1]))
        with np.errstate(divide="ignore"):
            row[1:-1] = np.log(token_probs[feature.owned_start - 1 : feature.owned_start - 1 + len(feature) - 2])
        rows.append(row)
    return rows


def entities(tokenizer, strategy):
    features = build_ner_features(tokenizer, [TEXT])
    result = ner_postprocess(features, logits_for(features, TOKEN_PROBS), LABELS, aggregation_strategy=strategy)[0]
    return [(e["entity_group"], round(e["score"], 4), e["word"], e["start"], e["end"]) for e in result]


def test_iob1_to_iob2() -> None:
    assert iob1_to_iob2(["I-PER", "I-PER", "O", "I-LOC", "B-LOC", "I-ORG"]) == [
        "B-PER",
        "I-PER",
        "O",
        "B-LOC",
        "B-LOC",
        "B-ORG",
    ]
    iob2 = ["B-PER", "I-PER", "B-PER", "O", "B-LOC"]
    assert iob1_to_iob2(iob2) == iob2


def test_strategy_none_lists_every_non_o_token(tokenizer) -> None:
    assert entities(tokenizer, "none") == [
        ("B-PER", 0.7, "Schwarz", 0, 7),
        ("B-LOC", 0.5, "ene", 7, 10),
        ("I-PER", 0.9, "gger", 10, 14),
        ("B-LOC", 0.8, "New", 23, 26),
        ("I-LOC", 0.6, "York", 27, 31),
    ]


def test_strategy_simple_groups_tokens_not_words(tokenizer) -> None:
    assert entities(tokenizer, "simple") == [
        ("PER", 0.7, "Schwarz", 0, 7),
        ("LOC", 0.5, "ene", 7, 10),
        ("PER", 0.9, "gger", 10, 14),
        ("LOC", 0.7, "New York", 23, 31),
    ]


def test_word_strategies_merge_pieces_into_words(tokenizer) -> None:
    assert entities(tokenizer, "first") == [("PER", 0.7, "Schwarzenegger", 0, 14), ("LOC", 0.7, "New York", 23, 31)]
    assert entities(tokenizer, "average") == [
        ("PER", round(1.4 / 3, 4), "Schwarzenegger", 0, 14),
        ("LOC", 0.7, "New York", 23, 31),
    ]
    assert entities(tokenizer, "max") == [("PER", 0.9, "Schwarzenegger", 0, 14), ("LOC", 0.7, "New York", 23, 31)]


def test_b_tag_starts_a_new_entity_of_the_same_type(tokenizer) -> None:
    features = build_ner_features(tokenizer, ["Paris Berlin"])
    probs = np.array([[0, 0, 0, 1.0, 0], [0, 0, 0, 1.0, 0]]) * 0.96 + 0.01
    result = ner_postprocess(features, logits_for(features, probs), LABELS)[0]
    assert [e["word"] for e in result] == ["Paris", "Berlin"]


def test_labels_go_on_the_first_piece_only(tokenizer) -> None:
    (feature,) = build_ner_word_features(tokenizer, [["Schwarzenegger", "visited", "New", "York"]])
    assert align_labels(feature, [1, 0, 3, 4]) == [-100, 1, -100, -100, 0, 3, 4, -100]
    with pytest.raises(ValueError, match="3 labels for a text of 4 words"):
        align_labels(feature, [1, 0, 3])


def test_a_word_split_across_windows_is_labelled_once(tokenizer) -> None:
    words = ["Xiangqiongzhuofication", "met", "Schwarzenegger"] * 3
    features = build_ner_word_features(tokenizer, [words], max_seq_length=6, stride=1)
    assert len(features) > 3
    first_piece_labels = [lab for f in features for lab in align_labels(f, list(range(9))) if lab != -100]
    assert sorted(set(first_piece_labels)) == list(range(9))
    owned = [f.word_starts[i] for f in features for i in range(f.owned_start, f.owned_end)]
    assert sum(owned) == 9  # each word's first piece is owned by exactly one window


def test_word_predictions_read_the_first_piece(tokenizer) -> None:
    sentences = [["Schwarzenegger", "visited", "New", "York"], ["Hi"]]
    features = build_ner_word_features(tokenizer, sentences)
    rows = [*logits_for(features[:1], TOKEN_PROBS), np.zeros((len(features[1]), 5))]
    assert ner_word_predictions(features, rows, LABELS) == {0: ["B-PER", "O", "B-LOC", "I-LOC"], 1: ["O"]}


def pseudo_logits(features, num_labels=5):
    """Deterministic logits per token id (window-independent), peaked enough to form entities."""
    rows = []
    for feature in features:
        ids = np.asarray(feature.input_ids)[:, None]
        rows.append(np.sin(ids * (np.arange(num_labels) + 1) * 0.37) * 4.0)
    return rows


@pytest.mark.parametrize("strategy", AGGREGATION_STRATEGIES)
def test_windows_give_the_same_entities_as_one_window(tokenizer, strategy) -> None:
    text = " ".join(["Angela Merkel met Xiangqiongzhuofication in Washingtonville, U.S.A."] * 6)
    whole = build_ner_features(tokenizer, [text], max_seq_length=256)
    windows = build_ner_features(tokenizer, [text], max_seq_length=16, stride=5)
    assert len(whole) == 1 and len(windows) > 5
    expected = ner_postprocess(whole, pseudo_logits(whole), LABELS, aggregation_strategy=strategy)
    assert ner_postprocess(windows, pseudo_logits(windows), LABELS, aggregation_strategy=strategy) == expected
    assert expected[0]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(max_size=200), seed=st.integers(0, 2**16))
def test_entity_offsets_always_slice_the_text(tokenizer, text: str, seed: int) -> None:
    features = build_ner_features(tokenizer, [text, "Xiangqiongzhuofication " + text], max_seq_length=12, stride=3)
    rng = np.random.default_rng(seed)
    rows = [rng.normal(size=(len(f), 5)) * 3 for f in features]
    texts = {0: text, 1: "Xiangqiongzhuofication " + text}
    for strategy in AGGREGATION_STRATEGIES:
        for index, found in ner_postprocess(features, rows, LABELS, aggregation_strategy=strategy).items():
            for entity in found:
                assert entity["word"] == texts[index][entity["start"] : entity["end"]]
                assert entity["start"] < entity["end"]


def test_grouping_matches_the_hugging_face_pipeline(tokenizer) -> None:
    """Parity of entity types, spans and scores with transformers' token-classification pipeline."""
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    from bert_model.registry import minilm_path

    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        id2label=dict(enumerate(LABELS)),
        label2id={label: i for i, label in enumerate(LABELS)},
    )
    model = transformers.BertForTokenClassification(config).eval()
    with torch.no_grad():
        model.classifier.weight.mul_(60.0)
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(str(minilm_path()))
    texts = ["Angela Merkel met Xiangqiongzhuofication in Washingtonville, U.S.A. yesterday.", "EU rejects German call"]
    features = build_ner_features(tokenizer, texts)
    with torch.no_grad():
        rows = [model(torch.tensor([f.input_ids])).logits[0].numpy() for f in features]
    for strategy in AGGREGATION_STRATEGIES:
        pipe = transformers.pipeline(
            "token-classification", model=model, tokenizer=hf_tokenizer, aggregation_strategy=strategy
        )
        ours = ner_postprocess(features, rows, LABELS, aggregation_strategy=strategy)
        for index, text in enumerate(texts):
            theirs = [
                (e.get("entity_group", e.get("entity")), e["start"], e["end"], round(float(e["score"]), 4))
                for e in pipe(text)
            ]
            mine = [(e["entity_group"], e["start"], e["end"], round(e["score"], 4)) for e in ours[index]]
            assert mine == theirs, strategy
            assert len(mine) > 1
