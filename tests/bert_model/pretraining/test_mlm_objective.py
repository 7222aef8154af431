"""RoBERTa's recipe: full sentences packed across documents without NSP, dynamic masking, MLM-only training."""

from __future__ import annotations

import itertools
import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch

from bert_model.heads import BertForMaskedLM
from bert_model.pretraining.build import DataOptions, build_pretraining_data
from bert_model.pretraining.dataset import InstanceStream, collate
from bert_model.pretraining.evaluation import held_out_mlm
from bert_model.pretraining.instances import NO_NSP_LABEL, Segment, TokenizedDocument
from bert_model.pretraining.masking import IGNORE_INDEX
from bert_model.pretraining.packing import PackOptions, pack_full_sentences
from bert_model.pretraining.shards import DataMeta
from bert_model.pretraining.trainer import pretrain
from bert_model.pretraining.training_args import TrainingArgs
from bert_model.tokenization import BertTokenizer

CLS, SEP = 2, 3
OPTIONS = PackOptions(max_seq_length=40, cls_id=CLS, sep_id=SEP)


def _documents(count: int, seed: int) -> tuple[list[TokenizedDocument], dict[int, tuple[int, int]]]:
    """Documents of unique token ids; `where[id] = (document, length of the sentence it is in)`; one sentence is
    longer than a whole sequence."""
    rng = np.random.default_rng(seed)
    counter = itertools.count(100)
    documents: list[TokenizedDocument] = []
    where: dict[int, tuple[int, int]] = {}
    for d in range(count):
        document = []
        for _ in range(int(rng.integers(1, 6))):
            length = 50 if d == 3 and not document else int(rng.integers(2, 15))
            ids = [next(counter) for _ in range(length)]
            where.update((token, (d, length)) for token in ids)
            document.append(Segment(ids, [True] * length))
        documents.append(document)
    return documents, where


def test_packing_fills_sequences_with_consecutive_sentences_across_documents() -> None:
    documents, where = _documents(60, seed=0)
    instances = pack_full_sentences(documents, OPTIONS)
    for instance in instances:
        ids = instance.input_ids
        assert ids[0] == CLS and ids[-1] == SEP and len(ids) <= OPTIONS.max_seq_length
        assert instance.next_sentence_label == NO_NSP_LABEL and instance.segment_b_start == len(ids)
        assert len(instance.word_start) == len(ids)
    # Every token once, in order; a [SEP] right after each document's last token.
    tokens = [t for i in instances for t in i.input_ids if t not in (CLS, SEP)]
    assert tokens == [t for document in documents for segment in document for t in segment.ids]
    last_tokens = {document[-1].ids[-1] for document in documents}
    for instance in instances:
        for token, after in itertools.pairwise(instance.input_ids):
            assert after == SEP or token not in last_tokens
    crossing = [i for i in instances if len({where[t][0] for t in i.input_ids if t in where}) > 1]
    assert len(crossing) > len(instances) / 2
    for instance in crossing:  # a [SEP] stands between the tokens of two documents
        content = instance.input_ids[1:-1]
        for a, b in itertools.pairwise(content):
            if a in where and b in where:
                assert where[a][0] == where[b][0]
    # Full: the next sequence's first sentence would not have fitted (the 50-token sentence is cut in pieces).
    for current, following in itertools.pairwise(instances):
        first = following.input_ids[1]
        assert len(current.input_ids) + min(where[first][1], OPTIONS.max_content) >= OPTIONS.max_seq_length
    assert max(len(i.input_ids) for i in instances) == OPTIONS.max_seq_length


def test_packing_tags_sources_and_checks_them() -> None:
    documents, _ = _documents(5, seed=1)
    instances = pack_full_sentences(documents, OPTIONS, sources=[0, 0, 1, 1, 1])
    assert instances[0].source == 0 and instances[-1].source == 1
    with pytest.raises(ValueError, match="5 documents but 2 sources"):
        pack_full_sentences(documents, OPTIONS, sources=[0, 1])
    with pytest.raises(ValueError, match="at least 8"):
        PackOptions(max_seq_length=4, cls_id=CLS, sep_id=SEP)


