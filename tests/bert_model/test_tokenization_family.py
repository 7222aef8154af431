"""Our tokenizer over each family's own tokenizer.json, against `transformers`' tokenizer of that family.

Each family gets a tiny tokenizer of its kind, trained here with the `tokenizers` library on a few sentences (the
family's vocabulary layout and special tokens) and then built and saved by the family's `transformers` tokenizer
class, so that the folder holds exactly what transformers 5 writes (tokenizer.json + tokenizer_config.json) and the
pipeline it uses: WordPiece for BERT, DistilBERT and ELECTRA; byte-level BPE for RoBERTa; SentencePiece Unigram for
XLM-RoBERTa and ALBERT. `save_family_tokenizer` is shared with the task, export and serving tests of the family.

Checked: ids and offsets equal transformers' for single texts and pairs (the pair template `<s> A </s></s> B </s>`
included), the special tokens found by role, the template read off the post-processor, token types on or off as
the model has them, offsets that slice the text without the leading space, a save / load round trip, and the
limit on input length past RoBERTa's position offset.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import transformers
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from bert_model.tokenization import BERT_SPECIAL_TOKENS, BertTokenizer, SpecialTokens

FAMILIES = ("bert", "distilbert", "electra", "roberta", "xlm-roberta", "albert")
TRAINING_TEXTS = [
    "Ada Lovelace worked with Charles Babbage in London.",
    "The quick brown fox jumps over the lazy dog near the river.",
    "Paris is the capital of France, and Berlin is the capital of Germany.",
    "Where does the old bridge cross the river? It crosses it in the town.",
    "Emoji 😀 and 東京 and café and naïve text, with numbers like 1,234.",
    "Marie Curie won the Nobel Prize in Physics in 1903 in Stockholm.",
]
TRICKY_TEXTS = [
    "Ada Lovelace met Babbage in London.",
    "  leading spaces and   runs of spaces  ",
    "Emoji 👩‍🔬 works in 東京 with José\r\nand Zoë e\u0301 in CRLF lines.",
    "Tabs\tand\nnewlines, punctuation!? (brackets) [MASK] <mask>",
]
VOCAB_SIZE = 400
SPECIALS: dict[str, SpecialTokens] = {
    "wordpiece": BERT_SPECIAL_TOKENS,
    "bpe": SpecialTokens(cls="<s>", sep="</s>", pad="<pad>", unk="<unk>", mask="<mask>"),
    "xlm-unigram": SpecialTokens(cls="<s>", sep="</s>", pad="<pad>", unk="<unk>", mask="<mask>"),
    "albert-unigram": SpecialTokens(cls="[CLS]", sep="[SEP]", pad="<pad>", unk="<unk>", mask="[MASK]"),
}
KIND = {
    "bert": "wordpiece",
    "distilbert": "wordpiece",
    "electra": "wordpiece",
    "roberta": "bpe",
    "xlm-roberta": "xlm-unigram",
    "albert": "albert-unigram",
}
ID_ORDER = {
    "wordpiece": ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"),
    "bpe": ("<s>", "<pad>", "</s>", "<unk>", "<mask>"),
    "xlm-unigram": ("<s>", "<pad>", "</s>", "<unk>", "<mask>"),
    "albert-unigram": ("<pad>", "<unk>", "[CLS]", "[SEP]", "[MASK]"),
}
"""Special tokens first, in the order of the released vocabularies (RoBERTa's pad is 1, ALBERT's unk is 1)."""


def _wordpiece(family: str) -> Any:
    trained = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    trained.normalizer = normalizers.BertNormalizer(lowercase=True)
    trained.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(vocab_size=VOCAB_SIZE, special_tokens=list(ID_ORDER["wordpiece"]))
    trained.train_from_iterator(TRAINING_TEXTS * 4, trainer)
    name = {"bert": "BertTokenizer", "distilbert": "DistilBertTokenizer", "electra": "ElectraTokenizer"}[family]
    return getattr(transformers, name)(vocab=trained.get_vocab(), do_lower_case=True)


def _bpe() -> Any:
    trained = Tokenizer(models.BPE())
    trained.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trained.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(ID_ORDER["bpe"]),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    trained.train_from_iterator(TRAINING_TEXTS * 4, trainer)
    state = json.loads(trained.to_str())["model"]
    merges = [tuple(merge) if isinstance(merge, list) else tuple(merge.split(" ")) for merge in state["merges"]]
    return transformers.RobertaTokenizer(vocab=state["vocab"], merges=merges)


def _unigram(kind: str) -> Any:
    order = ID_ORDER[kind]
    trained = Tokenizer(models.Unigram())
    trained.pre_tokenizer = pre_tokenizers.Metaspace()
    trainer = trainers.UnigramTrainer(vocab_size=VOCAB_SIZE, special_tokens=list(order), unk_token="<unk>")
    trained.train_from_iterator(TRAINING_TEXTS * 4, trainer)
    vocab = [(piece, score) for piece, score in json.loads(trained.to_str())["model"]["vocab"]]
    if kind == "albert-unigram":
        return transformers.AlbertTokenizer(vocab=vocab)
    return transformers.XLMRobertaTokenizer(vocab=vocab)


def save_family_tokenizer(family: str, folder: Path) -> Path:
    """A tiny tokenizer of `family`'s kind saved by its transformers class into `folder`; its vocabulary size is
    the model's `vocab_size` (`len(AutoTokenizer.from_pretrained(folder))`)."""
    kind = KIND[family]
    built = _wordpiece(family) if kind == "wordpiece" else _bpe() if kind == "bpe" else _unigram(kind)
    assert [built.convert_ids_to_tokens(i) for i in range(5)] == list(ID_ORDER[kind]), family
    built.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module", params=FAMILIES)
