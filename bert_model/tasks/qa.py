"""Extractive question answering (SQuAD): question/context windows and n-best span decoding.

References: Devlin et al. (2019), section 4.2-4.3 (a start and an end vector score every token; the best span
maximises start + end logits with end >= start; SQuAD 2.0 predicts "no answer" when the [CLS] span beats the
best span by a threshold tuned on dev data); Rajpurkar et al. (2016, 2018) for the data and answers.

Windows: the question comes first (at most `max_query_length` tokens), the context second, framed by the
tokenizer's pair template (`[CLS] q [SEP] c [SEP]`, RoBERTa's `<s> q </s></s> c </s>`); contexts longer than one
window are split into windows sharing `doc_stride` tokens (Hugging Face's `run_qa.py` convention, the windows of
the tokenizer's `only_second` truncation with that stride). Each question and context is
tokenized once, without special tokens (`encode_qa_inputs`); the windows are cut from those tokens
(`qa_window_features`), so their number is known (`QAInputs.window_counts`) before any is built.

Every window is scored with log-softmax over its context tokens and [CLS]; spans from all windows of a question
compete on that probability (as Hugging Face's question-answering pipeline does), duplicates of one character
span keep their best score. Answers carry character offsets into the original context, never starting or ending on
whitespace (`bert_model.tasks.features.token_spans`, `trim_span`), and `answer == context[start:end]` always holds.
Torch-free.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TypedDict

import numpy as np
from tokenizers import Encoding

import bert_model.tasks.defaults as defaults
from bert_model.tasks.features import Feature, OutputRows, check_aligned, feature_row, token_spans, trim_span
from bert_model.tasks.numeric import log_softmax
from bert_model.tasks.windows import QA_SPECIAL_TOKENS, token_windows, window_count
from bert_model.tokenization import BertTokenizer

NO_OFFSET = (0, 0)


class Answer(TypedDict):
    """One predicted answer: `answer == context[start:end]` (character offsets); "" for no answer."""

    answer: str
    score: float
    start: int
    end: int


@dataclass(eq=False)
class QAFeature(Feature):
    """One window: [CLS] question [SEP] part of the context [SEP] (the tokenizer's pair template)."""

    context: str
    """The whole original context (shared, not copied) that `offsets` index into."""
    offsets: list[tuple[int, int]]
    """Per token: its character span in `context` for context tokens, (0, 0) for question and special tokens."""
    context_start: int
    """Token index of this window's first context token."""
    context_end: int
    """One past the token index of this window's last context token (== context_start if there is none)."""
    window_index: int
    """0 for the first window of a context, 1 for the next, ..."""


@dataclass
class QAPrediction:
    """Decoded answers of one question, and the no-answer margin used to tune SQuAD 2.0's threshold."""

    answers: list[Answer]
    """Best first; a no-answer `{"answer": "", "start": 0, "end": 0}` leads when the threshold says so."""
    null_score_diff: float
    """log P(no answer) - log P(best span): predict no answer when it exceeds the threshold (+inf: no span)."""
    null_score: float = 0.0
    """P(no answer): the smallest [CLS] span probability over the question's windows."""
    candidates: list[Answer] = field(default_factory=list)
    """The span candidates before the no-answer decision (best first, at most `top_k`)."""


@dataclass(frozen=True)
class QASettings:
    """Window and decoding options (`bert_model.tasks.defaults`)."""

    max_seq_length: int = defaults.QA_MAX_SEQ_LENGTH
    """Tokens per window, specials included."""
    doc_stride: int = defaults.QA_DOC_STRIDE
    """Context tokens shared by consecutive windows."""
    max_query_length: int = defaults.QA_MAX_QUERY_LENGTH
    """Question tokens kept (longer questions are cut)."""
    max_answer_length: int = defaults.QA_MAX_ANSWER_LENGTH
    """Longest answer span, in tokens."""
    special_tokens: int = QA_SPECIAL_TOKENS
    """Special tokens of a window (the tokenizer's pair template: 3 for BERT, 4 for RoBERTa)."""

    def __post_init__(self) -> None:
        for name in ("max_seq_length", "max_query_length", "max_answer_length"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not isinstance(self.doc_stride, int) or self.doc_stride < 0:
            raise ValueError(f"doc_stride must be a non-negative integer, got {self.doc_stride!r}")
        room = self.max_seq_length - self.max_query_length - self.special_tokens
        if self.doc_stride >= room:
            raise ValueError(
                f"doc_stride ({self.doc_stride}) must be smaller than the context room of a window: max_seq_length "
                f"({self.max_seq_length}) - max_query_length ({self.max_query_length}) - {self.special_tokens} special "
                f"tokens = {room}"
            )


@dataclass(eq=False)
class QAInputs:
    """Questions and contexts tokenized once, without special tokens and before windowing: what
    `qa_window_features` cuts windows from, and what their number is counted from."""

    questions: list[Encoding]
    """Each question's tokens, cut to `max_query_length`."""
    question_lengths: list[int]
    """Each question's token count before the cut."""
    contexts: list[Encoding]
    """Each whole context's tokens."""
    context_texts: list[str]
    settings: QASettings

    def context_room(self, index: int) -> int:
        """Context tokens per window of pair `index`: what its question and the special tokens leave."""
        return self.settings.max_seq_length - len(self.questions[index].ids) - self.settings.special_tokens

    def window_counts(self) -> list[int]:
        """Windows per (question, context), computed from the token counts without building them."""
        stride = self.settings.doc_stride
        return [window_count(len(c.ids), self.context_room(i), stride) for i, c in enumerate(self.contexts)]


def build_qa_features(
    tokenizer: BertTokenizer,
    questions: Sequence[str],
    contexts: Sequence[str],
    *,
    max_seq_length: int = defaults.QA_MAX_SEQ_LENGTH,
    doc_stride: int = defaults.QA_DOC_STRIDE,
    max_query_length: int = defaults.QA_MAX_QUERY_LENGTH,
) -> list[QAFeature]:
    """One or more windows per (question, context), in input order; `request_index` = the pair's index."""
    inputs = encode_qa_inputs(
        tokenizer,
        questions,
        contexts,
        max_seq_length=max_seq_length,
        doc_stride=doc_stride,
        max_query_length=max_query_length,
    )
    return qa_window_features(tokenizer, inputs)


def encode_qa_inputs(
    tokenizer: BertTokenizer,
    questions: Sequence[str],
    contexts: Sequence[str],
    *,
    max_seq_length: int = defaults.QA_MAX_SEQ_LENGTH,
    doc_stride: int = defaults.QA_DOC_STRIDE,
    max_query_length: int = defaults.QA_MAX_QUERY_LENGTH,
) -> QAInputs:
    """Tokenize every question (cut to `max_query_length` tokens) and context once, for `qa_window_features`."""
    settings = QASettings(max_seq_length, doc_stride, max_query_length, special_tokens=tokenizer.template.pair_specials)
    _check_inputs(questions, contexts)
    backend = tokenizer.backend
    encoded = backend.encode_batch(list(questions), add_special_tokens=False)
    lengths = [len(encoding.ids) for encoding in encoded]
    long = [index for index, length in enumerate(lengths) if length > max_query_length]
    if long:
        # the cut question is tokenized again, as a text of its own (its last word may split differently)
        cut = [questions[i][: encoded[i].offsets[max_query_length - 1][1]] for i in long]
        for index, encoding in zip(long, backend.encode_batch(cut, add_special_tokens=False), strict=True):
            encoding.truncate(max_query_length)  # a no-op unless the cut text has more tokens than its prefix
            encoded[index] = encoding
    return QAInputs(
        questions=list(encoded),
        question_lengths=lengths,
        contexts=list(backend.encode_batch(list(contexts), add_special_tokens=False)),
        context_texts=list(contexts),
        settings=settings,
    )


def qa_window_features(tokenizer: BertTokenizer, inputs: QAInputs) -> list[QAFeature]:
    """question + window of the context in the tokenizer's pair template, for every window of every pair, in input
    order."""
    template = tokenizer.template
    features: list[QAFeature] = []
    for index, (question, context) in enumerate(zip(inputs.questions, inputs.contexts, strict=True)):
        text = inputs.context_texts[index]
        ids, offsets = context.ids, token_spans(text, context.offsets)
        context_start = template.second_start(len(question.ids))
        windows = token_windows(len(ids), inputs.context_room(index), inputs.settings.doc_stride)
        for number, (first, stop) in enumerate(windows):
            input_ids, token_type_ids = template.pair(question.ids, ids[first:stop])
            after = len(input_ids) - context_start - (stop - first)
            features.append(
                QAFeature(
                    request_index=index,
                    input_ids=input_ids,
                    token_type_ids=token_type_ids,
                    context=text,
                    offsets=[NO_OFFSET] * context_start + offsets[first:stop] + [NO_OFFSET] * after,
                    context_start=context_start,
                    context_end=context_start + stop - first,
                    window_index=number,
                )
            )
    return features


def truncate_question(tokenizer: BertTokenizer, question: str, max_query_length: int) -> str:
    """The question cut after its `max_query_length`-th token (unchanged when it is short enough)."""
    encoding = tokenizer.backend.encode(question, add_special_tokens=False)
    if len(encoding.ids) <= max_query_length:
        return question
    return question[: encoding.offsets[max_query_length - 1][1]]


def _check_inputs(questions: Sequence[str], contexts: Sequence[str]) -> None:
    if isinstance(questions, str) or isinstance(contexts, str):
        raise TypeError("questions and contexts must be lists of strings")
    if len(questions) != len(contexts):
        raise ValueError(f"got {len(questions)} questions but {len(contexts)} contexts")
    for name, texts in (("question", questions), ("context", contexts)):
        for index, text in enumerate(texts):
            if not isinstance(text, str):
                raise TypeError(f"{name} {index} must be a string, got {type(text).__name__}")
            if not text.strip():
                raise ValueError(f"{name} {index} is empty")


# ---- training labels -----------------------------------------------------------------------------------
def answer_token_positions(feature: QAFeature, answer_start: int, answer_end: int) -> tuple[int, int]:
    """Token indices (start, end) of the character span [answer_start, answer_end) in this window.

    (0, 0), the [CLS] position, when the window does not contain the whole answer (or for no answer).
    """
    if answer_end <= answer_start or feature.context_end == feature.context_start:
        return 0, 0
    first, last = feature.context_start, feature.context_end - 1
    if feature.offsets[first][0] > answer_start or feature.offsets[last][1] < answer_end:
        return 0, 0
    start = first
    while start <= last and feature.offsets[start][1] <= answer_start:
        start += 1
    end = last
    while end >= first and feature.offsets[end][0] >= answer_end:
        end -= 1
    if start > end:
        return 0, 0
    return start, end


# ---- decoding ------------------------------------------------------------------------------------------
def qa_predictions(
    features: Sequence[QAFeature],
    start_logits: OutputRows,
    end_logits: OutputRows,
    *,
    top_k: int = defaults.QA_TOP_K,
    max_answer_length: int = defaults.QA_MAX_ANSWER_LENGTH,
    null_threshold: float | None = None,
) -> dict[int, QAPrediction]:
    """Per request index: the best answers over all its windows, and its no-answer margin.

    `start_logits` / `end_logits` hold one row per feature (padded or not). With `null_threshold` set
    (SQuAD 2.0), the no-answer leads when `null_score_diff > null_threshold`; with None it is never predicted.
    """
    if top_k < 1 or max_answer_length < 1:
        raise ValueError(f"top_k ({top_k}) and max_answer_length ({max_answer_length}) must be positive")
    check_aligned(features, start_logits, "start_logits")
    check_aligned(features, end_logits, "end_logits")
    grouped: dict[int, list[tuple[QAFeature, np.ndarray, np.ndarray]]] = {}
    for feature, starts, ends in zip(features, start_logits, end_logits, strict=True):
        rows = (feature_row(feature, starts, "start_logits"), feature_row(feature, ends, "end_logits"))
        grouped.setdefault(feature.request_index, []).append((feature, *rows))
    return {
        index: _decode_request(windows, top_k, max_answer_length, null_threshold) for index, windows in grouped.items()
    }


def qa_postprocess(
    features: Sequence[QAFeature],
    start_logits: OutputRows,
    end_logits: OutputRows,
    *,
    top_k: int = defaults.QA_TOP_K,
    max_answer_length: int = defaults.QA_MAX_ANSWER_LENGTH,
    null_threshold: float | None = None,
) -> dict[int, list[Answer]]:
    """Per request index: up to `top_k` answers `[{answer, score, start, end}]`, best first."""
    predictions = qa_predictions(
        features,
        start_logits,
        end_logits,
        top_k=top_k,
        max_answer_length=max_answer_length,
        null_threshold=null_threshold,
    )
    return {index: prediction.answers for index, prediction in predictions.items()}


def _decode_request(
    windows: list[tuple[QAFeature, np.ndarray, np.ndarray]],
    top_k: int,
    max_answer_length: int,
    null_threshold: float | None,
) -> QAPrediction:
    best: dict[tuple[int, int], float] = {}
    null_logprob = np.inf
    context = windows[0][0].context
    for feature, starts, ends in windows:
        log_start, log_end = _window_log_probs(feature, starts, ends)
        null_logprob = min(null_logprob, float(log_start[0] + log_end[0]))
        for span, logprob in _window_spans(feature, log_start, log_end, top_k, max_answer_length):
            if logprob > best.get(span, -np.inf):
                best[span] = logprob
    ranked = sorted(best.items(), key=lambda item: (-item[1], item[0]))[:top_k]
    candidates: list[Answer] = [
        {"answer": context[s:e], "score": float(np.exp(lp)), "start": s, "end": e} for (s, e), lp in ranked
    ]
    null_diff = null_logprob - ranked[0][1] if ranked else np.inf
    answers = list(candidates)
    if null_threshold is not None and null_diff > null_threshold:
        null: Answer = {"answer": "", "score": float(np.exp(null_logprob)), "start": 0, "end": 0}
        answers = [null, *candidates[: top_k - 1]]
    return QAPrediction(answers, float(null_diff), float(np.exp(null_logprob)), candidates)


def _window_log_probs(feature: QAFeature, starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Log-softmax of start and end logits over [CLS] + this window's context tokens (-inf elsewhere)."""
    allowed = np.zeros(len(feature), dtype=bool)
    allowed[0] = True
    allowed[feature.context_start : feature.context_end] = True
    masked_start = np.where(allowed, np.asarray(starts, dtype=np.float64), -np.inf)
    masked_end = np.where(allowed, np.asarray(ends, dtype=np.float64), -np.inf)
    return log_softmax(masked_start), log_softmax(masked_end)


def _window_spans(
    feature: QAFeature, log_start: np.ndarray, log_end: np.ndarray, k: int, max_answer_length: int
) -> list[tuple[tuple[int, int], float]]:
    """The k best (character span, log-probability) of a window, end >= start, at most max_answer_length tokens."""
    first, stop = feature.context_start, feature.context_end
    count = stop - first
    if count == 0:
        return []
    starts, ends = log_start[first:stop], log_end[first:stop]
    width = min(max_answer_length, count)
    # band[d, i] = log P(start=i) + log P(end=i+d): every span of length d+1 tokens.
    band = np.full((width, count), -np.inf)
    for d in range(width):
        band[d, : count - d] = starts[: count - d] + ends[d:]
    flat = band.ravel()
    take = min(k, flat.size)
    picked = np.argpartition(-flat, take - 1)[:take]
    spans = []
    for position in picked:
        if not np.isfinite(flat[position]):
            continue
        d, i = divmod(int(position), count)
        span = trim_span(feature.context, feature.offsets[first + i][0], feature.offsets[first + i + d][1])
        if span[1] > span[0]:  # a span of whitespace alone answers nothing
            spans.append((span, float(flat[position])))
    return spans