@pytest.fixture(scope="module")
def mlm_data(corpus_file: Path, tokenizer: BertTokenizer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The conftest corpus as packed full sentences with dynamic masking (the same held-out documents as
    `data_folder`, which has the same seed)."""
    out = tmp_path_factory.mktemp("mlm-data")
    options = DataOptions(
        max_seq_length=48, objective="mlm", dupe_factor=2, dynamic_masking=True, eval_fraction=0.1, seed=3
    )
    build_pretraining_data([corpus_file], tokenizer, out, options, overwrite=True)
    return out


def test_mlm_data_has_no_nsp_labels_and_full_sequences(mlm_data: Path, data_folder: Path) -> None:
    meta = DataMeta.load(mlm_data)
    assert meta.objective == "mlm" and not meta.has_nsp and DataMeta.load(data_folder).has_nsp
    assert meta.splits["train"].not_next == 0
    assert meta.splits["eval"].documents == DataMeta.load(data_folder).splits["eval"].documents
    instances = InstanceStream(mlm_data, meta, seed=0).take(meta.splits["train"].instances)
    assert {i.next_sentence_label for i in instances} == {NO_NSP_LABEL}
    lengths = np.array([len(i.input_ids) for i in instances])
    assert lengths.max() <= 48 and np.median(lengths) >= 40  # filled, not one sentence each
    sep = meta.special_ids["sep"]
    crossing = sum(int((i.input_ids[:-1] == sep).sum()) > 0 for i in instances)
    assert crossing > len(instances) / 5  # a [SEP] inside: the sequence crosses a document boundary
    batch = collate(instances[:8], meta.special_ids["pad"])
    assert not batch["token_type_ids"].any()


def test_dynamic_masking_differs_between_epochs_and_keeps_80_10_10(mlm_data: Path) -> None:
    meta = DataMeta.load(mlm_data)
    size = meta.splits["train"].instances
    stream = InstanceStream(mlm_data, meta, seed=11)
    epochs = [stream.take(size) for _ in range(6)]
    again = InstanceStream(mlm_data, meta, seed=11).take(size)
    assert all(np.array_equal(a.labels, b.labels) for a, b in zip(epochs[0], again, strict=True))  # seeded

    def original(i):  # the uncorrupted ids: the label where one was chosen
        return tuple(np.where(i.labels != IGNORE_INDEX, i.labels, i.input_ids).tolist())

    first, second = ({original(i): i for i in epoch} for epoch in epochs[:2])
    assert set(first) == set(second)
    changed = sum(not np.array_equal(first[k].labels, second[k].labels) for k in first)
    assert changed > 0.9 * len(first)
    specials = np.array(sorted(meta.special_ids.values()))
    chosen = masked = random = kept = candidates = 0
    for instance in itertools.chain.from_iterable(epochs):
        choice = instance.labels != IGNORE_INDEX
        ids = np.where(choice, instance.labels, instance.input_ids)
        candidates += int((~np.isin(ids, specials)).sum())
        chosen += int(choice.sum())
        masked += int((instance.input_ids[choice] == meta.special_ids["mask"]).sum())
        kept += int((instance.input_ids[choice] == instance.labels[choice]).sum())
    random = chosen - masked - kept
    assert chosen > 10_000
    assert chosen / candidates == pytest.approx(0.15, abs=0.01)
    assert masked / chosen == pytest.approx(0.8, abs=0.02)
    assert random / chosen == pytest.approx(0.1, abs=0.015)
    assert kept / chosen == pytest.approx(0.1, abs=0.015)


def test_mlm_only_training_freezes_nsp_and_saves_a_masked_lm(
    mlm_data: Path, data_folder: Path, tiny_config: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    args = TrainingArgs(data=mlm_data, out=out, config=str(tiny_config), max_steps=6, batch_size=8)
    result = pretrain(args)
    assert result.steps == 6 and result.last_eval is not None
    assert "nsp_acc" not in result.last_eval and "nsp_loss" not in result.last_eval
    assert result.last_eval["loss"] == result.last_eval["mlm_loss"]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert all("nsp_acc" not in record for record in records)
    saved = json.loads((out / "config.json").read_text())
    assert saved["architectures"] == ["BertForMaskedLM"]
    assert json.loads((out / "pretraining_args.json").read_text())["objective"] == "mlm"
    model = BertForMaskedLM.from_pretrained(out)
    assert model.load_report is not None and not model.load_report.missing_head_keys
    # The same held-out text, packed and as NSP pairs, scored with fixed masks.
    for data in (mlm_data, data_folder):
        figures = held_out_mlm(model, data, limit=50)
        assert figures["masked_tokens"] > 0 and 0 <= figures["mlm_acc"] <= 1
        assert held_out_mlm(model, data, limit=50) == figures


def test_mlm_only_training_leaves_the_pooler_and_nsp_head_alone(
    mlm_data: Path, tiny_config: Path, tmp_path: Path
) -> None:
    from bert_model.pretraining.distributed import init_distributed
    from bert_model.pretraining.trainer import Trainer

    args = TrainingArgs(data=mlm_data, out=tmp_path, config=str(tiny_config), max_steps=2, batch_size=8)
    trainer = Trainer(args, init_distributed("cpu"))
    frozen = {n for n, p in trainer.model.named_parameters() if not p.requires_grad}
    assert frozen == {
        "bert.pooler.dense.weight",
        "bert.pooler.dense.bias",
        "cls.seq_relationship.weight",
        "cls.seq_relationship.bias",
    }
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if n in frozen}
    trainer.run()
    for name, value in before.items():
        torch.testing.assert_close(dict(trainer.model.named_parameters())[name], value, atol=0, rtol=0)


def test_bf16_request_on_a_cpu_without_native_bf16_trains_in_fp32(
    data_folder: Path, tiny_config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog
) -> None:
    from bert_model import training

    monkeypatch.setattr(training, "cpu_flags", lambda: frozenset({"avx2", "fma"}))
    monkeypatch.setattr(training, "_WARNED", set())
    args = TrainingArgs(data=data_folder, out=tmp_path / "run", config=str(tiny_config), max_steps=2, bf16=True)
    with caplog.at_level(logging.WARNING, logger="bert_model.training"):
        pretrain(args)
    messages = [r.getMessage() for r in caplog.records if r.name == "bert_model.training"]
    assert messages == ["bf16 requested but this CPU has no native bf16 (AVX512_BF16/AMX): training in fp32"]
    assert json.loads((tmp_path / "run" / "pretraining_args.json").read_text())["precision"] == "fp32"


@pytest.mark.parametrize("objective", ["roberta", ""])
def test_unknown_objective_is_refused(objective: str) -> None:
    with pytest.raises(ValueError, match="objective must be one of"):
        DataOptions(objective=objective)