def family_folder(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    family = request.param
    return family, save_family_tokenizer(family, tmp_path_factory.mktemp(family))


def _theirs(folder: Path) -> Any:
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    ids = tokenizer("Ada Lovelace in London")["input_ids"]
    assert ids.count(tokenizer.unk_token_id) < len(ids) - 2, "the reference tokenizer reads everything as unknown"
    return tokenizer


def test_single_texts_and_pairs_match_transformers(family_folder: tuple[str, Path]) -> None:
    family, folder = family_folder
    ours, theirs = BertTokenizer.from_pretrained(folder), _theirs(folder)
    for text in TRAINING_TEXTS + TRICKY_TEXTS:
        mine = ours.encode(text)
        reference = theirs(text, return_offsets_mapping=True)
        assert mine.ids == reference["input_ids"], (family, text)
        assert [tuple(o) for o in mine.offsets] == [tuple(o) for o in reference["offset_mapping"]], (family, text)
    for first, second in zip(TRAINING_TEXTS, TRICKY_TEXTS, strict=False):
        mine = ours.encode(first, second)
        reference = theirs(first, second, return_token_type_ids=True)
        assert mine.ids == reference["input_ids"], (family, first, second)
        expected_types = reference["token_type_ids"] if ours.uses_token_types else [0] * len(mine.ids)
        types = ours.pad([mine])["token_type_ids"][0].tolist()
        assert types == expected_types, family


def test_special_tokens_are_the_family_s(family_folder: tuple[str, Path]) -> None:
    family, folder = family_folder
    ours, theirs = BertTokenizer.from_pretrained(folder), _theirs(folder)
    assert ours.special_tokens == SPECIALS[KIND[family]]
    assert (ours.cls_id, ours.sep_id, ours.pad_id, ours.unk_id, ours.mask_id) == (
        theirs.cls_token_id,
        theirs.sep_token_id,
        theirs.pad_token_id,
        theirs.unk_token_id,
        theirs.mask_token_id,
    )
    assert ours.mask_token == theirs.mask_token
    assert ours.encode(f"a {ours.mask_token} b").ids.count(ours.mask_id) == 1  # one token, never split


def test_the_template_is_read_off_the_post_processor(family_folder: tuple[str, Path]) -> None:
    family, folder = family_folder
    ours = BertTokenizer.from_pretrained(folder)
    template = ours.template
    a, b = [7, 8, 9], [10, 11]
    ids, types = template.pair(a, b)
    if family in ("roberta", "xlm-roberta"):
        assert ids == [ours.cls_id, *a, ours.sep_id, ours.sep_id, *b, ours.sep_id]
        assert (template.single_specials, template.pair_specials) == (2, 4)
    else:
        assert ids == [ours.cls_id, *a, ours.sep_id, *b, ours.sep_id]
        assert (template.single_specials, template.pair_specials) == (2, 3)
    assert template.second_start(len(a)) == ids.index(b[0])
    assert template.single(a) == ([ours.cls_id, *a, ours.sep_id], [0] * 5)
    if ours.uses_token_types:
        assert types == [0] * 5 + [1] * 3
    else:
        assert types == [0] * len(ids)


def test_token_types_follow_the_model(tmp_path: Path) -> None:
    """Token types come from tokenizer_config's `model_input_names`, else the model's config.json."""
    folder = save_family_tokenizer("bert", tmp_path / "bert")
    assert BertTokenizer.from_pretrained(folder).uses_token_types
    (folder / "config.json").write_text(json.dumps({"model_type": "distilbert", "vocab_size": VOCAB_SIZE}))
    assert not BertTokenizer.from_pretrained(folder).uses_token_types
    (folder / "config.json").write_text(json.dumps({"model_type": "roberta", "type_vocab_size": 1, "pad_token_id": 1}))
    assert not BertTokenizer.from_pretrained(folder).uses_token_types
    (folder / "config.json").write_text(json.dumps({"model_type": "electra", "type_vocab_size": 2}))
    assert BertTokenizer.from_pretrained(folder).uses_token_types


@pytest.mark.parametrize("family", ["roberta", "xlm-roberta", "albert"])
def test_offsets_leave_out_the_leading_space(family: str, tmp_path: Path) -> None:
    ours = BertTokenizer.from_pretrained(save_family_tokenizer(family, tmp_path / family))
    text = "Ada Lovelace met Babbage in London."
    encoding = ours.encode(text)
    for token, (start, end) in zip(encoding.tokens, encoding.offsets, strict=True):
        if end > start:
            assert not text[start].isspace(), (family, token, text[start:end])


def test_save_round_trip_keeps_the_family(family_folder: tuple[str, Path], tmp_path: Path) -> None:
    family, folder = family_folder
    ours = BertTokenizer.from_pretrained(folder)
    saved = BertTokenizer.from_pretrained(ours.save(tmp_path / "saved"))
    assert saved.special_tokens == ours.special_tokens and saved.template == ours.template
    assert saved.uses_token_types == ours.uses_token_types
    assert saved.encode(TRICKY_TEXTS[2], TRICKY_TEXTS[0]).ids == ours.encode(TRICKY_TEXTS[2], TRICKY_TEXTS[0]).ids
    assert (tmp_path / "saved" / "vocab.txt").is_file() == (KIND[family] == "wordpiece")
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path / "saved")
    assert theirs(TRICKY_TEXTS[0])["input_ids"] == ours.encode(TRICKY_TEXTS[0]).ids


def test_lowercasing_is_read_from_the_normalizer(family_folder: tuple[str, Path]) -> None:
    family, folder = family_folder
    assert BertTokenizer.from_pretrained(folder).lowercase == (family in ("bert", "distilbert", "electra", "albert"))


def test_roberta_inputs_are_capped_past_the_position_offset(tmp_path: Path) -> None:
    folder = save_family_tokenizer("roberta", tmp_path / "roberta")
    config = {"model_type": "roberta", "max_position_embeddings": 514, "pad_token_id": 1, "type_vocab_size": 1}
    (folder / "config.json").write_text(json.dumps(config))
    assert BertTokenizer.from_pretrained(folder).model_max_length == 512
