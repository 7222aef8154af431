"""Windows counted before they are built: `window_count` agrees with the windows cut, QA and NER inputs count
exactly the features they later build, and QA windows cut from one tokenization equal the tokenizer's own
`only_second` overflow windows on real SQuAD pairs."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from bert_model.tasks.ner import build_ner_features, encode_ner_texts, ner_window_features, window_bounds
from bert_model.tasks.qa import build_qa_features, encode_qa_inputs, qa_window_features, truncate_question
from bert_model.tasks.windows import token_windows, window_count
from bert_model.tokenization import BertTokenizer
from tests.bert_model.real_text import squad_pairs


def test_window_count_is_the_number_of_windows_cut() -> None:
    for count, room in itertools.product(range(0, 70), range(1, 14)):
        for stride in range(room):
            windows = token_windows(count, room, stride)
            assert window_count(count, room, stride) == len(windows)
            assert windows[0][0] == 0 and windows[-1][1] == count
            assert all(stop - first <= room for first, stop in windows)
            assert all(a[1] - b[0] == stride for a, b in itertools.pairwise(windows))
            assert [span for span, _ in window_bounds(count, room, stride)] == windows
    with pytest.raises(ValueError, match="stride < room"):
        window_count(10, 4, 4)


def test_qa_and_ner_inputs_count_the_features_they_build(tokenizer: BertTokenizer) -> None:
    contexts = ["A short context.", "The old mill by the river. " * 40, "x", "Words and more words here. " * 9]
    questions = ["What is it?", "Where is the mill?", "Why?", "How many words " * 30]
    for length, stride, query in ((64, 8, 16), (48, 0, 8), (128, 60, 32)):
        inputs = encode_qa_inputs(
            tokenizer, questions, contexts, max_seq_length=length, doc_stride=stride, max_query_length=query
        )
        features = qa_window_features(tokenizer, inputs)
        built = [sum(f.request_index == i for f in features) for i in range(len(contexts))]
        assert inputs.window_counts() == built
        assert all(len(f) <= length for f in features)
        ner_inputs = encode_ner_texts(tokenizer, contexts, max_seq_length=length, stride=stride // 2)
        ner_features = ner_window_features(tokenizer, ner_inputs)
        assert ner_inputs.window_counts() == [sum(f.request_index == i for f in ner_features) for i in range(4)]
        assert len(ner_features) == len(
            build_ner_features(tokenizer, contexts, max_seq_length=length, stride=stride // 2)
        )


@pytest.mark.parametrize(("length", "stride", "query"), [(384, 128, 64), (192, 64, 32), (64, 20, 8)])
def test_qa_windows_equal_the_tokenizers_overflow_windows_on_squad(
    tokenizer: BertTokenizer, data_dir: Path, length: int, stride: int, query: int
) -> None:
    pairs = squad_pairs(data_dir, 40)
    questions = [question * 3 for question, _ in pairs]  # long enough to be cut at `query` tokens
    contexts = [context for _, context in pairs]
    features = build_qa_features(
        tokenizer, questions, contexts, max_seq_length=length, doc_stride=stride, max_query_length=query
    )
    expected = []
    for index, (question, context) in enumerate(zip(questions, contexts, strict=True)):
        cut = truncate_question(tokenizer, question, query)
        encoding = tokenizer.encode(cut, context, max_length=length, truncation="only_second", stride=stride)
        for window in [encoding, *encoding.overflowing]:
            in_context = [s == 1 for s in window.sequence_ids]
            offsets = [tuple(o) if c else (0, 0) for o, c in zip(window.offsets, in_context, strict=True)]
            expected.append((index, window.ids, window.type_ids, offsets, in_context.index(True), sum(in_context)))
    mine = [
        (f.request_index, f.input_ids, f.token_type_ids, f.offsets, f.context_start, f.context_end - f.context_start)
        for f in features
    ]
    assert mine == expected
    assert len(features) > len(pairs)  # long contexts gave several windows
