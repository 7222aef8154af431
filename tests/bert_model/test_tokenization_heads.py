"""A long text of which only the first window is wanted (`encode_batch(..., overflow=False)`) is tokenized in part,
and still gives exactly the encoding of the whole text, cut (ids, segment ids, offsets, word ids), whose ids are
transformers' truncated ones: for every family's tokenizer and for the real one, over texts of emoji, CJK with and
without spaces, combining marks, CRLF, runs of whitespace and digits, and special tokens written in the text, cut
at lengths from a few tokens to 128."""

from __future__ import annotations

import random
from typing import Any

import pytest
import transformers

from bert_model.tokenization import HEAD_CHARS_PER_TOKEN, BertTokenizer
from tests.bert_model.test_tokenization_family import FAMILIES, save_family_tokenizer

PIECES = [
    "Ada Lovelace met Charles Babbage in London.",
    "Emoji 😀 in 東京 with café, José and Zoë.",
    "A combining e\u0301 mark, and a CRLF line\r\nbreak here.",
    "  spaces before, 👍🏽 a skin tone, and after  ",
    "東京都渋谷区神南一丁目の交差点を渡った先にある店",
    "1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20",
    "tab\tseparated\twords and\u00a0no-break spaces",
    "x" * 300,
    "\u200d👍 joined by a zero-width joiner",
]
MAX_LENGTHS = (6, 16, 40, 128)


def _texts(mask: str, count: int = 40) -> list[str]:
    """Texts from a few characters to several thousand, most longer than a first prefix, cut anywhere."""
    rng = random.Random(0)
    texts = []
    for _ in range(count):
        pieces = [rng.choice([*PIECES, f"a {mask} in the text"]) for _ in range(rng.randint(1, 300))]
        text = " ".join(pieces)
        texts.append(text[: rng.randint(1, len(text))])
    texts.append("漢字" * 10_000)  # one pre-tokenizer word for some families: no prefix qualifies
    return texts


@pytest.fixture(scope="module", params=[*FAMILIES, "minilm"])
def tokenizers(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[BertTokenizer, Any]:
    """Ours and transformers' tokenizer of one family's tiny tokenizer, or of the embedded default model."""
    folder = tmp_path_factory.mktemp(request.param)
    if request.param == "minilm":
        BertTokenizer.from_pretrained("minilm").save(folder)
    else:
        save_family_tokenizer(request.param, folder)
    return BertTokenizer.from_pretrained(folder), transformers.AutoTokenizer.from_pretrained(folder)


@pytest.mark.parametrize("max_length", MAX_LENGTHS)
def test_the_first_window_of_a_text_tokenized_in_part_is_transformers_truncation(
    tokenizers: tuple[BertTokenizer, Any], max_length: int
) -> None:
    ours, theirs = tokenizers
    texts = _texts(ours.mask_token)
    assert max(map(len, texts)) > 16 * HEAD_CHARS_PER_TOKEN * max_length  # prefixes grow more than once
    heads = ours.encode_batch(texts, max_length=max_length, overflow=False)
    whole = ours.encode_batch(texts, max_length=max_length)
    for text, head, full in zip(texts, heads, whole, strict=True):
        assert head.ids == theirs(text, truncation=True, max_length=max_length)["input_ids"], text[:80]
        assert (head.ids, head.type_ids, head.offsets, head.word_ids) == (
            full.ids,
            full.type_ids,
            full.offsets,
            full.word_ids,
        )
