"""Our tokenizer against `transformers`' BERT tokenizer on >= 1,000 real sentences, plus its own behaviour:
pairs, truncation strategies, overflow windows, offsets, lower-casing per config, leaked padding."""

from __future__ import annotations

import json
import shutil
import unicodedata
from pathlib import Path

import numpy as np
import pytest
import transformers

from bert_model.registry import minilm_path
from bert_model.tokenization import BertTokenizer, InputTooLongError, pad_rows
from tests.bert_model.real_text import TRICKY, conll_sentences, squad_pairs, sst2_sentences


@pytest.fixture(scope="module")
def hf_tokenizer():
    tokenizer = transformers.AutoTokenizer.from_pretrained(minilm_path())
    assert tokenizer("hello world")["input_ids"][1:3] != [tokenizer.unk_token_id] * 2
    return tokenizer


@pytest.fixture(scope="module")
def real_sentences(data_dir: Path) -> list[str]:
    contexts = [context for _, context in squad_pairs(data_dir, 250)]
    sentences = sst2_sentences(data_dir) + conll_sentences(data_dir, 400) + contexts + TRICKY
    assert len(sentences) >= 1000
    return sentences


@pytest.fixture(scope="module", params=["tokenizer.json", "vocab.txt"])
def ours(request, tmp_path_factory) -> BertTokenizer:
    """Ours loaded from the shipped tokenizer.json, and built from vocab.txt alone."""
    if request.param == "tokenizer.json":
        return BertTokenizer.from_pretrained("minilm")
    folder = tmp_path_factory.mktemp("vocab_only")
    shutil.copy(minilm_path() / "vocab.txt", folder / "vocab.txt")
    shutil.copy(minilm_path() / "tokenizer_config.json", folder / "tokenizer_config.json")
    return BertTokenizer.from_pretrained(folder)


def _hf_offsets(encoding) -> list[tuple[int, int]]:
    return [tuple(pair) for pair in encoding["offset_mapping"]]


def test_single_sentences_match_transformers(ours, hf_tokenizer, real_sentences) -> None:
    mismatches = []
    for text in real_sentences:
        mine = ours.encode_batch([text], truncation="longest_first", max_length=512)[0]
        theirs = hf_tokenizer(text, return_offsets_mapping=True, truncation=True, max_length=512)
        if (
            mine.ids != theirs["input_ids"]
            or mine.type_ids != theirs["token_type_ids"]
            or [tuple(o) for o in mine.offsets] != _hf_offsets(theirs)
        ):
            mismatches.append(text)
    assert mismatches == [], f"{len(mismatches)} of {len(real_sentences)} differ, e.g. {mismatches[:2]}"


def test_unknown_characters_map_to_unk(ours) -> None:
    encoding = ours.encode("hello ☃ world")
    assert ours.unk_id in encoding.ids


def test_pairs_and_overflow_windows_match_transformers(ours, hf_tokenizer, data_dir) -> None:
    for question, context in squad_pairs(data_dir, 60):
        mine = ours.encode(question, context, max_length=192, truncation="only_second", stride=64)
        windows = [mine, *mine.overflowing]
        theirs = hf_tokenizer(
            question,
            context,
            max_length=192,
            truncation="only_second",
            stride=64,
            return_overflowing_tokens=True,
            return_offsets_mapping=True,
        )
        assert [w.ids for w in windows] == theirs["input_ids"]
        assert [w.type_ids for w in windows] == theirs["token_type_ids"]
        assert [[tuple(o) for o in w.offsets] for w in windows] == [
            [tuple(o) for o in offsets] for offsets in theirs["offset_mapping"]
        ]


def test_pair_layout_is_cls_a_sep_b_sep(ours) -> None:
    encoding = ours.encode("first part", "second part")
    tokens = encoding.tokens
    assert tokens[0] == "[CLS]" and tokens.count("[SEP]") == 2 and tokens[-1] == "[SEP]"
    first_sep = tokens.index("[SEP]")
    assert encoding.type_ids == [0] * (first_sep + 1) + [1] * (len(tokens) - first_sep - 1)


def _uncased(text: str) -> str:
    decomposed = unicodedata.normalize("NFD", text.lower())
    # BERT's normalizer: lower-case, strip accents (Mn after NFD), drop control and format characters.
    return "".join(ch for ch in decomposed if unicodedata.category(ch) not in ("Mn", "Cc", "Cf"))


def test_offsets_slice_the_original_text(ours, real_sentences) -> None:
    checked = 0
    for text in real_sentences:
        encoding = ours.encode(text, max_length=512)
        for token, (start, end), special in zip(
            encoding.tokens, encoding.offsets, encoding.special_tokens_mask, strict=True
        ):
            if special or token == "[UNK]":
                continue
            # Equal, except where one character decomposes into several pieces (Hangul jamo).
            assert token.removeprefix("##") in _uncased(text[start:end]), (text, token, start, end)
            checked += 1
    assert checked > 20_000


