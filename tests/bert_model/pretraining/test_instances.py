"""NSP pairs: 50% NotNext, [CLS] A [SEP] B [SEP] layout, segment ids, IsNext really next, lengths bounded."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from bert_model.pretraining.instances import (
    IS_NEXT,
    NOT_NEXT,
    PairOptions,
    Segment,
    TokenizedDocument,
    create_instances_from_document,
)

CLS, SEP = 2, 3


def _documents(count: int, seed: int) -> tuple[list[TokenizedDocument], dict[int, tuple[int, int]]]:
    """Documents whose every token id is unique; `where[id] = (document, position in the document)`."""
    rng = np.random.default_rng(seed)
    counter = itertools.count(100)
    documents: list[TokenizedDocument] = []
    where: dict[int, tuple[int, int]] = {}
    for d in range(count):
        document = []
        position = 0
        for _ in range(int(rng.integers(1, 12))):
            ids = [next(counter) for _ in range(int(rng.integers(3, 30)))]
            for token in ids:
                where[token] = (d, position)
                position += 1
            document.append(Segment(ids, [True] * len(ids)))
        documents.append(document)
    return documents, where


def _all_instances(documents: list[TokenizedDocument], options: PairOptions, seed: int) -> list:
    rng = np.random.default_rng(seed)
    return [
        instance
        for _ in range(3)
        for index in range(len(documents))
        for instance in create_instances_from_document(documents, index, options, rng)
    ]


OPTIONS = PairOptions(max_seq_length=64, short_seq_prob=0.1, cls_id=CLS, sep_id=SEP)


def test_not_next_share_is_half() -> None:
    documents, _ = _documents(2000, seed=0)
    instances = _all_instances(documents, OPTIONS, seed=1)
    assert len(instances) >= 10_000
    share = sum(i.next_sentence_label == NOT_NEXT for i in instances) / len(instances)
    assert abs(share - 0.5) <= 0.02, share


def test_layout_segment_ids_and_sep_positions() -> None:
    documents, _ = _documents(300, seed=2)
    for instance in _all_instances(documents, OPTIONS, seed=3):
        ids, b = instance.input_ids, instance.segment_b_start
        assert len(ids) <= OPTIONS.max_seq_length
        assert ids[0] == CLS and ids[b - 1] == SEP and ids[-1] == SEP
        assert [i for i, t in enumerate(ids) if t in (CLS, SEP)] == [0, b - 1, len(ids) - 1]
        assert b >= 3 and len(ids) - b >= 2  # A and B both non-empty
        assert instance.token_type_ids == [0] * b + [1] * (len(ids) - b)
        assert len(instance.word_start) == len(ids)


def test_is_next_continues_the_document_and_not_next_comes_from_another() -> None:
    documents, where = _documents(300, seed=4)
    for instance in _all_instances(documents, OPTIONS, seed=5):
        b = instance.segment_b_start
        a_tokens, b_tokens = instance.input_ids[1 : b - 1], instance.input_ids[b:-1]
        a_docs = {where[t][0] for t in a_tokens}
        b_docs = {where[t][0] for t in b_tokens}
        assert len(a_docs) == 1 and len(b_docs) == 1
        # Tokens stay in document order, contiguous apart from the truncated ends.
        a_positions = [where[t][1] for t in a_tokens]
        b_positions = [where[t][1] for t in b_tokens]
        assert a_positions == list(range(a_positions[0], a_positions[0] + len(a_positions)))
        assert b_positions == list(range(b_positions[0], b_positions[0] + len(b_positions)))
        if instance.next_sentence_label == IS_NEXT:
            assert a_docs == b_docs and a_positions[-1] < b_positions[0]
        else:
            assert a_docs != b_docs


def test_needs_two_documents() -> None:
    documents, _ = _documents(1, seed=6)
    with pytest.raises(ValueError, match="at least two documents"):
        create_instances_from_document(documents, 0, OPTIONS, np.random.default_rng(0))


def test_long_sentences_are_truncated_to_fit() -> None:
    long = [Segment(list(range(100, 400)), [True] * 300), Segment(list(range(400, 700)), [True] * 300)]
    other = [Segment(list(range(800, 900)), [True] * 100)]
    rng = np.random.default_rng(0)
    for _ in range(20):
        for instance in create_instances_from_document([long, other], 0, OPTIONS, rng):
            assert len(instance.input_ids) == OPTIONS.max_seq_length


@pytest.mark.parametrize("kwargs", [{"max_seq_length": 4}, {"short_seq_prob": 1.5}])
def test_bad_pair_options_are_refused(kwargs: dict) -> None:
    values = {"max_seq_length": 64, "short_seq_prob": 0.1, "cls_id": CLS, "sep_id": SEP} | kwargs
    with pytest.raises(ValueError):
        PairOptions(**values)
