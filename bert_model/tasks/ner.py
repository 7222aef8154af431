"""Named-entity recognition: word/label alignment for training, windows, and entity grouping at inference.

References: Devlin et al. (2019), section 5.3 (CoNLL-2003 NER as token classification: the label sits on the
first word piece of each word, the other pieces are not predicted: label -100 at training); Tjong Kim Sang &
De Meulder (2003) for the data; Ramshaw & Marcus (1995) for IOB1/IOB2 tags. Entity grouping follows the
semantics of Hugging Face's token-classification pipeline (`aggregation_strategy`):

- `none`: every token whose label is not ignored, with its own label and probability;
- `simple`: tokens grouped into entities (a group continues while the type stays the same and the tag is not
  B-), score = mean of the token scores;
- `first` / `average` / `max`: tokens first merged into words (the label of the first piece / the argmax of
  the averaged distributions / the label of the most confident piece), then words grouped as in `simple`.

Words are the pre-tokenizer's words for raw text (BERT splits on whitespace and punctuation, as the pipeline's
`##` test does), or the given words for pre-split input (CoNLL). Deviation from the pipeline, on purpose:
`word` is always `text[start:end]`, the exact original characters (the pipeline decodes word pieces, which loses
case and accents). Long texts are split into windows of `max_seq_length` tokens overlapping by `stride`; each
token's prediction comes from the window where it sits farthest from the edge. A text is tokenized once
(`encode_ner_texts`) and its windows cut from those tokens (`ner_window_features`), so their number is known
(`NERInputs.window_counts`) before any is built. A window is framed by the tokenizer's single-text template
(`[CLS] tokens [SEP]`, `<s> tokens </s>`); token spans leave out the space a byte-level BPE or SentencePiece token
carries (`bert_model.tasks.features.token_spans`), so `word == text[start:end]` never starts or ends on whitespace.
Torch-free.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypedDict

import numpy as np
from tokenizers import Encoding

import bert_model.tasks.defaults as defaults
from bert_model.tasks.defaults import AGGREGATION_STRATEGIES, AggregationStrategy
from bert_model.tasks.features import (
    Feature,
    OutputRows,
    check_aligned,
    feature_row,
    token_spans,
    trim_span,
    trimmed_spans,
)
from bert_model.tasks.numeric import softmax
from bert_model.tasks.windows import NER_SPECIAL_TOKENS, token_windows, window_count
from bert_model.tokenization import BertTokenizer

IGNORE_INDEX = -100
NO_OFFSET = (0, 0)


class Entity(TypedDict):
    """One entity (or one token with `none`): `word == text[start:end]`, character offsets."""

    entity_group: str
    """The entity type (`PER`), or the token's full label (`B-PER`) with aggregation `none`."""
    score: float
    word: str
    start: int
    end: int


@dataclass(eq=False)
class NERFeature(Feature):
    """One window of a text: [CLS] tokens [SEP] (the tokenizer's single-text template)."""

    text: str
    """The whole original text (shared, not copied) that `offsets` index into."""
    offsets: list[tuple[int, int]]
    """Per token: its character span in `text`; (0, 0) for the special tokens."""
    word_ids: list[int | None]
    """Per token: index of its word in the whole text; None for the special tokens."""
    word_starts: list[bool]
    """Per token: True for the first piece of its word (judged over the whole text, not just this window)."""
    owned_start: int
    """First token index whose prediction this window contributes (tokens are shared with neighbours)."""
    owned_end: int
    """One past the last token index this window contributes."""
    num_words: int
    """Number of words of the whole text."""
    window_index: int
    """0 for the first window of a text, 1 for the next, ..."""


@dataclass
class TokenPredictions:
    """The per-token probabilities of one whole text, windows merged (specials dropped)."""

    text: str
    probs: np.ndarray
    """(T, num_labels) softmax probabilities."""
    offsets: list[tuple[int, int]]
    word_ids: list[int]
    word_starts: list[bool]
    num_words: int


