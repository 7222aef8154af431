"""Masked-LM input corruption: choose 15% of the tokens, replace 80% of them by [MASK], 10% by a random token,
keep 10%, and predict the original token only at the chosen positions.

Reference: Devlin et al. (2019), section 3.1 "Task #1: Masked LM" and appendix A.1; whole-word masking as
in the google-research/bert README (2019-05-31 update): all the word pieces of a word are chosen together.
Dynamic masking (a fresh mask every epoch) is from Liu et al. (2019), RoBERTa, section 4.1; the caller decides
that by the generator it passes (see `dataset.py`).

Choices made here (each keeps the expected statistics exact):
- The number of tokens to predict is `masked_lm_prob * candidates`, rounded up or down at random in proportion
  to the fraction (unbiased, unlike a fixed rounding), then capped by `max_predictions_per_seq`.
- Special tokens ([CLS], [SEP], [PAD], ...) are never chosen; random replacements never produce one.
- With whole-word masking, the 80/10/10 decision is taken once per word, so a word is never half visible.
Every random draw comes from the `numpy.random.Generator` passed in, never from global state.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

IGNORE_INDEX = -100


@dataclass(frozen=True)
class MaskingOptions:
    """How many tokens to choose and how to corrupt them."""

    masked_lm_prob: float = 0.15
    """Share of the non-special tokens chosen for prediction."""
    max_predictions_per_seq: int = 20
    """Cap on the chosen tokens of one sequence."""
    whole_word: bool = False
    """Choose (and corrupt) all the pieces of a word together."""
    mask_prob: float = 0.8
    """Of the chosen tokens, the share replaced by [MASK]."""
    random_prob: float = 0.1
    """Of the chosen tokens, the share replaced by a random token (the rest stay unchanged)."""

    def __post_init__(self) -> None:
        if not 0.0 < self.masked_lm_prob < 1.0:
            raise ValueError(f"masked_lm_prob must be in (0, 1), got {self.masked_lm_prob}")
        if self.max_predictions_per_seq < 1:
            raise ValueError(f"max_predictions_per_seq must be at least 1, got {self.max_predictions_per_seq}")
        if self.mask_prob < 0 or self.random_prob < 0 or self.mask_prob + self.random_prob > 1:
            raise ValueError(
                f"mask_prob ({self.mask_prob}) and random_prob ({self.random_prob}) must be >= 0 and sum to <= 1"
            )


@dataclass(frozen=True)
class MaskingVocabulary:
    """The ids masking needs: [MASK], the specials that are never chosen, and the vocabulary size."""

    mask_id: int
    vocab_size: int
    special_ids: frozenset[int]
    replacement_ids: np.ndarray = field(init=False, repr=False, compare=False)
    """Ids a random replacement is drawn from: every id but the specials."""
    special_array: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        specials = np.fromiter(sorted(self.special_ids), dtype=np.int64)
        allowed = np.setdiff1d(np.arange(self.vocab_size), specials)
        if allowed.size == 0:
            raise ValueError("the vocabulary has no non-special token to draw random replacements from")
        object.__setattr__(self, "replacement_ids", allowed.astype(np.int64))
        object.__setattr__(self, "special_array", specials)

    @classmethod
    def build(cls, mask_id: int, vocab_size: int, special_ids: Iterable[int]) -> MaskingVocabulary:
        return cls(mask_id=mask_id, vocab_size=vocab_size, special_ids=frozenset(int(i) for i in special_ids))


@dataclass
class MaskedSequence:
    input_ids: np.ndarray
    """(S,) ids after corruption."""
    labels: np.ndarray
    """(S,) the original id at chosen positions, -100 elsewhere."""


def mask_tokens(
    input_ids: np.ndarray,
    options: MaskingOptions,
    vocab: MaskingVocabulary,
    rng: np.random.Generator,
    word_start: np.ndarray | None = None,
) -> MaskedSequence:
    """Corrupt one sequence for masked-LM training; `word_start` (bool, (S,)) is needed for whole-word masking."""
    ids = np.asarray(input_ids, dtype=np.int64)
    candidates = ~np.isin(ids, vocab.special_array)
    starts, lengths = _units(candidates, word_start if options.whole_word else None)
    budget = _prediction_budget(int(candidates.sum()), options, rng)
    chosen = _choose_units(lengths, budget, rng)
    labels = np.full_like(ids, IGNORE_INDEX)
    masked = ids.copy()
    if chosen.size == 0:
        return MaskedSequence(masked, labels)
    positions = _expand(starts[chosen], lengths[chosen])  # every chosen position, unit by unit
    action = np.repeat(rng.random(chosen.size), lengths[chosen])  # one decision per unit
    labels[positions] = ids[positions]
    to_mask = positions[action < options.mask_prob]
    to_random = positions[(action >= options.mask_prob) & (action < options.mask_prob + options.random_prob)]
    masked[to_mask] = vocab.mask_id
    masked[to_random] = rng.choice(vocab.replacement_ids, size=to_random.size)
    return MaskedSequence(masked, labels)


def _units(candidates: np.ndarray, word_start: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """(start, length) of each maskable unit: single tokens, or whole words of consecutive candidates."""
    positions = np.flatnonzero(candidates)
    if word_start is None or positions.size == 0:
        return positions, np.ones_like(positions)
    starts_word = np.asarray(word_start, dtype=bool)[positions]
    after_gap = np.ones_like(starts_word)
    after_gap[1:] = positions[1:] != positions[:-1] + 1  # a special token in between also ends a word
    first = np.flatnonzero(starts_word | after_gap)
    lengths = np.diff(np.append(first, positions.size))
    return positions[first], lengths


def _prediction_budget(num_candidates: int, options: MaskingOptions, rng: np.random.Generator) -> int:
    expected = num_candidates * options.masked_lm_prob
    whole = int(np.floor(expected))
    budget = whole + int(rng.random() < expected - whole)  # unbiased random rounding
    return min(budget, options.max_predictions_per_seq)


def _choose_units(lengths: np.ndarray, budget: int, rng: np.random.Generator) -> np.ndarray:
    """Indexes of units in random order, skipping any that would overflow the budget of tokens."""
    if budget == 0 or lengths.size == 0:
        return np.zeros(0, dtype=np.int64)
    order = rng.permutation(lengths.size)
    if np.all(lengths == 1):
        return np.sort(order[:budget])
    chosen: list[int] = []
    total = 0
    for unit in order:
        size = int(lengths[unit])
        if total + size <= budget:
            chosen.append(int(unit))
            total += size
            if total == budget:
                break
    return np.sort(np.asarray(chosen, dtype=np.int64))


def _expand(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Positions start, start+1, ..., start+length-1 of every unit, concatenated."""
    offsets = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    return np.repeat(starts, lengths) + offsets
