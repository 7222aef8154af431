"""Corpus reading, vocabulary training, the data folder (shards, held-out documents) and the resumable stream."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from bert_model.pretraining.build import DataOptions, build_pretraining_data
from bert_model.pretraining.corpus import iter_documents, split_sentences
from bert_model.pretraining.dataset import InstanceStream, StreamState, collate, iter_split
from bert_model.pretraining.instances import NOT_NEXT
from bert_model.pretraining.masking import IGNORE_INDEX
from bert_model.pretraining.shards import DataMeta, Shard
from bert_model.tokenization import BertTokenizer

# ---- corpus ---------------------------------------------------------------------------------------------


def test_sentence_splitting_keeps_abbreviations_and_initials() -> None:
    text = 'Mr. Smith went to St. Louis. He said "Hi." Then H. americanus left! Why? 3.5 kg is heavy.'
    assert split_sentences(text) == [
        "Mr. Smith went to St. Louis.",
        'He said "Hi."',
        "Then H. americanus left!",
        "Why? 3.5 kg is heavy.",
    ]
    assert split_sentences("   ") == []


def test_plain_documents_end_at_blank_lines(tmp_path: Path) -> None:
    path = tmp_path / "plain.txt"
    path.write_text("First doc line one.\nLine two. Still two.\n\n\nSecond doc.\n\n", encoding="utf-8")
    documents = list(iter_documents([path]))
    assert [d.sentences for d in documents] == [
        ["First doc line one.", "Line two.", "Still two."],
        ["Second doc."],
    ]


def test_paragraphs_can_be_grouped_into_documents(tmp_path: Path) -> None:
    path = tmp_path / "play.txt"
    path.write_text("A:\nHello.\n\nB:\nHi.\n\n\nA:\nBye.\n\nB:\nBye now.\n\nC:\nEnd.\n", encoding="utf-8")
    grouped = [d.sentences for d in iter_documents([path], paragraphs_per_document=2)]
    assert grouped == [["A:", "Hello.", "B:", "Hi."], ["A:", "Bye.", "B:", "Bye now."], ["C:", "End."]]
    assert len(list(iter_documents([path]))) == 5
    with pytest.raises(ValueError, match="paragraphs_per_document"):
        list(iter_documents([path], paragraphs_per_document=0))


def test_wikitext_articles_are_documents_and_headings_are_dropped(tmp_path: Path) -> None:
    path = tmp_path / "wiki.raw"
    path.write_text(
        " \n = Lobster = \n \n Lobsters are blue . They turn red .\n \n = = Biology = = \n \n They moult .\n"
        " \n = Valkyria = \n \n A game .\n",
        encoding="utf-8",
    )
    documents = list(iter_documents([path]))
    assert [d.sentences for d in documents] == [
        ["Lobsters are blue .", "They turn red .", "They moult ."],
        ["A game ."],
    ]
    # Forced plain reading: blank lines end documents, heading lines are text.
    assert len(list(iter_documents([path], "plain"))) == 6


def test_unreadable_corpus_files_raise_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        list(iter_documents([tmp_path / "missing.txt"]))
    with pytest.raises(ValueError, match="not a regular file"):
        list(iter_documents([tmp_path]))
    binary = tmp_path / "binary.txt"
    binary.write_bytes(b"fine line\n\xff\xfe\xfa broken\n")
    with pytest.raises(ValueError, match="not UTF-8"):
        list(iter_documents([binary]))
    if os.geteuid() != 0:  # root reads everything
        locked = tmp_path / "locked.txt"
        locked.write_text("text\n")
        locked.chmod(0)
        with pytest.raises(PermissionError, match="not readable"):
            list(iter_documents([locked]))


# ---- vocabulary -----------------------------------------------------------------------------------------


def test_trained_vocabulary_round_trips(tokenizer: BertTokenizer, tmp_path: Path) -> None:
    assert tokenizer.vocab_size <= 120
    assert (tokenizer.pad_id, tokenizer.unk_id, tokenizer.cls_id, tokenizer.sep_id, tokenizer.mask_id) == (
        0,
        1,
        2,
        3,
        4,
    )
    assert tokenizer.unk_id not in tokenizer.encode("The captain sees the harbour.").ids
    tokenizer.save(tmp_path)
    loaded = BertTokenizer.from_pretrained(tmp_path)
    assert loaded.encode("the farmer likes the goat").ids == tokenizer.encode("the farmer likes the goat").ids


# ---- data folder ----------------------------------------------------------------------------------------


def test_data_folder_layout_and_statistics(data_folder: Path) -> None:
    meta = DataMeta.load(data_folder)
    train, held_out = meta.splits["train"], meta.splits["eval"]
    assert train.documents + held_out.documents == 240
    assert train.instances == sum(s.instances for s in train.shards) > 500
    assert abs(train.not_next / train.instances - 0.5) < 0.06
    assert not train.static_masking and held_out.static_masking
    assert 0.13 < held_out.masked_tokens / held_out.maskable_tokens < 0.17
    assert BertTokenizer.from_pretrained(data_folder / "tokenizer").vocab_size == meta.vocab_size
    shard = Shard(data_folder / "train" / train.shards[0].file)
    instance = shard[0]
    assert instance.labels is None and instance.word_start is not None
    assert len(instance.input_ids) <= meta.max_seq_length


def test_held_out_documents_are_whole(data_folder: Path) -> None:
    """Each synthetic document starts with its own `storyN begins .` sentence: no N is in both splits."""
    tokenizer = BertTokenizer.from_pretrained(data_folder / "tokenizer")
    meta = DataMeta.load(data_folder)

    def stories(split: str) -> set[str]:
        found: set[str] = set()
        for instance in iter_split(data_folder, meta, split):
            text = tokenizer.decode(instance.input_ids[: instance.segment_b_start].tolist())
            found.update(word for word in text.replace("##", "").split() if word.startswith("story"))
        return found

    # Story numbers repeat every 50 documents, so compare whole-document fingerprints instead: the held-out
    # A segments must never appear verbatim among the training A segments.
    def segments(split: str) -> set[tuple[int, ...]]:
        return {
            tuple(int(t) for t in i.input_ids[1 : i.segment_b_start - 1] if t != tokenizer.mask_id)
            for i in iter_split(data_folder, meta, split)
            if i.segment_b_start > 12
        }

    assert stories("eval")
    assert not segments("eval") & segments("train")


def test_stream_is_deterministic_resumable_and_remasks_each_epoch(data_folder: Path) -> None:
    meta = DataMeta.load(data_folder)
    stream = InstanceStream(data_folder, meta, seed=7)
    first = stream.take(40)
    saved = StreamState(stream.state.epoch, stream.state.position)
    more = stream.take(30)
    resumed = InstanceStream(data_folder, meta, seed=7, state=saved).take(30)
    for a, b in zip(more, resumed, strict=True):
        assert np.array_equal(a.input_ids, b.input_ids) and np.array_equal(a.labels, b.labels)
    again = InstanceStream(data_folder, meta, seed=7).take(40)
    assert all(np.array_equal(a.labels, b.labels) for a, b in zip(first, again, strict=True))
    # A whole epoch later the same instances come back (in another order) with new masks.
    epoch_size = stream.epoch_size
    whole = InstanceStream(data_folder, meta, seed=7).take(2 * epoch_size)
    key = lambda i: tuple(np.where(i.labels != IGNORE_INDEX, i.labels, i.input_ids).tolist())  # noqa: E731
    epoch0 = {key(i): i for i in whole[:epoch_size]}
    epoch1 = {key(i): i for i in whole[epoch_size:]}
    assert set(epoch0) == set(epoch1)
    changed = sum(not np.array_equal(epoch0[k].labels, epoch1[k].labels) for k in epoch0)
    assert changed > 0.9 * len(epoch0)


def test_collate_pads_and_sets_segments(data_folder: Path) -> None:
    meta = DataMeta.load(data_folder)
    instances = InstanceStream(data_folder, meta, seed=0).take(8)
    batch = collate(instances, pad_id=0)
    width = max(len(i.input_ids) for i in instances)
    assert batch["input_ids"].shape == (8, width)
    for row, instance in enumerate(instances):
        length = len(instance.input_ids)
        assert batch["attention_mask"][row].sum() == length
        assert (batch["token_type_ids"][row, : instance.segment_b_start] == 0).all()
        assert (batch["token_type_ids"][row, instance.segment_b_start : length] == 1).all()
        assert (batch["token_type_ids"][row, length:] == 0).all()
        assert (batch["labels"][row, length:] == IGNORE_INDEX).all()
    assert set(batch["next_sentence_label"].tolist()) <= {0, NOT_NEXT}


def test_static_masking_and_whole_word_data(corpus_file: Path, tokenizer: BertTokenizer, tmp_path: Path) -> None:
    options = DataOptions(max_seq_length=48, dupe_factor=1, seed=1)
    meta = build_pretraining_data([corpus_file], tokenizer, tmp_path / "static", options)
    train = meta.splits["train"]
    assert train.static_masking and "eval" not in meta.splits
    assert abs(train.masked_tokens / train.maskable_tokens - 0.15) < 0.01
    stream = InstanceStream(tmp_path / "static", meta, seed=0)
    epoch = stream.epoch_size
    first = {tuple(i.input_ids.tolist()) for i in stream.take(epoch)}
    second = {tuple(i.input_ids.tolist()) for i in stream.take(epoch)}
    assert first == second  # static: the same corrupted inputs every epoch


# ---- bad input ------------------------------------------------------------------------------------------


def test_empty_corpus_is_refused(tokenizer: BertTokenizer, tmp_path: Path) -> None:
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n   \n")
    with pytest.raises(ValueError, match="holds no text"):
        build_pretraining_data([empty], tokenizer, tmp_path / "out", DataOptions(max_seq_length=48))


def test_single_document_corpus_is_refused(tokenizer: BertTokenizer, tmp_path: Path) -> None:
    single = tmp_path / "single.txt"
    single.write_text("The ship sails. The captain sees the storm.\nThe wave hits the deck.\n")
    with pytest.raises(ValueError, match="only one training document"):
        build_pretraining_data([single], tokenizer, tmp_path / "out", DataOptions(max_seq_length=48))


def test_missing_corpus_file_is_refused_before_work(tokenizer: BertTokenizer, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        build_pretraining_data([tmp_path / "nope.txt"], tokenizer, tmp_path / "out", DataOptions(max_seq_length=48))
    assert not (tmp_path / "out").exists()


def test_sequence_longer_than_the_tokenizer_allows_is_refused(
    corpus_file: Path, tokenizer: BertTokenizer, tmp_path: Path
) -> None:
    with pytest.raises(ValueError, match="exceeds the tokenizer's model_max_length"):
        build_pretraining_data([corpus_file], tokenizer, tmp_path / "out", DataOptions(max_seq_length=65))


def test_non_empty_output_needs_overwrite(corpus_file: Path, tokenizer: BertTokenizer, tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "something").write_text("x")
    with pytest.raises(ValueError, match="--overwrite"):
        build_pretraining_data([corpus_file], tokenizer, tmp_path / "out", DataOptions(max_seq_length=48))