# ---- tags and labels -----------------------------------------------------------------------------------
def iob1_to_iob2(tags: Sequence[str]) -> list[str]:
    """IOB1 (B- only between two adjacent entities of one type) -> IOB2 (every entity starts with B-).

    Idempotent: valid IOB2 input comes back unchanged.
    """
    converted: list[str] = []
    previous = "O"
    for tag in tags:
        if tag.startswith("I-") and (previous == "O" or previous[2:] != tag[2:]):
            tag = "B-" + tag[2:]
        converted.append(tag)
        previous = tag
    return converted


def bio_labels(entity_types: Sequence[str]) -> list[str]:
    """The label list `O, B-T1, I-T1, B-T2, I-T2, ...` for entity types in the given order."""
    labels = ["O"]
    for entity_type in entity_types:
        labels += [f"B-{entity_type}", f"I-{entity_type}"]
    return labels


def split_tag(label: str) -> tuple[str, str]:
    """`B-PER` -> ("B", "PER"), `I-PER` -> ("I", "PER"), anything else -> ("I", label) (the pipeline's rule)."""
    if label.startswith(("B-", "I-")):
        return label[0], label[2:]
    return "I", label


# ---- features ------------------------------------------------------------------------------------------
@dataclass(eq=False)
class NERInputs:
    """Raw texts tokenized once, without special tokens and before windowing: what `ner_window_features` cuts
    windows from, and what their number is counted from."""

    texts: list[str]
    encodings: list[Encoding]
    max_seq_length: int
    stride: int
    special_tokens: int = NER_SPECIAL_TOKENS
    """Special tokens of a window (the tokenizer's single-text template)."""

    def window_counts(self) -> list[int]:
        """Windows per text, computed from the token counts without building them."""
        room = self.max_seq_length - self.special_tokens
        return [window_count(len(encoding.ids), room, self.stride) for encoding in self.encodings]


def build_ner_features(
    tokenizer: BertTokenizer,
    texts: Sequence[str],
    *,
    max_seq_length: int = defaults.NER_MAX_SEQ_LENGTH,
    stride: int = defaults.NER_STRIDE,
) -> list[NERFeature]:
    """Windows of raw texts, words = the pre-tokenizer's words; `request_index` = the text's index."""
    return ner_window_features(
        tokenizer, encode_ner_texts(tokenizer, texts, max_seq_length=max_seq_length, stride=stride)
    )


def encode_ner_texts(
    tokenizer: BertTokenizer,
    texts: Sequence[str],
    *,
    max_seq_length: int = defaults.NER_MAX_SEQ_LENGTH,
    stride: int = defaults.NER_STRIDE,
) -> NERInputs:
    """Tokenize every text once, for `ner_window_features` (the window settings are checked here)."""
    if isinstance(texts, str):
        raise TypeError("texts must be a list of strings, not a single string")
    for index, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"text {index} must be a string, got {type(text).__name__}")
    specials = tokenizer.template.single_specials
    _check_window(max_seq_length, stride, specials)
    encodings = tokenizer.backend.encode_batch(list(texts), add_special_tokens=False)
    return NERInputs(list(texts), list(encodings), max_seq_length, stride, specials)


def ner_window_features(tokenizer: BertTokenizer, inputs: NERInputs) -> list[NERFeature]:
    """Every window of every text in the tokenizer's single-text template, in input order."""
    features: list[NERFeature] = []
    for index, (text, encoding) in enumerate(zip(inputs.texts, inputs.encodings, strict=True)):
        word_ids = [w if w is not None else -1 for w in encoding.word_ids]
        num_words = max(word_ids, default=-1) + 1
        offsets = token_spans(text, encoding.offsets)
        features += _windows(
            tokenizer, index, text, encoding.ids, offsets, word_ids, num_words, inputs.max_seq_length, inputs.stride
        )
    return features


def build_ner_word_features(
    tokenizer: BertTokenizer,
    sentences: Sequence[Sequence[str]],
    *,
    max_seq_length: int = defaults.NER_MAX_SEQ_LENGTH,
    stride: int = defaults.NER_STRIDE,
) -> list[NERFeature]:
    """Windows of pre-split sentences (CoNLL words): text = words joined by spaces, word ids = word positions."""
    features: list[NERFeature] = []
    for index, words in enumerate(sentences):
        if isinstance(words, str):
            raise TypeError(f"sentence {index} must be a list of words, not a string")
        text, spans = join_words(words)
        encoding = tokenizer.backend.encode(text, add_special_tokens=False)
        offsets = trimmed_spans(text, encoding.offsets)
        word_starts = [s for s, _ in spans]
        word_ids = [bisect.bisect_right(word_starts, start) - 1 for start, _ in offsets]
        features += _windows(
            tokenizer, index, text, encoding.ids, offsets, word_ids, len(words), max_seq_length, stride
        )
    return features


