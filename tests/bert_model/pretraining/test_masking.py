"""Seeded statistics of MLM masking on ~1M decisions (Devlin et al. 2019, section 3.1: 15%, then 80/10/10)."""

from __future__ import annotations

import numpy as np
import pytest

from bert_model.pretraining.masking import IGNORE_INDEX, MaskingOptions, MaskingVocabulary, mask_tokens

PAD, UNK, CLS, SEP, MASK = 0, 1, 2, 3, 4
VOCAB = MaskingVocabulary.build(MASK, 1000, {PAD, UNK, CLS, SEP, MASK})


def _sequence(rng: np.random.Generator, length: int, pad: int = 0) -> np.ndarray:
    """[CLS] A [SEP] B [SEP] [PAD]... with random non-special ids."""
    body = rng.integers(5, VOCAB.vocab_size, size=length).astype(np.int64)
    cut = int(rng.integers(1, length))
    return np.concatenate([[CLS], body[:cut], [SEP], body[cut:], [SEP], [PAD] * pad]).astype(np.int64)


def _run_many(options: MaskingOptions, sequences: int, seed: int = 0) -> dict[str, int]:
    rng = np.random.default_rng(seed)
    totals = dict.fromkeys(("candidates", "chosen", "mask", "random", "kept", "special_chosen", "over_cap"), 0)
    for _ in range(sequences):
        ids = _sequence(rng, int(rng.integers(20, 120)), pad=int(rng.integers(0, 5)))
        out = mask_tokens(ids, options, VOCAB, rng)
        chosen = out.labels != IGNORE_INDEX
        special = np.isin(ids, list(VOCAB.special_ids))
        assert np.array_equal(out.labels[chosen], ids[chosen]), "labels are the original ids"
        assert np.array_equal(out.input_ids[~chosen], ids[~chosen]), "only chosen positions change"
        assert not np.isin(out.input_ids[chosen & (out.input_ids != MASK)], list(VOCAB.special_ids)).any()
        totals["candidates"] += int((~special).sum())
        totals["chosen"] += int(chosen.sum())
        totals["mask"] += int((out.input_ids[chosen] == MASK).sum())
        totals["kept"] += int((out.input_ids[chosen] == ids[chosen]).sum())
        totals["special_chosen"] += int((chosen & special).sum())
        totals["over_cap"] += int(chosen.sum() > options.max_predictions_per_seq)
    # A random replacement can draw the original id (1 in 995): it then counts as kept, as the model sees it.
    totals["random"] = totals["chosen"] - totals["mask"] - totals["kept"]
    return totals


def test_selected_share_and_80_10_10_split_on_a_million_decisions() -> None:
    totals = _run_many(MaskingOptions(masked_lm_prob=0.15, max_predictions_per_seq=1000), sequences=15_000)
    assert totals["candidates"] >= 1_000_000
    share = totals["chosen"] / totals["candidates"]
    assert abs(share - 0.15) <= 0.005, share
    chosen = totals["chosen"]
    assert abs(totals["mask"] / chosen - 0.80) <= 0.01
    assert abs(totals["random"] / chosen - 0.10) <= 0.01
    assert abs(totals["kept"] / chosen - 0.10) <= 0.01
    assert totals["special_chosen"] == 0


def test_cap_is_respected_and_binding() -> None:
    options = MaskingOptions(masked_lm_prob=0.15, max_predictions_per_seq=5)
    rng = np.random.default_rng(1)
    counts = []
    for _ in range(2000):
        ids = _sequence(rng, 100)
        counts.append(int((mask_tokens(ids, options, VOCAB, rng).labels != IGNORE_INDEX).sum()))
    assert max(counts) == 5 and min(counts) == 5  # 15% of 100 = 15 > cap: always exactly the cap


def test_specials_only_sequence_masks_nothing() -> None:
    ids = np.array([CLS, SEP, SEP, PAD, PAD])
    out = mask_tokens(ids, MaskingOptions(), VOCAB, np.random.default_rng(0))
    assert (out.labels == IGNORE_INDEX).all() and np.array_equal(out.input_ids, ids)


def test_same_seed_same_mask_other_seed_other_mask() -> None:
    ids = _sequence(np.random.default_rng(5), 100)
    first = mask_tokens(ids, MaskingOptions(), VOCAB, np.random.default_rng(9))
    again = mask_tokens(ids, MaskingOptions(), VOCAB, np.random.default_rng(9))
    other = mask_tokens(ids, MaskingOptions(), VOCAB, np.random.default_rng(10))
    assert np.array_equal(first.input_ids, again.input_ids) and np.array_equal(first.labels, again.labels)
    assert not np.array_equal(first.labels, other.labels)


def test_whole_word_masking_keeps_word_pieces_together() -> None:
    options = MaskingOptions(masked_lm_prob=0.15, max_predictions_per_seq=1000, whole_word=True)
    rng = np.random.default_rng(2)
    chosen_tokens = candidates = 0
    partial_words = 0
    for _ in range(3000):
        ids = _sequence(rng, 80)
        starts = rng.random(ids.size) < 0.5  # words of 1-5 pieces
        starts[np.isin(ids, [CLS, SEP, PAD])] = True
        out = mask_tokens(ids, options, VOCAB, rng, word_start=starts)
        chosen = out.labels != IGNORE_INDEX
        word = np.cumsum(starts)  # word index of every position
        for w in np.unique(word[chosen]):
            members = word == w
            members &= ~np.isin(ids, [CLS, SEP, PAD])
            if not chosen[members].all():
                partial_words += 1
            actions = {
                "mask" if t == MASK else ("keep" if t == o else "random")
                for t, o in zip(out.input_ids[members], ids[members], strict=True)
            }
            assert actions in ({"mask"}, {"keep"}, {"random"}, {"random", "keep"}), actions
        chosen_tokens += int(chosen.sum())
        candidates += int((~np.isin(ids, [CLS, SEP, PAD])).sum())
    assert partial_words == 0
    assert abs(chosen_tokens / candidates - 0.15) < 0.02  # words fill the budget a little less exactly


def test_whole_word_units_never_cross_special_tokens() -> None:
    ids = np.array([CLS, 10, 11, SEP, 12, 13, SEP])
    starts = np.array([True, True, False, True, False, False, True])  # 12 continues nothing across [SEP]
    options = MaskingOptions(masked_lm_prob=0.5, max_predictions_per_seq=10, whole_word=True)
    for seed in range(50):
        out = mask_tokens(ids, options, VOCAB, np.random.default_rng(seed), word_start=starts)
        chosen = set(np.flatnonzero(out.labels != IGNORE_INDEX).tolist())
        assert chosen in (set(), {1, 2}, {4, 5}, {1, 2, 4, 5})


@pytest.mark.parametrize(
    "kwargs",
    [{"masked_lm_prob": 0.0}, {"masked_lm_prob": 1.0}, {"max_predictions_per_seq": 0}, {"mask_prob": 0.95}],
)
def test_bad_masking_options_are_refused(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        MaskingOptions(**kwargs)
