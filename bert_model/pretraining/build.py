"""`pretrain-data`: corpus files -> documents -> instances -> (static) MLM masks -> sharded files.

Two objectives. `mlm-nsp` (BERT, the default): within a block the reference procedure of google-research/bert
`create_pretraining_data.py` runs: `dupe_factor` passes over the documents, each cutting fresh NSP pairs (and,
with static masking, fresh masks), NotNext sides drawn from the other documents of the block. `mlm` (RoBERTa,
Liu et al. 2019, section 4.2): no pairs and no NSP labels; each of the `dupe_factor` passes packs the block's
documents, in a fresh random order, into full-sentence sequences that cross document boundaries (`packing.py`).
Pair with `dynamic_masking` for the whole RoBERTa recipe (a new mask each time a sequence is read).

The corpus is streamed in blocks of `documents_per_block` documents, so memory is bounded by a block, not by
the corpus; all the instances of a block are shuffled before they are written. Whole documents are held out for
evaluation (`eval_fraction`), each decided by one seeded draw (the same documents for both objectives), and
their NotNext sides come only from other held-out documents. Everything is deterministic in `seed`.
"""

from __future__ import annotations

import shutil
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from bert_model.pretraining.corpus import CORPUS_FORMATS, CorpusFormat, Document, check_corpus_files, iter_documents
from bert_model.pretraining.instances import (
    PairOptions,
    Segment,
    TokenizedDocument,
    TrainingInstance,
    create_instances_from_document,
)
from bert_model.pretraining.masking import MaskingOptions, MaskingVocabulary, mask_tokens
from bert_model.pretraining.packing import PackOptions, pack_full_sentences
from bert_model.pretraining.shards import TOKENIZER_DIR, DataMeta, ShardWriter, SplitInfo
from bert_model.tokenization import BertTokenizer

_ENCODE_CHUNK = 4096  # sentences per call to the Rust tokenizer
OBJECTIVES: tuple[str, ...] = ("mlm-nsp", "mlm")
"""`mlm-nsp`: BERT's sentence pairs with next-sentence labels; `mlm`: RoBERTa's packed full sentences, no NSP."""


@dataclass(frozen=True)
class DataOptions:
    """Options of `pretrain-data`, validated before any work starts."""

    max_seq_length: int = 128
    """Tokens per instance, [CLS] and both [SEP] included; must not exceed the model's positions."""
    objective: str = "mlm-nsp"
    """`mlm-nsp` (BERT: NSP pairs) or `mlm` (RoBERTa: full sentences packed across documents, no NSP)."""
    short_seq_prob: float = 0.1
    """Probability of a shorter random target length (so the model also sees short inputs); NSP pairs only."""
    dupe_factor: int = 5
    """Passes over the corpus, each with new NSP pairs (and new static masks)."""
    masking: MaskingOptions = field(default_factory=MaskingOptions)
    dynamic_masking: bool = False
    """Store unmasked instances and mask them afresh every epoch at training time (RoBERTa)."""
    eval_fraction: float = 0.0
    """Share of documents held out (whole) for evaluation."""
    instances_per_shard: int = 10_000
    documents_per_block: int = 10_000
    """Documents processed together; bounds memory; NotNext sides come from the same block."""
    corpus_format: CorpusFormat = "auto"
    paragraphs_per_document: int = 1
    """In plain files, this many blank-line-separated paragraphs form one document (1: each paragraph)."""
    seed: int = 12345

    def __post_init__(self) -> None:
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")
        if self.dupe_factor < 1:
            raise ValueError(f"dupe_factor must be at least 1, got {self.dupe_factor}")
        if not 0.0 <= self.eval_fraction < 1.0:
            raise ValueError(f"eval_fraction must be in [0, 1), got {self.eval_fraction}")
        if self.paragraphs_per_document < 1:
            raise ValueError(f"paragraphs_per_document must be at least 1, got {self.paragraphs_per_document}")
        if self.documents_per_block < 2:
            raise ValueError(f"documents_per_block must be at least 2, got {self.documents_per_block}")
        if self.corpus_format not in CORPUS_FORMATS:
            raise ValueError(f"corpus format must be one of {CORPUS_FORMATS}, got {self.corpus_format!r}")
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {OBJECTIVES}, got {self.objective!r}")
        PairOptions(self.max_seq_length, self.short_seq_prob, 0, 0)  # validates the lengths

    @property
    def min_documents(self) -> int:
        """Documents a split needs: two for NSP (NotNext sides come from another document), else one."""
        return 2 if self.objective == "mlm-nsp" else 1