def join_words(words: Sequence[str]) -> tuple[str, list[tuple[int, int]]]:
    """Words joined by single spaces, and each word's character span in the result."""
    spans: list[tuple[int, int]] = []
    position = 0
    for word in words:
        if not isinstance(word, str) or not word:
            raise ValueError(f"words must be non-empty strings, got {word!r}")
        spans.append((position, position + len(word)))
        position += len(word) + 1
    return " ".join(words), spans


def _windows(
    tokenizer: BertTokenizer,
    index: int,
    text: str,
    ids: Sequence[int],
    offsets: list[tuple[int, int]],
    word_ids: list[int],
    num_words: int,
    max_seq_length: int,
    stride: int,
) -> list[NERFeature]:
    template = tokenizer.template
    before, after = len(template.single_prefix.ids), len(template.single_suffix.ids)
    _check_window(max_seq_length, stride, before + after)
    starts = [wid >= 0 and (t == 0 or word_ids[t - 1] != wid) for t, wid in enumerate(word_ids)]
    bounds = window_bounds(len(ids), max_seq_length - before - after, stride)
    features = []
    for number, ((first, stop), (own_first, own_stop)) in enumerate(bounds):
        input_ids, token_type_ids = template.single(ids[first:stop])
        features.append(
            NERFeature(
                request_index=index,
                input_ids=input_ids,
                token_type_ids=token_type_ids,
                text=text,
                offsets=[NO_OFFSET] * before + offsets[first:stop] + [NO_OFFSET] * after,
                word_ids=[None] * before + [w if w >= 0 else None for w in word_ids[first:stop]] + [None] * after,
                word_starts=[False] * before + starts[first:stop] + [False] * after,
                owned_start=own_first - first + before,
                owned_end=own_stop - first + before,
                num_words=num_words,
                window_index=number,
            )
        )
    return features


def _check_window(max_seq_length: int, stride: int, specials: int = NER_SPECIAL_TOKENS) -> None:
    if max_seq_length - specials < 1 or not 0 <= stride < max_seq_length - specials:
        raise ValueError(
            f"need max_seq_length >= {specials + 1} and 0 <= stride < max_seq_length - {specials}, got "
            f"{max_seq_length}, {stride}"
        )


