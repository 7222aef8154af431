import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bert_model.tasks import answer_token_positions, build_qa_features, collate, qa_postprocess, qa_predictions
from bert_model.tasks.metrics import normalize_answer
from bert_model.tasks.readers import read_squad

FILLER = " ".join(f"Sentence number {i} talks about nothing in particular." for i in range(60))


def one_hot_logits(features, spans):
    """Logits that point at the token span of each window that contains it (and at [CLS] elsewhere)."""
    starts, ends = [], []
    for feature in features:
        s, e = answer_token_positions(feature, *spans[feature.request_index])
        start, end = np.zeros(len(feature)), np.zeros(len(feature))
        start[s], end[e] = 10.0, 10.0
        starts.append(start)
        ends.append(end)
    return starts, ends


def test_windows_put_the_question_first_and_overlap_by_doc_stride(tokenizer) -> None:
    features = build_qa_features(tokenizer, ["Where?"], [FILLER], max_seq_length=64, doc_stride=16, max_query_length=16)
    assert len(features) > 3
    for number, feature in enumerate(features):
        assert feature.window_index == number and feature.request_index == 0
        assert len(feature) <= 64
        assert tokenizer.convert_ids_to_tokens(feature.input_ids[:3]) == ["[CLS]", "where", "?"]
        assert feature.token_type_ids[feature.context_start :] == [1] * (len(feature) - feature.context_start)
    for before, after in itertools.pairwise(features):
        shared = set(before.offsets[before.context_start : before.context_end]) & set(
            after.offsets[after.context_start : after.context_end]
        )
        assert len(shared) == 16
    assert features[-1].offsets[features[-1].context_end - 1][1] == len(FILLER.rstrip())


def test_answer_in_the_last_of_more_than_three_windows_is_found(tokenizer) -> None:
    context = FILLER + " The treasure is buried under the old oak in Zanzibar."
    start = context.index("under the old oak")
    span = (start, start + len("under the old oak"))
    features = build_qa_features(
        tokenizer, ["Where is the treasure?"], [context], max_seq_length=96, doc_stride=32, max_query_length=16
    )
    assert len(features) > 3
    found_in = [f.window_index for f in features if answer_token_positions(f, *span) != (0, 0)]
    assert found_in == [len(features) - 1]
    starts, ends = one_hot_logits(features, {0: span})
    (answer, *_), *_ = qa_postprocess(features, starts, ends).values()
    assert answer["answer"] == "under the old oak" == context[answer["start"] : answer["end"]]
    assert (answer["start"], answer["end"]) == span
    assert answer["score"] > 0.99


def test_long_questions_are_cut_to_max_query_length(tokenizer) -> None:
    question = "why " * 100 + "?"
    features = build_qa_features(
        tokenizer, [question], ["Because."], max_seq_length=64, doc_stride=16, max_query_length=10
    )
    (feature,) = features
    assert feature.context_start == 12  # [CLS] + 10 question tokens + [SEP]


def test_bad_settings_and_inputs_are_refused(tokenizer) -> None:
    with pytest.raises(ValueError, match="doc_stride"):
        build_qa_features(tokenizer, ["q"], ["c"], max_seq_length=64, doc_stride=40, max_query_length=24)
    with pytest.raises(ValueError, match="question 1 is empty"):
        build_qa_features(tokenizer, ["q", "  "], ["c", "d"])
    with pytest.raises(ValueError, match="2 questions but 1 contexts"):
        build_qa_features(tokenizer, ["q", "r"], ["c"])


def test_decoding_respects_top_k_max_answer_length_and_end_after_start(tokenizer) -> None:
    context = "alpha beta gamma delta epsilon"
    (feature,) = build_qa_features(tokenizer, ["q"], [context])
    starts, ends = np.full(len(feature), -5.0), np.full(len(feature), -5.0)
    first = feature.context_start
    starts[first + 3], ends[first + 1] = 8.0, 8.0  # best start after best end: not a valid span
    starts[first], ends[first + 4] = 4.0, 4.0  # a 5-token span
    (prediction,) = qa_predictions([feature], [starts], [ends], top_k=3, max_answer_length=2).values()
    answers = prediction.answers
    assert len(answers) == 3
    assert all(a["end"] - a["start"] <= len("epsilon") + len("delta ") for a in answers)
    assert [a["score"] for a in answers] == sorted((a["score"] for a in answers), reverse=True)
    assert all(context[a["start"] : a["end"]] == a["answer"] for a in answers)
    starts, ends = np.full(len(feature), -5.0), np.full(len(feature), -5.0)
    starts[first], ends[first + 4] = 4.0, 4.0
    (short,) = qa_postprocess([feature], [starts], [ends], max_answer_length=4).values()
    assert short[0]["answer"] != context
    (full,) = qa_postprocess([feature], [starts], [ends], max_answer_length=5).values()
    assert full[0]["answer"] == context