def build_pretraining_data(
    corpus: Sequence[str | Path],
    tokenizer: BertTokenizer,
    out: str | Path,
    options: DataOptions,
    overwrite: bool = False,
) -> DataMeta:
    """Write the shards of `corpus` into folder `out` and return its `meta.json` content."""
    files = check_corpus_files(corpus)
    if options.max_seq_length > tokenizer.model_max_length:
        raise ValueError(
            f"max_seq_length {options.max_seq_length} exceeds the tokenizer's model_max_length "
            f"({tokenizer.model_max_length}, the model's positions)"
        )
    folder = _prepare_output(Path(out), overwrite)
    builder = _SplitBuilder(tokenizer, options)
    meta = DataMeta(
        max_seq_length=options.max_seq_length,
        vocab_size=tokenizer.vocab_size,
        special_ids={
            "pad": tokenizer.pad_id,
            "cls": tokenizer.cls_id,
            "sep": tokenizer.sep_id,
            "mask": tokenizer.mask_id,
            "unk": tokenizer.unk_id,
        },
        masking=asdict(options.masking) | {"dynamic": options.dynamic_masking},
        options={k: v for k, v in asdict(options).items() if k != "masking"},
        corpus=[str(p) for p in files],
    )
    meta.splits = builder.run(files, folder)
    _check_result(meta, files, options)
    tokenizer.save(folder / TOKENIZER_DIR)
    meta.save(folder)
    return meta


def _prepare_output(folder: Path, overwrite: bool) -> Path:
    if folder.exists() and not folder.is_dir():
        raise NotADirectoryError(f"--out {folder} exists and is not a folder")
    if folder.is_dir() and any(folder.iterdir()):
        if not overwrite:
            raise ValueError(f"output folder {folder} is not empty; pass --overwrite to replace its contents")
        for name in ("train", "eval", TOKENIZER_DIR):
            shutil.rmtree(folder / name, ignore_errors=True)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _check_result(meta: DataMeta, files: Sequence[Path], options: DataOptions) -> None:
    train = meta.splits["train"]
    names = ", ".join(str(p) for p in files)
    if train.documents == 0:
        raise ValueError(f"the corpus ({names}) holds no text: every file is empty or blank")
    if train.documents < options.min_documents:
        raise ValueError(
            f"the corpus ({names}) has only one training document; next-sentence prediction needs at least two "
            "(NotNext pairs come from another document): separate documents with blank lines"
        )
    if train.instances == 0:
        raise ValueError(f"the corpus ({names}) produced no training instance")
    if options.eval_fraction > 0 and meta.splits.get("eval", SplitInfo()).instances == 0:
        needed = "two documents, too few for NSP pairs" if options.min_documents == 2 else "one document"
        raise ValueError(
            f"eval_fraction {options.eval_fraction} held out fewer than {needed}: raise it or use a larger corpus"
        )