def window_bounds(count: int, room: int, stride: int) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """Token windows [first, stop) of at most `room` tokens overlapping by `stride`, and the part each owns.

    Owned parts tile [0, count) without overlap; a shared stretch is split in its middle.
    """
    windows = token_windows(count, room, stride)
    cuts = [0] + [(windows[k + 1][0] + windows[k][1]) // 2 for k in range(len(windows) - 1)] + [count]
    return [(window, (cuts[k], cuts[k + 1])) for k, window in enumerate(windows)]


def align_labels(feature: NERFeature, word_labels: Sequence[int], ignore_index: int = IGNORE_INDEX) -> list[int]:
    """Token labels for training: the word's label on its first piece, `ignore_index` on every other token."""
    if len(word_labels) != feature.num_words:
        raise ValueError(f"got {len(word_labels)} labels for a text of {feature.num_words} words")
    return [
        word_labels[word] if word is not None and first else ignore_index
        for word, first in zip(feature.word_ids, feature.word_starts, strict=True)
    ]


# ---- predictions ---------------------------------------------------------------------------------------
def ner_token_predictions(features: Sequence[NERFeature], logits: OutputRows) -> dict[int, TokenPredictions]:
    """Per request index: softmax probabilities of every token of the text, windows merged in order."""
    check_aligned(features, logits, "logits")
    parts: dict[int, list[tuple[NERFeature, np.ndarray]]] = {}
    for feature, row in zip(features, logits, strict=True):
        rows = feature_row(feature, row, "logits")
        if rows.ndim != 2:
            raise ValueError(f"token logits rows must have shape (sequence, num_labels), got {rows.shape}")
        parts.setdefault(feature.request_index, []).append((feature, rows))
    return {index: _merge_windows(windows) for index, windows in parts.items()}


def _merge_windows(windows: list[tuple[NERFeature, np.ndarray]]) -> TokenPredictions:
    windows = sorted(windows, key=lambda item: item[0].window_index)
    first = windows[0][0]
    probs, offsets, word_ids, word_starts = [], [], [], []
    for feature, rows in windows:
        keep = slice(feature.owned_start, feature.owned_end)
        probs.append(softmax(rows[keep], axis=-1))
        offsets += feature.offsets[keep]
        word_ids += [w if w is not None else -1 for w in feature.word_ids[keep]]
        word_starts += feature.word_starts[keep]
    return TokenPredictions(first.text, np.concatenate(probs), offsets, word_ids, word_starts, first.num_words)


def ner_word_predictions(
    features: Sequence[NERFeature],
    logits: OutputRows,
    labels: Sequence[str],
    default: str = "O",
) -> dict[int, list[str]]:
    """Per request index: one label per word, read at the word's first piece (`default` if it has no token)."""
    results: dict[int, list[str]] = {}
    for index, tokens in ner_token_predictions(features, logits).items():
        words = [default] * tokens.num_words
        best = np.argmax(tokens.probs, axis=-1)
        for position, (word, first) in enumerate(zip(tokens.word_ids, tokens.word_starts, strict=True)):
            if first and word >= 0:
                words[word] = labels[int(best[position])]
        results[index] = words
    return results


def ner_postprocess(
    features: Sequence[NERFeature],
    logits: OutputRows,
    labels: Sequence[str],
    *,
    aggregation_strategy: AggregationStrategy = defaults.NER_AGGREGATION,
    ignore_labels: Sequence[str] = ("O",),
) -> dict[int, list[Entity]]:
    """Per request index: the entities of the text `[{entity_group, score, word, start, end}]`, in text order."""
    if aggregation_strategy not in AGGREGATION_STRATEGIES:
        raise ValueError(f"aggregation_strategy must be one of {AGGREGATION_STRATEGIES}, got {aggregation_strategy!r}")
    return {
        index: group_entities(tokens, labels, aggregation_strategy, ignore_labels)
        for index, tokens in ner_token_predictions(features, logits).items()
    }


@dataclass
class _Pieces:
    """Tokens (or words) with their predicted label, score and character span, as arrays: one entry per piece."""

    labels: np.ndarray
    """Index into the label names."""
    scores: np.ndarray
    """float64: the label's probability (of the word's distribution for the word strategies); an entity scores
    the mean of its pieces'."""
    starts: np.ndarray
    ends: np.ndarray


def group_entities(
    tokens: TokenPredictions,
    labels: Sequence[str],
    strategy: AggregationStrategy = defaults.NER_AGGREGATION,
    ignore_labels: Sequence[str] = ("O",),
) -> list[Entity]:
    """Entities of one text from its token probabilities (see the module docstring for the strategies). A token (or
    word) that shares a character with the one before it (the bytes of one character in byte-level BPE, a mark
    the pre-tokenizer split from its letter) continues that one's entity; an entity of whitespace alone (a
    byte-level BPE token of a line break) is none.

    Pieces and groups are found with array operations; Python runs once per entity kept, so a long text costs
    little time holding the interpreter."""
    if tokens.probs.shape[-1] != len(labels):
        raise ValueError(f"logits have {tokens.probs.shape[-1]} labels but {len(labels)} label names were given")
    pieces = _token_pieces(tokens) if strategy in ("none", "simple") else _word_pieces(tokens, strategy)
    if strategy == "none":
        firsts, stops, names, scores = _one_per_piece(pieces, labels, ignore_labels)
    else:
        firsts, stops, names, scores = _groups(pieces, labels, ignore_labels)
    starts, ends = pieces.starts[firsts].tolist(), pieces.ends[stops - 1].tolist()
    entities = [
        _entity(tokens.text, start, end, name, score)
        for start, end, name, score in zip(starts, ends, names, scores.tolist(), strict=True)
    ]
    return [e for e in entities if e["end"] > e["start"]]


_Spans = tuple[np.ndarray, np.ndarray, list[str], np.ndarray]
"""Entities as the first piece and one past the last of each, their names and scores."""


def _one_per_piece(pieces: _Pieces, labels: Sequence[str], ignore_labels: Sequence[str]) -> _Spans:
    ignored = np.array([label in ignore_labels for label in labels], dtype=bool)
    kept = np.flatnonzero(~ignored[pieces.labels])
    return kept, kept + 1, [labels[i] for i in pieces.labels[kept].tolist()], pieces.scores[kept]


def _groups(pieces: _Pieces, labels: Sequence[str], ignore_labels: Sequence[str]) -> _Spans:
    """A piece continues the group before it when its type is the same and its tag not B-, or when it shares a
    character with the piece before it (a character is in one entity at most); groups of an ignored type drop."""
    tags = [split_tag(label) for label in labels]
    begins = np.array([bi == "B" for bi, _ in tags], dtype=bool)
    types = np.unique([tag for _, tag in tags], return_inverse=True)[1].reshape(-1)
    ignored = np.array([tag in ignore_labels for _, tag in tags], dtype=bool)
    label, count = pieces.labels, len(pieces.labels)
    if count == 0:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64), [], np.empty(0)
    continues = np.zeros(count, dtype=bool)
    continues[1:] = (~begins[label[1:]] & (types[label[1:]] == types[label[:-1]])) | (
        pieces.starts[1:] < pieces.ends[:-1]
    )
    firsts = np.flatnonzero(~continues)
    stops = np.append(firsts[1:], count)
    means = np.add.reduceat(pieces.scores, firsts) / (stops - firsts)
    kept = ~ignored[label[firsts]]
    firsts, stops = firsts[kept], stops[kept]
    return firsts, stops, [tags[i][1] for i in label[firsts].tolist()], means[kept]