@pytest.mark.parametrize(
    ("strategy", "first_len", "second_len"),
    [("longest_first", 6, 6), ("only_first", 2, 10), ("only_second", 10, 2)],
)
def test_truncation_strategies(ours, strategy: str, first_len: int, second_len: int) -> None:
    a = " ".join(["alpha"] * 10)
    b = " ".join(["beta"] * 10)
    encoding = ours.encode(a, b, max_length=15, truncation=strategy)  # type: ignore[arg-type]
    assert len(encoding.ids) == 15
    assert encoding.tokens.count("alpha") == first_len and encoding.tokens.count("beta") == second_len


def test_no_truncation_raises_on_too_long_input(ours) -> None:
    with pytest.raises(InputTooLongError, match="more than the maximum of 16"):
        ours.encode("word " * 40, max_length=16, truncation="none")
    with pytest.raises(ValueError, match="exceeds the model's maximum of 512"):
        ours.encode("word", max_length=1000)


def test_shipped_padding_and_truncation_do_not_leak(ours) -> None:
    # MiniLM's tokenizer.json pads and truncates to 128: ours must do neither by itself.
    assert len(ours.encode("short").ids) == 3
    assert len(ours.encode("word " * 300).ids) == 302


def test_lowercasing_follows_the_config(tmp_path) -> None:
    shutil.copy(minilm_path() / "vocab.txt", tmp_path / "vocab.txt")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": False}))
    cased = BertTokenizer.from_pretrained(tmp_path)
    uncased = BertTokenizer.from_pretrained("minilm")
    hf_cased = transformers.BertTokenizerFast.from_pretrained(tmp_path)
    text = "Hello Paris, Café"
    assert cased.encode(text).ids == hf_cased(text)["input_ids"]
    assert cased.encode(text).ids != uncased.encode(text).ids
    assert not cased.lowercase and uncased.lowercase


def test_pad_builds_int64_arrays(ours) -> None:
    arrays = ours(["a b c d", "a"], max_length=32)
    assert set(arrays) == {"input_ids", "attention_mask", "token_type_ids"}
    assert all(a.dtype == np.int64 and a.shape == (2, 6) for a in arrays.values())
    assert arrays["attention_mask"][1].tolist() == [1, 1, 1, 0, 0, 0]
    assert arrays["input_ids"][1, 3:].tolist() == [ours.pad_id] * 3


def test_pad_rows_keeps_segments_and_refuses_rows_that_do_not_fit() -> None:
    arrays = pad_rows([[101, 7, 102, 8, 102], [101, 102]], [[0, 0, 0, 1, 1], [0, 0]], width=6, pad_id=0)
    assert arrays["input_ids"].tolist() == [[101, 7, 102, 8, 102, 0], [101, 102, 0, 0, 0, 0]]
    assert arrays["token_type_ids"].tolist() == [[0, 0, 0, 1, 1, 0], [0, 0, 0, 0, 0, 0]]
    assert arrays["attention_mask"].sum(axis=1).tolist() == [5, 2]
    with pytest.raises(ValueError, match="row 0 has 5 tokens, more than the width 4"):
        pad_rows([[101, 7, 102, 8, 102]], [[0, 0, 0, 1, 1]], width=4, pad_id=0)
    with pytest.raises(ValueError, match="2 rows of token ids but 1 rows of segment ids"):
        pad_rows([[101], [101]], [[0]], width=2, pad_id=0)


def test_bad_inputs(ours, tmp_path) -> None:
    with pytest.raises(TypeError, match="list of strings"):
        ours.encode_batch("not a list")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"texts\[1\] must be a string"):
        ours.encode_batch(["ok", 3])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="2 texts but 1 pairs"):
        ours.encode_batch(["a", "b"], ["c"])
    with pytest.raises(FileNotFoundError, match="no tokenizer"):
        (tmp_path / "config.json").write_text("{}")
        BertTokenizer.from_pretrained(tmp_path)
    (tmp_path / "vocab.txt").write_text("hello\nworld\n")
    with pytest.raises(ValueError, match="special tokens"):
        BertTokenizer.from_vocab(tmp_path / "vocab.txt")


def test_save_round_trip_loads_in_transformers(ours, tmp_path) -> None:
    ours.save(tmp_path)
    again = BertTokenizer.from_pretrained(tmp_path)
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path)
    text = "A round trip, naïve café."
    assert again.encode(text).ids == ours.encode(text).ids == theirs(text)["input_ids"]
    assert len(theirs("word " * 300)["input_ids"]) == 302  # no baked-in truncation either


def test_special_tokens_written_in_a_text_stay_whole_as_in_transformers(ours, hf_tokenizer, tmp_path) -> None:
    """ "[MASK]" in a text is the mask token (fill-mask inputs), as in Hugging Face's BERT tokenizers, also for a
    tokenizer.json saved without `added_tokens` (what an older `bertserve pretrain-vocab` wrote)."""
    text = "Paris is the [MASK] of France. [SEP] and [CLS] too"
    expected = hf_tokenizer(text)["input_ids"]
    assert ours.encode(text).ids == expected
    assert ours.mask_id in expected and expected.count(ours.sep_id) == 2
    state = json.loads(ours.backend.to_str())
    state["added_tokens"] = []
    (tmp_path / "tokenizer.json").write_text(json.dumps(state))
    shutil.copy(minilm_path() / "tokenizer_config.json", tmp_path / "tokenizer_config.json")
    assert BertTokenizer.from_pretrained(tmp_path).encode(text).ids == expected
