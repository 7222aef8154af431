"""The task features of every family: sequences framed by the tokenizer's template, and exact character offsets.

For each family's tiny tokenizer (tests/bert_model/test_tokenization_family.py): classification features are what
transformers' tokenizer gives for a text and a pair; QA windows are `[CLS] q [SEP] c [SEP]` (RoBERTa and XLM-R:
`<s> q </s></s> c </s>`, four specials, so one token less of context per window) and equal transformers'
`only_second` overflow windows; NER windows are the single-text template. Offsets: every answer and entity slices
its text exactly (`context[start:end] == answer`, `text[start:end] == word`), never starts or ends on whitespace,
and, over texts with emoji, CJK, combining marks and CRLF, the entities of all words cover every character that is
not whitespace exactly once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import transformers

from bert_model.tasks.classification import build_classification_features
from bert_model.tasks.fill_mask import build_fill_mask_features
from bert_model.tasks.ner import build_ner_features, encode_ner_texts, ner_postprocess
from bert_model.tasks.qa import QAFeature, build_qa_features, encode_qa_inputs, qa_postprocess
from bert_model.tokenization import BertTokenizer
from tests.bert_model.test_tokenization_family import FAMILIES, save_family_tokenizer

TEXTS = [
    "Ada Lovelace met Charles Babbage in London.",
    "Emoji 😀 in 東京 with café, José and Zoë.",
    "A combining e\u0301 mark, and a CRLF line\r\nbreak here.",
    "  spaces before, 👍🏽 a skin tone, and after  ",
]
QUESTION = "Who met Babbage in London?"
CONTEXT = " ".join(TEXTS + [f"Sentence {i} talks about the river near the old bridge." for i in range(12)])
LABELS = ["O", "B-PER", "I-PER"]


@pytest.fixture(scope="module", params=FAMILIES)
def family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, BertTokenizer, Any]:
    folder = save_family_tokenizer(request.param, tmp_path_factory.mktemp(request.param))
    return request.param, BertTokenizer.from_pretrained(folder), transformers.AutoTokenizer.from_pretrained(folder)


def _types(ours: BertTokenizer, theirs: dict[str, Any]) -> list[int]:
    return list(theirs["token_type_ids"]) if ours.uses_token_types else [0] * len(theirs["input_ids"])


def test_classification_features_are_the_family_s_encoding(family: tuple[str, BertTokenizer, Any]) -> None:
    name, ours, theirs = family
    singles = build_classification_features(ours, TEXTS)
    pairs = build_classification_features(ours, TEXTS, TEXTS[::-1])
    for index, text in enumerate(TEXTS):
        reference = theirs(text, return_token_type_ids=True)
        assert singles[index].input_ids == reference["input_ids"], (name, text)
        assert singles[index].token_type_ids == _types(ours, reference)
        reference = theirs(text, TEXTS[::-1][index], return_token_type_ids=True)
        assert pairs[index].input_ids == reference["input_ids"], (name, text)
        assert pairs[index].token_type_ids == _types(ours, reference)
    if name in ("roberta", "xlm-roberta"):
        ids = pairs[0].input_ids
        first_sep = ids.index(ours.sep_id)
        assert ids[0] == ours.cls_id and ids[first_sep + 1] == ours.sep_id and ids[-1] == ours.sep_id


def test_qa_windows_are_the_family_s_overflow_windows(family: tuple[str, BertTokenizer, Any]) -> None:
    name, ours, theirs = family
    length, stride = 80, 16
    features = build_qa_features(
        ours, [QUESTION], [CONTEXT], max_seq_length=length, doc_stride=stride, max_query_length=32
    )
    reference = theirs(
        QUESTION,
        CONTEXT,
        max_length=length,
        truncation="only_second",
        stride=stride,
        return_overflowing_tokens=True,
        return_token_type_ids=True,
    )
    assert len(features) > 2, name
    assert [f.input_ids for f in features] == reference["input_ids"], name
    specials = 4 if name in ("roberta", "xlm-roberta") else 3
    question = len(ours.backend.encode(QUESTION, add_special_tokens=False).ids)
    for feature, types in zip(features, reference["token_type_ids"], strict=True):
        assert feature.token_type_ids == (types if ours.uses_token_types else [0] * len(types))
        assert feature.context_start == question + (3 if specials == 4 else 2)
        assert feature.context_end - feature.context_start <= length - question - specials
    assert features[0].context_end - features[0].context_start == length - question - specials
    inputs = encode_qa_inputs(
        ours, [QUESTION], [CONTEXT], max_seq_length=length, doc_stride=stride, max_query_length=32
    )
    assert inputs.window_counts() == [len(features)]


def _answers(features: list[QAFeature], start: int, stop: int) -> dict[int, Any]:
    """Answers when the logits point at context tokens `start` and `stop - 1` of the first window."""
    first = features[0]
    starts = np.full(len(first), -9.0, dtype=np.float32)
    ends = np.full(len(first), -9.0, dtype=np.float32)
    starts[first.context_start + start], ends[first.context_start + stop - 1] = 9.0, 9.0
    others = [np.full(len(f), -9.0, dtype=np.float32) for f in features[1:]]
    return qa_postprocess(features, [starts, *others], [ends, *others], top_k=1)


def test_qa_answers_slice_the_context_without_spaces(family: tuple[str, BertTokenizer, Any]) -> None:
    name, ours, _ = family
    context = " ".join(TEXTS)
    features = build_qa_features(ours, [QUESTION], [context], max_seq_length=256, doc_stride=32)
    assert len(features) == 1
    count = features[0].context_end - features[0].context_start
    checked = 0
    for start in range(count):
        for stop in range(start + 1, min(start + 6, count) + 1):
            for answer in _answers(features, start, stop).get(0, []):
                assert context[answer["start"] : answer["end"]] == answer["answer"], (name, answer)
                assert answer["answer"] and answer["answer"] == answer["answer"].strip(), (name, answer)
                checked += 1
    assert checked > count


def _ner_entities(ours: BertTokenizer, texts: list[str], strategy: str, max_seq_length: int = 128) -> dict[int, Any]:
    """Entities when every word is a B-PER (each its own entity)."""
    features = build_ner_features(ours, texts, max_seq_length=max_seq_length, stride=8)
    logits = []
    for feature in features:
        rows = np.zeros((len(feature), len(LABELS)), dtype=np.float32)
        rows[:, 1] = 5.0
        logits.append(rows)
    return ner_postprocess(features, logits, LABELS, aggregation_strategy=strategy)  # type: ignore[arg-type]


@pytest.mark.parametrize("strategy", ["first", "simple", "none"])
def test_ner_entities_slice_the_text_and_cover_it(family: tuple[str, BertTokenizer, Any], strategy: str) -> None:
    name, ours, _ = family
    by_text = _ner_entities(ours, TEXTS, strategy)
    for index, text in enumerate(TEXTS):
        entities = by_text[index]
        for entity in entities:
            word = entity["word"]
            assert text[entity["start"] : entity["end"]] == word and word == word.strip() and word, (name, entity)
        if strategy != "none":  # tokens of one character may share it (bytes of an emoji); words never do
            covered = "".join(e["word"] for e in entities)
            assert covered == "".join(text.split()), (name, strategy, text, [e["word"] for e in entities])


def test_ner_windows_use_the_single_template_and_agree_with_one_window(family: tuple[str, BertTokenizer, Any]) -> None:
    name, ours, theirs = family
    text = " ".join(TEXTS * 3)
    features = build_ner_features(ours, [text], max_seq_length=24, stride=6)
    assert len(features) > 3
    assert len(features) == encode_ner_texts(ours, [text], max_seq_length=24, stride=6).window_counts()[0]
    for feature in features:
        assert len(feature) <= 24
        assert feature.input_ids[0] == ours.cls_id and feature.input_ids[-1] == ours.sep_id
    whole = build_ner_features(ours, [text], max_seq_length=512, stride=8)
    assert whole[0].input_ids == theirs(text)["input_ids"], name
    assert _ner_entities(ours, [text], "first", 24) == _ner_entities(ours, [text], "first", 512)


def test_fill_mask_features_use_the_family_s_mask(family: tuple[str, BertTokenizer, Any]) -> None:
    _, ours, theirs = family
    text = f"Paris is the {ours.mask_token} of France."
    (feature,) = build_fill_mask_features(ours, [text])
    assert feature.input_ids == theirs(text)["input_ids"] and feature.input_ids.count(ours.mask_id) == 1


def test_bert_defaults_are_bert_s(tmp_path: Path) -> None:
    ours = BertTokenizer.from_pretrained(save_family_tokenizer("bert", tmp_path / "bert"))
    assert (ours.template.single_specials, ours.template.pair_specials) == (2, 3) and ours.uses_token_types
    (feature,) = build_qa_features(
        ours, ["who?"], ["Ada met Babbage."], max_seq_length=64, doc_stride=8, max_query_length=16
    )
    head = feature.context_start
    assert feature.token_type_ids == [0] * head + [1] * (len(feature) - head)