def _entity(text: str, start: int, end: int, group: str, score: float) -> Entity:
    start, end = trim_span(text, start, end)
    return {"entity_group": group, "score": score, "word": text[start:end], "start": start, "end": end}


def _spans(tokens: TokenPredictions) -> tuple[np.ndarray, np.ndarray]:
    spans = np.asarray(tokens.offsets, dtype=np.int64).reshape(-1, 2)
    return spans[:, 0], spans[:, 1]


def _token_pieces(tokens: TokenPredictions) -> _Pieces:
    best = np.argmax(tokens.probs, axis=-1)
    scores = np.take_along_axis(tokens.probs, best[:, None], axis=-1)[:, 0].astype(np.float64)
    return _Pieces(best, scores, *_spans(tokens))


def _word_pieces(tokens: TokenPredictions, strategy: str) -> _Pieces:
    """One piece per word: a word starts at a token that starts a word (or has none) and shares no character with
    the token before it; its distribution is `strategy`'s over its tokens."""
    probs = tokens.probs
    starts, ends = _spans(tokens)
    count = len(starts)
    if count == 0:
        return _Pieces(np.empty(0, dtype=np.int64), np.empty(0), starts, ends)
    word_starts = np.asarray(tokens.word_starts, dtype=bool)
    no_word = np.asarray(tokens.word_ids, dtype=np.int64) < 0
    opens = np.ones(count, dtype=bool)
    opens[1:] = (word_starts[1:] | no_word[1:]) & (starts[1:] >= ends[:-1])
    firsts = np.flatnonzero(opens)
    lasts = np.append(firsts[1:], count) - 1
    if strategy == "first":
        distributions = probs[firsts]
    elif strategy == "average":
        sums = np.add.reduceat(probs, firsts, axis=0)  # in the probabilities' dtype, as their mean sums them
        distributions = (sums / (lasts - firsts + 1)[:, None]).astype(probs.dtype)
    else:  # max: the distribution of the most confident token of the word (the first, on a tie)
        word = np.cumsum(opens) - 1
        order = np.lexsort((-probs.max(axis=-1), word))
        distributions = probs[order[firsts]]
    best = np.argmax(distributions, axis=-1)
    scores = np.take_along_axis(distributions, best[:, None], axis=-1)[:, 0].astype(np.float64)
    return _Pieces(best, scores, starts[firsts], ends[lasts])
