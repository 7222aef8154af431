"""Next-sentence-prediction pairs `[CLS] A [SEP] B [SEP]` from tokenized documents.

Reference: Devlin et al. (2019), section 3.1 "Task #2: Next Sentence Prediction" and appendix A.2, and the
algorithm of google-research/bert `create_pretraining_data.py` (re-implemented here): sentences of a document
are gathered into a chunk until a target length (the full `max_seq_length - 3`, or with probability
`short_seq_prob` a random shorter one); A is a random prefix of the chunk; B is the rest of the chunk (IsNext)
or, half of the time, text from a random other document (NotNext), and the unused sentences of the chunk are
put back. The longer side is truncated, one token at a time, from a random end. Segment ids are 0 up to and
including the first [SEP], 1 after it.

Deliberate differences, so that the IsNext/NotNext share is exactly 50% in expectation (the reference forces
every one-sentence chunk to NotNext, which gives about 58% NotNext on a corpus of short documents such as
Tiny Shakespeare): a chunk always holds at least two sentences, a single sentence left at the end of a document
joins the chunk before it (or, after a NotNext pair, is not put back), and a document of one sentence gives a
NotNext pair half of the time and nothing otherwise. Each label is then a fair coin flip.

Every random choice draws from the `numpy.random.Generator` passed in, never from global state.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

IS_NEXT = 0
NOT_NEXT = 1  # BERT's convention: label 1 means B is a random sentence
NO_NSP_LABEL = -100
"""The label of a sequence without a next-sentence task (MLM-only packing, `packing.py`): ignored by losses."""


@dataclass
class Segment:
    """One sentence as word-piece ids, with True at the first piece of every word."""

    ids: list[int]
    word_start: list[bool]

    def __len__(self) -> int:
        return len(self.ids)


TokenizedDocument = list[Segment]


@dataclass
class TrainingInstance:
    """`[CLS] A [SEP] B [SEP]` ids (unmasked), word starts, where B begins, and the NSP label."""

    input_ids: list[int]
    word_start: list[bool]
    segment_b_start: int
    """Index of the first token of B: token type 0 before it ([CLS] A [SEP]), 1 from it on (B [SEP])."""
    next_sentence_label: int
    """0 = IsNext (B follows A in the document), 1 = NotNext (B comes from another document), NO_NSP_LABEL for a
    packed MLM-only sequence (which has no B: segment_b_start is its length)."""
    source: int = 0
    """Index of the corpus file A comes from (for per-source statistics)."""

    @property
    def token_type_ids(self) -> list[int]:
        return [0] * self.segment_b_start + [1] * (len(self.input_ids) - self.segment_b_start)


@dataclass(frozen=True)
class PairOptions:
    """How pairs are cut: lengths in tokens, the special ids to insert."""

    max_seq_length: int
    short_seq_prob: float
    cls_id: int
    sep_id: int

    def __post_init__(self) -> None:
        if self.max_seq_length < 8:
            raise ValueError(f"max_seq_length must be at least 8 tokens, got {self.max_seq_length}")
        if not 0.0 <= self.short_seq_prob <= 1.0:
            raise ValueError(f"short_seq_prob must be in [0, 1], got {self.short_seq_prob}")


def create_instances_from_document(
    documents: Sequence[TokenizedDocument], index: int, options: PairOptions, rng: np.random.Generator
) -> list[TrainingInstance]:
    """All NSP instances of `documents[index]`; NotNext B sides come from the other documents."""
    if len(documents) < 2:
        raise ValueError("next-sentence prediction needs at least two documents (NotNext pairs use another one)")
    document = documents[index]
    max_tokens = options.max_seq_length - 3  # [CLS], [SEP], [SEP]
    target = max_tokens
    if rng.random() < options.short_seq_prob:
        target = int(rng.integers(2, max_tokens + 1))
    instances: list[TrainingInstance] = []
    start = 0
    while start < len(document):
        end = _chunk_end(document, start, target)
        chunk = document[start:end]
        if len(chunk) == 1:  # a one-sentence document: NotNext only, half of the time to keep labels fair
            if rng.random() < 0.5:
                a, b = _concat(chunk), _random_continuation(documents, index, target - len(chunk[0]), rng)
                instances.extend(_finish(a, b, True, options, rng))
            start = end
            continue
        a_end = int(rng.integers(1, len(chunk)))
        tokens_a = _concat(chunk[:a_end])
        is_random = bool(rng.random() < 0.5)
        if is_random:
            tokens_b = _random_continuation(documents, index, target - len(tokens_a), rng)
            # Put the unused sentences back, unless only the document's last sentence is left (it could not
            # form a pair of its own).
            resume = start + a_end
            start = resume if len(document) - resume >= 2 else end
        else:
            tokens_b = _concat(chunk[a_end:])
            start = end
        instances.extend(_finish(tokens_a, tokens_b, is_random, options, rng))
    return instances


def _chunk_end(document: TokenizedDocument, start: int, target: int) -> int:
    """End (exclusive) of the chunk from `start`: at least two sentences and `target` tokens, or the document's
    end; a single sentence left after the chunk joins it."""
    end, length = start, 0
    while end < len(document) and (length < target or end - start < 2):
        length += len(document[end])
        end += 1
    if len(document) - end == 1:
        end += 1
    return end


def _finish(
    a: Segment, b: Segment, is_random: bool, options: PairOptions, rng: np.random.Generator
) -> list[TrainingInstance]:
    _truncate_pair(a, b, options.max_seq_length - 3, rng)
    return [_assemble(a, b, is_random, options)] if a.ids and b.ids else []


def _random_continuation(
    documents: Sequence[TokenizedDocument], index: int, target_b: int, rng: np.random.Generator
) -> Segment:
    other = int(rng.integers(0, len(documents) - 1))
    other += other >= index  # uniform over the documents other than `index`
    document = documents[other]
    start = int(rng.integers(0, len(document)))
    pieces: list[Segment] = []
    length = 0
    for segment in document[start:]:
        pieces.append(segment)
        length += len(segment)
        if length >= target_b:
            break
    return _concat(pieces)


def _concat(segments: Sequence[Segment]) -> Segment:
    ids: list[int] = []
    starts: list[bool] = []
    for segment in segments:
        ids.extend(segment.ids)
        starts.extend(segment.word_start)
    return Segment(ids, starts)


def _truncate_pair(a: Segment, b: Segment, max_tokens: int, rng: np.random.Generator) -> None:
    """Trim the longer of A and B, from the front or the back at random, until both fit `max_tokens`."""
    while len(a) + len(b) > max_tokens:
        longer = a if len(a) > len(b) else b
        if rng.random() < 0.5:
            del longer.ids[0], longer.word_start[0]
            if longer.word_start:
                longer.word_start[0] = True  # a word cut at the front starts where the cut is
        else:
            longer.ids.pop()
            longer.word_start.pop()


def _assemble(a: Segment, b: Segment, is_random: bool, options: PairOptions) -> TrainingInstance:
    ids = [options.cls_id, *a.ids, options.sep_id, *b.ids, options.sep_id]
    starts = [True, *a.word_start, True, *b.word_start, True]
    return TrainingInstance(
        input_ids=ids,
        word_start=starts,
        segment_b_start=len(a) + 2,
        next_sentence_label=NOT_NEXT if is_random else IS_NEXT,
    )
