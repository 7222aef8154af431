"""Spans keep grapheme clusters whole: an answer or an entity never ends between a base character and its marks,
even where the tokenizer drops the marks (BERT uncased strips accents) or covers no part of them (emoji modifiers)."""

from __future__ import annotations

import numpy as np

from bert_model.tasks.ner import encode_ner_texts, ner_postprocess, ner_window_features
from bert_model.tasks.offsets import whole_clusters
from bert_model.tasks.qa import build_qa_features, qa_postprocess
from bert_model.tokenization import BertTokenizer

DECOMPOSED = "Ada flew to Bogota\u0301 on Monday."  # "Bogotá" as "a" + COMBINING ACUTE ACCENT (NFD)


def test_a_span_is_widened_over_marks_modifiers_and_joined_characters() -> None:
    text = "Bogota\u0301 \U0001f44d\U0001f3fd \U0001f468\u200d\U0001f469 e\u0301\u0301x"
    spans = whole_clusters(text, [(0, 6), (8, 9), (11, 12), (15, 16), (0, 0)])
    assert [text[s:e] for s, e in spans] == [
        "Bogota\u0301",
        "\U0001f44d\U0001f3fd",
        "\U0001f468\u200d\U0001f469",
        "e\u0301\u0301",
        "",
    ]
    assert whole_clusters("plain ascii", [(0, 5), (6, 11)]) == [(0, 5), (6, 11)]
    assert whole_clusters("a\u0301", [(1, 2)]) == [(0, 2)]  # a span starting on a mark starts at its base


def test_a_qa_answer_keeps_the_accent_of_its_last_character(tokenizer: BertTokenizer) -> None:
    features = build_qa_features(tokenizer, ["Where?"], [DECOMPOSED])
    tokens = [DECOMPOSED[s:e] for s, e in features[0].offsets if e > s]
    assert "Bogota\u0301" in tokens, tokens
    feature = features[0]
    position = next(i for i, (s, e) in enumerate(feature.offsets) if DECOMPOSED[s:e] == "Bogota\u0301")
    start, end = np.full(len(feature), -10.0), np.full(len(feature), -10.0)
    start[position], end[position] = 10.0, 10.0
    answer = qa_postprocess(features, [start], [end])[0][0]
    assert answer["answer"] == "Bogota\u0301" == DECOMPOSED[answer["start"] : answer["end"]]


def test_an_entity_keeps_the_accent_of_its_last_character(tokenizer: BertTokenizer) -> None:
    labels = ["O", "B-LOC", "I-LOC"]
    features = ner_window_features(tokenizer, encode_ner_texts(tokenizer, [DECOMPOSED], max_seq_length=64))
    feature = features[0]
    logits = np.zeros((len(feature), len(labels)))
    logits[:, 0] = 5.0
    for position, (s, e) in enumerate(feature.offsets):
        if e > s and DECOMPOSED[s:e].lower().startswith("bogot"):
            logits[position] = [0.0, 5.0, 0.0]
    entity = ner_postprocess(features, [logits], labels)[0][0]
    assert entity["word"] == "Bogota\u0301" == DECOMPOSED[entity["start"] : entity["end"]]