def test_null_answer_needs_a_threshold(tokenizer) -> None:
    (feature,) = build_qa_features(tokenizer, ["q"], ["some context here"])
    starts, ends = np.zeros(len(feature)), np.zeros(len(feature))
    starts[0], ends[0] = 6.0, 6.0
    starts[feature.context_start], ends[feature.context_start] = 3.0, 3.0
    (prediction,) = qa_predictions([feature], [starts], [ends], top_k=2).values()
    assert prediction.answers[0]["answer"] == "some"
    assert prediction.null_score_diff == pytest.approx(6.0)
    (null_first,) = qa_predictions([feature], [starts], [ends], top_k=2, null_threshold=0.0).values()
    assert null_first.answers[0] == {"answer": "", "score": pytest.approx(prediction.null_score), "start": 0, "end": 0}
    assert null_first.answers[1]["answer"] == "some"
    (kept,) = qa_predictions([feature], [starts], [ends], null_threshold=7.0).values()
    assert kept.answers[0]["answer"] == "some"


def test_features_of_several_requests_can_be_shuffled_and_padded(tokenizer) -> None:
    contexts = [FILLER + " Paris is the answer.", "Berlin is another one."]
    spans = {0: (contexts[0].index("Paris"), contexts[0].index("Paris") + 5), 1: (0, 6)}
    features = build_qa_features(
        tokenizer, ["q1", "q2"], contexts, max_seq_length=96, doc_stride=32, max_query_length=16
    )
    starts, ends = one_hot_logits(features, spans)
    order = np.random.default_rng(0).permutation(len(features))
    shuffled = [features[i] for i in order]
    width = collate(shuffled)["input_ids"].shape[1]
    padded_starts = np.stack([np.pad(starts[i], (0, width - len(starts[i])), constant_values=-1e4) for i in order])
    padded_ends = np.stack([np.pad(ends[i], (0, width - len(ends[i])), constant_values=-1e4) for i in order])
    results = qa_postprocess(shuffled, padded_starts, padded_ends)
    assert results[0][0]["answer"] == "Paris" and results[1][0]["answer"] == "Berlin"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(context=st.text(min_size=1, max_size=300).filter(str.strip), seed=st.integers(0, 2**16))
def test_answers_always_slice_any_context(tokenizer, context: str, seed: int) -> None:
    features = build_qa_features(tokenizer, ["what?"], [context], max_seq_length=48, doc_stride=8, max_query_length=8)
    rng = np.random.default_rng(seed)
    starts = [rng.normal(size=len(f)) for f in features]
    ends = [rng.normal(size=len(f)) for f in features]
    for answer in qa_postprocess(features, starts, ends, top_k=5).get(0, []):
        assert answer["answer"] == context[answer["start"] : answer["end"]]
        assert answer["answer"]


def test_offsets_slice_the_squad_contexts_to_the_predicted_answers(tokenizer, data_dir) -> None:
    """Property over real SQuAD questions: every decoded answer slices its context; labels round-trip."""
    examples = read_squad(data_dir / "squad_v1.1" / "dev-v1.1.half-a.json")[::12]
    examples += read_squad(data_dir / "squad_v2.0" / "dev-v2.0.subset-3articles.json")[::8]
    questions = [e.question for e in examples]
    contexts = [e.context for e in examples]
    features = build_qa_features(tokenizer, questions, contexts, max_seq_length=128, doc_stride=32, max_query_length=48)
    assert len(features) > len(examples)  # several windows for long contexts
    rng = np.random.default_rng(0)
    random_results = qa_postprocess(
        features, [rng.normal(size=len(f)) for f in features], [rng.normal(size=len(f)) for f in features], top_k=3
    )
    for index, answers in random_results.items():
        assert all(a["answer"] == contexts[index][a["start"] : a["end"]] for a in answers)
    spans = {
        i: (e.answers[0].start, e.answers[0].start + len(e.answers[0].text))
        for i, e in enumerate(examples)
        if e.answers
    }
    answered = {i for i, e in enumerate(examples) if e.answers}
    starts, ends = one_hot_logits(features, {i: spans.get(i, (0, 0)) for i in range(len(examples))})
    decoded = qa_postprocess(features, starts, ends, max_answer_length=64)
    exact = 0
    for index in answered:
        answer = decoded[index][0]
        reference = examples[index].answers[0].text
        assert answer["answer"] == contexts[index][answer["start"] : answer["end"]]
        assert normalize_answer(reference) in normalize_answer(answer["answer"])
        exact += answer["answer"] == reference
    assert exact / len(answered) > 0.97  # only answers cut inside a word piece widen to whole tokens