class _SplitBuilder:
    """Routes documents to train/eval, and turns blocks of documents into shards."""

    def __init__(self, tokenizer: BertTokenizer, options: DataOptions) -> None:
        self.tokenizer = tokenizer
        self.options = options
        self.pairs = PairOptions(options.max_seq_length, options.short_seq_prob, tokenizer.cls_id, tokenizer.sep_id)
        self.packing = PackOptions(options.max_seq_length, tokenizer.cls_id, tokenizer.sep_id)
        specials = {tokenizer.pad_id, tokenizer.unk_id, tokenizer.cls_id, tokenizer.sep_id, tokenizer.mask_id}
        self.vocab = MaskingVocabulary.build(tokenizer.mask_id, tokenizer.vocab_size, specials)

    def run(self, files: Sequence[Path], folder: Path) -> dict[str, SplitInfo]:
        split_rng = np.random.default_rng([self.options.seed, 0])
        writers = {"train": ShardWriter(folder / "train", self.options.instances_per_shard, self._static("train"))}
        if self.options.eval_fraction > 0:
            writers["eval"] = ShardWriter(folder / "eval", self.options.instances_per_shard, True)
        pending: dict[str, list[Document]] = {name: [] for name in writers}
        blocks = Counter[str]()
        sources = {name: Counter[str]() for name in writers}
        for document in iter_documents(files, self.options.corpus_format, self.options.paragraphs_per_document):
            name = "eval" if "eval" in writers and split_rng.random() < self.options.eval_fraction else "train"
            pending[name].append(document)
            sources[name][str(files[document.source])] += 1
            # Keep one block in hand, so that a last block of a single document joins the one before it.
            if len(pending[name]) >= 2 * self.options.documents_per_block:
                head = pending[name][: self.options.documents_per_block]
                pending[name] = pending[name][self.options.documents_per_block :]
                self._write_block(head, name, blocks[name], writers[name])
                blocks[name] += 1
        for name, documents in pending.items():
            for block in _final_blocks(documents, self.options.documents_per_block):
                self._write_block(block, name, blocks[name], writers[name])
                blocks[name] += 1
        infos = {name: writer.close() for name, writer in writers.items()}
        for name, info in infos.items():
            info.documents_per_source = dict(sources[name])
            info.documents = sum(sources[name].values())
        return infos

    def _static(self, split: str) -> bool:
        return split == "eval" or not self.options.dynamic_masking

    def _write_block(self, documents: list[Document], split: str, block: int, writer: ShardWriter) -> None:
        kept = [
            (doc, document.source) for doc, document in zip(self._tokenize(documents), documents, strict=True) if doc
        ]
        if len(kept) < self.options.min_documents:
            return  # nothing to pair with; the caller reports a corpus of one document
        rng = np.random.default_rng([self.options.seed, 1 if split == "train" else 2, block])
        dupes = self.options.dupe_factor if split == "train" else 1
        instances = []
        for _ in range(dupes):
            instances += self._instances(kept, rng)
        for position in rng.permutation(len(instances)):
            instance = instances[position]
            ids = np.asarray(instance.input_ids)
            writer.info.maskable_tokens += int((~np.isin(ids, self.vocab.special_array)).sum())
            masked = None
            if writer.static_masking:
                starts = np.asarray(instance.word_start)
                masked = mask_tokens(ids, self.options.masking, self.vocab, rng, starts)
            writer.add(instance, masked)

    def _instances(self, kept: list[tuple[TokenizedDocument, int]], rng: np.random.Generator) -> list[TrainingInstance]:
        """One pass over a block's documents: NSP pairs of each document, or the documents in a random order
        packed into full-sentence sequences (each tagged with the source of its first document)."""
        if self.options.objective == "mlm":
            shuffled = [kept[i] for i in rng.permutation(len(kept))]
            return pack_full_sentences([d for d, _ in shuffled], self.packing, [source for _, source in shuffled])
        tokenized = [doc for doc, _ in kept]
        instances: list[TrainingInstance] = []
        for index, (_, source) in enumerate(kept):
            for instance in create_instances_from_document(tokenized, index, self.pairs, rng):
                instance.source = source
                instances.append(instance)
        return instances

    def _tokenize(self, documents: list[Document]) -> list[TokenizedDocument]:
        sentences = [sentence for document in documents for sentence in document.sentences]
        segments = list(self._encode(sentences))
        result: list[TokenizedDocument] = []
        cursor = 0
        for document in documents:
            pieces = segments[cursor : cursor + len(document.sentences)]
            cursor += len(document.sentences)
            result.append([segment for segment in pieces if segment.ids])
        return result

    def _encode(self, sentences: list[str]) -> Iterator[Segment]:
        for start in range(0, len(sentences), _ENCODE_CHUNK):
            chunk = sentences[start : start + _ENCODE_CHUNK]
            # The backend has no truncation: a sentence longer than a sequence is cut later, when pairs are made.
            for encoding in self.tokenizer.backend.encode_batch(chunk, add_special_tokens=False):
                yield Segment(list(encoding.ids), _word_starts(encoding.word_ids))


def _word_starts(word_ids: list[int | None]) -> list[bool]:
    starts: list[bool] = []
    previous: int | None = None
    for word in word_ids:
        starts.append(word is None or word != previous)
        previous = word
    return starts


def _final_blocks(documents: list[Document], size: int) -> Iterator[list[Document]]:
    """The remaining documents in blocks of `size`; a last block of one document joins the previous block."""
    blocks = [documents[i : i + size] for i in range(0, len(documents), size)]
    if len(blocks) >= 2 and len(blocks[-1]) < 2:
        blocks[-2].extend(blocks.pop())
    yield from blocks
