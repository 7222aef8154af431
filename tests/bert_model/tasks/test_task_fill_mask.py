"""Fill-mask post-processing: equal to transformers' FillMaskPipeline on a tiny random masked-LM model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bert_model.tasks.fill_mask import build_fill_mask_features, fill_mask_postprocess, target_ids, top_indices
from bert_model.tokenization import BertTokenizer

TEXTS = ["Paris is the [MASK] of France.", "The [MASK] sat on the [MASK]."]


@pytest.fixture(scope="module")
def hf(tokenizer: BertTokenizer, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """A transformers fill-mask pipeline over a tiny random BertForMaskedLM with the minilm vocabulary."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    folder: Path = tokenizer.save(tmp_path_factory.mktemp("tok"))
    hf_tokenizer = transformers.BertTokenizerFast.from_pretrained(str(folder))
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    model = transformers.BertForMaskedLM(config).eval()
    return transformers.pipeline("fill-mask", model=model, tokenizer=hf_tokenizer, device="cpu"), model, torch


def _ours(tokenizer: BertTokenizer, hf, texts, **options):  # type: ignore[no-untyped-def]
    """Post-processing of rows shaped as a bundle's graph outputs them: the logits at the mask tokens in position
    order, then a filler row (a batch with more masks in another row)."""
    _, model, torch = hf
    features = build_fill_mask_features(tokenizer, texts, max_seq_length=64)
    rows = []
    with torch.no_grad():
        for feature in features:
            ids = torch.tensor([feature.input_ids])
            logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[0].numpy()  # (S, V)
            at_masks = logits[np.asarray(feature.input_ids) == tokenizer.mask_id]
            rows.append(np.concatenate([at_masks, np.full_like(logits[:1], 50.0)]))  # filler rows never read
    return fill_mask_postprocess(tokenizer, features, rows, **options)


def _same(ours: list[dict], theirs: list[dict]) -> None:
    assert [(r["token"], r["token_str"], r["sequence"]) for r in ours] == [
        (r["token"], r["token_str"], r["sequence"]) for r in theirs
    ]
    np.testing.assert_allclose([r["score"] for r in ours], [r["score"] for r in theirs], rtol=1e-4, atol=1e-7)


def test_single_mask_equals_the_pipeline(tokenizer: BertTokenizer, hf) -> None:  # type: ignore[no-untyped-def]
    ours = _ours(tokenizer, hf, TEXTS[:1], top_k=5)[0]
    assert len(ours) == 1  # one mask position
    _same(ours[0], hf[0](TEXTS[0], top_k=5))
    assert "[CLS]" not in ours[0][0]["sequence"]


def test_several_masks_equal_the_pipeline(tokenizer: BertTokenizer, hf) -> None:  # type: ignore[no-untyped-def]
    ours = _ours(tokenizer, hf, TEXTS[1:], top_k=3)[0]
    theirs = hf[0](TEXTS[1], top_k=3)
    assert len(ours) == len(theirs) == 2
    for mine, reference in zip(ours, theirs, strict=True):
        _same(mine, reference)
    assert ours[0][0]["sequence"].startswith("[CLS]") and "[MASK]" in ours[0][0]["sequence"]


def test_targets_restrict_the_candidates(tokenizer: BertTokenizer, hf) -> None:  # type: ignore[no-untyped-def]
    targets = ["capital", "city", "Heart", "capital"]
    ids = target_ids(tokenizer, targets)
    assert ids == [tokenizer.token_to_id("capital"), tokenizer.token_to_id("city"), tokenizer.token_to_id("heart")]
    ours = _ours(tokenizer, hf, TEXTS[:1], top_k=5, targets=ids)[0][0]
    assert len(ours) == 3  # top_k capped at the number of targets
    _same(ours, hf[0](TEXTS[0], top_k=5, targets=["capital", "city", "heart"]))


def test_a_target_of_several_pieces_is_refused(tokenizer: BertTokenizer) -> None:
    with pytest.raises(ValueError, match=r"targets\[1\] 'unbelievably' is not one token"):
        target_ids(tokenizer, ["city", "unbelievably"])
    with pytest.raises(ValueError, match="targets is empty"):
        target_ids(tokenizer, [])
    with pytest.raises(ValueError, match="non-blank"):
        target_ids(tokenizer, [" "])
    assert target_ids(tokenizer, ["##ing"]) == [tokenizer.token_to_id("##ing")]


def test_input_without_a_mask_is_refused(tokenizer: BertTokenizer) -> None:
    with pytest.raises(ValueError, match=r"input 1 has no mask token: put \[MASK\]"):
        build_fill_mask_features(tokenizer, ["a [MASK] here", "none here"])
    long = "word " * 80 + "[MASK]"
    with pytest.raises(ValueError, match=r"input 0: every \[MASK\] falls after the first 16 tokens"):
        build_fill_mask_features(tokenizer, [long], max_seq_length=16)


def test_rows_with_fewer_mask_rows_than_masks_are_refused(tokenizer: BertTokenizer) -> None:
    (feature,) = build_fill_mask_features(tokenizer, TEXTS[1:])
    with pytest.raises(ValueError, match=r"mask_logits row of shape \(1, 7\) for an input with 2 mask tokens"):
        fill_mask_postprocess(tokenizer, [feature], [np.zeros((1, 7), np.float32)])


@pytest.mark.parametrize("k", [1, 5, 37, 100, 999, 1000, 1500])
def test_top_indices_are_a_stable_sort_s_first_k(k: int) -> None:
    """Best first, ties in index order, also where a tie straddles the k-th place (scores drawn from few values)."""
    rng = np.random.default_rng(k)
    for scores in (rng.standard_normal(1000), rng.integers(0, 7, 1000).astype(np.float32) / 7):
        np.testing.assert_array_equal(top_indices(scores, k), np.argsort(-scores, kind="stable")[:k])
